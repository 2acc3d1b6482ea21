/* build-plan.c: Build steps 1-4 of docs/semantics.md, composed from Resolve's stages. */
#include <inttypes.h>
#include <stdio.h>

#include "build-plan.h"
#include "placement-case.h"
#include "repr.h"

void source_module_done(SourceModule *m) {
        if (!m)
                return;
        free(m->fqn);
        for (size_t i = 0; i < m->n_parameters; i++) {
                free(m->parameters[i].name);
                free(m->parameters[i].shape);
                free(m->parameters[i].dtype);
        }
        free(m->parameters);
        *m = (SourceModule) {};
}

void materialize_options_done(MaterializeOptions *o) {
        if (!o)
                return;
        free(o->dtype);
        free(o->ranks);
        *o = (MaterializeOptions) {};
}

int materialize_options_copy(const MaterializeOptions *src, MaterializeOptions *ret) {
        _cleanup_(materialize_options_done) MaterializeOptions o = *src;

        o.dtype = NULL;
        o.ranks = NULL;
        if (src->dtype) {
                o.dtype = strdup(src->dtype);
                if (!o.dtype)
                        return -ENOMEM;
        }
        if (src->n_ranks > 0) {
                o.ranks = calloc(src->n_ranks, sizeof(int64_t));
                if (!o.ranks)
                        return -ENOMEM;
                memcpy(o.ranks, src->ranks, src->n_ranks * sizeof(int64_t));
        }

        *ret = o;
        o = (MaterializeOptions) {};
        return 0;
}

void parameter_dtypes_free(ParameterDtype *d, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(d[i].name);
                free(d[i].dtype);
        }
        free(d);
}

int parameter_dtypes_copy(const ParameterDtype *src, size_t n, ParameterDtype **ret) {
        ParameterDtype *d;

        d = calloc(n ? n : 1, sizeof(ParameterDtype));
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                d[i].name = strdup(strempty(src[i].name));
                d[i].dtype = strdup(strempty(src[i].dtype));
                if (!d[i].name || !d[i].dtype) {
                        parameter_dtypes_free(d, i + 1);
                        return -ENOMEM;
                }
        }
        *ret = d;
        return 0;
}

void build_request_done(BuildRequest *r) {
        if (!r)
                return;
        free(r->family);
        value_map_done(&r->arguments);
        value_map_done(&r->config);
        source_module_done(&r->module);
        free(r->module_fqn);
        job_context_done(&r->context);
        free(r->mesh_id);
        materialize_options_done(&r->materialize);
        parameter_dtypes_free(r->parameter_dtypes, r->n_parameter_dtypes);
        value_map_done(&r->source_config);
        free(r->checkpoint_token);
        free(r->checkpoint_prefix);
        *r = (BuildRequest) {};
}

static const char *const build_origin_table[_BUILD_ORIGIN_MAX] = {
        [BUILD_ORIGIN_DIRECT] = "direct",
        [BUILD_ORIGIN_REPLACEMENT] = "replacement",
};

const char *build_origin_to_string(BuildOrigin o) {
        if (o < 0 || o >= _BUILD_ORIGIN_MAX)
                return NULL;
        return build_origin_table[o];
}

static void plan_parameter_done(PlanParameter *p) {
        if (!p)
                return;
        free(p->name);
        free(p->shape);
        for (size_t i = 0; i < p->n_placements; i++)
                free(p->placements[i].axis);
        free(p->placements);
        free(p->init_text);
        free(p->dtype);
        checkpoint_source_done(&p->checkpoint);
        *p = (PlanParameter) {};
}

void build_plan_done(BuildPlan *p) {
        if (!p)
                return;
        resolve_request_done(&p->request);
        resolved_family_done(&p->resolved);
        free(p->module_fqn);
        mesh_unref(p->mesh);
        for (size_t i = 0; i < p->n_parameters; i++)
                plan_parameter_done(&p->parameters[i]);
        free(p->parameters);
        value_map_done(&p->config);
        value_map_done(&p->bound_fields);
        value_map_done(&p->init_fields);
        materialize_options_done(&p->materialize);
        parameter_dtypes_free(p->parameter_dtypes, p->n_parameter_dtypes);
        activation_layout_done(&p->activations);
        *p = (BuildPlan) {};
}

/* Error helpers: every text is docs/semantics.md's; each quotes its names as Python's repr does. */

/* family_error_set with one or two names quoted as Python's repr does; format checked at each use. */
#define fail_q(e, reason, field, format, name)                                                           \
        ({                                                                                               \
                _cleanup_free_ char *_q_ = repr_string(name);                                            \
                _q_ ? family_error_set((e), FAMILY_STATUS_INVALID_ARGUMENT, (reason), (field), format, _q_) \
                    : -ENOMEM;                                                                           \
        })

#define fail_qq(e, reason, field, format, a, b)                                                          \
        ({                                                                                               \
                _cleanup_free_ char *_qa_ = repr_string(a), *_qb_ = repr_string(b);                      \
                _qa_ && _qb_ ? family_error_set((e), FAMILY_STATUS_INVALID_ARGUMENT, (reason), (field),  \
                                                format, _qa_, _qb_)                                      \
                             : -ENOMEM;                                                                  \
        })

