/* cuda-fill-kernel.h: one element of a shard fill on the GPU, in C that nvcc and gcc both compile. */
#pragma once

/*
 * DESIGN: the device fill (cuda-fill.cu, compiled to the PTX in cuda-fill.ptx) computes each
 * element with the functions below, and so do the unit test (against daemon/core/fill.c, the
 * reference) and the tests' fake driver (which runs launches of the kernel on the CPU). One
 * text, three compilers: what the tests prove of these functions holds for the kernel, short
 * of the CUDA compiler itself, which the GPU script checks (tests/gpu/).
 *
 * Bit-exactness (semantics.md, Build 6) rests on the same rules as fill.c: integers for
 * Philox and the dtype conversions, and for uniform only correctly rounded float32 products
 * and sums, never contracted: on the device __fmul_rn and __fadd_rn, which nvcc never fuses
 * into an FMA whatever -fmad says (the PTX is built with -fmad=false as well); here plain
 * operators with contraction off. Only constant patterns and uniform run on the device:
 * normal needs fill.c's float32 polynomials (no contraction) and is filled through host memory.
 */

#ifdef __CUDACC__
typedef unsigned int FkU32;
typedef unsigned short FkU16;
typedef unsigned long long FkU64;
#define FK_FN static __device__ __forceinline__
#define FK_FMUL(a, b) __fmul_rn((a), (b))
#define FK_FADD(a, b) __fadd_rn((a), (b))
#define FK_BITS_FLOAT(u) __uint_as_float(u)
#define FK_FLOAT_BITS(f) __float_as_uint(f)
#else
#include <stdint.h>
#include <string.h>
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif
typedef uint32_t FkU32;
typedef uint16_t FkU16;
typedef uint64_t FkU64;
#define FK_FN static inline
#define FK_FMUL(a, b) ((a) * (b))
#define FK_FADD(a, b) ((a) + (b))
static inline float fk_bits_float(FkU32 u) {
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
}
static inline FkU32 fk_float_bits(float f) {
        FkU32 u;
        memcpy(&u, &f, sizeof u);
        return u;
}
#define FK_BITS_FLOAT(u) fk_bits_float(u)
#define FK_FLOAT_BITS(f) fk_float_bits(f)
#endif

/* Dimensions a launch can walk; deeper slices are filled through host memory. */
#define FK_RANK_MAX 8

enum {
        FK_KIND_PATTERN = 0, /* zeros, ones, constant: every element value_bits */
        FK_KIND_UNIFORM = 1,
};

enum {
        FK_DTYPE_FLOAT32 = 0, /* the values of daemon/core/fill.h's Dtype */
        FK_DTYPE_BFLOAT16 = 1,
        FK_DTYPE_FLOAT16 = 2,
};

/*
 * One slice of one parameter, passed by value to the kernel (264 bytes): 8-byte members
 * first, then 4-byte ones, padded to a multiple of 8, so gcc and nvcc lay it out alike.
 * Global index of local element j: row = j / inner, o = j % inner, then
 * run_offset + o + sum over the outer dimensions d of (offset[d] + l[d]) * stride[d], l the
 * row unravelled over local[0..n_outer) (fill.c's walker, element by element).
 */
typedef struct FillKernelParams {
        FkU64 dst;        /* device address of the slice's first element */
        FkU64 n;          /* local elements */
        FkU64 inner;      /* elements per contiguous run, >= 1 */
        FkU64 run_offset; /* global index offset of a run's first element */
        FkU64 local[FK_RANK_MAX];
        FkU64 offset[FK_RANK_MAX];
        FkU64 stride[FK_RANK_MAX];
        FkU32 n_outer;
        FkU32 kind;
        FkU32 dtype;
        FkU32 k0, k1, h; /* Philox key (seed) and counter word 2 (the name's FNV-1a) */
        FkU32 value_bits; /* pattern: the float32 value; uniform: low */
        FkU32 span_bits;  /* uniform: (float) high - (float) low */
        FkU32 pad[2];
} FillKernelParams;

#define FK_PHILOX_M0 0xD2511F53u
#define FK_PHILOX_M1 0xCD9E8D57u
#define FK_PHILOX_W0 0x9E3779B9u
#define FK_PHILOX_W1 0xBB67AE85u

