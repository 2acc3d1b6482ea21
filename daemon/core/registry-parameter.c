/* registry-parameter.c: a variant's or family's parameters: shapes, placements, inits. */

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "fill.h"
#include "placement-case.h"
#include "resource-limits.h"
#include "registry-load.h"

/* "shard(d)" or "replicate". */
int registry_parse_placement(const char *s, PlacementKind *ret_kind, int64_t *ret_dim) {
        const char *p;
        char *end;

        if (streq(s, "replicate")) {
                *ret_kind = PLACEMENT_REPLICATE;
                *ret_dim = 0;
                return 0;
        }
        if (strncmp(s, "shard(", 6) != 0)
                return -EINVAL;
        p = s + 6;
        while (*p == ' ')
                p++;
        if (!(*p == '-' || (*p >= '0' && *p <= '9')))
                return -EINVAL;
        errno = 0;
        long long d = strtoll(p, &end, 10);
        if (errno == ERANGE || end == p)
                return -EINVAL;
        while (*end == ' ')
                end++;
        if (!streq(end, ")"))
                return -EINVAL;

        *ret_kind = PLACEMENT_SHARD;
        *ret_dim = d;
        return 0;
}

static void format_number(double v, char buf[static 32]) {
        /* The shortest of %.15g..%.17g that reads back as the same double: "0.02", not
         * "0.02000000000000000042". */
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, 32, "%.*g", prec, v);
                if (strtod(buf, NULL) == v)
                        return;
        }
}

/* An init's number: an int, a finite float, a config field name, or a float expression in a
 * string ("initializer_range / sqrt(2 * num_layers)", "1 / sqrt(fan_in)"). */
static int load_init_number(Loader *l, const YNode *n, const char *ctx, const char *what,
                            InitNumber *ret) {
        _cleanup_free_ char *message = NULL;
        Value v = {};
        int r;

        r = loader_node_value(l, n, ctx, what, &v);
        if (r < 0)
                return r;
        switch (v.kind) {
        case VALUE_INT:
                *ret = (InitNumber) { .value = (double) v.i };
                return 0;
        case VALUE_FLOAT:
                if (!isfinite(v.f))
                        return loader_diag(l, n, ctx, "%s must be finite", what);
                *ret = (InitNumber) { .value = v.f };
                return 0;
        case VALUE_STRING:
                break;
        default:
                value_done(&v);
                return loader_diag(l, n, ctx, "%s must be a number, a config field name or an expression",
                                   what);
        }

        _cleanup_free_ char *s = TAKE_PTR(v.s);
        /* A lone field name stays a field (fan_in and fan_out are the expression's own names). */
        if (loader_is_identifier(s) && strlen(s) <= FAMILYD_MAX_NAME_LENGTH && !streq(s, "fan_in") &&
            !streq(s, "fan_out") && !streq(s, "sqrt")) {
                *ret = (InitNumber) { .field = TAKE_PTR(s) };
                return 0;
        }
        InitExpr *e = NULL;
        r = init_expr_parse(s, &e, &message);
        if (r == -EINVAL)
                return loader_diag(l, n, ctx, "%s: %s", what, message);
        if (r < 0)
                return r;
        *ret = (InitNumber) { .expr = e };
        return 0;
}

/* The canonical text of a number; *ret_free gets what must be freed (an expression's text). */
static const char *init_number_text(const InitNumber *x, char buf[static 32], char **ret_free) {
        *ret_free = NULL;
        if (x->field)
                return x->field;
        if (x->expr)
                return *ret_free = init_expr_to_string(x->expr);
        format_number(x->value, buf);
        return buf;
}

