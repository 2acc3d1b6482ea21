/* registry-checkpoint.c: a parameter's `checkpoint` key: the tensors its values come from. */

#include <inttypes.h>
#include <stdio.h>

#include "registry-load.h"
#include "resource-limits.h"

/* A dimension of a parameter of rank dims (or of unknown rank: rank < 0), normalised. */
static int load_dim(Loader *l, const YNode *n, const char *ctx, const char *what, int64_t rank,
                    int64_t *ret) {
        int64_t d;
        int r;

        r = loader_int(l, n, ctx, what, &d);
        if (r < 0)
                return r;
        if (rank >= 0 && (d < -rank || d >= rank))
                return loader_diag(l, n, ctx, "%s %" PRId64 " is out of range for %" PRId64
                                   " dimensions", what, d, rank);
        *ret = rank >= 0 && d < 0 ? d + rank : d;
        return 0;
}

static int load_template(Loader *l, const YNode *n, const char *ctx, const char *stack_key,
                         char **ret) {
        _cleanup_free_ char *s = NULL;
        char why[160];
        int r;

        r = loader_string(l, n, ctx, "a tensor name", CHECKPOINT_TEMPLATE_MAX, &s);
        if (r < 0)
                return r;
        if (checkpoint_template_check(s, stack_key, why, sizeof why) < 0)
                return loader_diag(l, n, ctx, "tensor name '%.64s': %s", s, why);
        *ret = TAKE_PTR(s);
        return 0;
}

static int load_transpose(Loader *l, const YNode *n, const char *ctx, bool *ret) {
        Value v = {};
        int r;

        r = loader_typed(l, n, ctx, "'transpose'", FIELD_TYPE_BOOL, &v);
        if (r < 0)
                return r;
        *ret = v.b;
        return 0;
}

/* A part: a template, or {tensor, transpose}. */
static int load_part(Loader *l, const YNode *n, const char *ctx, const char *stack_key,
                     CheckpointPart *ret) {
        static const char *const keys[] = { "tensor", "transpose" };
        const YNode *v[ELEMENTSOF(keys)] = {};
        int r;

        if (n->kind == YNODE_SCALAR)
                return load_template(l, n, ctx, stack_key, &ret->tensor);
        r = loader_expect_kind(l, n, ctx, "a checkpoint tensor", YNODE_MAPPING);
        if (r >= 0)
                r = loader_map_fixed(l, n, ctx, keys, v, ELEMENTSOF(keys));
        if (r < 0)
                return r;
        if (!v[0])
                return loader_missing_key(l, n, ctx, "tensor");
        if (v[1]) {
                r = load_transpose(l, v[1], ctx, &ret->transpose);
                if (r < 0)
                        return r;
        }
        return load_template(l, v[0], ctx, stack_key, &ret->tensor);
}

static int load_stack(Loader *l, const YNode *n, const char *ctx, int64_t rank,
                      CheckpointSource *s) {
        static const char *const keys[] = { "dim", "key" };
        const YNode *v[ELEMENTSOF(keys)] = {};
        int r;

        r = loader_expect_kind(l, n, ctx, "'stack'", YNODE_MAPPING);
        if (r >= 0)
                r = loader_map_fixed(l, n, ctx, keys, v, ELEMENTSOF(keys));
        if (r < 0)
                return r;
        if (!v[0] || !v[1])
                return loader_missing_key(l, n, ctx, !v[0] ? "dim" : "key");
        r = load_dim(l, v[0], ctx, "'stack' dim", rank, &s->stack_dim);
        if (r < 0)
                return r;
        r = loader_string(l, v[1], ctx, "'stack' key", FAMILYD_MAX_NAME_LENGTH, &s->stack_key);
        if (r < 0)
                return r;
        if (!loader_is_identifier(s->stack_key) || streq(s->stack_key, "prefix"))
                return loader_diag_q(l, v[1], ctx,
                                     "'stack' key must be an identifier other than prefix, not %s",
                                     s->stack_key);
        s->stack = true;
        return 0;
}

