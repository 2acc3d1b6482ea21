/* cuda-fill-params.c: a slice of a rank as the fill kernel's parameters. */
#include <string.h>

#include "cuda-fill-params.h"

_Static_assert(sizeof(FillKernelParams) == 264, "the kernel's parameter block (cuda-fill.ptx)");
_Static_assert((int) DTYPE_FLOAT32 == FK_DTYPE_FLOAT32 && (int) DTYPE_BFLOAT16 == FK_DTYPE_BFLOAT16 &&
                       (int) DTYPE_FLOAT16 == FK_DTYPE_FLOAT16,
               "fill.h's Dtype values are the kernel's");

bool cuda_fill_kernel_params(const MaterializeSlice *m, uint64_t base, FillKernelParams *p) {
        const FillSlice *s = &m->fill;
        const FillSpec *spec = &m->spec;
        uint64_t stride = 1, n = 1;
        size_t c = 0;

        if (spec->kind != INIT_ZEROS && spec->kind != INIT_ONES && spec->kind != INIT_CONSTANT &&
            spec->kind != INIT_UNIFORM)
                return false;
        if (s->rank > FILL_RANK_MAX)
                return false;

        *p = (FillKernelParams) {
                .dst = base + m->byte_offset,
                .kind = spec->kind == INIT_UNIFORM ? FK_KIND_UNIFORM : FK_KIND_PATTERN,
                .dtype = (FkU32) spec->dtype,
                .k0 = (FkU32) spec->seed,
                .k1 = (FkU32) (spec->seed >> 32),
                .h = spec->name_hash,
        };
        uint64_t strides[FILL_RANK_MAX];
        for (size_t d = s->rank; d-- > 0;) {
                strides[d] = stride;
                stride *= (uint64_t) s->shape[d];
                n *= (uint64_t) s->local_shape[d];
        }
        /* The last dimension the slice does not span; those after it are one run (fill.c). */
        for (size_t d = s->rank; d-- > 0;)
                if (s->local_shape[d] != s->shape[d]) {
                        c = d;
                        break;
                }
        if (c > FK_RANK_MAX)
                return false;
        p->n = n;
        p->n_outer = (FkU32) c;
        p->inner = s->rank > 0 ? (uint64_t) s->local_shape[c] * strides[c] : 1;
        p->run_offset = s->rank > 0 ? (uint64_t) s->global_offset[c] * strides[c] : 0;
        for (size_t d = 0; d < c; d++) {
                p->local[d] = (uint64_t) s->local_shape[d];
                p->offset[d] = (uint64_t) s->global_offset[d];
                p->stride[d] = strides[d];
        }

        float v, low = (float) spec->a, high = (float) spec->b;
        switch (spec->kind) {
        case INIT_ZEROS:
                v = 0.0f;
                break;
        case INIT_ONES:
                v = 1.0f;
                break;
        case INIT_CONSTANT:
                v = (float) spec->a;
                break;
        default:
                v = low;
                break;
        }
        float span = high - low; /* fill.c's gen_params: float32 arithmetic */
        memcpy(&p->value_bits, &v, sizeof v);
        memcpy(&p->span_bits, &span, sizeof span);
        return p->inner > 0 || p->n == 0;
}
