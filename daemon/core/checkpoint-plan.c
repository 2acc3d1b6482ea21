/* checkpoint-plan.c: which boxes of which checkpoint tensors fill one shard slice of a parameter. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "checkpoint-plan.h"

void checkpoint_blocks_free(CheckpointBlock *b, size_t n) {
        for (size_t i = 0; b && i < n; i++)
                free(b[i].tensor);
        free(b);
}

static void shape_text(const int64_t *s, size_t n, char *buf, size_t size) {
        size_t at = (size_t) snprintf(buf, size, "[");
        for (size_t i = 0; i < n && at < size; i++)
                at += (size_t) snprintf(buf + at, size - at, "%s%" PRId64, i ? ", " : "", s[i]);
        if (at < size)
                (void) snprintf(buf + at, size - at, "]");
}

/* What one part of one stack index reads: its tensor's name and shape, checked against the
 * parameter's (along the concat dimension, any extent: *ret_extent). */
typedef struct PartSource {
        char *name;
        int64_t shape[FAMILYD_MAX_SHAPE_RANK];
        size_t n_dims;
        size_t axis_of[FAMILYD_MAX_SHAPE_RANK]; /* per parameter axis: its source axis */
} PartSource;

static int part_source(const CheckpointSource *src, const CheckpointPart *part, const char *prefix,
                       const ParameterLayout *p, int64_t index, CheckpointShapeFunc shape_of,
                       void *userdata, PartSource *ret, FamilyError *ret_error) {
        _cleanup_free_ char *name = NULL;
        size_t want = p->n_dims - (src->stack ? 1 : 0), k = 0;
        int64_t expect[FAMILYD_MAX_SHAPE_RANK];
        char a[160], b[160];
        int r;

        r = checkpoint_tensor_name(part->tensor, prefix, src->stack_key, index, &name);
        if (r == -ENAMETOOLONG)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                        "CHECKPOINT_TENSOR_MISSING", "checkpoint_prefix",
                                        "parameter '%s': its checkpoint tensor's name is longer "
                                        "than %d bytes with this prefix", p->name,
                                        CHECKPOINT_TEMPLATE_MAX);
        if (r < 0)
                return r;
        r = shape_of(name, &ret->n_dims, ret->shape, userdata);
        if (r == -ENOENT)
                return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND,
                                        "CHECKPOINT_TENSOR_MISSING", NULL,
                                        "parameter '%s': the checkpoint has no tensor '%s'",
                                        p->name, name);
        if (r == -E2BIG)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "CHECKPOINT_SHAPE", NULL,
                                        "parameter '%s': checkpoint tensor '%s' has more than %u "
                                        "dimensions or one over 2^63", p->name, name,
                                        FAMILYD_MAX_SHAPE_RANK);
        if (r < 0)
                return r;
        /* The parameter's axes without the stacked one, the last two swapped if transposed. */
        for (size_t d = 0; d < p->n_dims; d++) {
                if (src->stack && (int64_t) d == src->stack_dim) {
                        ret->axis_of[d] = CHECKPOINT_NO_AXIS;
                        continue;
                }
                ret->axis_of[d] = k;
                expect[k++] = p->shape[d];
        }
        if (part->transpose) {
                for (size_t d = 0; d < p->n_dims; d++)
                        if (ret->axis_of[d] == want - 2 || ret->axis_of[d] == want - 1)
                                ret->axis_of[d] = ret->axis_of[d] == want - 2 ? want - 1 : want - 2;
                int64_t t = expect[want - 2];
                expect[want - 2] = expect[want - 1];
                expect[want - 1] = t;
        }
        bool ok = ret->n_dims == want;
        for (size_t d = 0; ok && d < want; d++)
                if (!(src->concat && d == ret->axis_of[src->concat_dim]) && ret->shape[d] != expect[d])
                        ok = false;
        if (!ok) {
                shape_text(ret->shape, ret->n_dims, a, sizeof a);
                shape_text(expect, want, b, sizeof b);
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "CHECKPOINT_SHAPE", NULL,
                                        "parameter '%s': checkpoint tensor '%s' has shape %s, not "
                                        "%s%s", p->name, name, a, b,
                                        src->concat ? " (any extent along the concatenated "
                                                      "dimension)" : "");
        }
        ret->name = TAKE_PTR(name);
        return 0;
}

