/* verbs-family.c: familyctl families, family NAME, resolve FAMILY. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "macro.h"

static int cmp_entry_key(const void *a, const void *b) {
        /* Every map entry type of the API starts with base, then char *key. */
        const Familyd__V1__ResolvedFamily__ArgumentsEntry *const *x = a, *const *y = b;

        return strcmp(strempty((*x)->key), strempty((*y)->key));
}

/* Map entries arrive in the daemon's order; print them sorted so output is stable. */
static char *value_map_to_string(Familyd__V1__ResolvedFamily__ArgumentsEntry **entries, size_t n) {
        _cleanup_free_ Familyd__V1__ResolvedFamily__ArgumentsEntry **sorted = NULL;
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (n == 0)
                return strdup("-");
        sorted = malloc(n * sizeof(*sorted));
        if (!sorted)
                return NULL;
        memcpy(sorted, entries, n * sizeof(*sorted));
        qsort(sorted, n, sizeof(*sorted), cmp_entry_key);

        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *v = ctl_value_to_string(sorted[i]->value);

                fprintf(f, "%s%s=%s", i > 0 ? " " : "", strempty(sorted[i]->key), strempty(v));
        }
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static char *typed_fields_to_string(Familyd__V1__TypedField *const *fields, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (n == 0)
                return strdup("-");
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                fprintf(f, "%s%s:%s", i > 0 ? " " : "", strempty(fields[i]->name), strempty(fields[i]->type));
                if (fields[i]->default_) {
                        _cleanup_free_ char *v = ctl_value_to_string(fields[i]->default_);

                        fprintf(f, "=%s", strempty(v));
                }
        }
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static char *variant_names(const Familyd__V1__Family *fam) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t i = 0; i < fam->n_variants; i++)
                fprintf(f, "%s%s", i > 0 ? "," : "", strempty(fam->variants[i]->name));
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