/* Step 1, after Resolve 1-2: `config` passed Resolve 2 as an allowed name; it belongs in its own field. */
static int check_config_argument(const BuildRequest *req, FamilyError *e) {
        if (!value_map_get(&req->arguments, "config"))
                return 0;
        if (req->has_config)
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "CONFIG", "config",
                                        "config was supplied twice");
        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "CONFIG", "config",
                                "config must be given in BuildRequest.config");
}

/* Step 2. *ret_fqn is borrowed from req. */
static int check_origin(const BuildRequest *req, const char **ret_fqn, FamilyError *e) {
        if (req->has_config == req->has_module)
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "BINDING", NULL,
                                        "provide exactly one of config or module");
        /* A direct build's config is the one config: a second would only contradict it. */
        if (req->has_config && req->has_source_config)
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "BINDING", "source_config",
                                        "source_config is only for a replacement (module); a direct "
                                        "build's config is BuildRequest.config");

        const char *fqn = strempty(req->module_fqn);
        if (req->has_module && !isempty(req->module.fqn)) {
                if (!isempty(fqn) && !streq(fqn, req->module.fqn))
                        return fail_qq(e, "BINDING", "module_fqn", "module_fqn %s disagrees with module.fqn %s",
                                       fqn, req->module.fqn);
                fqn = req->module.fqn;
        }

        *ret_fqn = fqn;
        return 0;
}

/* Step 3, first half: the context Resolve 3-5 sees, naming the mesh of mesh_id. */
static int effective_context(const BuildRequest *req, JobContext *ret, FamilyError *e) {
        _cleanup_(job_context_done) JobContext c = {};
        int r;

        if (!isempty(req->mesh_id) && !isempty(req->context.mesh_id) && !streq(req->mesh_id, req->context.mesh_id))
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "MESH_MISMATCH", "mesh_id",
                                        "context and mesh belong to different jobs");

        r = job_context_copy(&req->context, &c);
        if (r < 0)
                return r;
        if (!isempty(req->mesh_id)) {
                free(c.mesh_id);
                c.mesh_id = strdup(req->mesh_id);
                if (!c.mesh_id)
                        return -ENOMEM;
        }

        *ret = c;
        c = (JobContext) {};
        return 0;
}

static bool variant_accepts(const Variant *v, const char *name) {
        for (size_t i = 0; i < v->n_accepts; i++)
                if (streq(v->accepts[i], name))
                        return true;
        return false;
}

static int string_ptr_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Step 3, second half: binding, as hyper_parallel's _constructor_arguments does. */
static int check_binding(const Variant *v, const ResolvedFamily *res, BuildOrigin origin, FamilyError *e) {
        const char *required = origin == BUILD_ORIGIN_DIRECT ? "config" : "module";

        if (!variant_accepts(v, required)) {
                _cleanup_free_ char *q = repr_string(v->name);
                if (!q)
                        return -ENOMEM;
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "BINDING", required,
                                        "member %s must explicitly accept %s", q, required);
        }

        size_t n = 0;
        for (size_t i = 0; i < res->arguments.n; i++)
                if (!variant_accepts(v, res->arguments.items[i].name))
                        n++;
        if (n == 0)
                return 0;

        _cleanup_free_ char **unknown = calloc(n, sizeof(char *));
        if (!unknown)
                return -ENOMEM;
        n = 0;
        for (size_t i = 0; i < res->arguments.n; i++)
                if (!variant_accepts(v, res->arguments.items[i].name))
                        unknown[n++] = res->arguments.items[i].name;
        qsort(unknown, n, sizeof(char *), string_ptr_cmp);

        _cleanup_free_ char *q = repr_string(v->name), *list = repr_string_list(unknown, n);
        if (!q || !list)
                return -ENOMEM;
        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "BINDING", "arguments",
                                "member %s does not accept %s", q, list);
}

/* Step 4. */

/* An ExprLookup over a ValueMap: an int field or nothing (a field that is not an int: -EDOM). */
static int lookup_int(const char *name, int64_t *ret_value, void *userdata) {
        const Value *v = value_map_get(userdata, name);

        if (!v)
                return -ENOENT;
        if (v->kind != VALUE_INT)
                return -EDOM;
        *ret_value = v->i;
        return 0;
}

static int fail_dim_positive(FamilyError *e, const char *param, size_t dim, int64_t value) {
        _cleanup_free_ char *q = repr_string(param);
        if (!q)
                return -ENOMEM;
        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", param,
                                "parameter %s: dimension %zu must be positive, got %" PRId64, q, dim, value);
}

/* Each dimension >= 1 (0-based index in the text, as shard(d) counts), then the element bound. */
static int check_shape(const char *param, const int64_t *shape, size_t n_dims, int64_t *ret_elements,
                       FamilyError *e) {
        int64_t n = 1;

        for (size_t d = 0; d < n_dims; d++)
                if (shape[d] < 1)
                        return fail_dim_positive(e, param, d, shape[d]);

        for (size_t d = 0; d < n_dims; d++)
                if (__builtin_mul_overflow(n, shape[d], &n) || n > BUILD_PLAN_MAX_ELEMENTS) {
                        _cleanup_free_ char *q = repr_string(param), *s = repr_int_list(shape, n_dims);
                        if (!q || !s)
                                return -ENOMEM;
                        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", param,
                                                "parameter %s: shape %s is too large", q, s);
                }

        *ret_elements = n;
        return 0;
}

