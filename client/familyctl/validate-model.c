/* validate-model.c: the model file of `familyctl validate`, a ValidateRequest as proto3 JSON,
 * read with jansson and checked key by key. */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

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
        if (r < 0) {
                what = NULL;
                return -ENOMEM;
        }
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

static int unknown_key(Loader *l, const char *where, const char *key, const Key *keys, size_t n) {
        _cleanup_free_ char *known = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&known, &size);

        if (!f)
                return -ENOMEM;
        for (size_t k = 0; k < n; k++)
                fprintf(f, "%s%s", k > 0 ? ", " : "", keys[k].json_name);
        if (fclose(f) != 0)
                return -ENOMEM;
        return loader_fail(l, where, "unknown key '%s' (%s)", key, known);
}

/* Refuses keys outside keys[0..n), and a key given twice (as both of its names), in the order
 * of the file. */
static int check_keys(Loader *l, const char *where, json_t *obj, const Key *keys, size_t n) {
        const char *name;
        json_t *value;

        json_object_foreach(obj, name, value) {
                const Key *found = NULL;
                const char *earlier;
                json_t *v;

                for (size_t k = 0; k < n && !found; k++)
                        if (key_matches(&keys[k], name))
                                found = &keys[k];
                if (!found)
                        return unknown_key(l, where, name, keys, n);
                json_object_foreach(obj, earlier, v) {
                        if (earlier == name)
                                break;
                        if (key_matches(found, earlier))
                                return loader_fail(l, where, "'%s' given twice", found->json_name);
                }
        }
        return 0;
}

static json_t *get(json_t *obj, const Key *k) {
        json_t *v = json_object_get(obj, k->json_name);

        if (!v && k->proto_name)
                v = json_object_get(obj, k->proto_name);
        /* null means "not set" in proto3 JSON. */
        return json_is_null(v) ? NULL : v;
}

/* An int64 as proto3 JSON writes it: a number, or a string of decimal digits. */
static int get_int64(Loader *l, const char *where, json_t *v, const char *what, int64_t *ret) {
        if (json_is_integer(v)) {
                *ret = json_integer_value(v);
                return 0;
        }
        if (json_is_string(v) && ctl_parse_int64(json_string_value(v), ret) >= 0)
                return 0;
        return loader_fail(l, where, "%s must be an integer", what);
}

static int get_bool(Loader *l, const char *where, json_t *v, const char *what, protobuf_c_boolean *ret) {
        if (!json_is_boolean(v))
                return loader_fail(l, where, "%s must be true or false", what);
        *ret = json_is_true(v);
        return 0;
}

static int get_string(Loader *l, const char *where, json_t *v, const char *what, char **ret) {
        if (!json_is_string(v))
                return loader_fail(l, where, "%s must be a string", what);
        /* protobuf-c's init leaves string fields at its shared empty string, not NULL. */
        if (*ret != protobuf_c_empty_string)
                free(*ret);
        *ret = strdup(json_string_value(v));
        return *ret ? 0 : -ENOMEM;
}

static int get_list(Loader *l, const char *where, json_t *v, const char *what) {
        if (!json_is_array(v))
                return loader_fail(l, where, "%s must be a list", what);
        return 0;
}

