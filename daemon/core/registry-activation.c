/* registry-activation.c: a family's `layout`: the placements of its inputs and outputs. */

#include <inttypes.h>
#include <stdio.h>

#include "resource-limits.h"
#include "registry-load.h"

static const char *const layout_keys[] = {
        "in_src", "in_dst", "out_src", "out_dst", "out_names", "boundary",
};

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
                PlacementKind kind = PLACEMENT_REPLICATE;
                int64_t dim = 0;

                if (asprintf(&pwhat, "%s placement '%s'", what, e[i].key) < 0)
                        return -ENOMEM;
                r = loader_string(l, e[i].value, ctx, pwhat, FAMILYD_MAX_NAME_LENGTH, &s);
                if (r >= 0 && !streq(s, "partial") && registry_parse_placement(s, &kind, &dim) < 0)
                        r = loader_diag(l, e[i].value, ctx, "%s must be shard(d), replicate or partial", pwhat);
                if (r >= 0) {
                        ActivationPlacement *p = &ret->placements[ret->n_placements];

                        p->axis = strdup(e[i].key);
                        p->kind = strdup(streq(s, "partial") ? "partial" : placement_kind_to_string(kind));
                        ret->n_placements++;
                        if (!p->axis || !p->kind)
                                return -ENOMEM;
                        p->dim = dim;
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