/* A direct build's dimension: the expression on the config. */
static int eval_direct_dim(const ParameterSpec *p, size_t d, const ValueMap *config, int64_t *ret,
                           FamilyError *e) {
        ExprEvalError err = {};
        int r;

        r = expr_eval(p->shape[d], lookup_int, (void *) config, ret, &err);
        if (r != -EINVAL)
                return r;

        switch (err.failure) {
        case EXPR_FAILURE_MISSING_FIELD:
                return fail_qq(e, "CONFIG", err.field, "parameter %s needs config field %s", p->name,
                               strempty(err.field));
        case EXPR_FAILURE_NOT_INT:
                return fail_q(e, "CONFIG", err.field, "config field %s must be int", strempty(err.field));
        case EXPR_FAILURE_NOT_DIVISIBLE:
        case EXPR_FAILURE_DIVISION_BY_ZERO: {
                _cleanup_free_ char *q = repr_string(p->name);
                if (!q)
                        return -ENOMEM;
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", p->name,
                                        "parameter %s: %" PRId64 " / %" PRId64 " does not divide exactly",
                                        q, err.lhs, err.rhs);
        }
        case EXPR_FAILURE_OVERFLOW: {
                _cleanup_free_ char *q = repr_string(p->name);
                if (!q)
                        return -ENOMEM;
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", p->name,
                                        "parameter %s: dimension %zu overflows int64", q, d);
        }
        default:
                return -EIO;
        }
}

static const char *const init_number_names[_INIT_KIND_MAX][4] = {
        [INIT_CONSTANT] = { "value" },
        [INIT_NORMAL] = { "mean", "std" },
        [INIT_UNIFORM] = { "low", "high" },
        [INIT_TRUNC_NORMAL] = { "mean", "std", "a", "b" },
};

static const char *init_number_name(InitKind kind, size_t i) {
        const char *s = kind >= 0 && kind < _INIT_KIND_MAX && i < 4 ? init_number_names[kind][i] : NULL;
        return s ?: "value";
}

/* The shortest of %.15g..%.17g that reads back as v (as the registry shows its numbers). */
static void format_double(double v, char buf[static 32]) {
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, 32, "%.*g", prec, v);
                if (strtod(buf, NULL) == v)
                        return;
        }
}

/* An init expression's failure as the Build's error (docs/semantics.md, Build failures, step 6). */
static int fail_init_expr(FamilyError *e, const char *param, InitKind kind, size_t i, const InitExpr *x,
                          const InitExprError *err) {
        _cleanup_free_ char *q = repr_string(param), *text = init_expr_to_string(x), *qt = NULL;
        const char *what = init_number_name(kind, i);
        char v[32];

        if (!q || !text)
                return -ENOMEM;
        qt = repr_string(text);
        if (!qt)
                return -ENOMEM;
        switch (err->failure) {
        case INIT_EXPR_FAILURE_MISSING_FIELD:
                return fail_qq(e, "CONFIG", err->field, "parameter %s needs config field %s", param, err->field);
        case INIT_EXPR_FAILURE_NOT_NUMBER:
                return fail_q(e, "CONFIG", err->field, "config field %s must be float", err->field);
        case INIT_EXPR_FAILURE_FAN_RANK:
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                        "parameter %s: init %s %s uses %s, which needs at least 2 dimensions; "
                                        "the parameter has %.0f",
                                        q, what, qt, err->field, err->value);
        case INIT_EXPR_FAILURE_SQRT_NEGATIVE:
                format_double(err->value, v);
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                        "parameter %s: init %s %s takes the square root of %s", q, what, qt, v);
        case INIT_EXPR_FAILURE_NOT_FINITE:
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                        "parameter %s: init %s %s is not finite", q, what, qt);
        default:
                return -EIO;
        }
}

static int config_number(const ValueMap *config, const char *name, double *ret) {
        const Value *v = value_map_get(config, name);

        if (!v)
                return -ENOENT;
        if (v->kind == VALUE_INT)
                *ret = (double) v->i;
        else if (v->kind == VALUE_FLOAT)
                *ret = v->f;
        else
                return -EDOM;
        return 0;
}

static int lookup_direct(const char *name, double *ret, void *userdata) {
        return config_number(userdata, name, ret);
}

/* A number of a direct build's init: a literal, a config field holding an int or a float, or an
 * expression of them and the parameter's fans. */
static int init_number_direct(const char *param, const InitNumber *x, InitKind kind, size_t i,
                              const ValueMap *config, const int64_t *shape, size_t n_dims, double *ret,
                              FamilyError *e) {
        if (x->expr) {
                InitExprEnv env = {
                        .lookup = lookup_direct, .userdata = (void *) config, .shape = shape, .n_dims = n_dims,
                };
                InitExprError err;
                int r = init_expr_eval(x->expr, &env, ret, &err);
                if (r == -EINVAL)
                        return fail_init_expr(e, param, kind, i, x->expr, &err);
                return r;
        }
        if (!x->field) {
                *ret = x->value;
                return 0;
        }

        const Value *v = value_map_get(config, x->field);
        if (!v)
                return fail_qq(e, "CONFIG", x->field, "parameter %s needs config field %s", param, x->field);
        if (v->kind == VALUE_INT)
                *ret = (double) v->i;
        else if (v->kind == VALUE_FLOAT)
                *ret = v->f;
        else
                /* "float" as Resolve 2 names a number type: an int is accepted where float is declared. */
                return fail_q(e, "CONFIG", x->field, "config field %s must be float", x->field);
        return 0;
}