/* *ret, an array of the list's size (none for an empty list). */
static int list_alloc(json_t *v, size_t size, void **ret) {
        if (json_array_size(v) == 0)
                return 0;
        *ret = calloc(json_array_size(v), size);
        return *ret ? 0 : -ENOMEM;
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

static int load_context(Loader *l, json_t *j, Familyd__V1__JobContext *jc) {
        AxisSizes axes = {};
        protobuf_c_boolean *flags[] = { &jc->tp, &jc->cp, &jc->ep, &jc->pp };
        json_t *v;
        int r;

        if (!json_is_object(j))
                return loader_fail(l, "context", "must be an object (a familyd.v1.JobContext)");
        r = check_keys(l, "context", j, context_keys, ELEMENTSOF(context_keys));
        if (r < 0)
                return r;

        for (size_t i = 0; i < 4; i++)
                if ((v = get(j, &context_keys[i]))) {
                        r = get_int64(l, "context", v, context_keys[i].json_name, &axes.size[i]);
                        if (r < 0)
                                return r;
                        axes.set[i] = true;
                }
        for (size_t i = 0; i < 4; i++)
                if ((v = get(j, &context_keys[4 + i])) &&
                    (r = get_bool(l, "context", v, context_keys[4 + i].json_name, flags[i])) < 0)
                        return r;
        ctl_axis_to_context(&axes, jc);
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

static int load_placement(Loader *l, const char *where, json_t *j, Familyd__V1__Placement **ret) {
        Familyd__V1__Placement *p;
        json_t *v;
        int r;

        if (!json_is_object(j))
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

static int load_shape(Loader *l, const char *where, json_t *v, Familyd__V1__ParameterLayout *p) {
        int r;

        r = get_list(l, where, v, "shape");
        if (r >= 0)
                r = list_alloc(v, sizeof(*p->shape), (void **) &p->shape);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                r = get_int64(l, where, json_array_get(v, i), "shape", &p->shape[i]);
                if (r >= 0)
                        p->n_shape++;
        }
        return r;
}

static int load_placements(Loader *l, const char *where, json_t *v, Familyd__V1__ParameterLayout *p) {
        int r;

        r = get_list(l, where, v, "placements");
        if (r >= 0)
                r = list_alloc(v, sizeof(*p->placements), (void **) &p->placements);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                _cleanup_free_ char *w = NULL;

                if (asprintf(&w, "%s.placements[%zu]", where, i) < 0) {
                        w = NULL;
                        return -ENOMEM;
                }
                r = load_placement(l, w, json_array_get(v, i), &p->placements[i]);
                if (p->placements[i])
                        p->n_placements++;
        }
        return r;
}

static const Key parameter_keys[] = {
        { "name", NULL }, { "shape", NULL }, { "dtype", NULL }, { "placements", NULL },
        { "meshView", "mesh_view" },
};

static int load_parameter(Loader *l, const char *where, json_t *j, Familyd__V1__ParameterLayout **ret) {
        Familyd__V1__ParameterLayout *p;
        json_t *v;
        int r;

        if (!json_is_object(j))
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
        if ((v = get(j, &parameter_keys[1])) && (r = load_shape(l, where, v, p)) < 0)
                return r;
        if ((v = get(j, &parameter_keys[2])) && (r = get_string(l, where, v, "dtype", &p->dtype)) < 0)
                return r;
        if ((v = get(j, &parameter_keys[3])) && (r = load_placements(l, where, v, p)) < 0)
                return r;
        if ((v = get(j, &parameter_keys[4])) && (r = get_string(l, where, v, "meshView", &p->mesh_view)) < 0)
                return r;
        return 0;
}

static const Key layout_keys[] = {
        { "meshId", "mesh_id" }, { "parameters", NULL }, { "applied", NULL },
};

static int load_layout(Loader *l, const char *where, json_t *j, Familyd__V1__Layout **ret) {
        Familyd__V1__Layout *layout;
        json_t *v;
        int r;

        if (!json_is_object(j))
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
                if (r >= 0)
                        r = list_alloc(v, sizeof(*layout->parameters), (void **) &layout->parameters);
                for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                        _cleanup_free_ char *w = NULL;

                        if (asprintf(&w, "%s.parameters[%zu]", where, i) < 0) {
                                w = NULL;
                                return -ENOMEM;
                        }
                        r = load_parameter(l, w, json_array_get(v, i), &layout->parameters[i]);
                        if (layout->parameters[i])
                                layout->n_parameters++;
                }
                if (r < 0)
                        return r;
        }
        /* applied is ignored on input (docs/semantics.md); checked for its type only. */
        if ((v = get(j, &layout_keys[2])) && (r = get_bool(l, where, v, "applied", &layout->applied)) < 0)
                return r;
        return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The model file */

static const Key boundary_keys[] = {
        { "fqns", NULL }, { "buildId", "build_id" }, { "appliedLayout", "applied_layout" },
};

static int load_fqns(Loader *l, const char *where, json_t *v, Familyd__V1__ModelBoundary *b) {
        int r;

        r = get_list(l, where, v, "fqns");
        if (r >= 0)
                r = list_alloc(v, sizeof(*b->fqns), (void **) &b->fqns);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                r = get_string(l, where, json_array_get(v, i), "fqns", &b->fqns[i]);
                if (b->fqns[i])
                        b->n_fqns++;
        }
        return r;
}

static int load_boundary(Loader *l, size_t index, json_t *j, Familyd__V1__ModelBoundary **ret) {
        _cleanup_free_ char *where = NULL, *w = NULL;
        Familyd__V1__ModelBoundary *b;
        json_t *v;
        int r;

        if (asprintf(&where, "boundaries[%zu]", index) < 0) {
                where = NULL;
                return -ENOMEM;
        }
        if (asprintf(&w, "%s.appliedLayout", where) < 0) {
                w = NULL;
                return -ENOMEM;
        }
        if (!json_is_object(j))
                return loader_fail(l, where, "must be an object {\"fqns\", \"buildId\", \"appliedLayout\"}");
        r = check_keys(l, where, j, boundary_keys, ELEMENTSOF(boundary_keys));
        if (r < 0)
                return r;
        b = malloc(sizeof(*b));
        if (!b)
                return -ENOMEM;
        familyd__v1__model_boundary__init(b);
        *ret = b;
        if ((v = get(j, &boundary_keys[0])) && (r = load_fqns(l, where, v, b)) < 0)
                return r;
        if ((v = get(j, &boundary_keys[1])) && (r = get_string(l, where, v, "buildId", &b->build_id)) < 0)
                return r;
        if ((v = get(j, &boundary_keys[2])) && (r = load_layout(l, w, v, &b->applied_layout)) < 0)
                return r;
        return 0;
}

static const Key use_keys[] = {
        { "fqn", NULL }, { "buildId", "build_id" }, { "parameter", NULL },
};