static int load_concat(Loader *l, const YNode *n, const char *ctx, int64_t rank,
                       CheckpointSource *s) {
        static const char *const keys[] = { "dim", "parts" };
        const YNode *v[ELEMENTSOF(keys)] = {};
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'concat'", YNODE_MAPPING);
        if (r >= 0)
                r = loader_map_fixed(l, n, ctx, keys, v, ELEMENTSOF(keys));
        if (r < 0)
                return r;
        if (!v[0] || !v[1])
                return loader_missing_key(l, n, ctx, !v[0] ? "dim" : "parts");
        r = load_dim(l, v[0], ctx, "'concat' dim", rank, &s->concat_dim);
        if (r < 0)
                return r;
        r = loader_expect_kind(l, v[1], ctx, "'parts'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (v[1]->n_items < 2 || v[1]->n_items > CHECKPOINT_PARTS_MAX)
                return loader_diag(l, v[1], ctx, "'parts' must list 2 to %d tensors",
                                   CHECKPOINT_PARTS_MAX);
        s->parts = calloc(v[1]->n_items, sizeof *s->parts);
        if (!s->parts)
                return -ENOMEM;
        for (size_t i = 0; i < v[1]->n_items; i++) {
                r = load_part(l, v[1]->items[i], ctx, s->stack_key, &s->parts[s->n_parts]);
                if (r >= 0)
                        s->n_parts++;
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        s->concat = true;
        return acc;
}

/* Source rank: the parameter's, less a stacked dimension; a transpose needs two. */
static int check_shapes(Loader *l, const YNode *n, const char *ctx, int64_t rank,
                        const CheckpointSource *s) {
        if (rank < 0)
                return 0;
        if (s->stack && s->concat && s->stack_dim == s->concat_dim)
                return loader_diag(l, n, ctx, "'stack' and 'concat' name the same dimension %" PRId64,
                                   s->stack_dim);
        for (size_t i = 0; i < s->n_parts; i++)
                if (s->parts[i].transpose && rank - (s->stack ? 1 : 0) < 2)
                        return loader_diag(l, n, ctx,
                                           "a transposed tensor needs two dimensions besides "
                                           "the stacked one");
        return 0;
}

int loader_checkpoint(Loader *l, const YNode *n, const char *ctx, int64_t rank,
                      CheckpointSource *ret) {
        static const char *const keys[] = { "tensor", "transpose", "stack", "concat" };
        const YNode *v[ELEMENTSOF(keys)] = {};
        _cleanup_free_ char *cctx = NULL;
        CheckpointSource s = {};
        int r;

        if (asprintf(&cctx, "%s: checkpoint", ctx) < 0)
                return -ENOMEM;
        if (n->kind == YNODE_SCALAR) {
                s.parts = calloc(1, sizeof *s.parts);
                if (!s.parts)
                        return -ENOMEM;
                s.n_parts = 1; /* freed by checkpoint_source_done() from here on */
                r = load_template(l, n, cctx, NULL, &s.parts[0].tensor);
        } else {
                r = loader_expect_kind(l, n, cctx, "'checkpoint'", YNODE_MAPPING);
                if (r >= 0)
                        r = loader_map_fixed(l, n, cctx, keys, v, ELEMENTSOF(keys));
                if (r >= 0 && !v[0] == !v[3])
                        r = loader_diag(l, n, cctx, "'checkpoint' needs one of 'tensor' and "
                                        "'concat'");
                if (r >= 0 && v[1] && !v[0])
                        r = loader_diag(l, v[1], cctx, "'transpose' goes with 'tensor' (or "
                                        "inside each of concat's parts)");
                if (r >= 0 && v[2])
                        r = load_stack(l, v[2], cctx, rank, &s);
                if (r >= 0 && v[3])
                        r = load_concat(l, v[3], cctx, rank, &s);
                else if (r >= 0) {
                        s.parts = calloc(1, sizeof *s.parts);
                        s.n_parts = s.parts ? 1 : 0;
                        r = s.parts ? load_template(l, v[0], cctx, s.stack_key,
                                                    &s.parts[0].tensor) : -ENOMEM;
                        if (r >= 0 && v[1])
                                r = load_transpose(l, v[1], cctx, &s.parts[0].transpose);
                }
        }
        if (r >= 0)
                r = check_shapes(l, n, cctx, rank, &s);
        if (r >= 0)
                r = checkpoint_source_make_text(&s);
        if (r < 0) {
                checkpoint_source_done(&s);
                return r;
        }
        *ret = s;
        return 0;
}