static int record_init_field(const char *name, const ValueMap *source_config, ValueMap *init_fields) {
        const Value *v = value_map_get(source_config, name);
        Value copy;
        int r;

        if (!v || value_map_get(init_fields, name))
                return 0;
        r = value_copy(v, &copy);
        if (r < 0)
                return r;
        r = value_map_put(init_fields, name, &copy);
        if (r < 0)
                value_done(&copy);
        return r;
}

typedef struct BoundLookup {
        const ValueMap *bound;
        const ValueMap *source_config;
        ValueMap *init_fields;
} BoundLookup;

/* A field the source's shapes bound (an int), else source_config's (an int or a float). */
static int lookup_bound(const char *name, double *ret, void *userdata) {
        const BoundLookup *b = userdata;
        const Value *v = value_map_get(b->bound, name);

        if (v && v->kind == VALUE_INT) {
                *ret = (double) v->i;
                return 0;
        }
        return config_number(b->source_config, name, ret);
}

static int record_bound_field(const char *name, void *userdata) {
        const BoundLookup *b = userdata;
        const Value *v = value_map_get(b->bound, name);

        if (v && v->kind == VALUE_INT)
                return 0;
        return record_init_field(name, b->source_config, b->init_fields);
}

/*
 * A number of a replacement build's init: a literal, a field the source's shapes bound, else
 * source_config's field (an int or a float; recorded in init_fields), or an expression of them.
 * 1: *ret set; 0: a field is in neither (the init is then zeros); -EINVAL with e filled:
 * source_config's field is no number, or the expression fails.
 */
static int init_number_bound(const char *param, const InitNumber *x, InitKind kind, size_t i,
                             const ValueMap *bound, const ValueMap *source_config, ValueMap *init_fields,
                             const int64_t *shape, size_t n_dims, double *ret, FamilyError *e) {
        const Value *v;
        int r;

        if (x->expr) {
                BoundLookup b = { .bound = bound, .source_config = source_config, .init_fields = init_fields };
                InitExprEnv env = { .lookup = lookup_bound, .userdata = &b, .shape = shape, .n_dims = n_dims };
                InitExprError err;

                r = init_expr_eval(x->expr, &env, ret, &err);
                if (r == -EINVAL && err.failure == INIT_EXPR_FAILURE_MISSING_FIELD)
                        return 0;
                if (r == -EINVAL)
                        return fail_init_expr(e, param, kind, i, x->expr, &err);
                if (r < 0)
                        return r;
                r = init_expr_foreach_field(x->expr, record_bound_field, &b);
                return r < 0 ? r : 1;
        }
        if (!x->field) {
                *ret = x->value;
                return 1;
        }

        v = value_map_get(bound, x->field);
        if (v && v->kind == VALUE_INT) {
                *ret = (double) v->i;
                return 1;
        }

        v = value_map_get(source_config, x->field);
        if (!v)
                return 0;
        if (v->kind != VALUE_INT && v->kind != VALUE_FLOAT)
                return fail_q(e, "CONFIG", x->field, "config field %s must be float", x->field);
        *ret = v->kind == VALUE_INT ? (double) v->i : v->f;
        r = record_init_field(x->field, source_config, init_fields);
        return r < 0 ? r : 1;
}

/* The resolved numbers' own rules: a std not negative (trunc_normal: positive), a < b. */
static int check_resolved_init(const char *param, const ResolvedInit *init, FamilyError *e) {
        _cleanup_free_ char *q = repr_string(param);
        char v[32], w[32];

        if (!q)
                return -ENOMEM;
        switch (init->kind) {
        case INIT_NORMAL:
                if (init->b < 0) {
                        format_double(init->b, v);
                        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                                "parameter %s: init std must not be negative, got %s", q, v);
                }
                return 0;
        case INIT_TRUNC_NORMAL:
                if (!(init->b > 0)) {
                        format_double(init->b, v);
                        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                                "parameter %s: init std must be positive, got %s", q, v);
                }
                if (!(init->c < init->d)) {
                        format_double(init->c, v);
                        format_double(init->d, w);
                        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "INIT", param,
                                                "parameter %s: init bound a must be less than b, got a=%s, b=%s",
                                                q, v, w);
                }
                return 0;
        default:
                return 0;
        }
}

static int copy_placements(const ParameterSpec *p, PlanParameter *out) {
        if (p->n_placements == 0)
                return 0;

        out->placements = calloc(p->n_placements, sizeof(Placement));
        if (!out->placements)
                return -ENOMEM;
        for (size_t i = 0; i < p->n_placements; i++) {
                out->placements[i] = p->placements[i];
                out->placements[i].axis = strdup(strempty(p->placements[i].axis));
                if (!out->placements[i].axis) {
                        out->n_placements = i;
                        return -ENOMEM;
                }
        }
        out->n_placements = p->n_placements;
        return 0;
}

