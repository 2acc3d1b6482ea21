/* materialize.h: one rank's slices of every parameter, as fills of its segment. */
#pragma once

#include "core/build-plan.h"
#include "core/fill.h"
#include "core/layout.h"
#include "segment.h"

/*
 * One non-empty slice of a rank: the values (docs/semantics.md, Build 6) and where they go,
 * relative to the rank's first byte. fill.spec points at spec; fill.dst is left NULL for the
 * backend to set (a host mapping, a staging buffer, or nothing for a device kernel).
 */
typedef struct MaterializeSlice {
        FillSpec spec;
        FillSlice fill;
        uint64_t byte_offset;
        uint64_t byte_length;
} MaterializeSlice;

/* The rank's non-empty slices in layout order, each parameter's values in its own dtype (the
 * layout's ParameterLayout.dtype): *ret (free() it) and *ret_n. */
int materialize_slices(const BuildPlan *plan, const Layout *layout, const RankLayout *rank,
                       uint64_t seed, MaterializeSlice **ret, size_t *ret_n);

/*
 * Fills a host segment (mapped, at least the rank's size: a memfd, or a file under
 * --state-dir) on all cores; its mapping is dropped afterwards. The host backend's fill.
 */
int materialize_host_fill(ShardSegment *seg, const MaterializeSlice *slices, size_t n);

/* The same, leaving the segment mapped (its bytes read again: fill-share.c). */
int materialize_host_write(ShardSegment *seg, const MaterializeSlice *slices, size_t n);
