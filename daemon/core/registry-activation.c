/* registry-activation.c: a family's `layout`: the placements of its inputs and outputs. */

#include <inttypes.h>
#include <stdio.h>

#include "placement-case.h"
#include "resource-limits.h"
#include "registry-load.h"

static const char *const layout_keys[] = {
        "in_src", "in_dst", "out_src", "out_dst", "out_names", "boundary",
};

/* "shard(d)", "replicate" or "partial" (and with cases "none": kind NULL); -EINVAL otherwise. */
static int parse_activation_placement(const char *s, bool allow_none, char **ret_kind, int64_t *ret_dim) {
        PlacementKind kind = PLACEMENT_REPLICATE;
        int64_t dim = 0;

        if (allow_none && streq(s, "none")) {
                *ret_kind = NULL;
                *ret_dim = 0;
                return 0;
        }
        if (!streq(s, "partial") && registry_parse_placement(s, &kind, &dim) < 0)
                return -EINVAL;
        *ret_kind = strdup(streq(s, "partial") ? "partial" : placement_kind_to_string(kind));
        if (!*ret_kind)
                return -ENOMEM;
        *ret_dim = dim;
        return 0;
}

/*
 * A placement that depends on the job, with the syntax of a parameter's: a list of cases
 * {when: CONDITION, placement: P}, P shard(d), replicate, partial or none.
 */