/* Name, placements, init text; shape and init are the caller's. */
static int plan_parameter_start(const ParameterSpec *p, PlanParameter *out) {
        int r;

        out->name = strdup(strempty(p->name));
        out->init_text = strdup(strempty(p->init_text));
        if (!out->name || !out->init_text)
                return -ENOMEM;
        if (p->dtype) {
                out->dtype = strdup(p->dtype);
                if (!out->dtype)
                        return -ENOMEM;
        }
        if (p->has_checkpoint) {
                r = checkpoint_source_copy(&p->checkpoint, &out->checkpoint);
                if (r < 0)
                        return r;
                out->has_checkpoint = true;
        }
        if (p->n_dims > 0) {
                out->shape = calloc(p->n_dims, sizeof(int64_t));
                if (!out->shape)
                        return -ENOMEM;
        }
        out->n_dims = p->n_dims;

        r = copy_placements(p, out);
        if (r < 0)
                return r;
        return 0;
}

static int plan_direct_parameter(const ParameterSpec *p, const ValueMap *config, PlanParameter *out,
                                 FamilyError *e) {
        int r;

        r = plan_parameter_start(p, out);
        if (r < 0)
                return r;

        /* Each dimension evaluated and checked before the next, so the first failing one answers. */
        for (size_t d = 0; d < p->n_dims; d++) {
                r = eval_direct_dim(p, d, config, &out->shape[d], e);
                if (r < 0)
                        return r;
                if (out->shape[d] < 1)
                        return fail_dim_positive(e, p->name, d, out->shape[d]);
        }
        r = check_shape(p->name, out->shape, out->n_dims, &out->n_elements, e);
        if (r < 0)
                return r;

        out->init.kind = p->init.kind;
        const InitNumber *xs[] = { &p->init.a, &p->init.b, &p->init.c, &p->init.d };
        double *vs[] = { &out->init.a, &out->init.b, &out->init.c, &out->init.d };
        for (size_t i = 0; i < ELEMENTSOF(xs); i++) {
                r = init_number_direct(p->name, xs[i], p->init.kind, i, config, out->shape, out->n_dims, vs[i], e);
                if (r < 0)
                        return r;
        }
        r = check_resolved_init(p->name, &out->init, e);
        if (r < 0)
                return r;
        out->init_resolved = true;
        return 0;
}

static const SourceParameter *source_find(const SourceModule *m, const char *name) {
        /* A name given twice: the last wins, as for a map key sent twice. */
        for (size_t i = m->n_parameters; i > 0; i--)
                if (streq_ptr(m->parameters[i - 1].name, name))
                        return &m->parameters[i - 1];
        return NULL;
}

/* `parameter 'w' of module 'm' has shape [8, 16, 32], which contradicts <what>` */
static int fail_contradiction(FamilyError *e, const char *fqn, const char *param, const int64_t *shape,
                              size_t n_dims, const char *what) {
        _cleanup_free_ char *qp = repr_string(param), *qm = repr_string(fqn), *s = repr_int_list(shape, n_dims);
        if (!qp || !qm || !s)
                return -ENOMEM;
        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", param,
                                "parameter %s of module %s has shape %s, which contradicts %s", qp, qm, s, what);
}

typedef struct FieldList {
        const ValueMap *bound;
        char *text; /* "a=1, b=2" */
        bool unbound;
} FieldList;

static int field_list_add(const char *name, void *userdata) {
        FieldList *l = userdata;
        const Value *v = value_map_get(l->bound, name);
        char *t = NULL;

        if (!v || v->kind != VALUE_INT) {
                l->unbound = true;
                return 0;
        }
        if (asprintf(&t, "%s%s%s=%" PRId64, strempty(l->text), l->text ? ", " : "", name, v->i) < 0)
                return -ENOMEM;
        free(l->text);
        l->text = t;
        return 0;
}

/* Checks one non-lone expression against the source's dimension once every field it names is bound. */
static int check_bound_dim(const Expr *x, int64_t have, const ValueMap *bound, const char *fqn, const char *param,
                           const int64_t *shape, size_t n_dims, FamilyError *e) {
        _cleanup_free_ char *what = NULL;
        FieldList l = { .bound = bound };
        ExprEvalError err = {};
        int64_t want;
        int r;

        r = expr_foreach_field(x, field_list_add, &l);
        what = l.text;
        if (r < 0)
                return r;
        if (l.unbound)
                return 0;

        r = expr_eval(x, lookup_int, (void *) bound, &want, &err);
        if (r < 0 && r != -EINVAL)
                return r;
        /* Bound fields whose expression has no value (overflow, inexact division) contradict too. */
        if (r == 0 && want == have)
                return 0;

        if (!what) {
                what = expr_to_string(x);
                if (!what)
                        return -ENOMEM;
        }
        return fail_contradiction(e, fqn, param, shape, n_dims, what);
}

/*
 * Lone field names bind, in declared order; a later disagreement contradicts the first binding.
 * A field that source_config also gives must hold the same int there: the first binding that
 * disagrees with it contradicts source_config's value.
 */