static int init_make_text(ParameterSpec *p) {
        _cleanup_free_ char *fa = NULL, *fb = NULL, *fc = NULL, *fd = NULL;
        char a[32], b[32], c[32], d[32];
        const char *ta, *tb, *tc, *td;
        int k;

        switch (p->init.kind) {
        case INIT_ZEROS:
        case INIT_ONES:
        case INIT_MODULE:
                p->init_text = strdup(init_kind_to_string(p->init.kind));
                return p->init_text ? 0 : -ENOMEM;
        default:
                break;
        }
        ta = init_number_text(&p->init.a, a, &fa);
        tb = init_number_text(&p->init.b, b, &fb);
        tc = init_number_text(&p->init.c, c, &fc);
        td = init_number_text(&p->init.d, d, &fd);
        if (!ta || !tb || !tc || !td)
                return -ENOMEM;

        switch (p->init.kind) {
        case INIT_CONSTANT:
                k = asprintf(&p->init_text, "constant(value=%s)", ta);
                break;
        case INIT_NORMAL:
                k = asprintf(&p->init_text, "normal(mean=%s, std=%s)", ta, tb);
                break;
        case INIT_UNIFORM:
                k = asprintf(&p->init_text, "uniform(low=%s, high=%s)", ta, tb);
                break;
        case INIT_TRUNC_NORMAL:
                k = asprintf(&p->init_text, "trunc_normal(mean=%s, std=%s, a=%s, b=%s)", ta, tb, tc, td);
                break;
        default:
                return -EINVAL;
        }
        if (k < 0) {
                p->init_text = NULL;
                return -ENOMEM;
        }
        return 0;
}

static int load_init(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p) {
        static const char *const kinds[] = { "constant", "normal", "uniform", "trunc_normal" };
        static const char *const constant_keys[] = { "value" };
        static const char *const normal_keys[] = { "mean", "std" };
        static const char *const uniform_keys[] = { "low", "high" };
        static const char *const trunc_keys[] = { "mean", "std", "a", "b" };
        static const char *const *const arg_keys[] = { constant_keys, normal_keys, uniform_keys,
                                                       trunc_keys };
        static const size_t n_arg_keys[] = { 1, 2, 2, 4 };
        static const InitKind kind_of[] = { INIT_CONSTANT, INIT_NORMAL, INIT_UNIFORM, INIT_TRUNC_NORMAL };
        static const char *const usage =
                "'init' must be zeros, ones, module, or one of constant: {value}, normal: {mean, std}, "
                "uniform: {low, high}, trunc_normal: {mean, std, a, b}";
        const YNode *values[ELEMENTSOF(kinds)] = {}, *args[4] = {}, *m = NULL;
        size_t which = 0, n_present = 0;
        int acc = 0, r = 0;

        if (n->kind == YNODE_SCALAR) {
                _cleanup_free_ char *s = NULL;

                r = loader_string(l, n, ctx, "'init'", FAMILYD_MAX_NAME_LENGTH, &s);
                if (r < 0)
                        return r;
                if (streq(s, "zeros"))
                        p->init = (InitSpec) { .kind = INIT_ZEROS };
                else if (streq(s, "ones"))
                        p->init = (InitSpec) { .kind = INIT_ONES };
                else if (streq(s, "module"))
                        p->init = (InitSpec) { .kind = INIT_MODULE };
                else
                        return loader_diag(l, n, ctx, "%s", usage);
                return 0;
        }
        if (n->kind != YNODE_MAPPING)
                return loader_diag(l, n, ctx, "%s", usage);

        r = loader_map_fixed(l, n, ctx, kinds, values, ELEMENTSOF(kinds));
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(kinds); i++)
                if (values[i]) {
                        which = i;
                        n_present++;
                }
        if (n_present != 1)
                return loader_diag(l, n, ctx, "%s", usage);

        m = values[which];
        _cleanup_free_ char *ictx = NULL;
        if (asprintf(&ictx, "%s: init %s", ctx, kinds[which]) < 0)
                return -ENOMEM;
        r = loader_expect_kind(l, m, ictx, "the init's arguments", YNODE_MAPPING);
        if (r < 0)
                return r;
        r = loader_map_fixed(l, m, ictx, arg_keys[which], args, n_arg_keys[which]);
        if (r < 0)
                return r;

        _cleanup_(init_spec_done) InitSpec init = { .kind = kind_of[which] };
        InitNumber *numbers[] = { &init.a, &init.b, &init.c, &init.d };
        if (kind_of[which] == INIT_TRUNC_NORMAL) {
                /* torch.nn.init.trunc_normal_'s defaults: mean 0, std 1, a -2, b 2. */
                init.b.value = 1;
                init.c.value = -2;
                init.d.value = 2;
        }
        for (size_t i = 0; i < n_arg_keys[which]; i++) {
                _cleanup_free_ char *what = NULL;

                if (!args[i]) {
                        /* normal's mean and all of trunc_normal's are optional (defaults above). */
                        if ((kind_of[which] == INIT_NORMAL && i == 0) || kind_of[which] == INIT_TRUNC_NORMAL)
                                continue;
                        r = loader_missing_key(l, m, ictx, arg_keys[which][i]);
                } else {
                        if (asprintf(&what, "'%s'", arg_keys[which][i]) < 0)
                                r = -ENOMEM;
                        else
                                r = load_init_number(l, args[i], ictx, what, numbers[i]);
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        break;
        }
        if (r < 0 || acc < 0)
                return r < 0 ? r : acc;
        /* Literal bounds are checked here; bounds from the config at Build (docs/semantics.md). */
        if (kind_of[which] == INIT_TRUNC_NORMAL && !init.c.field && !init.c.expr && !init.d.field &&
            !init.d.expr && !(init.c.value < init.d.value))
                return loader_diag(l, m, ictx, "'a' must be less than 'b'");
        p->init = init;
        init = (InitSpec) {};
        return 0;
}

