/* verbs-validate.c: familyctl validate: a trainer's model file checked against its job. */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "macro.h"

/* The model file is read into a heap-allocated ValidateRequest, every string and array
 * malloc()ed, so that protobuf-c's free_unpacked releases all of it. */
static void validate_request_freep(Familyd__V1__ValidateRequest **p) {
        if (*p)
                familyd__v1__validate_request__free_unpacked(*p, NULL);
}

/* Why the model file was refused: "FILE: WHERE: WHAT", printed as a usage error. -ENOMEM is
 * returned as such (nothing to say). */
typedef struct Loader {
        const char *path;
        char *error;
} Loader;

static int loader_fail(Loader *l, const char *where, const char *fmt, ...) _printf_(3, 4);
static int loader_fail(Loader *l, const char *where, const char *fmt, ...) {
        _cleanup_free_ char *what = NULL;
        va_list ap;
        int r;

        if (l->error)
                return -EINVAL;
        va_start(ap, fmt);
        r = vasprintf(&what, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        if (asprintf(&l->error, "%s: %s%s%s", l->path, strempty(where), isempty(where) ? "" : ": ", what) < 0) {
                l->error = NULL;
                return -ENOMEM;
        }
        return -EINVAL;
}

/* A key of a proto3 JSON object: its lowerCamelCase JSON name or its proto field name. */
typedef struct Key {
        const char *json_name;
        const char *proto_name;
} Key;

static bool key_matches(const Key *k, const char *name) {
        return streq(name, k->json_name) || (k->proto_name && streq(name, k->proto_name));
}

/* Refuses keys outside keys[0..n), and a key given twice (as both of its names). */
static int check_keys(Loader *l, const char *where, const JsonValue *obj, const Key *keys, size_t n) {
        for (size_t i = 0; i < obj->n; i++) {
                const Key *found = NULL;

                for (size_t k = 0; k < n && !found; k++)
                        if (key_matches(&keys[k], obj->keys[i]))
                                found = &keys[k];
                if (!found) {
                        _cleanup_free_ char *known = NULL;
                        size_t size = 0;
                        FILE *f = open_memstream(&known, &size);

                        if (!f)
                                return -ENOMEM;
                        for (size_t k = 0; k < n; k++)
                                fprintf(f, "%s%s", k > 0 ? ", " : "", keys[k].json_name);
                        if (fclose(f) != 0)
                                return -ENOMEM;
                        return loader_fail(l, where, "unknown key '%s' (%s)", obj->keys[i], known);
                }
                for (size_t j = 0; j < i; j++)
                        if (key_matches(found, obj->keys[j]))
                                return loader_fail(l, where, "'%s' given twice", found->json_name);
        }
        return 0;
}

static const JsonValue *get(const JsonValue *obj, const Key *k) {
        const JsonValue *v = json_object_get(obj, k->json_name);

        if (!v && k->proto_name)
                v = json_object_get(obj, k->proto_name);
        /* null means "not set" in proto3 JSON. */
        return v && v->type != JSON_NULL ? v : NULL;
}

/* An int64 as proto3 JSON writes it: a number, or a string of decimal digits. */
static int get_int64(Loader *l, const char *where, const JsonValue *v, const char *what, int64_t *ret) {
        if (v->type == JSON_NUMBER && v->is_int) {
                *ret = v->integer;
                return 0;
        }
        if (v->type == JSON_STRING && ctl_parse_int64(v->string, ret) >= 0)
                return 0;
        return loader_fail(l, where, "%s must be an integer", what);
}

static int get_bool(Loader *l, const char *where, const JsonValue *v, const char *what, protobuf_c_boolean *ret) {
        if (v->type != JSON_BOOL)
                return loader_fail(l, where, "%s must be true or false", what);
        *ret = v->boolean;
        return 0;
}

static int get_string(Loader *l, const char *where, const JsonValue *v, const char *what, char **ret) {
        if (v->type != JSON_STRING)
                return loader_fail(l, where, "%s must be a string", what);
        /* protobuf-c's init leaves string fields at its shared empty string, not NULL. */
        if (*ret != protobuf_c_empty_string)
                free(*ret);
        *ret = strdup(v->string);
        return *ret ? 0 : -ENOMEM;
}

static int get_list(Loader *l, const char *where, const JsonValue *v, const char *what) {
        if (v->type != JSON_ARRAY)
                return loader_fail(l, where, "%s must be a list", what);
        return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* JobContext */

static const Key context_keys[] = {
        { "tpSize", "tp_size" }, { "cpSize", "cp_size" }, { "epSize", "ep_size" }, { "ppSize", "pp_size" },
        { "tp", NULL }, { "cp", NULL }, { "ep", NULL }, { "pp", NULL },
        { "meshId", "mesh_id" },
        { "sequenceParallel", "sequence_parallel" },
        { "lossParallel", "loss_parallel" },
};

static int load_context(Loader *l, const JsonValue *j, Familyd__V1__JobContext *jc) {
        const JsonValue *v;
        int r;

        if (j->type != JSON_OBJECT)
                return loader_fail(l, "context", "must be an object (a familyd.v1.JobContext)");
        r = check_keys(l, "context", j, context_keys, ELEMENTSOF(context_keys));
        if (r < 0)
                return r;

        if ((v = get(j, &context_keys[0]))) {
                r = get_int64(l, "context", v, "tpSize", &jc->tp_size);
                if (r < 0)
                        return r;
                jc->_tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
        }
        if ((v = get(j, &context_keys[1]))) {
                r = get_int64(l, "context", v, "cpSize", &jc->cp_size);
                if (r < 0)
                        return r;
                jc->_cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
        }
        if ((v = get(j, &context_keys[2]))) {
                r = get_int64(l, "context", v, "epSize", &jc->ep_size);
                if (r < 0)
                        return r;
                jc->_ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
        }
        if ((v = get(j, &context_keys[3]))) {
                r = get_int64(l, "context", v, "ppSize", &jc->pp_size);
                if (r < 0)
                        return r;
                jc->_pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
        }
        if ((v = get(j, &context_keys[4])) && (r = get_bool(l, "context", v, "tp", &jc->tp)) < 0)
                return r;
        if ((v = get(j, &context_keys[5])) && (r = get_bool(l, "context", v, "cp", &jc->cp)) < 0)
                return r;
        if ((v = get(j, &context_keys[6])) && (r = get_bool(l, "context", v, "ep", &jc->ep)) < 0)
                return r;
        if ((v = get(j, &context_keys[7])) && (r = get_bool(l, "context", v, "pp", &jc->pp)) < 0)
                return r;
        if ((v = get(j, &context_keys[8])) && (r = get_string(l, "context", v, "meshId", &jc->mesh_id)) < 0)
                return r;
        if ((v = get(j, &context_keys[9])) &&
            (r = get_bool(l, "context", v, "sequenceParallel", &jc->sequence_parallel)) < 0)
                return r;
        if ((v = get(j, &context_keys[10])) &&
            (r = get_bool(l, "context", v, "lossParallel", &jc->loss_parallel)) < 0)
                return r;
        return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Layout */

static const Key placement_keys[] = {
        { "axis", NULL }, { "kind", NULL }, { "dim", NULL },
};

static int load_placement(Loader *l, const char *where, const JsonValue *j, Familyd__V1__Placement **ret) {
        Familyd__V1__Placement *p;
        const JsonValue *v;
        int r;

        if (j->type != JSON_OBJECT)
                return loader_fail(l, where, "must be an object {\"axis\", \"kind\", \"dim\"}");
        r = check_keys(l, where, j, placement_keys, ELEMENTSOF(placement_keys));
        if (r < 0)
                return r;
        p = malloc(sizeof(*p));
        if (!p)
                return -ENOMEM;
        familyd__v1__placement__init(p);
        *ret = p;       /* owned by the caller's message from here on */
        if ((v = get(j, &placement_keys[0])) && (r = get_string(l, where, v, "axis", &p->axis)) < 0)
                return r;
        if ((v = get(j, &placement_keys[1])) && (r = get_string(l, where, v, "kind", &p->kind)) < 0)
                return r;
        if ((v = get(j, &placement_keys[2])) && (r = get_int64(l, where, v, "dim", &p->dim)) < 0)
                return r;
        return 0;
}

static const Key parameter_keys[] = {
        { "name", NULL }, { "shape", NULL }, { "dtype", NULL }, { "placements", NULL },
        { "meshView", "mesh_view" },
};

static int load_parameter(Loader *l, const char *where, const JsonValue *j, Familyd__V1__ParameterLayout **ret) {
        Familyd__V1__ParameterLayout *p;
        const JsonValue *v;
        int r;

        if (j->type != JSON_OBJECT)
                return loader_fail(l, where, "must be an object {\"name\", \"shape\", \"placements\", ...}");
        r = check_keys(l, where, j, parameter_keys, ELEMENTSOF(parameter_keys));
        if (r < 0)
                return r;
        p = malloc(sizeof(*p));
        if (!p)
                return -ENOMEM;
        familyd__v1__parameter_layout__init(p);
        *ret = p;
        if ((v = get(j, &parameter_keys[0])) && (r = get_string(l, where, v, "name", &p->name)) < 0)
                return r;
        if ((v = get(j, &parameter_keys[1]))) {
                r = get_list(l, where, v, "shape");
                if (r < 0)
                        return r;
                if (v->n > 0) {
                        p->shape = calloc(v->n, sizeof(*p->shape));
                        if (!p->shape)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < v->n; i++) {
                        r = get_int64(l, where, v->items[i], "shape", &p->shape[i]);
                        if (r < 0)
                                return r;
                        p->n_shape++;
                }
        }
        if ((v = get(j, &parameter_keys[2])) && (r = get_string(l, where, v, "dtype", &p->dtype)) < 0)
                return r;
        if ((v = get(j, &parameter_keys[3]))) {
                r = get_list(l, where, v, "placements");
                if (r < 0)
                        return r;
                if (v->n > 0) {
                        p->placements = calloc(v->n, sizeof(*p->placements));
                        if (!p->placements)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < v->n; i++) {
                        _cleanup_free_ char *w = NULL;

                        if (asprintf(&w, "%s.placements[%zu]", where, i) < 0)
                                return -ENOMEM;
                        r = load_placement(l, w, v->items[i], &p->placements[i]);
                        if (p->placements[i])
                                p->n_placements++;
                        if (r < 0)
                                return r;
                }
        }
        if ((v = get(j, &parameter_keys[4])) && (r = get_string(l, where, v, "meshView", &p->mesh_view)) < 0)
                return r;
        return 0;
}

static const Key layout_keys[] = {
        { "meshId", "mesh_id" }, { "parameters", NULL }, { "applied", NULL },
};

static int load_layout(Loader *l, const char *where, const JsonValue *j, Familyd__V1__Layout **ret) {
        Familyd__V1__Layout *layout;
        const JsonValue *v;
        int r;

        if (j->type != JSON_OBJECT)
                return loader_fail(l, where, "must be an object {\"meshId\", \"parameters\"}");
        r = check_keys(l, where, j, layout_keys, ELEMENTSOF(layout_keys));
        if (r < 0)
                return r;
        layout = malloc(sizeof(*layout));
        if (!layout)
                return -ENOMEM;
        familyd__v1__layout__init(layout);
        *ret = layout;
        if ((v = get(j, &layout_keys[0])) && (r = get_string(l, where, v, "meshId", &layout->mesh_id)) < 0)
                return r;
        if ((v = get(j, &layout_keys[1]))) {
                r = get_list(l, where, v, "parameters");
                if (r < 0)
                        return r;
                if (v->n > 0) {
                        layout->parameters = calloc(v->n, sizeof(*layout->parameters));
                        if (!layout->parameters)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < v->n; i++) {
                        _cleanup_free_ char *w = NULL;

                        if (asprintf(&w, "%s.parameters[%zu]", where, i) < 0)
                                return -ENOMEM;
                        r = load_parameter(l, w, v->items[i], &layout->parameters[i]);
                        if (layout->parameters[i])
                                layout->n_parameters++;
                        if (r < 0)
                                return r;
                }
        }
        /* applied is ignored on input (semantics.md); checked for its type only. */
        if ((v = get(j, &layout_keys[2])) && (r = get_bool(l, where, v, "applied", &layout->applied)) < 0)
                return r;
        return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The model file */

static const Key boundary_keys[] = {
        { "fqns", NULL }, { "buildId", "build_id" }, { "appliedLayout", "applied_layout" },
};

static int load_boundary(Loader *l, size_t index, const JsonValue *j, Familyd__V1__ModelBoundary **ret) {
        _cleanup_free_ char *where = NULL;
        Familyd__V1__ModelBoundary *b;
        const JsonValue *v;
        int r;

        if (asprintf(&where, "boundaries[%zu]", index) < 0)
                return -ENOMEM;
        if (j->type != JSON_OBJECT)
                return loader_fail(l, where, "must be an object {\"fqns\", \"buildId\", \"appliedLayout\"}");
        r = check_keys(l, where, j, boundary_keys, ELEMENTSOF(boundary_keys));
        if (r < 0)
                return r;
        b = malloc(sizeof(*b));
        if (!b)
                return -ENOMEM;
        familyd__v1__model_boundary__init(b);
        *ret = b;
        if ((v = get(j, &boundary_keys[0]))) {
                r = get_list(l, where, v, "fqns");
                if (r < 0)
                        return r;
                if (v->n > 0) {
                        b->fqns = calloc(v->n, sizeof(*b->fqns));
                        if (!b->fqns)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < v->n; i++) {
                        r = get_string(l, where, v->items[i], "fqns", &b->fqns[i]);
                        if (b->fqns[i])
                                b->n_fqns++;
                        if (r < 0)
                                return r;
                }
        }
        if ((v = get(j, &boundary_keys[1])) && (r = get_string(l, where, v, "buildId", &b->build_id)) < 0)
                return r;
        if ((v = get(j, &boundary_keys[2]))) {
                _cleanup_free_ char *w = NULL;

                if (asprintf(&w, "%s.appliedLayout", where) < 0)
                        return -ENOMEM;
                r = load_layout(l, w, v, &b->applied_layout);
                if (r < 0)
                        return r;
        }
        return 0;
}

static const Key model_keys[] = {
        { "boundaries", NULL }, { "context", NULL },
};

static int load_model(Loader *l, const JsonValue *doc, Familyd__V1__ValidateRequest *req) {
        const JsonValue *v;
        int r;

        if (doc->type != JSON_OBJECT)
                return loader_fail(l, NULL, "expected an object {\"boundaries\": [...], \"context\": {...}}");
        r = check_keys(l, NULL, doc, model_keys, ELEMENTSOF(model_keys));
        if (r < 0)
                return r;
        v = get(doc, &model_keys[0]);
        if (!v)
                return loader_fail(l, NULL, "no \"boundaries\" list");
        r = get_list(l, NULL, v, "boundaries");
        if (r < 0)
                return r;
        if (v->n > 0) {
                req->boundaries = calloc(v->n, sizeof(*req->boundaries));
                if (!req->boundaries)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < v->n; i++) {
                r = load_boundary(l, i, v->items[i], &req->boundaries[i]);
                if (req->boundaries[i])
                        req->n_boundaries++;
                if (r < 0)
                        return r;
        }
        if ((v = get(doc, &model_keys[1]))) {
                r = load_context(l, v, req->context);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Output */

static char *fqns_to_string(char *const *fqns, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (n == 0)
                return strdup("-");
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%s", i > 0 ? "," : "", strempty(fqns[i]));
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static void json_string(FILE *f, const char *s) {
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) strempty(s); *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

/* The ValidateResponse as proto3 JSON, with "ok" and "violations" always present (proto3 JSON
 * may omit defaults; scripts should not have to know that a missing "ok" means false). */
static void print_json(const Familyd__V1__ValidateResponse *resp) {
        printf("{\n  \"ok\": %s,\n  \"violations\": [", resp->ok ? "true" : "false");
        for (size_t i = 0; i < resp->n_violations; i++) {
                const Familyd__V1__Violation *v = resp->violations[i];

                printf("%s\n    {\"fqns\": [", i > 0 ? "," : "");
                for (size_t k = 0; k < v->n_fqns; k++) {
                        if (k > 0)
                                fputs(", ", stdout);
                        json_string(stdout, v->fqns[k]);
                }
                fputs("], \"reason\": ", stdout);
                json_string(stdout, v->reason);
                fputs(", \"message\": ", stdout);
                json_string(stdout, v->message);
                fputc('}', stdout);
        }
        printf("%s]\n}\n", resp->n_violations > 0 ? "\n  " : "");
}

static int print_table(const Familyd__V1__ValidateResponse *resp) {
        _cleanup_(table_freep) Table *t = NULL;

        if (resp->n_violations == 0) {
                puts(resp->ok ? "ok" : "not ok (no violations listed)");
                return EXIT_OK;
        }
        t = table_new(3, "FQNS", "REASON", "MESSAGE");
        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < resp->n_violations; i++) {
                const Familyd__V1__Violation *v = resp->violations[i];
                _cleanup_free_ char *fqns = fqns_to_string(v->fqns, v->n_fqns);

                /* A message is one line in the daemon's texts; keep the table rectangular anyway. */
                for (char *p = v->message; p && *p; p++)
                        if (*p == '\n' || *p == '\t')
                                *p = ' ';
                if (!fqns ||
                    table_add_cell(t, fqns) < 0 ||
                    table_add_cell(t, isempty(v->reason) ? "-" : v->reason) < 0 ||
                    table_add_cell(t, isempty(v->message) ? "-" : v->message) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        (void) table_print(t, stdout);
        return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* validate */

static const char validate_help[] =
        "Usage: familyctl validate [OPTIONS] MODEL.json\n"
        "\n"
        "Asks the daemon whether a trainer's model is consistent with its job (Validate): the\n"
        "cp/ep sizes each build was made for, the mesh it was laid out on, context/mesh\n"
        "agreement, shapes of parameters shared between boundaries, applied layouts against\n"
        "the builds' layouts, unknown or released builds. Prints `ok`, or every violation as a\n"
        "table FQNS REASON MESSAGE, in the order of the model's boundaries.\n"
        "\n"
        "MODEL.json (see client/README.md):\n"
        "  {\"boundaries\": [{\"fqns\": [\"layers.0.moe\", \"model.layers.0.moe\"],\n"
        "                   \"buildId\": \"bld-...\",\n"
        "                   \"appliedLayout\": {\"meshId\": \"...\", \"parameters\": [{\"name\": \"w\",\n"
        "                     \"shape\": [8, 64, 64], \"placements\": [{\"axis\": \"ep\",\n"
        "                     \"kind\": \"shard\", \"dim\": 0}]}]}}],\n"
        "   \"context\": {\"epSize\": 4}}\n"
        "Keys are proto3 JSON: lowerCamelCase or the proto field names (build_id, ...);\n"
        "appliedLayout and context are optional.\n"
        "\n"
        "Job context (set over the file's context):\n"
        "      --mesh ID       the job's mesh, made by `familyctl mesh create`\n"
        "      --tp N, --cp N, --ep N, --pp N\n"
        "                      axis sizes (tp_size, ...)\n"
        "\n"
        "Exit status: 0 when the model is ok, 1 when the daemon reported any violation (or\n"
        "answered an error status), 2 on a bad command line or model file, 3 and 4 as for\n"
        "every verb (`familyctl --help`). --json prints {\"ok\": BOOL, \"violations\": [{\"fqns\",\n"
        "\"reason\", \"message\"}]} with the same exit status.\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_validate(Context *ctx, int argc, char **argv) {
        enum {
                ARG_TP = 0x100, ARG_CP, ARG_EP, ARG_PP, ARG_MESH,
        };
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "tp",   required_argument, NULL, ARG_TP },
                { "cp",   required_argument, NULL, ARG_CP },
                { "ep",   required_argument, NULL, ARG_EP },
                { "pp",   required_argument, NULL, ARG_PP },
                { "mesh", required_argument, NULL, ARG_MESH },
                {}
        };
        _cleanup_(validate_request_freep) Familyd__V1__ValidateRequest *req = NULL;
        _cleanup_(json_value_freep) JsonValue *doc = NULL;
        _cleanup_free_ char *why = NULL;
        Loader loader = {};
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ValidateResponse *resp = NULL;
        const char *mesh = NULL;
        int64_t sizes[4];
        bool sizes_set[4] = {};
        int c, r;

        while ((c = getopt_long(argc, argv, "s:jt:h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        fputs(validate_help, stdout);
                        return EXIT_OK;
                case '?':
                        return ctl_usage_error("validate", "invalid option");
                case ARG_TP:
                case ARG_CP:
                case ARG_EP:
                case ARG_PP:
                        /* Any integer: the daemon owns "must be a positive integer". */
                        if (ctl_parse_int64(optarg, &sizes[c - ARG_TP]) < 0)
                                return ctl_usage_error("validate", "--%s needs an integer, not '%s'",
                                                       options[4 + c - ARG_TP].name, optarg);
                        sizes_set[c - ARG_TP] = true;
                        break;
                case ARG_MESH:
                        if (isempty(optarg))
                                return ctl_usage_error("validate", "--mesh needs a mesh id");
                        mesh = optarg;
                        break;
                default:
                        r = ctl_common_option(ctx, c, optarg);
                        if (r != EXIT_OK)
                                return r < 0 ? EXIT_INTERNAL : r;
                }
        }
        if (optind >= argc)
                return ctl_usage_error("validate", "missing MODEL.json");
        if (argc - optind > 1)
                return ctl_usage_error("validate", "unexpected argument '%s'", argv[optind + 1]);

        req = malloc(sizeof(*req));
        if (!req)
                return ctl_fail("read the model", -ENOMEM, NULL);
        familyd__v1__validate_request__init(req);
        req->context = malloc(sizeof(*req->context));
        if (!req->context)
                return ctl_fail("read the model", -ENOMEM, NULL);
        familyd__v1__job_context__init(req->context);

        r = json_parse_file(argv[optind], &doc, &why);
        if (r == -ENOMEM)
                return ctl_fail("read the model", r, NULL);
        if (r == -EINVAL)
                return ctl_usage_error("validate", "%s: not JSON: %s", argv[optind], strempty(why));
        if (r < 0)
                return ctl_usage_error("validate", "%s: %s", argv[optind], strerror(-r));

        loader.path = argv[optind];
        r = load_model(&loader, doc, req);
        if (r == -EINVAL) {
                r = ctl_usage_error("validate", "%s", strempty(loader.error));
                free(loader.error);
                return r;
        }
        free(loader.error);
        if (r < 0)
                return ctl_fail("read the model", r, NULL);

        if (mesh) {
                if (req->context->mesh_id != protobuf_c_empty_string)
                        free(req->context->mesh_id);
                req->context->mesh_id = strdup(mesh);
                if (!req->context->mesh_id)
                        return ctl_fail("read the model", -ENOMEM, NULL);
        }
        if (sizes_set[0]) {
                req->context->_tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
                req->context->tp_size = sizes[0];
        }
        if (sizes_set[1]) {
                req->context->_cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                req->context->cp_size = sizes[1];
        }
        if (sizes_set[2]) {
                req->context->_ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                req->context->ep_size = sizes[2];
        }
        if (sizes_set[3]) {
                req->context->_pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
                req->context->pp_size = sizes[3];
        }

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_validate(ctx->client, req, &resp, &error);
        if (r < 0) {
                r = ctl_fail("validate", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        if (ctx->json) {
                print_json(resp);
                r = EXIT_OK;
        } else
                r = print_table(resp);
        if (r == EXIT_OK && (!resp->ok || resp->n_violations > 0))
                r = EXIT_DAEMON;
        familyd__v1__validate_response__free_unpacked(resp, NULL);
        return r;
}