static int bind_lone_fields(const ParameterSpec *params, size_t n, const char *fqn, const PlanParameter *out,
                            const ValueMap *source_config, ValueMap *bound, FamilyError *e) {
        int r;

        for (size_t i = 0; i < n; i++)
                for (size_t d = 0; d < params[i].n_dims; d++) {
                        const char *name;
                        int64_t want;

                        if (!expr_is_field(params[i].shape[d], &name))
                                continue;

                        const Value *v = value_map_get(bound, name), *given = value_map_get(source_config, name);
                        if (v)
                                want = v->i;
                        else if (given && given->kind != VALUE_INT)
                                return fail_q(e, "CONFIG", name, "config field %s must be int", name);
                        else if (given)
                                want = given->i;
                        else
                                want = out[i].shape[d];

                        if (want != out[i].shape[d]) {
                                _cleanup_free_ char *what = NULL;
                                if (asprintf(&what, "%s=%" PRId64, name, want) < 0)
                                        return -ENOMEM;
                                return fail_contradiction(e, fqn, params[i].name, out[i].shape, out[i].n_dims,
                                                          what);
                        }
                        if (v)
                                continue;
                        Value x = { .kind = VALUE_INT, .i = want };
                        r = value_map_put(bound, name, &x);
                        if (r < 0)
                                return r;
                }
        return 0;
}

/* Inits: a field-named number comes from the bindings, else source_config, or the init is zeros. */
static int resolve_replacement_inits(const ParameterSpec *params, size_t n, const ValueMap *bound,
                                     const ValueMap *source_config, PlanParameter *out, ValueMap *init_fields,
                                     FamilyError *e) {
        int r;

        for (size_t i = 0; i < n; i++) {
                ResolvedInit init = { .kind = params[i].init.kind };
                const InitNumber *xs[] = { &params[i].init.a, &params[i].init.b, &params[i].init.c,
                                           &params[i].init.d };
                double *vs[] = { &init.a, &init.b, &init.c, &init.d };
                bool resolved = true;

                for (size_t k = 0; k < ELEMENTSOF(xs); k++) {
                        r = init_number_bound(params[i].name, xs[k], init.kind, k, bound, source_config,
                                              init_fields, out[i].shape, out[i].n_dims, vs[k], e);
                        if (r < 0)
                                return r;
                        resolved = resolved && r > 0;
                }
                if (resolved) {
                        r = check_resolved_init(params[i].name, &init, e);
                        if (r < 0)
                                return r;
                        out[i].init = init;
                        out[i].init_resolved = true;
                } else
                        out[i].init = (ResolvedInit) { .kind = INIT_ZEROS };
        }
        return 0;
}

static int plan_replacement(const ParameterSpec *params, size_t n, const BuildRequest *req, const char *fqn,
                            BuildPlan *plan, FamilyError *e) {
        const SourceModule *m = &req->module;
        PlanParameter *out = plan->parameters;
        int r;

        /* Every declared parameter present, with its rank and a usable shape. */
        for (size_t i = 0; i < n; i++) {
                const ParameterSpec *p = &params[i];

                const SourceParameter *src = source_find(m, p->name);
                if (!src)
                        return fail_qq(e, "SHAPE", p->name, "module %s has no parameter %s", fqn, p->name);
                if (src->n_dims != p->n_dims) {
                        _cleanup_free_ char *qp = repr_string(p->name), *qm = repr_string(fqn);
                        if (!qp || !qm)
                                return -ENOMEM;
                        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", p->name,
                                                "parameter %s of module %s has %zu dimensions, expected %zu",
                                                qp, qm, src->n_dims, p->n_dims);
                }

                r = plan_parameter_start(p, &out[i]);
                if (r < 0)
                        return r;
                if (p->n_dims > 0)
                        memcpy(out[i].shape, src->shape, p->n_dims * sizeof(int64_t));
                r = check_shape(p->name, out[i].shape, out[i].n_dims, &out[i].n_elements, e);
                if (r < 0)
                        return r;
        }

        r = bind_lone_fields(params, n, fqn, out, &req->source_config, &plan->bound_fields, e);
        if (r < 0)
                return r;

        /* Every other expression, now that the bindings are complete. */
        for (size_t i = 0; i < n; i++)
                for (size_t d = 0; d < params[i].n_dims; d++) {
                        if (expr_is_field(params[i].shape[d], NULL))
                                continue;
                        r = check_bound_dim(params[i].shape[d], out[i].shape[d], &plan->bound_fields, fqn,
                                            params[i].name, out[i].shape, out[i].n_dims, e);
                        if (r < 0)
                                return r;
                }

        return resolve_replacement_inits(params, n, &plan->bound_fields, &req->source_config, out,
                                         &plan->init_fields, e);
}

static int plan_parameters(const Family *f, const Variant *v, const BuildRequest *req, BuildOrigin origin,
                           const char *fqn, BuildPlan *plan, FamilyError *e) {
        const ParameterSpec *params;
        size_t n;
        int r;

        variant_parameters(f, v, &params, &n);
        if (n == 0)
                return 0;

        plan->parameters = calloc(n, sizeof(PlanParameter));
        if (!plan->parameters)
                return -ENOMEM;
        /* Counted from the start so build_plan_done frees partial entries on failure. */
        plan->n_parameters = n;

        if (origin == BUILD_ORIGIN_REPLACEMENT)
                return plan_replacement(params, n, req, fqn, plan, e);

        for (size_t i = 0; i < n; i++) {
                r = plan_direct_parameter(&params[i], &req->config, &plan->parameters[i], e);
                if (r < 0)
                        return r;
        }
        return 0;
}

static const char *eval_problem(const ExprEvalError *err, char buf[static 64]) {
        switch (err->failure) {
        case EXPR_FAILURE_DIVISION_BY_ZERO:
                return "division by zero";
        case EXPR_FAILURE_NOT_DIVISIBLE:
                snprintf(buf, 64, "%" PRId64 " / %" PRId64 " does not divide exactly", err->lhs, err->rhs);
                return buf;
        default:
                return "overflows int64";
        }
}

