/* cuda-fill-params.h: a slice of a rank as the fill kernel's parameters (pure; unit-tested). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "cuda-fill-kernel.h"
#include "materialize.h"

/*
 * The kernel's parameters for slice m of a shard mapped at base (a device address): its
 * destination, element count, the walk of fill.c (the dimensions the slice does not span
 * fully, the contiguous run after them), the Philox key and name hash, and the value bits
 * (constant patterns: the float32 value; uniform: low and high - low, in float32 as fill.c
 * computes them). False when the kernel cannot write it: a normal init, or a walk deeper than
 * FK_RANK_MAX dimensions; such a slice is filled through host memory.
 */
bool cuda_fill_kernel_params(const MaterializeSlice *m, uint64_t base, FillKernelParams *p);
