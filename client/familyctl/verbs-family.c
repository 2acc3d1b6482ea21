/* verbs-family.c: familyctl families, family NAME, resolve FAMILY. */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

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


static const char *const families_columns[] = {
        "NAME", "BASELINE", "DEFAULT", "VARIANTS", "SOURCE", NULL,
};
static const char *const *const families_tables[] = { families_columns, NULL };

static int families_call(VerbRun *v) {
        return familyd_list_families(v->ctx->client, (Familyd__V1__ListFamiliesResponse **) &v->response, &v->error);
}

static int families_print(VerbRun *v) {
        const Familyd__V1__ListFamiliesResponse *resp = (const Familyd__V1__ListFamiliesResponse *) v->response;
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, families_columns);

        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < resp->n_families; i++) {
                const Familyd__V1__Family *fam = resp->families[i];
                _cleanup_free_ char *vn = variant_names(fam);

                if (table_add_cell(t, fam->name) < 0 || table_add_cell(t, fam->baseline) < 0 ||
                    table_add_cell(t, fam->default_variant) < 0 || table_add_cell(t, vn) < 0 ||
                    table_add_cell(t, fam->source) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        return table_print(t, false);
}

static const VerbDef families_verb = {
        .name = "families",
        .help = "Usage: familyctl families [OPTIONS]\n"
                "\n"
                "Lists the registry's families in load order:\n"
                "NAME BASELINE DEFAULT VARIANTS SOURCE.\n"
                "\n",
        .tables = families_tables,
        .call = families_call,
        .what = "list families",
        .print = families_print,
};

int verb_families(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &families_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* family NAME */

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

                /* A flag: the one bool it must be. */
                if (l && l->n_values == 1 && l->values[0]->kind_case == FAMILYD__V1__VALUE__KIND_BOOL_VALUE) {
                        fprintf(f, "%s%s=%s", i > 0 ? " " : "", strempty(v->requires[i]->key),
                                l->values[0]->bool_value ? "true" : "false");
                        continue;
                }
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

static char *accepts_to_string(const Familyd__V1__Variant *v) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t j = 0; j < v->n_accepts; j++)
                fprintf(f, "%s%s", j > 0 ? "," : "", v->accepts[j]);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static void print_rule(const Familyd__V1__Rule *rule, bool first) {
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
        ctl_print_field(first ? "rules" : "", "when %s -> %s %s", strempty(when), what, strempty(arg));
}

static const char *const variant_columns[] = {
        "VARIANT", "CONSTRUCTOR", "ACCEPTS", "REQUIRES", NULL,
};
static const char *const *const family_tables[] = { variant_columns, NULL };

static int family_print(VerbRun *v) {
        const Familyd__V1__Family *fam = (const Familyd__V1__Family *) v->response;
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, variant_columns);
        _cleanup_free_ char *sel = typed_fields_to_string(fam->selectors, fam->n_selectors);
        _cleanup_free_ char *args = typed_fields_to_string(fam->arguments, fam->n_arguments);

        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        ctl_print_field("name", "%s", strempty(fam->name));
        ctl_print_field("baseline", "%s", strempty(fam->baseline));
        ctl_print_field("default variant", "%s", isempty(fam->default_variant) ? "-" : fam->default_variant);
        ctl_print_field("parallel axis", "%s", isempty(fam->parallel_axis) ? "-" : fam->parallel_axis);
        ctl_print_field("selectors", "%s", strempty(sel));
        ctl_print_field("arguments", "%s", strempty(args));
        ctl_print_field("source", "%s", isempty(fam->source) ? "-" : fam->source);
        for (size_t i = 0; i < fam->n_rules; i++)
                print_rule(fam->rules[i], i == 0);

        for (size_t i = 0; i < fam->n_variants; i++) {
                const Familyd__V1__Variant *var = fam->variants[i];
                _cleanup_free_ char *req = requires_to_string(var);
                _cleanup_free_ char *accepts = accepts_to_string(var);

                if (table_add_cell(t, var->name) < 0 || table_add_cell(t, var->constructor) < 0 ||
                    table_add_cell(t, accepts) < 0 || table_add_cell(t, req) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        return table_print(t, true);
}

static int family_call(VerbRun *v) {
        return familyd_get_family(v->ctx->client, v->args[0], (Familyd__V1__Family **) &v->response, &v->error);
}

static const VerbDef family_verb = {
        .name = "family",
        .help = "Usage: familyctl family [OPTIONS] NAME\n"
                "\n"
                "Shows one family, named by its name or its baseline path: selectors and\n"
                "arguments (name:type=default), rules in order, and the variants.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one family name",
        .args_extra = "expected exactly one family name",
        .tables = family_tables,
        .call = family_call,
        .what = "get family",
        .print = family_print,
};

int verb_family(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &family_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* resolve FAMILY [KEY=VALUE...] */

typedef struct ResolveState {
        Familyd__V1__ResolveRequest req;
        Familyd__V1__JobContext context;
        AxisSizes axes;
        const char *mesh;
        bool active[4];                 /* tp, cp, ep, pp */
        bool sequence_parallel;
        bool loss_parallel;
        Familyd__V1__ResolveRequest__ArgumentsEntry *entries;
        Familyd__V1__ResolveRequest__ArgumentsEntry **entry_ptrs;
        Familyd__V1__Value *values;
} ResolveState;

enum {
        ARG_MESH = 0x100, ARG_ACTIVE, ARG_SP, ARG_LP,
};

static const struct option resolve_options[] = {
        AXIS_LONG_OPTIONS,
        { "mesh",              required_argument, NULL, ARG_MESH },
        { "active",            required_argument, NULL, ARG_ACTIVE },
        { "sequence-parallel", no_argument,       NULL, ARG_SP },
        { "loss-parallel",     no_argument,       NULL, ARG_LP },
        {}
};

/* --active tp,ep: the axes' active flags. */
static int resolve_active(ResolveState *s, const char *arg) {
        static const char *const axes[] = { "tp", "cp", "ep", "pp" };
        _cleanup_free_ char *copy = strdup(arg);
        char *save = NULL;

        if (!copy)
                return ctl_fail("parse --active", -ENOMEM, NULL);
        for (char *a = strtok_r(copy, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
                size_t i = 0;

                while (i < ELEMENTSOF(axes) && !streq(a, axes[i]))
                        i++;
                if (i == ELEMENTSOF(axes))
                        return ctl_usage_error("resolve", "--active: unknown axis '%s' (tp, cp, ep, pp)", a);
                s->active[i] = true;
        }
        return EXIT_OK;
}

static int resolve_option(VerbRun *v, int c, const char *arg) {
        ResolveState *s = v->state;
        int r;

        switch (c) {
        case ARG_MESH:
                s->mesh = arg;
                return EXIT_OK;
        case ARG_ACTIVE:
                return resolve_active(s, arg);
        case ARG_SP:
                s->sequence_parallel = true;
                return EXIT_OK;
        case ARG_LP:
                s->loss_parallel = true;
                return EXIT_OK;
        }
        r = ctl_axis_option("resolve", &s->axes, c, arg);
        return r < 0 ? EXIT_INTERNAL : r;
}

static int resolve_prepare(VerbRun *v) {
        ResolveState *s = v->state;
        size_t n = v->n_args - 1;

        familyd__v1__resolve_request__init(&s->req);
        familyd__v1__job_context__init(&s->context);
        s->req.context = &s->context;
        s->req.family = v->args[0];
        ctl_axis_to_context(&s->axes, &s->context);
        if (s->mesh)
                s->context.mesh_id = (char *) s->mesh;
        s->context.tp = s->active[0];
        s->context.cp = s->active[1];
        s->context.ep = s->active[2];
        s->context.pp = s->active[3];
        s->context.sequence_parallel = s->sequence_parallel;
        s->context.loss_parallel = s->loss_parallel;
        if (n > 0) {
                s->entries = calloc(n, sizeof(*s->entries));
                s->entry_ptrs = calloc(n, sizeof(*s->entry_ptrs));
                s->values = calloc(n, sizeof(*s->values));
                if (!s->entries || !s->entry_ptrs || !s->values)
                        return ctl_fail("parse arguments", -ENOMEM, NULL);
        }
        for (size_t i = 0; i < n; i++) {
                char *kv = v->args[1 + i], *eq = strchr(kv, '=');

                if (!eq || eq == kv)
                        return ctl_usage_error("resolve", "expected KEY=VALUE, not '%s'", kv);
                *eq = 0;
                familyd__v1__resolve_request__arguments_entry__init(&s->entries[i]);
                s->entries[i].key = kv;
                (void) ctl_parse_value(eq + 1, &s->values[i]);
                s->entries[i].value = &s->values[i];
                s->entry_ptrs[i] = &s->entries[i];
        }
        s->req.n_arguments = n;
        s->req.arguments = s->entry_ptrs;
        return EXIT_OK;
}

static int resolve_call(VerbRun *v) {
        ResolveState *s = v->state;

        return familyd_resolve(v->ctx->client, &s->req, (Familyd__V1__ResolveResponse **) &v->response, &v->error);
}

static int resolve_print(VerbRun *v) {
        static const char *const axes[] = { "tp", "cp", "ep", "pp" };
        const Familyd__V1__ResolvedFamily *rf = ((const Familyd__V1__ResolveResponse *) v->response)->resolved;
        _cleanup_free_ char *args = NULL, *sels = NULL;

        if (!rf)
                return ctl_fail("resolve", -EBADMSG, NULL);
        args = value_map_to_string((Familyd__V1__ResolvedFamily__ArgumentsEntry **) rf->arguments, rf->n_arguments);
        sels = value_map_to_string((Familyd__V1__ResolvedFamily__ArgumentsEntry **) rf->selectors, rf->n_selectors);
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
        return EXIT_OK;
}

static void resolve_done(VerbRun *v) {
        ResolveState *s = v->state;

        free(s->entries);
        free(s->entry_ptrs);
        free(s->values);
}

static const VerbDef resolve_verb = {
        .name = "resolve",
        .help = "Usage: familyctl resolve [OPTIONS] FAMILY [KEY=VALUE...]\n"
                "\n"
                "Resolves FAMILY (name or baseline) for a job: prints family, variant, constructor,\n"
                "arguments, selectors and axis sizes.\n"
                "\n"
                "KEY=VALUE sets a selector or argument. VALUE is read as: true/false -> bool; an\n"
                "integer -> int; a number with '.', 'e' or 'E' -> float; anything else -> string.\n"
                "\n"
                "Job context:\n"
                AXIS_OPTIONS_HELP
                "      --active AXES   axis active flags, comma-separated (e.g. tp,ep); an active\n"
                "                      axis needs a size\n"
                "      --mesh ID       take axis sizes from a mesh made by `familyctl mesh create`\n"
                "      --sequence-parallel, --loss-parallel\n"
                "                      set those context flags\n"
                "\n",
        .options = resolve_options,
        .option = resolve_option,
        .min_args = 1,
        .max_args = UINT_MAX,
        .args_missing = "missing family name",
        .state_size = sizeof(ResolveState),
        .prepare = resolve_prepare,
        .call = resolve_call,
        .what = "resolve",
        .print = resolve_print,
        .done = resolve_done,
};

int verb_resolve(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &resolve_verb, argc, argv);
}