/*
 * Placements that depend on the job (registry.md): each decided by its first case whose
 * condition holds over the job's axis sizes and flags; none holding, or `none`, leaves the axis
 * unplaced. The plan's parameters are the member's, in order, with their placements copied.
 */
static int plan_job_placements(const Family *f, const Variant *v, const PlacementJob *job,
                               BuildPlan *plan, FamilyError *e) {
        const ParameterSpec *params;
        size_t n;
        int r;

        variant_parameters(f, v, &params, &n);
        for (size_t i = 0; i < n && i < plan->n_parameters; i++) {
                const ParameterSpec *p = &params[i];
                PlanParameter *out = &plan->parameters[i];
                size_t keep = 0;

                if (!p->placement_cases || out->n_placements != p->n_placements)
                        continue;
                for (size_t j = 0; j < out->n_placements; j++) {
                        const PlacementCases *c = &p->placement_cases[j];
                        ExprEvalError err = {};
                        size_t k;

                        if (c->n == 0) {
                                out->placements[keep++] = out->placements[j];
                                continue;
                        }
                        r = placement_cases_decide(c, job, &k, &err);
                        if (r == -EINVAL) {
                                _cleanup_free_ char *when = expr_to_string(c->items[k].when);
                                char buf[64];

                                if (!when)
                                        return -ENOMEM;
                                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "PLACEMENT", p->name,
                                                        "parameter '%s': the placement over '%s' cannot be "
                                                        "decided: case %zu's condition '%s' %s",
                                                        p->name, out->placements[j].axis, k + 1, when,
                                                        eval_problem(&err, buf));
                        }
                        if (r < 0)
                                return r;
                        if (k == c->n || c->items[k].none) {
                                free(out->placements[j].axis);
                                continue;
                        }
                        out->placements[j].kind = c->items[k].kind;
                        out->placements[j].dim = c->items[k].kind == PLACEMENT_SHARD ? c->items[k].dim : 0;
                        out->placements[keep++] = out->placements[j];
                }
                out->n_placements = keep;
        }
        return 0;
}

/*
 * The family's activation layout as this job decides it (registry.md, "Activation layouts"):
 * each placement with cases by its first that holds; one that cannot be decided fails the Build
 * as a parameter's does (INVALID_ARGUMENT PLACEMENT, field layout).
 */
static int plan_activations(const ActivationLayout *declared, const PlacementJob *job, BuildPlan *plan,
                            FamilyError *e) {
        ActivationDecideError err = {};
        int r;

        r = activation_layout_decide(declared, job, &plan->activations, &err);
        if (r == -EINVAL) {
                _cleanup_free_ char *when = expr_to_string(err.when);
                char buf[64];

                if (!when)
                        return -ENOMEM;
                return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "PLACEMENT", "layout",
                                        "activation layout: the placement of '%s' entry %zu over '%s' cannot "
                                        "be decided: case %zu's condition '%s' %s",
                                        activation_field_to_string(err.field), err.activation + 1, err.axis,
                                        err.case_index + 1, when, eval_problem(&err.eval, buf));
        }
        if (r < 0)
                return r;
        plan->has_activations = true;
        return 0;
}

static int copy_request(const BuildRequest *req, const JobContext *ctx, ResolveRequest *ret) {
        _cleanup_(resolve_request_done) ResolveRequest r = {};
        int k;

        r.family = strdup(strempty(req->family));
        if (!r.family)
                return -ENOMEM;
        k = value_map_copy(&req->arguments, &r.arguments);
        if (k < 0)
                return k;
        k = job_context_copy(ctx, &r.context);
        if (k < 0)
                return k;

        *ret = r;
        r = (ResolveRequest) {};
        return 0;
}

