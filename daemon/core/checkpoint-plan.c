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

/* Appends one box: per parameter axis, where it starts in the source (in the part's own
 * coordinates), where it lands in the slice, and its extent. */
static int block_add(CheckpointBlock **blocks, size_t *n, const PartSource *ps,
                     const ParameterLayout *p, const int64_t *src_from, const int64_t *dst_at,
                     const int64_t *extent) {
        CheckpointBlock *b, *grown = realloc(*blocks, (*n + 1) * sizeof **blocks);

        if (!grown)
                return -ENOMEM;
        *blocks = grown;
        b = &grown[*n];
        *b = (CheckpointBlock) { .n_src_dims = ps->n_dims };
        for (size_t d = 0; d < p->n_dims; d++) {
                b->dst_offset[d] = dst_at[d];
                b->src_axis[d] = ps->axis_of[d];
                if (ps->axis_of[d] != CHECKPOINT_NO_AXIS) {
                        b->src_offset[ps->axis_of[d]] = src_from[d];
                        b->src_extent[ps->axis_of[d]] = extent[d];
                }
        }
        b->tensor = strdup(ps->name);
        if (!b->tensor)
                return -ENOMEM;
        (*n)++;
        return 0;
}

/* Into how many pieces the mesh cuts dimension d: the product of the sizes of the axes that
 * shard it (nested shards multiply), 1 when none does. */
static int64_t shard_count(const ParameterLayout *p, int64_t d) {
        int64_t g = 1;

        for (size_t i = 0; i < p->n_placements; i++)
                if (p->placements[i].kind == PLACEMENT_SHARD && p->placements[i].dim == d)
                        g *= p->axis_size[i];
        return g;
}

/* Checks the parts of a concatenated source against the parameter: their extents along the
 * concat dimension add up to the parameter's, and each splits into g equal groups. */
static int concat_check(const CheckpointSource *src, const ParameterLayout *p,
                        const PartSource *ps, int64_t g, FamilyError *ret_error) {
        int64_t total = 0, cd = src->concat_dim;

        for (size_t i = 0; i < src->n_parts; i++)
                total += ps[i].shape[ps[i].axis_of[cd]];
        if (total != p->shape[cd])
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "CHECKPOINT_SHAPE", NULL,
                                        "parameter '%s': its %zu checkpoint tensors joined along "
                                        "dimension %" PRId64 " have %" PRId64 ", not %" PRId64,
                                        p->name, src->n_parts, cd, total, p->shape[cd]);
        for (size_t i = 0; i < src->n_parts; i++) {
                int64_t e = ps[i].shape[ps[i].axis_of[cd]];
                if (e % g != 0)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "CHECKPOINT_SHAPE", NULL,
                                                "parameter '%s': checkpoint tensor '%s' has %"
                                                PRId64 " along the concatenated dimension %"
                                                PRId64 ", which the mesh shards into %" PRId64
                                                " pieces; each part must split evenly into them",
                                                p->name, ps[i].name, e, cd, g);
        }
        return 0;
}

/*
 * The runs of a concatenated source that fill [lo, hi) of the concat dimension. The dimension
 * is g groups of G = extent / g; group k is each part's k-th 1/g in order (part i gives c_i =
 * extent_i / g rows, from row k * c_i of its tensor). With g = 1 this is the plain join.
 */
static int plan_concat(const CheckpointSource *src, const ParameterLayout *p,
                       const ShardSlice *slice, const PartSource *ps, int64_t g,
                       int64_t *src_from, int64_t *dst_at, int64_t *extent,
                       CheckpointBlock **blocks, size_t *n_blocks) {
        int64_t cd = src->concat_dim, G = p->shape[cd] / g;
        int64_t lo = slice->global_offset[cd], hi = lo + slice->local_shape[cd];
        int r;

        if (G == 0) /* an empty dimension: a slice of it is empty too */
                return 0;
        for (int64_t k = lo / G; k < g && k * G < hi; k++) {
                int64_t at = k * G;
                for (size_t i = 0; i < src->n_parts; i++) {
                        int64_t c = ps[i].shape[ps[i].axis_of[cd]] / g;
                        int64_t a = lo > at ? lo : at, b = hi < at + c ? hi : at + c;
                        if (a < b) {
                                src_from[cd] = k * c + (a - at);
                                dst_at[cd] = a - lo;
                                extent[cd] = b - a;
                                r = block_add(blocks, n_blocks, &ps[i], p, src_from, dst_at,
                                              extent);
                                if (r < 0)
                                        return r;
                        }
                        at += c;
                }
        }
        return 0;
}

/* One stack index (or the one tensor set of an unstacked source). */
static int plan_index(const CheckpointSource *src, const char *prefix, const ParameterLayout *p,
                      const ShardSlice *slice, int64_t index, CheckpointShapeFunc shape_of,
                      void *userdata, CheckpointBlock **blocks, size_t *n_blocks,
                      FamilyError *ret_error) {
        PartSource ps[CHECKPOINT_PARTS_MAX] = {};
        int64_t src_from[FAMILYD_MAX_SHAPE_RANK], dst_at[FAMILYD_MAX_SHAPE_RANK],
                extent[FAMILYD_MAX_SHAPE_RANK], g = 1;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < src->n_parts; i++)
                r = part_source(src, &src->parts[i], prefix, p, index, shape_of, userdata, &ps[i],
                                ret_error);
        if (r >= 0 && src->concat) {
                g = shard_count(p, src->concat_dim);
                r = concat_check(src, p, ps, g, ret_error);
        }
        if (r >= 0) {
                for (size_t d = 0; d < p->n_dims; d++) {
                        src_from[d] = slice->global_offset[d];
                        dst_at[d] = 0;
                        extent[d] = slice->local_shape[d];
                        if (src->stack && (int64_t) d == src->stack_dim) {
                                src_from[d] = index;
                                dst_at[d] = index - slice->global_offset[d];
                                extent[d] = 1;
                        }
                }
                if (src->concat)
                        r = plan_concat(src, p, slice, ps, g, src_from, dst_at, extent, blocks,
                                        n_blocks);
                else
                        r = block_add(blocks, n_blocks, &ps[0], p, src_from, dst_at, extent);
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