static int load_activation_cases(Loader *l, const YNode *n, const char *ctx, const char *what,
                                 ActivationPlacement *ret) {
        static const char *const keys[] = { "when", "placement" };
        int acc = 0, r;

        if (n->n_items == 0 || n->n_items > FAMILYD_MAX_MESH_DIMS)
                return loader_diag(l, n, ctx, "%s must list 1 to %u cases", what, FAMILYD_MAX_MESH_DIMS);
        ret->cases = calloc(n->n_items, sizeof(ActivationCase));
        if (!ret->cases)
                return -ENOMEM;
        for (size_t i = 0; i < n->n_items; i++) {
                const YNode *item = n->items[i], *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *cwhat = NULL, *s = NULL;
                ActivationCase *c = &ret->cases[ret->n_cases];

                if (asprintf(&cwhat, "%s case %zu", what, i + 1) < 0)
                        return -ENOMEM;
                r = loader_expect_kind(l, item, ctx, cwhat, YNODE_MAPPING);
                if (r >= 0)
                        r = loader_map_fixed(l, item, ctx, keys, values, ELEMENTSOF(keys));
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
                if (item->kind != YNODE_MAPPING)
                        continue;
                ret->n_cases++;

                if (!values[1])
                        r = loader_missing_key(l, item, ctx, "placement");
                else {
                        r = loader_string(l, values[1], ctx, cwhat, FAMILYD_MAX_NAME_LENGTH, &s);
                        if (r >= 0) {
                                r = parse_activation_placement(s, true, &c->kind, &c->dim);
                                if (r == -EINVAL)
                                        r = loader_diag(l, values[1], ctx,
                                                        "%s must be shard(d), replicate, partial or none", cwhat);
                        }
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;

                if (values[0]) {
                        r = loader_fold(&acc, loader_job_condition(l, values[0], ctx, cwhat, &c->when));
                        if (r < 0)
                                return r;
                }
        }
        return acc;
}

/* One activation: a mapping of mesh dimension names to shard(d), replicate or partial. */
static int load_activation(Loader *l, const YNode *n, const char *ctx, const char *what, Activation *ret) {
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = loader_map_entries(l, n, ctx, what, FAMILYD_MAX_MESH_DIMS, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;
        ret->placements = calloc(n_e + 1, sizeof(ActivationPlacement));
        if (!ret->placements)
                return -ENOMEM;
        for (size_t i = 0; i < n_e; i++) {
                _cleanup_free_ char *s = NULL, *pwhat = NULL;
                ActivationPlacement *p = &ret->placements[ret->n_placements];

                if (asprintf(&pwhat, "%s placement '%s'", what, e[i].key) < 0)
                        return -ENOMEM;
                p->axis = strdup(e[i].key);
                if (!p->axis)
                        return -ENOMEM;
                ret->n_placements++;
                if (e[i].value->kind == YNODE_SEQUENCE) {
                        r = load_activation_cases(l, e[i].value, ctx, pwhat, p);
                        if (r >= 0) {
                                p->kind = strdup("cases");
                                if (!p->kind)
                                        return -ENOMEM;
                        }
                } else {
                        r = loader_string(l, e[i].value, ctx, pwhat, FAMILYD_MAX_NAME_LENGTH, &s);
                        if (r >= 0) {
                                r = parse_activation_placement(s, false, &p->kind, &p->dim);
                                if (r == -EINVAL)
                                        r = loader_diag(l, e[i].value, ctx,
                                                        "%s must be shard(d), replicate or partial", pwhat);
                        }
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_activations(Loader *l, const YNode *n, const char *ctx, const char *key,
                            Activation **ret, size_t *ret_n) {
        _cleanup_free_ char *what = NULL;
        int acc = 0, r;

        if (asprintf(&what, "'%s'", key) < 0)
                return -ENOMEM;
        r = loader_expect_kind(l, n, ctx, what, YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_MESH_DIMS)
                return loader_diag(l, n, ctx, "%s lists at most %u activations", what, FAMILYD_MAX_MESH_DIMS);
        *ret = calloc(n->n_items + 1, sizeof(Activation));
        if (!*ret)
                return -ENOMEM;
        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *iwhat = NULL;

                if (asprintf(&iwhat, "'%s' entry %zu", key, i + 1) < 0)
                        return -ENOMEM;
                (*ret_n)++;
                r = loader_fold(&acc, load_activation(l, n->items[i], ctx, iwhat, &(*ret)[i]));
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_out_names(Loader *l, const YNode *n, const char *ctx, ActivationLayout *ret) {
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'out_names'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_MESH_DIMS)
                return loader_diag(l, n, ctx, "'out_names' lists at most %u names", FAMILYD_MAX_MESH_DIMS);
        ret->out_names = calloc(n->n_items + 1, sizeof(char *));
        if (!ret->out_names)
                return -ENOMEM;
        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *name = NULL;

                r = loader_name(l, n->items[i], ctx, "'out_names' entry", &name);
                for (size_t j = 0; r >= 0 && j < ret->n_out_names; j++)
                        if (streq(ret->out_names[j], name))
                                r = loader_diag_q(l, n->items[i], ctx, "'out_names' names %s twice", name);
                if (r >= 0)
                        ret->out_names[ret->n_out_names++] = TAKE_PTR(name);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

int loader_activation_layout(Loader *l, const YNode *n, const char *ctx, ActivationLayout *ret) {
        const YNode *values[ELEMENTSOF(layout_keys)] = {};
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'layout'", YNODE_MAPPING);
        if (r < 0)
                return r;
        r = loader_fold(&acc, loader_map_fixed(l, n, ctx, layout_keys, values, ELEMENTSOF(layout_keys)));
        if (r < 0)
                return r;

        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++) {
                if (!values[f])
                        continue;
                r = loader_fold(&acc, load_activations(l, values[f], ctx, layout_keys[f], &ret->lists[f],
                                                       &ret->n_lists[f]));
                if (r < 0)
                        return r;
        }
        if (values[ACTIVATION_OUT_NAMES]) {
                r = loader_fold(&acc, load_out_names(l, values[ACTIVATION_OUT_NAMES], ctx, ret));
                if (r < 0)
                        return r;
        }
        if (values[ACTIVATION_IS_BOUNDARY]) {
                Value v = {};

                r = loader_typed(l, values[ACTIVATION_IS_BOUNDARY], ctx, "'boundary'", FIELD_TYPE_BOOL, &v);
                if (r >= 0)
                        ret->is_boundary = v.b;
                value_done(&v);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}