/* x0 of Philox4x32-10 for counter (lo32(i), hi32(i), h, 0) and key (k0, k1). */
FK_FN FkU32 fk_philox_x0(FkU64 i, FkU32 h, FkU32 k0, FkU32 k1) {
        FkU32 c0 = (FkU32) i, c1 = (FkU32) (i >> 32), c2 = h, c3 = 0;

        for (FkU32 r = 0; r < 10; r++) {
                FkU64 p0 = (FkU64) FK_PHILOX_M0 * c0;
                FkU64 p1 = (FkU64) FK_PHILOX_M1 * c2;
                FkU32 n0 = (FkU32) (p1 >> 32) ^ c1 ^ (k0 + r * FK_PHILOX_W0);
                FkU32 n2 = (FkU32) (p0 >> 32) ^ c3 ^ (k1 + r * FK_PHILOX_W1);
                c1 = (FkU32) p1;
                c3 = (FkU32) p0;
                c0 = n0;
                c2 = n2;
        }
        return c0;
}

/* float32 bits to bfloat16, round to nearest even; NaN stays a quiet NaN. */
FK_FN FkU16 fk_bf16(FkU32 b) {
        if ((b & 0x7fffffffu) > 0x7f800000u)
                return (FkU16) ((b >> 16) | 0x40u);
        return (FkU16) ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* float32 bits to float16, round to nearest even, overflow to infinity, subnormals exact. */
FK_FN FkU16 fk_f16(FkU32 b) {
        FkU32 sign = (b >> 16) & 0x8000u, x = b & 0x7fffffffu;

        if (x > 0x7f800000u)
                return (FkU16) (sign | 0x7e00u | ((x >> 13) & 0x3ffu));
        if (x >= 0x477ff000u)
                return (FkU16) (sign | 0x7c00u);
        if (x >= 0x38800000u) {
                FkU32 h = (x - 0x38000000u) >> 13, rem = x & 0x1fffu;
                h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
                return (FkU16) (sign | h);
        }
        if (x <= 0x33000000u)
                return (FkU16) sign;
        FkU32 e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, shift = 126u - e;
        FkU32 k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        k += rem > half || (rem == half && (k & 1u));
        return (FkU16) (sign | k);
}

/* The float32 uniform value of semantics.md for x0: low + span * ((x0 >> 8) * 2^-24). */
FK_FN FkU32 fk_uniform_bits(FkU32 x0, FkU32 low_bits, FkU32 span_bits) {
        /* (x0 >> 8) < 2^24: the conversion and the power-of-two scaling are exact. */
        float u = FK_FMUL((float) (int) (x0 >> 8), 0x1p-24f);
        float t = FK_FMUL(FK_BITS_FLOAT(span_bits), u);
        return FK_FLOAT_BITS(FK_FADD(FK_BITS_FLOAT(low_bits), t));
}

FK_FN FkU64 fk_global_index(const FillKernelParams *p, FkU64 j) {
        /* One run (a slice spanning every dimension after its first): no 64-bit division,
         * which GPUs do in software. */
        if (p->n_outer == 0)
                return p->run_offset + j;
        FkU64 row = j / p->inner, g = p->run_offset + j % p->inner;

        for (FkU32 d = p->n_outer; d-- > 0;) {
                FkU64 l = row % p->local[d];
                row /= p->local[d];
                g += (p->offset[d] + l) * p->stride[d];
        }
        return g;
}

/* The float32 bits of local element j. */
FK_FN FkU32 fk_value_bits(const FillKernelParams *p, FkU64 j) {
        if (p->kind != FK_KIND_UNIFORM)
                return p->value_bits;
        FkU32 x0 = fk_philox_x0(fk_global_index(p, j), p->h, p->k0, p->k1);
        return fk_uniform_bits(x0, p->value_bits, p->span_bits);
}

/* Stores local element j at dst (the slice's first element, as a host or device pointer). */
FK_FN void fk_store(const FillKernelParams *p, void *dst, FkU64 j) {
        FkU32 v = fk_value_bits(p, j);

        if (p->dtype == FK_DTYPE_FLOAT32)
                ((FkU32 *) dst)[j] = v;
        else
                ((FkU16 *) dst)[j] = p->dtype == FK_DTYPE_BFLOAT16 ? fk_bf16(v) : fk_f16(v);
}
