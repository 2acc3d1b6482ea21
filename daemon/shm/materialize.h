/* materialize.h: one rank's shard segment, filled with its slices of every parameter. */
#pragma once

#include "build-plan.h"
#include "fill.h"
#include "layout.h"
#include "segment.h"

/*
 * Creates a sealed host segment of the rank's size and fills each non-empty slice with the
 * values of semantics.md Build 6 (fill.c), on all cores; the daemon's mapping is dropped
 * afterwards. The rank must hold bytes (size_bytes > 0).
 */
int materialize_rank(const BuildPlan *plan, const Layout *layout, const RankLayout *rank,
                     Dtype dtype, uint64_t seed, int device, ShardSegment **ret);