int build_plan(const Registry *reg, MeshTable *meshes, const BuildRequest *req, BuildPlan *ret,
               FamilyError *ret_error) {
        static const char *const allow_config[] = { "config", NULL };
        _cleanup_(build_plan_done) BuildPlan plan = {};
        _cleanup_(job_context_done) JobContext ctx = {};
        const Family *f = NULL;
        const Variant *v;
        const char *fqn = NULL;
        int64_t size[_AXIS_MAX];
        bool flag[_JOB_FLAG_MAX];
        int r;

        if (!reg || !req || !ret)
                return -EINVAL;

        /* Step 1: Resolve 1-2 with `config` let through, then refused: hyper_parallel's
         * module-family layer validates the request's arguments when it makes the FamilyRequest,
         * before it looks at `config`. */
        r = registry_find(reg, strempty(req->family), &f, ret_error);
        if (r < 0)
                return r;
        r = resolve_check_arguments(f, &req->arguments, allow_config, ret_error);
        if (r < 0)
                return r;
        r = check_config_argument(req, ret_error);
        if (r < 0)
                return r;

        /* Step 2. */
        r = check_origin(req, &fqn, ret_error);
        if (r < 0)
                return r;
        plan.origin = req->has_module ? BUILD_ORIGIN_REPLACEMENT : BUILD_ORIGIN_DIRECT;

        /* Step 3: which mesh (as hyper_parallel's _context_from_mesh, before any size), Resolve
         * 3-8, binding. */
        r = effective_context(req, &ctx, ret_error);
        if (r < 0)
                return r;
        r = resolve_axis_sizes(meshes, &ctx, size, &plan.mesh, ret_error);
        if (r < 0)
                return r;
        resolve_job_flags(&ctx, plan.mesh, flag);
        r = resolve_select(f, &req->arguments, size, flag, &plan.resolved, ret_error);
        if (r < 0)
                return r;
        v = family_find_variant(f, plan.resolved.variant);
        if (!v)
                return -EIO;
        r = check_binding(v, &plan.resolved, plan.origin, ret_error);
        if (r < 0)
                return r;

        /* Step 4. */
        r = plan_parameters(f, v, req, plan.origin, fqn, &plan, ret_error);
        if (r < 0)
                return r;
        {
                PlacementJob job = {
                        .sequence_parallel = plan.mesh ? plan.mesh->spec.sequence_parallel : ctx.sequence_parallel,
                        .loss_parallel = plan.mesh ? plan.mesh->spec.loss_parallel : ctx.loss_parallel,
                };

                memcpy(job.axis_size, plan.resolved.axis_size, sizeof job.axis_size);
                r = plan_job_placements(f, v, &job, &plan, ret_error);
                if (r < 0)
                        return r;
                if (f->has_layout) {
                        r = plan_activations(&f->layout, &job, &plan, ret_error);
                        if (r < 0)
                                return r;
                }
        }

        /* hyper_parallel marks a direct build whose module can reset its parameters; here every
         * parameter has an init (zeros when none is declared), so any parameter qualifies. */
        plan.reset_after_materialization = plan.origin == BUILD_ORIGIN_DIRECT && plan.n_parameters > 0;

        plan.module_fqn = strdup(fqn);
        if (!plan.module_fqn)
                return -ENOMEM;
        plan.has_config = req->has_config;
        if (req->has_config) {
                r = value_map_copy(&req->config, &plan.config);
                if (r < 0)
                        return r;
        }
        r = copy_request(req, &ctx, &plan.request);
        if (r < 0)
                return r;
        r = materialize_options_copy(&req->materialize, &plan.materialize);
        if (r < 0)
                return r;
        if (req->n_parameter_dtypes > 0) {
                r = parameter_dtypes_copy(req->parameter_dtypes, req->n_parameter_dtypes,
                                          &plan.parameter_dtypes);
                if (r < 0)
                        return r;
                plan.n_parameter_dtypes = req->n_parameter_dtypes;
        }

        *ret = plan;
        plan = (BuildPlan) {};
        return 0;
}

static int parameter_dtype_cmp(const void *x, const void *y) {
        const ParameterDtype *a = *(const ParameterDtype *const *) x;
        const ParameterDtype *b = *(const ParameterDtype *const *) y;
        int c = strcmp(strempty(a->name), strempty(b->name));

        /* Equal names keep the order sent: the array's addresses are that order. */
        return c != 0 ? c : (a > b) - (a < b);
}

static int plan_name_cmp(const void *x, const void *y) {
        return strcmp(*(const char *const *) x, *(const char *const *) y);
}

int build_plan_check_dtypes(const BuildPlan *plan, FamilyError *ret_error) {
        _cleanup_free_ const ParameterDtype **sorted = NULL;
        _cleanup_free_ const char **names = NULL;
        size_t n = plan->n_parameter_dtypes;

        if (n == 0)
                return 0;
        /* A map has no order on the wire: entries are checked by name, parameters found by
         * binary search, so a hostile request costs n log n. */
        sorted = calloc(n, sizeof(ParameterDtype *));
        names = calloc(plan->n_parameters + 1, sizeof(char *));
        if (!sorted || !names)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                sorted[i] = &plan->parameter_dtypes[i];
        qsort(sorted, n, sizeof(ParameterDtype *), parameter_dtype_cmp);
        for (size_t i = 0; i < plan->n_parameters; i++)
                names[i] = strempty(plan->parameters[i].name);
        qsort(names, plan->n_parameters, sizeof(char *), plan_name_cmp);

        for (size_t i = 0; i < n; i++) {
                const char *name = strempty(sorted[i]->name), *dtype = strempty(sorted[i]->dtype);

                if (!bsearch(&name, names, plan->n_parameters, sizeof(char *), plan_name_cmp))
                        return fail_qq(ret_error, "DTYPE", "parameter_dtypes",
                                       "parameter_dtypes names %s, which is not a parameter of "
                                       "member %s",
                                       name, strempty(plan->resolved.variant));
                if (isempty(dtype) || dtype_from_string(dtype) < 0)
                        return fail_qq(ret_error, "DTYPE", "parameter_dtypes",
                                       "dtype %s of parameter %s is not supported; use float32, "
                                       "bfloat16 or float16",
                                       dtype, name);
        }
        return 0;
}

Dtype build_plan_parameter_dtype(const BuildPlan *plan, size_t i, Dtype build_dtype) {
        const PlanParameter *p = &plan->parameters[i];
        Dtype d;

        for (size_t k = plan->n_parameter_dtypes; k > 0; k--)
                if (streq_ptr(plan->parameter_dtypes[k - 1].name, p->name)) {
                        d = dtype_from_string(plan->parameter_dtypes[k - 1].dtype);
                        return d >= 0 ? d : build_dtype;
                }
        if (p->dtype) {
                d = dtype_from_string(p->dtype);
                if (d >= 0)
                        return d;
        }
        return build_dtype;
}