int verb_families(Context *ctx, int argc, char **argv) {
        _cleanup_(table_freep) Table *t = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ListFamiliesResponse *resp = NULL;
        int r;

        PARSE_SIMPLE_VERB("families",
                          "Usage: familyctl families [OPTIONS]\n"
                          "\n"
                          "Lists the registry's families in load order:\n"
                          "NAME BASELINE DEFAULT VARIANTS SOURCE.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (optind < argc)
                return ctl_usage_error("families", "unexpected argument '%s'", argv[optind]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_list_families(ctx->client, &resp, &error);
        if (r < 0) {
                r = ctl_fail("list families", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        if (ctx->json) {
                r = ctl_print_json(&resp->base);
                goto finish;
        }

        t = table_new(5, "NAME", "BASELINE", "DEFAULT", "VARIANTS", "SOURCE");
        if (!t) {
                r = ctl_fail("build table", -ENOMEM, NULL);
                goto finish;
        }
        for (size_t i = 0; i < resp->n_families; i++) {
                const Familyd__V1__Family *fam = resp->families[i];
                _cleanup_free_ char *vn = variant_names(fam);

                if (table_add_cell(t, fam->name) < 0 || table_add_cell(t, fam->baseline) < 0 ||
                    table_add_cell(t, fam->default_variant) < 0 || table_add_cell(t, vn) < 0 ||
                    table_add_cell(t, fam->source) < 0) {
                        r = ctl_fail("build table", -ENOMEM, NULL);
                        goto finish;
                }
        }
        (void) table_print(t, stdout);
        r = EXIT_OK;
finish:
        familyd__v1__list_families_response__free_unpacked(resp, NULL);
        return r;
}

static char *requires_to_string(const Familyd__V1__Variant *v) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (v->n_requires == 0)
                return strdup("-");
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < v->n_requires; i++) {
                const Familyd__V1__ValueList *l = v->requires[i]->value;

                fprintf(f, "%s%s in [", i > 0 ? " " : "", strempty(v->requires[i]->key));
                for (size_t j = 0; l && j < l->n_values; j++) {
                        _cleanup_free_ char *s = ctl_value_to_string(l->values[j]);

                        fprintf(f, "%s%s", j > 0 ? ", " : "", strempty(s));
                }
                fputc(']', f);
        }
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static void print_family(const Familyd__V1__Family *fam) {
        _cleanup_(table_freep) Table *t = NULL;
        _cleanup_free_ char *sel = typed_fields_to_string(fam->selectors, fam->n_selectors);
        _cleanup_free_ char *args = typed_fields_to_string(fam->arguments, fam->n_arguments);

        ctl_print_field("name", "%s", strempty(fam->name));
        ctl_print_field("baseline", "%s", strempty(fam->baseline));
        ctl_print_field("default variant", "%s", isempty(fam->default_variant) ? "-" : fam->default_variant);
        ctl_print_field("parallel axis", "%s", isempty(fam->parallel_axis) ? "-" : fam->parallel_axis);
        ctl_print_field("selectors", "%s", strempty(sel));
        ctl_print_field("arguments", "%s", strempty(args));
        ctl_print_field("source", "%s", isempty(fam->source) ? "-" : fam->source);

        for (size_t i = 0; i < fam->n_rules; i++) {
                const Familyd__V1__Rule *rule = fam->rules[i];
                _cleanup_free_ char *when = value_map_to_string(
                                (Familyd__V1__ResolvedFamily__ArgumentsEntry **) rule->when, rule->n_when);
                const char *what = "variant", *arg = "";

                switch (rule->outcome_case) {
                case FAMILYD__V1__RULE__OUTCOME_VARIANT:
                        arg = rule->variant;
                        break;
                case FAMILYD__V1__RULE__OUTCOME_ERROR:
                        what = "error";
                        arg = rule->error;
                        break;
                case FAMILYD__V1__RULE__OUTCOME_UNSUPPORTED:
                        what = "unsupported";
                        arg = rule->unsupported;
                        break;
                default:
                        what = "?";
                }
                ctl_print_field(i == 0 ? "rules" : "", "when %s -> %s %s", strempty(when), what, strempty(arg));
        }

        putchar('\n');
        t = table_new(4, "VARIANT", "CONSTRUCTOR", "ACCEPTS", "REQUIRES");
        if (!t)
                return;
        for (size_t i = 0; i < fam->n_variants; i++) {
                const Familyd__V1__Variant *v = fam->variants[i];
                _cleanup_free_ char *req = requires_to_string(v);
                char *accepts = NULL;
                size_t size = 0;
                FILE *f = open_memstream(&accepts, &size);

                if (f) {
                        for (size_t j = 0; j < v->n_accepts; j++)
                                fprintf(f, "%s%s", j > 0 ? "," : "", v->accepts[j]);
                        (void) fclose(f);
                }
                (void) table_add_cell(t, v->name);
                (void) table_add_cell(t, v->constructor);
                (void) table_add_cell(t, accepts);
                (void) table_add_cell(t, req);
                free(accepts);
        }
        (void) table_print(t, stdout);
}

int verb_family(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__Family *fam = NULL;
        int r;

        PARSE_SIMPLE_VERB("family",
                          "Usage: familyctl family [OPTIONS] NAME\n"
                          "\n"
                          "Shows one family, named by its name or its baseline path: selectors and\n"
                          "arguments (name:type=default), rules in order, and the variants.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (argc - optind != 1)
                return ctl_usage_error("family", "expected exactly one family name");

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_get_family(ctx->client, argv[optind], &fam, &error);
        if (r < 0) {
                r = ctl_fail("get family", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        if (ctx->json)
                r = ctl_print_json(&fam->base);
        else {
                print_family(fam);
                r = EXIT_OK;
        }
        familyd__v1__family__free_unpacked(fam, NULL);
        return r;
}

static const char resolve_help[] =
        "Usage: familyctl resolve [OPTIONS] FAMILY [KEY=VALUE...]\n"
        "\n"
        "Resolves FAMILY (name or baseline) for a job: prints family, variant, constructor,\n"
        "arguments, selectors and axis sizes.\n"
        "\n"
        "KEY=VALUE sets a selector or argument. VALUE is read as: true/false -> bool; an\n"
        "integer -> int; a number with '.', 'e' or 'E' -> float; anything else -> string.\n"
        "\n"
        "Job context:\n"
        "      --tp N, --cp N, --ep N, --pp N\n"
        "                      axis sizes (tp_size, ...)\n"
        "      --active AXES   axis active flags, comma-separated (e.g. tp,ep); an active\n"
        "                      axis needs a size\n"
        "      --mesh ID       take axis sizes from a mesh made by `familyctl mesh create`\n"
        "      --sequence-parallel, --loss-parallel\n"
        "                      set those context flags\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_resolve(Context *ctx, int argc, char **argv) {
        enum {
                ARG_TP = 0x100, ARG_CP, ARG_EP, ARG_PP, ARG_MESH, ARG_ACTIVE, ARG_SP, ARG_LP,
        };
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "tp",                required_argument, NULL, ARG_TP },
                { "cp",                required_argument, NULL, ARG_CP },
                { "ep",                required_argument, NULL, ARG_EP },
                { "pp",                required_argument, NULL, ARG_PP },
                { "mesh",              required_argument, NULL, ARG_MESH },
                { "active",            required_argument, NULL, ARG_ACTIVE },
                { "sequence-parallel", no_argument,       NULL, ARG_SP },
                { "loss-parallel",     no_argument,       NULL, ARG_LP },
                {}
        };
        Familyd__V1__ResolveRequest req = FAMILYD__V1__RESOLVE_REQUEST__INIT;
        Familyd__V1__JobContext jc = FAMILYD__V1__JOB_CONTEXT__INIT;
        _cleanup_free_ Familyd__V1__ResolveRequest__ArgumentsEntry *entries = NULL;
        _cleanup_free_ Familyd__V1__ResolveRequest__ArgumentsEntry **entry_ptrs = NULL;
        _cleanup_free_ Familyd__V1__Value *values = NULL;
        _cleanup_free_ char *active = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ResolveResponse *resp = NULL;
        int c, r;

        req.context = &jc;
        while ((c = getopt_long(argc, argv, "s:jt:h", options, NULL)) >= 0) {
                int64_t n;

                switch (c) {
                case 'h':
                        fputs(resolve_help, stdout);
                        return EXIT_OK;
                case '?':
                        return ctl_usage_error("resolve", "invalid option");
                case ARG_TP:
                case ARG_CP:
                case ARG_EP:
                case ARG_PP:
                        /* Any integer: the daemon owns "must be a positive integer". */
                        if (ctl_parse_int64(optarg, &n) < 0)
                                return ctl_usage_error("resolve", "--%s needs an integer, not '%s'",
                                                       options[4 + c - ARG_TP].name, optarg);
                        if (c == ARG_TP) {
                                jc._tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
                                jc.tp_size = n;
                        } else if (c == ARG_CP) {
                                jc._cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                                jc.cp_size = n;
                        } else if (c == ARG_EP) {
                                jc._ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                                jc.ep_size = n;
                        } else {
                                jc._pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
                                jc.pp_size = n;
                        }
                        break;
                case ARG_MESH:
                        jc.mesh_id = optarg;
                        break;
                case ARG_ACTIVE: {
                        char *save = NULL;

                        free(active);
                        active = strdup(optarg);
                        if (!active)
                                return ctl_fail("parse --active", -ENOMEM, NULL);
                        for (char *a = strtok_r(active, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
                                if (streq(a, "tp"))
                                        jc.tp = true;
                                else if (streq(a, "cp"))
                                        jc.cp = true;
                                else if (streq(a, "ep"))
                                        jc.ep = true;
                                else if (streq(a, "pp"))
                                        jc.pp = true;
                                else
                                        return ctl_usage_error("resolve", "--active: unknown axis '%s' (tp, cp, ep, pp)", a);
                        }
                        break;
                }
                case ARG_SP:
                        jc.sequence_parallel = true;
                        break;
                case ARG_LP:
                        jc.loss_parallel = true;
                        break;
                default:
                        r = ctl_common_option(ctx, c, optarg);
                        if (r != EXIT_OK)
                                return r < 0 ? EXIT_INTERNAL : r;
                }
        }

        if (optind >= argc)
                return ctl_usage_error("resolve", "missing family name");
        req.family = argv[optind++];

        size_t n = (size_t) (argc - optind);
        if (n > 0) {
                entries = calloc(n, sizeof(*entries));
                entry_ptrs = calloc(n, sizeof(*entry_ptrs));
                values = calloc(n, sizeof(*values));
                if (!entries || !entry_ptrs || !values)
                        return ctl_fail("parse arguments", -ENOMEM, NULL);
        }
        for (size_t i = 0; i < n; i++) {
                char *kv = argv[optind + i], *eq = strchr(kv, '=');

                if (!eq || eq == kv)
                        return ctl_usage_error("resolve", "expected KEY=VALUE, not '%s'", kv);
                *eq = 0;
                familyd__v1__resolve_request__arguments_entry__init(&entries[i]);
                entries[i].key = kv;
                (void) ctl_parse_value(eq + 1, &values[i]);
                entries[i].value = &values[i];
                entry_ptrs[i] = &entries[i];
        }
        req.n_arguments = n;
        req.arguments = entry_ptrs;

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_resolve(ctx->client, &req, &resp, &error);
        if (r < 0) {
                r = ctl_fail("resolve", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        if (ctx->json)
                r = ctl_print_json(&resp->base);
        else if (!resp->resolved)
                r = ctl_fail("resolve", -EBADMSG, NULL);
        else {
                const Familyd__V1__ResolvedFamily *rf = resp->resolved;
                _cleanup_free_ char *args = value_map_to_string(
                                (Familyd__V1__ResolvedFamily__ArgumentsEntry **) rf->arguments, rf->n_arguments);
                _cleanup_free_ char *sels = value_map_to_string(
                                (Familyd__V1__ResolvedFamily__ArgumentsEntry **) rf->selectors, rf->n_selectors);
                static const char *const axes[] = { "tp", "cp", "ep", "pp" };

                ctl_print_field("family", "%s", strempty(rf->family));
                ctl_print_field("variant", "%s", strempty(rf->variant));
                ctl_print_field("constructor", "%s", strempty(rf->constructor));
                ctl_print_field("arguments", "%s", strempty(args));
                ctl_print_field("selectors", "%s", strempty(sels));

                /* Axis sizes in the fixed order tp, cp, ep, pp; 1 when the daemon omits one. */
                printf("%-21s", "axis sizes");
                for (size_t a = 0; a < ELEMENTSOF(axes); a++) {
                        int64_t size = 1;

                        for (size_t i = 0; i < rf->n_axis_sizes; i++)
                                if (streq_ptr(rf->axis_sizes[i]->key, axes[a]))
                                        size = rf->axis_sizes[i]->value;
                        printf(" %s=%" PRId64, axes[a], size);
                }
                putchar('\n');
                r = EXIT_OK;
        }
        familyd__v1__resolve_response__free_unpacked(resp, NULL);
        return r;
}
