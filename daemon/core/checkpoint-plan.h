/* checkpoint-plan.h: which boxes of which checkpoint tensors fill one shard slice of a parameter. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint-source.h"
#include "error.h"
#include "layout.h"
#include "resource-limits.h"

/*
 * DESIGN
 *
 * A slice of a parameter (its global offset and local shape, layout.h) is filled from
 * checkpoint tensors as its CheckpointSource says. The plan is pure: it names, for the slice,
 * each source tensor and the box of it that the slice needs (offsets and extents in the
 * tensor's own coordinates), and where that box lands in the slice (offsets in the slice's
 * local coordinates, and which source axis each of the parameter's axes reads: a transpose
 * swaps the last two; a stacked axis reads none, extent 1). A reader then turns boxes into byte
 * ranges (a box's innermost rows are contiguous in the file), reads them once, converts the
 * dtype and scatters.
 *
 * Concatenated sources are sharded before they are joined. When the mesh cuts the concat
 * dimension into g pieces (the product of the sizes of the parameter's axes that shard it; 1
 * when none does), that dimension is g equal groups, and group k is each part's k-th 1/g in
 * order: a tp rank's fused q/k/v block is [q_r; k_r; v_r], what the model's own sharded modules
 * hold, not a slice of the fused tensor. With g = 1 it is the plain join. The slice's range along
 * the concat dimension (any range: nested or hand-made slices may span groups) becomes runs of
 * (part, rows of that part, where they land), one box each, in the order of the dimension.
 *
 * Refused, with the tensor's and the parameter's names: a tensor the checkpoint lacks
 * (NOT_FOUND, CHECKPOINT_TENSOR_MISSING), one of another rank or shape than the parameter needs,
 * concatenated parts whose extents do not add up to the parameter's, or a part whose extent
 * along a sharded concat dimension is not a multiple of g (FAILED_PRECONDITION,
 * CHECKPOINT_SHAPE; every rank refuses alike, whichever parts its slice meets).
 */

#define CHECKPOINT_NO_AXIS SIZE_MAX

typedef struct CheckpointBlock {
        char *tensor;   /* the source tensor's name */
        size_t n_src_dims;
        int64_t src_offset[FAMILYD_MAX_SHAPE_RANK];
        int64_t src_extent[FAMILYD_MAX_SHAPE_RANK];
        /* Per parameter axis: where the box starts in the slice's local coordinates, and the
         * source axis it reads (CHECKPOINT_NO_AXIS: the stacked axis, one index). */
        int64_t dst_offset[FAMILYD_MAX_SHAPE_RANK];
        size_t src_axis[FAMILYD_MAX_SHAPE_RANK];
} CheckpointBlock;

void checkpoint_blocks_free(CheckpointBlock *b, size_t n);

/* A checkpoint tensor's shape by name: 0, or -ENOENT when the checkpoint has none so named,
 * -E2BIG when it has more than FAMILYD_MAX_SHAPE_RANK dimensions or one over INT64_MAX. */
typedef int (*CheckpointShapeFunc)(const char *name, size_t *ret_n_dims,
                                   int64_t ret_shape[static FAMILYD_MAX_SHAPE_RANK],
                                   void *userdata);

/*
 * The blocks that fill slice (of parameter p, whose source is src) for a request's prefix.
 * Blocks of an empty slice: none. Appends to *blocks (*n_blocks entries, reallocated).
 */
int checkpoint_plan_slice(const CheckpointSource *src, const char *prefix,
                          const ParameterLayout *p, const ShardSlice *slice,
                          CheckpointShapeFunc shape_of, void *userdata, CheckpointBlock **blocks,
                          size_t *n_blocks, FamilyError *ret_error);
