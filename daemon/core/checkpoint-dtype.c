/* checkpoint-dtype.c: a checkpoint tensor's elements converted to a parameter's dtype, exactly or by a stated rounding. */

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint-dtype.h"

int checkpoint_dtype_check(SafetensorsDtype from, Dtype to, char *why, size_t why_size) {
        const char *reason = NULL;

        switch (from) {
        case SAFETENSORS_F32:
        case SAFETENSORS_BF16:
                if (from == SAFETENSORS_BF16 && to == DTYPE_FLOAT16)
                        reason = "float16's range is smaller than bfloat16's";
                break;
        case SAFETENSORS_F16:
                break;
        case SAFETENSORS_F64:
                if (to != DTYPE_FLOAT32)
                        reason = "it would be rounded twice (through float32)";
                break;
        default:
                reason = "only F32, F64, BF16 and F16 tensors fill floating-point parameters";
                break;
        }
        if (!reason)
                return 0;
        (void) snprintf(why, why_size, "a %s tensor cannot become %s: %s",
                        strempty(safetensors_dtype_to_string(from)), dtype_to_string(to), reason);
        return -EINVAL;
}

static float load_float(SafetensorsDtype from, const uint8_t *p) {
        uint16_t h;
        float f;
        double d;

        switch (from) {
        case SAFETENSORS_F32:
                memcpy(&f, p, sizeof f);
                return f;
        case SAFETENSORS_F64:
                memcpy(&d, p, sizeof d);
                return (float) d;
        case SAFETENSORS_BF16:
                memcpy(&h, p, sizeof h);
                return bfloat16_to_float(h);
        default: /* F16: the only other that checks */
                memcpy(&h, p, sizeof h);
                return float16_to_float(h);
        }
}

bool checkpoint_dtype_same(SafetensorsDtype from, Dtype to) {
        return (from == SAFETENSORS_F32 && to == DTYPE_FLOAT32) ||
               (from == SAFETENSORS_BF16 && to == DTYPE_BFLOAT16) ||
               (from == SAFETENSORS_F16 && to == DTYPE_FLOAT16);
}

void checkpoint_dtype_convert(SafetensorsDtype from, Dtype to, const void *src, void *dst,
                              size_t n) {
        size_t in = safetensors_dtype_bits(from) / 8, out = dtype_size(to);
        const uint8_t *s = src;
        uint8_t *d = dst;

        if (checkpoint_dtype_same(from, to)) {
                memcpy(dst, src, n * out);
                return;
        }
        for (size_t i = 0; i < n; i++, s += in, d += out) {
                float f = load_float(from, s);
                uint16_t h;
                switch (to) {
                case DTYPE_FLOAT32:
                        memcpy(d, &f, sizeof f);
                        break;
                case DTYPE_BFLOAT16:
                        h = float_to_bfloat16(f);
                        memcpy(d, &h, sizeof h);
                        break;
                default:
                        h = float_to_float16(f);
                        memcpy(d, &h, sizeof h);
                        break;
                }
        }
}