static int load_shape(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p) {
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'shape'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_SHAPE_RANK)
                return loader_diag(l, n, ctx, "'shape' has more than %u dimensions",
                                   FAMILYD_MAX_SHAPE_RANK);

        p->shape = calloc(n->n_items ? n->n_items : 1, sizeof(Expr *));
        if (!p->shape)
                return -ENOMEM;

        for (size_t i = 0; i < n->n_items; i++) {
                const YNode *item = n->items[i];
                _cleanup_free_ char *text = NULL, *message = NULL;
                Value v = {};

                r = loader_node_value(l, item, ctx, "'shape'", &v);
                if (r < 0) {
                        r = loader_fold(&acc, r);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (v.kind == VALUE_INT) {
                        if (asprintf(&text, "%" PRId64, v.i) < 0)
                                return -ENOMEM;
                } else if (v.kind == VALUE_STRING)
                        text = TAKE_PTR(v.s);
                value_done(&v);
                if (!text) {
                        r = loader_fold(&acc, loader_diag(l, item, ctx,
                                                   "'shape' entries must be integers or expressions"));
                        if (r < 0)
                                return r;
                        continue;
                }

                r = expr_parse(text, &p->shape[p->n_dims], &message);
                if (r == -EINVAL)
                        r = loader_diag(l, item, ctx, "'shape': %s", message);
                else if (r >= 0)
                        p->n_dims++;
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

/* A condition's field that is not the job's: diagnosed, the walk goes on. */
typedef struct WhenCheck {
        Loader *l;
        const YNode *n;
        const char *ctx;
        const char *what;
        int acc;
} WhenCheck;

static int when_check_field(const char *name, void *userdata) {
        WhenCheck *w = userdata;
        _cleanup_free_ char *format = NULL;

        if (placement_job_has_field(name))
                return 0;
        if (asprintf(&format, "%s: 'when' names %%s; a condition may name tp_size, cp_size, "
                     "ep_size, pp_size, sequence_parallel and loss_parallel", w->what) < 0)
                return -ENOMEM;
        return loader_fold(&w->acc, loader_diag_q(w->l, w->n, w->ctx, format, name));
}

int loader_job_condition(Loader *l, const YNode *n, const char *ctx, const char *what,
                         Expr **ret) {
        _cleanup_free_ char *when = NULL, *message = NULL;
        int r;

        r = loader_string(l, n, ctx, what, FAMILYD_MAX_EXPR_LENGTH * 4, &when);
        if (r < 0)
                return r;
        r = expr_parse_condition(when, ret, &message);
        if (r == -EINVAL)
                return loader_diag(l, n, ctx, "%s: 'when': %s", what, message);
        if (r < 0)
                return r;
        WhenCheck w = { .l = l, .n = n, .ctx = ctx, .what = what };
        r = expr_foreach_field(*ret, when_check_field, &w);
        return r < 0 ? r : w.acc;
}

/*
 * A placement that depends on the job: a list of cases {when: CONDITION, placement: P}, the
 * first whose condition holds deciding at Build; P is shard(d), replicate or none.
 */
static int load_placement_cases(Loader *l, const YNode *n, const char *ctx, const char *what,
                                int64_t rank, bool rank_known, PlacementCases *ret) {
        static const char *const keys[] = { "when", "placement" };
        int acc = 0, r;

        if (n->n_items == 0 || n->n_items > FAMILYD_MAX_MESH_DIMS)
                return loader_diag(l, n, ctx, "%s must list 1 to %u cases", what, FAMILYD_MAX_MESH_DIMS);
        ret->items = calloc(n->n_items, sizeof(PlacementCase));
        if (!ret->items)
                return -ENOMEM;

        for (size_t i = 0; i < n->n_items; i++) {
                const YNode *item = n->items[i], *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *cwhat = NULL, *s = NULL;
                PlacementCase *c = &ret->items[ret->n];
                int cacc = 0;

                if (asprintf(&cwhat, "%s case %zu", what, i + 1) < 0)
                        return -ENOMEM;
                r = loader_expect_kind(l, item, ctx, cwhat, YNODE_MAPPING);
                if (r >= 0)
                        r = loader_map_fixed(l, item, ctx, keys, values, ELEMENTSOF(keys));
                r = loader_fold(&cacc, r);
                if (r < 0)
                        return r;
                if (item->kind != YNODE_MAPPING) {
                        acc = -EINVAL;
                        continue;
                }

                if (!values[1])
                        r = loader_missing_key(l, item, ctx, "placement");
                else {
                        r = loader_string(l, values[1], ctx, cwhat, FAMILYD_MAX_NAME_LENGTH, &s);
                        if (r >= 0 && streq(s, "none"))
                                c->none = true;
                        else if (r >= 0 && registry_parse_placement(s, &c->kind, &c->dim) < 0)
                                r = loader_diag(l, values[1], ctx, "%s must be shard(d), replicate or none", cwhat);
                        else if (r >= 0 && c->kind == PLACEMENT_SHARD && rank_known &&
                                 (c->dim < -rank || c->dim >= rank))
                                r = loader_diag(l, values[1], ctx,
                                                "%s: shard(%" PRId64 ") is out of range for %" PRId64 " dimensions",
                                                cwhat, c->dim, rank);
                }
                r = loader_fold(&cacc, r);
                if (r < 0)
                        return r;

                if (values[0]) {
                        r = loader_fold(&cacc, loader_job_condition(l, values[0], ctx, cwhat, &c->when));
                        if (r < 0)
                                return r;
                }
                ret->n++;
                if (cacc < 0)
                        acc = cacc;
        }
        return acc;
}

static int load_placements(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p,
                           bool rank_known) {
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = loader_map_entries(l, n, ctx, "'placements'", FAMILYD_MAX_MESH_DIMS, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        p->placements = calloc(n_e ? n_e : 1, sizeof(Placement));
        if (!p->placements)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                _cleanup_free_ char *s = NULL, *what = NULL;
                PlacementKind kind;
                int64_t dim, rank = (int64_t) p->n_dims;

                what = loader_ctx_push(NULL, "placement", e[i].key);
                if (!what)
                        return -ENOMEM;
                if (e[i].value->kind == YNODE_SEQUENCE) {
                        if (!p->placement_cases) {
                                p->placement_cases = calloc(n_e, sizeof(PlacementCases));
                                if (!p->placement_cases)
                                        return -ENOMEM;
                        }
                        r = load_placement_cases(l, e[i].value, ctx, what, rank, rank_known,
                                                 &p->placement_cases[p->n_placements]);
                        if (r >= 0) {
                                Placement *pl = &p->placements[p->n_placements];
                                pl->axis = strdup(e[i].key);
                                if (!pl->axis)
                                        return -ENOMEM;
                                pl->kind = PLACEMENT_REPLICATE;
                                pl->dim = 0;
                                p->n_placements++;
                        } else
                                placement_cases_done(&p->placement_cases[p->n_placements]);
                        r = loader_fold(&acc, r);
                        if (r < 0)
                                return r;
                        continue;
                }
                r = loader_string(l, e[i].value, ctx, what, FAMILYD_MAX_NAME_LENGTH, &s);
                if (r >= 0 && registry_parse_placement(s, &kind, &dim) < 0)
                        r = loader_diag(l, e[i].value, ctx, "%s must be shard(d) or replicate", what);
                else if (r >= 0 && kind == PLACEMENT_SHARD && rank_known && (dim < -rank || dim >= rank))
                        r = loader_diag(l, e[i].value, ctx,
                                        "%s: shard(%" PRId64 ") is out of range for %" PRId64 " dimensions",
                                        what, dim, rank);
                else if (r >= 0) {
                        Placement *pl = &p->placements[p->n_placements];
                        pl->axis = strdup(e[i].key);
                        if (!pl->axis)
                                return -ENOMEM;
                        pl->kind = kind;
                        pl->dim = dim;
                        p->n_placements++;
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

/* The element type a parameter names, stored canonical: the names materialize.dtype takes. */
static int load_dtype(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p) {
        _cleanup_free_ char *s = NULL;
        Dtype d;
        int r;

        r = loader_string(l, n, ctx, "'dtype'", FAMILYD_MAX_NAME_LENGTH, &s);
        if (r < 0)
                return r;
        d = isempty(s) ? _DTYPE_INVALID : dtype_from_string(s);
        if (d < 0)
                return loader_diag_q(l, n, ctx,
                                     "'dtype' must be float32, bfloat16 or float16 (or f32, "
                                     "fp32, bf16, f16, fp16), not %s",
                                     s);
        p->dtype = strdup(dtype_to_string(d));
        return p->dtype ? 0 : -ENOMEM;
}

int loader_parameters(Loader *l, const YNode *n, const char *ctx, ParameterSpec **ret,
                    size_t *ret_n) {
        static const char *const keys[] = { "shape", "placements", "init", "dtype", "checkpoint" };
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = loader_map_entries(l, n, ctx, "'parameters'", FAMILYD_MAX_LIST_VALUES, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        *ret = calloc(n_e ? n_e : 1, sizeof(ParameterSpec));
        if (!*ret)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                const YNode *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *pctx = NULL;
                ParameterSpec *p = &(*ret)[(*ret_n)++];
                int pacc = 0;

                p->name = strdup(e[i].key);
                pctx = loader_ctx_push(ctx, "parameter", e[i].key);
                if (!p->name || !pctx)
                        return -ENOMEM;

                r = loader_expect_kind(l, e[i].value, pctx, "the parameter", YNODE_MAPPING);
                if (r >= 0)
                        r = loader_map_fixed(l, e[i].value, pctx, keys, values, ELEMENTSOF(keys));
                r = loader_fold(&pacc, r);
                if (r < 0)
                        return r;
                if (e[i].value->kind != YNODE_MAPPING) {
                        acc = -EINVAL;
                        continue;
                }

                int shape_r = 0;
                if (!values[0])
                        shape_r = loader_missing_key(l, e[i].value, pctx, "shape");
                else
                        shape_r = load_shape(l, values[0], pctx, p);
                r = loader_fold(&pacc, shape_r);
                if (r < 0)
                        return r;

                if (values[1]) {
                        r = loader_fold(&pacc, load_placements(l, values[1], pctx, p, shape_r >= 0));
                        if (r < 0)
                                return r;
                }

                p->init = (InitSpec) { .kind = INIT_ZEROS };
                if (values[2]) {
                        r = loader_fold(&pacc, load_init(l, values[2], pctx, p));
                        if (r < 0)
                                return r;
                }
                r = init_make_text(p);
                if (r < 0)
                        return r;
                if (values[3]) {
                        r = loader_fold(&pacc, load_dtype(l, values[3], pctx, p));
                        if (r < 0)
                                return r;
                }
                if (values[4]) {
                        r = loader_checkpoint(l, values[4], pctx,
                                              shape_r >= 0 ? (int64_t) p->n_dims : -1,
                                              &p->checkpoint);
                        if (r >= 0)
                                p->has_checkpoint = true;
                        r = loader_fold(&pacc, r);
                        if (r < 0)
                                return r;
                }
                if (pacc < 0)
                        acc = pacc;
        }
        return acc;
}