static int load_use(Loader *l, const char *where, json_t *j, Familyd__V1__SharedParameterUse **ret) {
        Familyd__V1__SharedParameterUse *u;
        json_t *v;
        int r;

        if (!json_is_object(j))
                return loader_fail(l, where, "must be an object {\"fqn\", \"buildId\", \"parameter\"}");
        r = check_keys(l, where, j, use_keys, ELEMENTSOF(use_keys));
        if (r < 0)
                return r;
        u = malloc(sizeof(*u));
        if (!u)
                return -ENOMEM;
        familyd__v1__shared_parameter_use__init(u);
        *ret = u;
        if ((v = get(j, &use_keys[0])) && (r = get_string(l, where, v, "fqn", &u->fqn)) < 0)
                return r;
        if ((v = get(j, &use_keys[1])) && (r = get_string(l, where, v, "buildId", &u->build_id)) < 0)
                return r;
        if ((v = get(j, &use_keys[2])) && (r = get_string(l, where, v, "parameter", &u->parameter)) < 0)
                return r;
        return 0;
}

static const Key shared_keys[] = {
        { "uses", NULL },
};

/* One entry of sharedParameters: {"uses": [{"fqn", "buildId", "parameter"}, ...]}; how many
 * uses, and their values, are the daemon's to check. */
static int load_shared(Loader *l, size_t index, json_t *j, Familyd__V1__SharedParameter **ret) {
        _cleanup_free_ char *where = NULL;
        Familyd__V1__SharedParameter *s;
        json_t *v;
        int r;

        if (asprintf(&where, "sharedParameters[%zu]", index) < 0) {
                where = NULL;
                return -ENOMEM;
        }
        if (!json_is_object(j))
                return loader_fail(l, where, "must be an object {\"uses\": [...]}");
        r = check_keys(l, where, j, shared_keys, ELEMENTSOF(shared_keys));
        if (r < 0)
                return r;
        s = malloc(sizeof(*s));
        if (!s)
                return -ENOMEM;
        familyd__v1__shared_parameter__init(s);
        *ret = s;
        v = get(j, &shared_keys[0]);
        if (!v)
                return 0;
        r = get_list(l, where, v, "uses");
        if (r >= 0)
                r = list_alloc(v, sizeof(*s->uses), (void **) &s->uses);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                _cleanup_free_ char *w = NULL;
                if (asprintf(&w, "%s.uses[%zu]", where, i) < 0) {
                        w = NULL;
                        return -ENOMEM;
                }
                r = load_use(l, w, json_array_get(v, i), &s->uses[i]);
                if (s->uses[i])
                        s->n_uses++;
        }
        return r;
}

static const Key model_keys[] = {
        { "boundaries", NULL }, { "context", NULL }, { "sharedParameters", "shared_parameters" },
};

static int load_shared_parameters(Loader *l, json_t *v, Familyd__V1__ValidateRequest *req) {
        int r;

        r = get_list(l, NULL, v, "sharedParameters");
        if (r >= 0)
                r = list_alloc(v, sizeof(*req->shared_parameters), (void **) &req->shared_parameters);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                r = load_shared(l, i, json_array_get(v, i), &req->shared_parameters[i]);
                if (req->shared_parameters[i])
                        req->n_shared_parameters++;
        }
        return r;
}

static int load_model(Loader *l, json_t *doc, Familyd__V1__ValidateRequest *req) {
        json_t *v;
        int r;

        if (!json_is_object(doc))
                return loader_fail(l, NULL, "expected an object {\"boundaries\": [...], \"context\": {...}}");
        r = check_keys(l, NULL, doc, model_keys, ELEMENTSOF(model_keys));
        if (r < 0)
                return r;
        v = get(doc, &model_keys[0]);
        if (!v)
                return loader_fail(l, NULL, "no \"boundaries\" list");
        r = get_list(l, NULL, v, "boundaries");
        if (r >= 0)
                r = list_alloc(v, sizeof(*req->boundaries), (void **) &req->boundaries);
        for (size_t i = 0; r >= 0 && i < json_array_size(v); i++) {
                r = load_boundary(l, i, json_array_get(v, i), &req->boundaries[i]);
                if (req->boundaries[i])
                        req->n_boundaries++;
        }
        if (r < 0)
                return r;
        if ((v = get(doc, &model_keys[2])) && (r = load_shared_parameters(l, v, req)) < 0)
                return r;
        if ((v = get(doc, &model_keys[1])))
                return load_context(l, v, req->context);
        return 0;
}

int validate_model_load(const char *path, Familyd__V1__ValidateRequest *req) {
        _cleanup_(json_decrefp) json_t *doc = NULL;
        Loader loader = { .path = path };
        int r;

        r = ctl_json_load("validate", "", path, &doc);
        if (r != EXIT_OK)
                return r;
        r = load_model(&loader, doc, req);
        if (r == -EINVAL)
                r = ctl_usage_error("validate", "%s", strempty(loader.error));
        else if (r < 0)
                r = ctl_fail("read the model", r, NULL);
        free(loader.error);
        return r;
}