static int block_add(CheckpointBlock **blocks, size_t *n, const PartSource *ps,
                     const ParameterLayout *p, const ShardSlice *slice, const int64_t *from,
                     const int64_t *extent) {
        CheckpointBlock *b, *grown = realloc(*blocks, (*n + 1) * sizeof **blocks);

        if (!grown)
                return -ENOMEM;
        *blocks = grown;
        b = &grown[*n];
        *b = (CheckpointBlock) { .n_src_dims = ps->n_dims };
        for (size_t d = 0; d < p->n_dims; d++) {
                b->dst_offset[d] = from[d] - slice->global_offset[d];
                b->src_axis[d] = ps->axis_of[d];
                if (ps->axis_of[d] != CHECKPOINT_NO_AXIS) {
                        b->src_offset[ps->axis_of[d]] = from[d];
                        b->src_extent[ps->axis_of[d]] = extent[d];
                }
        }
        b->tensor = strdup(ps->name);
        if (!b->tensor)
                return -ENOMEM;
        (*n)++;
        return 0;
}

/* One stack index (or the one tensor set of an unstacked source). */
static int plan_index(const CheckpointSource *src, const char *prefix, const ParameterLayout *p,
                      const ShardSlice *slice, int64_t index, CheckpointShapeFunc shape_of,
                      void *userdata, CheckpointBlock **blocks, size_t *n_blocks,
                      FamilyError *ret_error) {
        PartSource ps[CHECKPOINT_PARTS_MAX] = {};
        int64_t from[FAMILYD_MAX_SHAPE_RANK], extent[FAMILYD_MAX_SHAPE_RANK], at = 0;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < src->n_parts; i++)
                r = part_source(src, &src->parts[i], prefix, p, index, shape_of, userdata, &ps[i],
                                ret_error);
        if (r >= 0 && src->concat) {
                int64_t total = 0, cd = src->concat_dim;
                for (size_t i = 0; i < src->n_parts; i++)
                        total += ps[i].shape[ps[i].axis_of[cd]];
                if (total != p->shape[cd])
                        r = family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                             "CHECKPOINT_SHAPE", NULL,
                                             "parameter '%s': its %zu checkpoint tensors joined "
                                             "along dimension %" PRId64 " have %" PRId64 ", not %"
                                             PRId64, p->name, src->n_parts, cd, total,
                                             p->shape[cd]);
        }
        for (size_t i = 0; r >= 0 && i < src->n_parts; i++) {
                int64_t part_extent = src->concat ? ps[i].shape[ps[i].axis_of[src->concat_dim]] : 0;
                bool skip = false;
                for (size_t d = 0; d < p->n_dims; d++) {
                        from[d] = slice->global_offset[d];
                        extent[d] = slice->local_shape[d];
                        if (src->stack && (int64_t) d == src->stack_dim) {
                                from[d] = index;
                                extent[d] = 1;
                        } else if (src->concat && (int64_t) d == src->concat_dim) {
                                /* The part covers [at, at + part_extent) of the dimension. */
                                int64_t lo = from[d] > at ? from[d] : at;
                                int64_t hi = from[d] + extent[d] < at + part_extent
                                                     ? from[d] + extent[d] : at + part_extent;
                                skip = hi <= lo;
                                from[d] = lo, extent[d] = hi - lo;
                        }
                }
                if (!skip) {
                        /* In the part's coordinates along the concat dimension. */
                        int64_t saved = 0;
                        if (src->concat) {
                                saved = from[src->concat_dim];
                                from[src->concat_dim] -= at;
                        }
                        r = block_add(blocks, n_blocks, &ps[i], p, slice, from, extent);
                        if (r >= 0 && src->concat)
                                (*blocks)[*n_blocks - 1].dst_offset[src->concat_dim] =
                                        saved - slice->global_offset[src->concat_dim];
                }
                at += part_extent;
        }
        for (size_t i = 0; i < src->n_parts; i++)
                free(ps[i].name);
        return r;
}

int checkpoint_plan_slice(const CheckpointSource *src, const char *prefix,
                          const ParameterLayout *p, const ShardSlice *slice,
                          CheckpointShapeFunc shape_of, void *userdata, CheckpointBlock **blocks,
                          size_t *n_blocks, FamilyError *ret_error) {
        int64_t first = 0, count = 1;
        int r;

        for (size_t d = 0; d < slice->n_dims; d++)
                if (slice->local_shape[d] == 0)
                        return 0;
        if (src->stack) {
                first = slice->global_offset[src->stack_dim];
                count = slice->local_shape[src->stack_dim];
        }
        for (int64_t i = first; i < first + count; i++) {
                r = plan_index(src, prefix, p, slice, i, shape_of, userdata, blocks, n_blocks,
                               ret_error);
                if (r < 0)
                        return r;
        }
        return 0;
}
