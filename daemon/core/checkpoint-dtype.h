/* checkpoint-dtype.h: a checkpoint tensor's elements converted to a parameter's dtype, exactly or by a stated rounding. */
#pragma once

#include <stddef.h>

#include "common/safetensors.h"
#include "fill.h"

/*
 * DESIGN
 *
 * What converts (checkpoint dtype -> parameter dtype):
 *   the same type                      bytes copied;
 *   BF16, F16 -> float32               exact;
 *   F32 -> bfloat16, float16           round to nearest even (fill.h's conversions: the same
 *                                      bits as torch's .to());
 *   F64 -> float32                     round to nearest even (C's conversion);
 *   F16 -> bfloat16                    exact to float32, then rounded once to nearest even.
 * Refused with a sentence: every integer, bool and 8-bit or smaller float type, complex, and
 * the conversions that would round twice or overflow (F64 -> bfloat16 or float16, BF16 ->
 * float16, whose range is smaller).
 */

/* 0 when from converts to to; -EINVAL with why ("BF16 cannot become float16: ...") otherwise. */
int checkpoint_dtype_check(SafetensorsDtype from, Dtype to, char *why, size_t why_size);

/* Whether from is to's own type: its elements convert by copying their bytes. */
bool checkpoint_dtype_same(SafetensorsDtype from, Dtype to);

/* n elements of from at src as to at dst (both unaligned-safe); from -> to must check. */
void checkpoint_dtype_convert(SafetensorsDtype from, Dtype to, const void *src, void *dst,
                              size_t n);
