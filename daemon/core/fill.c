/* fill.c: materialisation of parameter values (docs/semantics.md, Build step 6). */

/*
 * DESIGN
 *
 * Determinism. An element's bits depend on its global index only. The generators use integer
 * operations and the IEEE-754 float32 basic operations (+ - * sqrt, int<->float conversions),
 * which are correctly rounded: a scalar, SSE2, AVX2 or AVX-512 instruction gives the same bits.
 * Two things could break that and are ruled out here: contraction of a*b+c into an FMA (off for
 * this file by pragma, for GCC and clang; GCC ignores `#pragma STDC FP_CONTRACT`), so a CPU
 * without FMA computes the same, and libm, whose vector variants (libmvec) may round
 * differently from the scalar ones. So the normal init uses no libm at all: ln and cos are
 * float32 polynomials below, with exact argument reductions (error bound: docs/semantics.md,
 * measured by test-fill), and sqrt is the IEEE instruction. Nor -ffast-math: every operation
 * is evaluated as written.
 *
 * Speed. Values are produced per batch of up to FILL_BATCH global indices (a multiple of
 * FILL_BLOCK; a partial block computes padding lanes and drops them), one Philox call per element
 * as the spec requires, in two stages: Philox x0/x1 for the batch (AVX-512 or AVX2 intrinsics
 * on x86-64, chosen by CPU at run time, else portable C; integers, so all agree), then the
 * float stage in plain C that gcc vectorises (cloned for AVX2 and AVX-512 on x86-64 gcc by
 * ifunc; the default clone is SSE2). Every element goes through the same functions whatever its
 * slice. Contiguous runs of a slice are walked row by row; a batch inside one run needs no index
 * array at all (Philox adds the lane to the run's first index).
 *
 * Threads. fill_run() cuts the slices into chunks of FILL_CHUNK local elements. In the daemon
 * the chunks go to the fill pool (fill-pool.c: threads started once, shared round robin by the
 * fills under way, cancellable between chunks) bound to the Build's thread; without a pool
 * (tools, tests) threads started for the call take chunks from one atomic counter. A chunk
 * writes only its own bytes of dst, so the split never shows in the result.
 */

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common/populate.h"
#include "fill.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
        !defined(FILL_NO_CLONES)
/* Multiversioning (glibc ifunc): the vector width follows the CPU, the bits do not. */
#define _fill_clones_ __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define _fill_clones_
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(FILL_NO_INTRINSICS)
#include <immintrin.h>
#define FILL_X86_INTRINSICS 1
#else
#define FILL_X86_INTRINSICS 0
#endif

#define FILL_BLOCK 16            /* lanes per generator call; a multiple of every vector width */
#define FILL_BATCH 512           /* indices walked per generator call */
#define FILL_CHUNK (1u << 16)    /* local elements per thread work item */
#define FILL_THREADS_MAX 1024u

#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9)
#define PHILOX_W1 UINT32_C(0xBB67AE85)

static const char *const dtype_table[_DTYPE_MAX] = {
        [DTYPE_FLOAT32] = "float32",
        [DTYPE_BFLOAT16] = "bfloat16",
        [DTYPE_FLOAT16] = "float16",
};

Dtype dtype_from_string(const char *s) {
        static const struct {
                const char *name;
                Dtype dtype;
        } aliases[] = {
                { "f32", DTYPE_FLOAT32 },  { "fp32", DTYPE_FLOAT32 }, { "bf16", DTYPE_BFLOAT16 },
                { "f16", DTYPE_FLOAT16 },  { "fp16", DTYPE_FLOAT16 },
        };

        if (isempty(s))
                return DTYPE_FLOAT32;
        for (Dtype d = 0; d < _DTYPE_MAX; d++)
                if (streq(s, dtype_table[d]))
                        return d;
        for (size_t i = 0; i < ELEMENTSOF(aliases); i++)
                if (streq(s, aliases[i].name))
                        return aliases[i].dtype;
        return _DTYPE_INVALID;
}

const char *dtype_to_string(Dtype d) {
        if (d < 0 || d >= _DTYPE_MAX)
                return NULL;
        return dtype_table[d];
}

size_t dtype_size(Dtype d) {
        switch (d) {
        case DTYPE_FLOAT32:
                return 4;
        case DTYPE_BFLOAT16:
        case DTYPE_FLOAT16:
                return 2;
        default:
                return 0;
        }
}

uint32_t fnv1a32(const void *data, size_t n) {
        const unsigned char *p = data;
        uint32_t h = UINT32_C(0x811c9dc5);

        for (size_t i = 0; i < n; i++) {
                h ^= p[i];
                h *= UINT32_C(0x01000193);
        }
        return h;
}

uint32_t fnv1a32_string(const char *s) {
        s = strempty(s);
        return fnv1a32(s, strlen(s));
}

static inline __attribute__((always_inline)) void philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
        uint64_t p0 = (uint64_t) PHILOX_M0 * c[0];
        uint64_t p1 = (uint64_t) PHILOX_M1 * c[2];

        c[0] = (uint32_t) (p1 >> 32) ^ c[1] ^ k0;
        c[1] = (uint32_t) p1;
        c[2] = (uint32_t) (p0 >> 32) ^ c[3] ^ k1;
        c[3] = (uint32_t) p0;
}

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t ret[4]) {
        uint32_t c[4] = { counter[0], counter[1], counter[2], counter[3] };
        uint32_t k0 = key[0], k1 = key[1];

        for (unsigned r = 0; r < 10; r++) {
                philox_round(c, k0, k1);
                k0 += PHILOX_W0;
                k1 += PHILOX_W1;
        }
        memcpy(ret, c, sizeof(c));
}

/*
 * x0 and x1 of Philox4x32-10 for counter (lo32(i), hi32(i), h, 0). The tenth round needs only
 * the M1 product: x0 = hi(M1 * c2) ^ c1 ^ k0, x1 = lo(M1 * c2).
 */
static inline __attribute__((always_inline)) void philox_x0x1(uint64_t i, uint32_t h, uint32_t k0,
                                                             uint32_t k1, uint32_t *ret_x0,
                                                             uint32_t *ret_x1) {
        uint32_t c[4] = { (uint32_t) i, (uint32_t) (i >> 32), h, 0 };

        /* Unrolled by hand: at -O2 gcc keeps a loop here, and a loop inside the lane loop stops
         * vectorisation. */
#define R(r) philox_round(c, k0 + (r) * PHILOX_W0, k1 + (r) * PHILOX_W1)
        R(0); R(1); R(2); R(3); R(4); R(5); R(6); R(7); R(8);
#undef R

        uint64_t p1 = (uint64_t) PHILOX_M1 * c[2];
        *ret_x0 = (uint32_t) (p1 >> 32) ^ c[1] ^ (k0 + 9 * PHILOX_W0);
        *ret_x1 = (uint32_t) p1;
}

static inline uint32_t float_bits(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        return u;
}

static inline float bits_float(uint32_t u) {
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
}

static inline uint16_t bf16_from_bits(uint32_t b) {
        uint16_t r = (uint16_t) ((b + UINT32_C(0x7fff) + ((b >> 16) & 1)) >> 16);
        /* NaN: keep sign and top payload bits, force quiet (rounding could carry into inf). */
        return (b & UINT32_C(0x7fffffff)) > UINT32_C(0x7f800000) ? (uint16_t) ((b >> 16) | 0x40) : r;
}

uint16_t float_to_bfloat16(float f) {
        return bf16_from_bits(float_bits(f));
}

static inline uint16_t f16_from_bits(uint32_t b) {
        uint32_t sign = (b >> 16) & 0x8000;
        uint32_t x = b & UINT32_C(0x7fffffff);

        if (x > UINT32_C(0x7f800000)) /* NaN: quiet, top payload bits kept */
                return (uint16_t) (sign | 0x7e00 | ((x >> 13) & 0x3ff));
        if (x >= UINT32_C(0x477ff000)) /* >= 65520 (incl. inf) rounds to inf */
                return (uint16_t) (sign | 0x7c00);
        if (x >= UINT32_C(0x38800000)) { /* normal: rebias 127 -> 15, round 13 bits away */
                uint32_t h = (x - UINT32_C(0x38000000)) >> 13;
                uint32_t rem = x & 0x1fff;
                h += rem > 0x1000 || (rem == 0x1000 && (h & 1));
                return (uint16_t) (sign | h);
        }
        if (x <= UINT32_C(0x33000000)) /* <= 2^-25: to zero (2^-25 ties to even 0) */
                return (uint16_t) sign;
        /* Subnormal: value = k * 2^-24, k = m >> (126 - e); shift is 14..24 here. */
        uint32_t e = x >> 23, m = (x & UINT32_C(0x7fffff)) | UINT32_C(0x800000);
        uint32_t shift = 126 - e;
        uint32_t k = m >> shift, rem = m & ((UINT32_C(1) << shift) - 1), half = UINT32_C(1) << (shift - 1);
        k += rem > half || (rem == half && (k & 1));
        return (uint16_t) (sign | k);
}

uint16_t float_to_float16(float f) {
        return f16_from_bits(float_bits(f));
}

float bfloat16_to_float(uint16_t h) {
        return bits_float((uint32_t) h << 16);
}

float float16_to_float(uint16_t h) {
        uint32_t sign = (uint32_t) (h & 0x8000) << 16;
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;

        if (e == 0x1f)
                return bits_float(sign | UINT32_C(0x7f800000) | (m << 13));
        if (e == 0) {
                /* Subnormal or zero: m * 2^-24, exact in float32. */
                float v = (float) m * 0x1p-24f;
                return sign ? -v : v;
        }
        return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

int fill_spec_init(FillSpec *ret, InitKind kind, double a, double b, uint64_t seed, const char *name,
                   Dtype dtype) {
        return fill_spec_init4(ret, kind, (const double[4]) { a, b, 0, 0 }, seed, name, dtype);
}

/* Phi(x), the standard normal CDF, for the trunc_normal bounds (once per spec). */
static double normal_cdf(double x) {
        return 0.5 * erfc(-x * M_SQRT1_2);
}

int fill_spec_init4(FillSpec *ret, InitKind kind, const double numbers[4], uint64_t seed, const char *name,
                    Dtype dtype) {
        if (!ret || !numbers || kind < 0 || kind >= _INIT_KIND_MAX || dtype < 0 || dtype >= _DTYPE_MAX)
                return -EINVAL;
        *ret = (FillSpec) {
                .kind = kind,
                .a = numbers[0],
                .b = numbers[1],
                .c = numbers[2],
                .d = numbers[3],
                .seed = seed,
                .name_hash = fnv1a32_string(name),
                .dtype = dtype,
                .sign = 1,
        };
        if (kind == INIT_TRUNC_NORMAL) {
                double mean = numbers[0], std = numbers[1];

                if (!(std > 0) || !(numbers[2] < numbers[3]) || !isfinite(std) || !isfinite(mean))
                        return -EINVAL;
                double alpha = (numbers[2] - mean) / std, beta = (numbers[3] - mean) / std;
                /* Bounds above the mean are mirrored below it, where Phi has its precision. */
                if (alpha > 0) {
                        double t = -beta;
                        beta = -alpha;
                        alpha = t;
                        ret->sign = -1;
                }
                ret->cdf_low = normal_cdf(alpha);
                ret->cdf_span = normal_cdf(beta) - ret->cdf_low;
        }
        return 0;
}

/* ---- Generators: a batch of indices in, float32 values out. ---- */

typedef struct GenParams {
        uint32_t k0, k1, h;
        float low, span; /* uniform: low, (float) high - (float) low */
        float mean, std;  /* normal: rounded to float32 */
        /* trunc_normal, in double: mean, sign * std, Phi at the (mirrored) lower bound and the
         * span to the upper; the bounds rounded to float32 clamp the result. */
        double t_mean, t_scale, cdf_low, cdf_span;
        float t_low, t_high;
} GenParams;

static GenParams gen_params(const FillSpec *spec) {
        float low = (float) spec->a, high = (float) spec->b;

        return (GenParams) {
                .k0 = (uint32_t) spec->seed,
                .k1 = (uint32_t) (spec->seed >> 32),
                .h = spec->name_hash,
                .low = low,
                .span = high - low,
                .mean = (float) spec->a,
                .std = (float) spec->b,
                .t_mean = spec->a,
                .t_scale = spec->sign * spec->b,
                .cdf_low = spec->cdf_low,
                .cdf_span = spec->cdf_span,
                .t_low = (float) spec->c,
                .t_high = (float) spec->d,
        };
}

/* ---- Stage 1: Philox x0, x1 for a batch of indices. ---- */

static void philox_batch_c(const GenParams *p, const uint64_t *restrict idx, uint64_t first, size_t n,
                           uint32_t *restrict x0, uint32_t *restrict x1) {
        for (size_t j = 0; j < n; j++)
                philox_x0x1(idx ? idx[j] : first + j, p->h, p->k0, p->k1, &x0[j], &x1[j]);
}

#if FILL_X86_INTRINSICS
/*
 * Counter words live in 64-bit lanes, only their low 32 bits meaningful: vpmuludq reads the low
 * halves and yields the full 64-bit product, so a round is two multiplies, two shifts and two
 * three-way xors with no shuffles (gcc's own vectorisation of the C widens to 64x64 multiplies
 * on AVX-512, three times the work). Lane 0 of idx is i itself: low half lo32(i), and
 * hi32(i) is i >> 32. n is a multiple of 8. The indices are idx[0..n), or first + [0, n) when idx
 * is NULL (a contiguous run: no index array to write and read back).
 */
__attribute__((target("avx512f"))) static void philox_batch_avx512(const GenParams *p,
                                                                   const uint64_t *restrict idx,
                                                                   uint64_t first, size_t n,
                                                                   uint32_t *restrict x0,
                                                                   uint32_t *restrict x1) {
        const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
        const __m512i c2_0 = _mm512_set1_epi64(p->h), lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        __m512i k0[10], k1[10];

        for (uint32_t r = 0; r < 10; r++) {
                k0[r] = _mm512_set1_epi64(p->k0 + r * PHILOX_W0);
                k1[r] = _mm512_set1_epi64(p->k1 + r * PHILOX_W1);
        }
        for (size_t j = 0; j < n; j += 8) {
                __m512i c0 = idx ? _mm512_loadu_si512(idx + j)
                                 : _mm512_add_epi64(_mm512_set1_epi64((long long) (first + j)), lanes);
                __m512i c1 = _mm512_srli_epi64(c0, 32);
                __m512i c2 = c2_0, c3 = _mm512_setzero_si512();

                for (unsigned r = 0; r < 9; r++) {
                        __m512i p0 = _mm512_mul_epu32(c0, m0), p1 = _mm512_mul_epu32(c2, m1);
                        c0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1, k0[r], 0x96);
                        c1 = p1;
                        c2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3, k1[r], 0x96);
                        c3 = p0;
                }
                __m512i p1 = _mm512_mul_epu32(c2, m1);
                __m512i r0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1, k0[9], 0x96);
                _mm256_storeu_si256((__m256i *) (x0 + j), _mm512_cvtepi64_epi32(r0));
                _mm256_storeu_si256((__m256i *) (x1 + j), _mm512_cvtepi64_epi32(p1));
        }
}

__attribute__((target("avx2"))) static inline __m128i low_halves_avx2(__m256i v) {
        return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
}

/* Two vectors of four lanes per step: a round is a chain of multiply, shift and xors that one
 * vector alone leaves mostly waiting on the multiply's latency. */
__attribute__((target("avx2"))) static void philox_batch_avx2(const GenParams *p, const uint64_t *restrict idx,
                                                              uint64_t first, size_t n, uint32_t *restrict x0,
                                                              uint32_t *restrict x1) {
        const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
        const __m256i c2_0 = _mm256_set1_epi64x(p->h), lanes = _mm256_setr_epi64x(0, 1, 2, 3);
        const __m256i four = _mm256_set1_epi64x(4);
        __m256i k0[10], k1[10];

        for (uint32_t r = 0; r < 10; r++) {
                k0[r] = _mm256_set1_epi64x(p->k0 + r * PHILOX_W0);
                k1[r] = _mm256_set1_epi64x(p->k1 + r * PHILOX_W1);
        }
        for (size_t j = 0; j < n; j += 8) {
                __m256i a0 = idx ? _mm256_loadu_si256((const __m256i *) (idx + j))
                                 : _mm256_add_epi64(_mm256_set1_epi64x((long long) (first + j)), lanes);
                __m256i b0 = idx ? _mm256_loadu_si256((const __m256i *) (idx + j + 4))
                                 : _mm256_add_epi64(a0, four);
                __m256i a1 = _mm256_srli_epi64(a0, 32), b1 = _mm256_srli_epi64(b0, 32);
                __m256i a2 = c2_0, b2 = c2_0, a3 = _mm256_setzero_si256(), b3 = a3;

                for (unsigned r = 0; r < 9; r++) {
                        __m256i pa0 = _mm256_mul_epu32(a0, m0), pa1 = _mm256_mul_epu32(a2, m1);
                        __m256i pb0 = _mm256_mul_epu32(b0, m0), pb1 = _mm256_mul_epu32(b2, m1);
                        a0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa1, 32), a1), k0[r]);
                        b0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb1, 32), b1), k0[r]);
                        a1 = pa1;
                        b1 = pb1;
                        a2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa0, 32), a3), k1[r]);
                        b2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb0, 32), b3), k1[r]);
                        a3 = pa0;
                        b3 = pb0;
                }
                __m256i pa1 = _mm256_mul_epu32(a2, m1), pb1 = _mm256_mul_epu32(b2, m1);
                __m256i ra = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa1, 32), a1), k0[9]);
                __m256i rb = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb1, 32), b1), k0[9]);
                _mm_storeu_si128((__m128i *) (x0 + j), low_halves_avx2(ra));
                _mm_storeu_si128((__m128i *) (x0 + j + 4), low_halves_avx2(rb));
                _mm_storeu_si128((__m128i *) (x1 + j), low_halves_avx2(pa1));
                _mm_storeu_si128((__m128i *) (x1 + j + 4), low_halves_avx2(pb1));
        }
}
#endif

/* n is a multiple of FILL_BLOCK; idx NULL: first + [0, n). Every path computes the same integers. */
static void philox_batch(const GenParams *p, const uint64_t *idx, uint64_t first, size_t n, uint32_t *x0,
                         uint32_t *x1) {
#if FILL_X86_INTRINSICS
        if (__builtin_cpu_supports("avx512f")) {
                philox_batch_avx512(p, idx, first, n, x0, x1);
                return;
        }
        if (__builtin_cpu_supports("avx2")) {
                philox_batch_avx2(p, idx, first, n, x0, x1);
                return;
        }
#endif
        philox_batch_c(p, idx, first, n, x0, x1);
}

/* ---- Stage 2: values from the bits. ---- */

_fill_clones_ static void uniform_from_bits(const GenParams *p, const uint32_t *restrict x0, size_t n,
                                            float *restrict out) {
        const float low = p->low, span = p->span;

        /* Blocks of a fixed count: gcc -O2 (very cheap cost model) vectorises only those. */
        for (size_t b = 0; b < n; b += FILL_BLOCK, x0 += FILL_BLOCK, out += FILL_BLOCK)
                for (size_t j = 0; j < FILL_BLOCK; j++) {
                        /* (x0 >> 8) < 2^24: exact in float32, and so is the scaling by 2^-24. */
                        float u = (float) (int32_t) (x0[j] >> 8) * 0x1p-24f;
                        float t = span * u;
                        out[j] = low + t;
                }
}

/*
 * -2 ln(n * 2^-24) for n in [1, 2^24], in float32. n = 2^(k + 24) * f with f in about
 * [sqrt(1/2), sqrt(2)) (halved above float32 sqrt(2) exactly), taken from the bits of (float) n
 * (exact); t = f - 1 is exact (Sterbenz) and
 * ln f = t + t^2 * Q(t), Q a degree-8 fit of (ln(1 + t) - t) / t^2 on [sqrt(1/2) - 1, sqrt(2) - 1]
 * with float32 coefficients (|error| < 3.1e-8, so < 1.3e-8 relative in ln f): relative accuracy
 * near u = 1, where ln u is t itself. k ln 2 is split Cody-Waite style: k * LN2_HI is exact
 * (LN2_HI has 17 significant bits, |k| <= 24).
 */
#define LN2_HI 0x1.62e300p-1f /* 0.693138122558593750 */
#define LN2_LO 0x1.2fefa4p-17f /* ln 2 - LN2_HI, rounded */

static inline __attribute__((always_inline)) float minus_two_ln_u(uint32_t n) {
        uint32_t bits = float_bits((float) (int32_t) n);
        uint32_t mant = bits & UINT32_C(0x7fffff);
        /* The reduction in integers (sqrt(2) is 0x3fb504f3): gcc if-converts integer selects at
         * every vector width, while a select between f and f * 0.5 stays a branch ("could trap"). */
        uint32_t big = mant > UINT32_C(0x3504f3);
        float k = (float) ((int32_t) (bits >> 23) - 127 - 24 + (int32_t) big);
        float t = bits_float(mant | (big ? UINT32_C(0x3f000000) : UINT32_C(0x3f800000))) - 1.0f;

        float q = -0x1.4136acp-4f;
        q = q * t + 0x1.069f1ap-3f;
        q = q * t - 0x1.0c8b34p-3f;
        q = q * t + 0x1.229882p-3f;
        q = q * t - 0x1.548196p-3f;
        q = q * t + 0x1.99a3b6p-3f;
        q = q * t - 0x1.00022cp-2f;
        q = q * t + 0x1.55554ep-2f;
        q = q * t - 0x1.fffffep-2f;
        float t2 = t * t;
        float lo = t2 * q + k * LN2_LO;
        float ln_u = k * LN2_HI + (t + lo);
        return -2.0f * ln_u;
}

/*
 * cos(2 pi m 2^-24) for m in [0, 2^24), in float32, as sin((pi/2) g): cos(2 pi u) =
 * sin((pi/2) (1 - 4u)), and sin((pi/2) x) = sin((pi/2) (-2 - x)) folds 1 - 4u from (-3, 1] into
 * [-1, 1]. Both steps are exact in integers (4u is m in units of 2^-22), so g = T 2^-22 is exact,
 * and the zeros of cos (u = 1/4, 3/4) are g = 0 exactly: the value stays relatively accurate
 * next to them. sin((pi/2) g) = g * S(g^2), S a degree-4 fit of sin((pi/2) sqrt(y)) / sqrt(y) on
 * [0, 1] with float32 coefficients (|error| < 4.4e-8, the rounding of pi/2 itself).
 */
static inline __attribute__((always_inline)) float cos_two_pi_u(uint32_t m) {
        int32_t t = (INT32_C(1) << 22) - (int32_t) m;
        t = t < -(INT32_C(1) << 22) ? -(INT32_C(1) << 23) - t : t;
        float g = (float) t * 0x1p-22f;
        float y = g * g;

        float s = 0x1.413080p-13f;
        s = s * y - 0x1.328aeep-8f;
        s = s * y + 0x1.466b8ap-4f;
        s = s * y - 0x1.4abbdap-1f;
        s = s * y + 0x1.921fb6p+0f;
        return g * s;
}

/*
 * sqrt is correctly rounded (IEEE), so every width agrees. Declared const here (never given a
 * negative, it never sets errno): without that GCC keeps a libm call on the errno path next to
 * the instruction, which stops vectorising, and `#pragma GCC optimize("no-math-errno")` does not
 * reach builtins. So the compilers emit sqrtss/vsqrtps; a call, if one ever remained (-O0), goes
 * to libm's sqrtf, correctly rounded too.
 */
extern float sqrtf(float t) __attribute__((const, nothrow, leaf));

static inline __attribute__((always_inline)) float normal_value(float mean, float std, uint32_t x0,
                                                                uint32_t x1) {
        float rad = sqrtf(minus_two_ln_u((x0 >> 8) + 1));
        float z = rad * cos_two_pi_u(x1 >> 8);
        float t = std * z;
        return mean + t;
}

_fill_clones_ static void normal_from_bits(const GenParams *p, const uint32_t *restrict x0,
                                           const uint32_t *restrict x1, size_t n, float *restrict out) {
        const float mean = p->mean, std = p->std;

        for (size_t b = 0; b < n; b += FILL_BLOCK, x0 += FILL_BLOCK, x1 += FILL_BLOCK, out += FILL_BLOCK)
                for (size_t j = 0; j < FILL_BLOCK; j++)
                        out[j] = normal_value(mean, std, x0[j], x1[j]);
}

void fill_normal_from_bits(float mean, float std, const uint32_t *x0, const uint32_t *x1, size_t n,
                           float *out) {
        GenParams p = { .mean = mean, .std = std };
        size_t whole = n / FILL_BLOCK * FILL_BLOCK;
        uint32_t y0[FILL_BLOCK] = {}, y1[FILL_BLOCK] = {};
        float v[FILL_BLOCK];

        normal_from_bits(&p, x0, x1, whole, out);
        if (whole == n)
                return;
        memcpy(y0, x0 + whole, (n - whole) * sizeof(uint32_t));
        memcpy(y1, x1 + whole, (n - whole) * sizeof(uint32_t));
        normal_from_bits(&p, y0, y1, FILL_BLOCK, v);
        memcpy(out + whole, v, (n - whole) * sizeof(float));
}

/*
 * trunc_normal: one uniform per element, u = (x0 + 1/2) 2^-32 (exact in double, in (0, 1)),
 * p = cdf_low + u cdf_span, z = Phi^-1(p), value mean + sign std z rounded to float32 and
 * clamped to [a, b] (as float32): the inverse CDF of torch.nn.init.trunc_normal_, with every
 * step an IEEE double operation (no FMA, no libm), so the bits never depend on the path.
 *
 * ln x for normal doubles x in (0, 1]: x = 2^e m, m in [sqrt(1/2), sqrt(2)), s = (m - 1) / (m + 1),
 * ln m = 2 s (1 + s^2/3 + s^4/5 + ... + s^16/17) (|s| < 0.172: the next term is below 3e-14
 * relative), ln x = e ln 2 + ln m.
 */
extern double sqrt(double t) __attribute__((const, nothrow, leaf));

static inline __attribute__((always_inline)) double ln_double(double x) {
        uint64_t bits;
        memcpy(&bits, &x, sizeof(bits));
        int64_t e = (int64_t) ((bits >> 52) & 0x7ff) - 1023;
        uint64_t mant = bits & UINT64_C(0xfffffffffffff);
        /* sqrt(2)'s mantissa bits: above them m is halved (exactly). */
        uint64_t big = mant > UINT64_C(0x6a09e667f3bcd);
        e += (int64_t) big;
        uint64_t mb = mant | (big ? UINT64_C(0x3fe0000000000000) : UINT64_C(0x3ff0000000000000));
        double m;
        memcpy(&m, &mb, sizeof(m));

        double s = (m - 1.0) / (m + 1.0);
        double s2 = s * s;
        double q = 1.0 / 17;
        q = q * s2 + 1.0 / 15;
        q = q * s2 + 1.0 / 13;
        q = q * s2 + 1.0 / 11;
        q = q * s2 + 1.0 / 9;
        q = q * s2 + 1.0 / 7;
        q = q * s2 + 1.0 / 5;
        q = q * s2 + 1.0 / 3;
        q = q * s2 + 1.0;
        double ln_m = 2.0 * s * q;
        return (double) e * 0x1.62e42fefa39efp-1 + ln_m;
}

/* Phi^-1(p) for p in (0, 1): P. J. Acklam's rational approximations (relative error below
 * 1.2e-9, far below float32's resolution), central region |p - 1/2| <= 0.47575, tails through
 * sqrt(-2 ln p). */
static inline __attribute__((always_inline)) double normal_quantile(double p) {
        const double p_low = 0.02425;

        if (p < p_low || p > 1.0 - p_low) {
                double t = p < p_low ? p : 1.0 - p;
                double q = sqrt(-2.0 * ln_double(t));
                double num = -7.784894002430293e-03;
                num = num * q - 3.223964580411365e-01;
                num = num * q - 2.400758277161838e+00;
                num = num * q - 2.549732539343734e+00;
                num = num * q + 4.374664141464968e+00;
                num = num * q + 2.938163982698783e+00;
                double den = 7.784695709041462e-03;
                den = den * q + 3.224671290700398e-01;
                den = den * q + 2.445134137142996e+00;
                den = den * q + 3.754408661907416e+00;
                den = den * q + 1.0;
                double z = num / den;
                return p < p_low ? z : -z;
        }

        double q = p - 0.5, r = q * q;
        double num = -3.969683028665376e+01;
        num = num * r + 2.209460984245205e+02;
        num = num * r - 2.759285104469687e+02;
        num = num * r + 1.383577518672690e+02;
        num = num * r - 3.066479806614716e+01;
        num = num * r + 2.506628277459239e+00;
        double den = -5.447609879822406e+01;
        den = den * r + 1.615858368580409e+02;
        den = den * r - 1.556989798598866e+02;
        den = den * r + 6.680131188771972e+01;
        den = den * r - 1.328068155288572e+01;
        den = den * r + 1.0;
        return num * q / den;
}

double fill_normal_quantile(double p) {
        return normal_quantile(p);
}

static inline __attribute__((always_inline)) float trunc_normal_value(const GenParams *p, uint32_t x0) {
        double u = ((double) x0 + 0.5) * 0x1p-32;
        double t = p->cdf_span * u;
        double c = p->cdf_low + t;
        /* Rounding may reach 0 or 1 at extreme bounds; the clamp below takes the value then. */
        c = c < 0x1p-1022 ? 0x1p-1022 : c;
        c = c > 1.0 - 0x1p-53 ? 1.0 - 0x1p-53 : c;
        double z = normal_quantile(c);
        double s = p->t_scale * z;
        float v = (float) (p->t_mean + s);
        v = v < p->t_low ? p->t_low : v;
        return v > p->t_high ? p->t_high : v;
}

_fill_clones_ static void trunc_normal_from_bits(const GenParams *p, const uint32_t *restrict x0, size_t n,
                                                 float *restrict out) {
        for (size_t b = 0; b < n; b += FILL_BLOCK, x0 += FILL_BLOCK, out += FILL_BLOCK)
                for (size_t j = 0; j < FILL_BLOCK; j++)
                        out[j] = trunc_normal_value(p, x0[j]);
}

/* n values for the indices idx[0..n) (NULL: first + [0, n)), n a multiple of FILL_BLOCK and at
 * most FILL_BATCH. */
static void generate(const FillSpec *spec, const GenParams *p, const uint64_t *idx, uint64_t first, size_t n,
                     float *out) {
        uint32_t x0[FILL_BATCH], x1[FILL_BATCH];

        philox_batch(p, idx, first, n, x0, x1);
        if (spec->kind == INIT_UNIFORM)
                uniform_from_bits(p, x0, n, out);
        else if (spec->kind == INIT_TRUNC_NORMAL)
                trunc_normal_from_bits(p, x0, n, out);
        else
                normal_from_bits(p, x0, x1, n, out);
}

float fill_value(const FillSpec *spec, uint64_t i) {
        uint64_t idx[FILL_BLOCK];
        float out[FILL_BLOCK];
        GenParams p;

        switch (spec->kind) {
        case INIT_ZEROS:
                return 0.0f;
        case INIT_ONES:
                return 1.0f;
        case INIT_CONSTANT:
                return (float) spec->a;
        default:
                break;
        }
        for (size_t j = 0; j < FILL_BLOCK; j++)
                idx[j] = i;
        p = gen_params(spec);
        generate(spec, &p, idx, 0, FILL_BLOCK, out);
        return out[0];
}

/* ---- Slices: geometry, walking, chunks. ---- */

typedef struct SliceGeom {
        size_t n_outer;   /* dimensions walked row by row; the rest form one contiguous run */
        uint64_t inner;   /* local elements per run */
        uint64_t run_offset;
        uint64_t local[FILL_RANK_MAX];
        uint64_t offset[FILL_RANK_MAX];
        uint64_t stride[FILL_RANK_MAX]; /* global row-major strides */
} SliceGeom;

int fill_slice_check(const FillSlice *s, uint64_t *ret_n_elements) {
        uint64_t total = 1, local = 1;
        bool overflow = false, empty = false;

        if (!s || !s->spec || s->spec->kind < 0 || s->spec->kind >= _INIT_KIND_MAX ||
            s->spec->dtype < 0 || s->spec->dtype >= _DTYPE_MAX)
                return -EINVAL;
        if (s->rank > FILL_RANK_MAX)
                return -E2BIG;
        if (s->rank > 0 && (!s->shape || !s->local_shape || !s->global_offset))
                return -EINVAL;
        for (size_t d = 0; d < s->rank; d++) {
                int64_t n = s->shape[d], l = s->local_shape[d], o = s->global_offset[d];

                if (n < 0 || l < 0 || o < 0 || l > n || o > n - l)
                        return -EINVAL;
                overflow = overflow || __builtin_mul_overflow(total, (uint64_t) n, &total);
                empty = empty || n == 0;
                local *= (uint64_t) l; /* <= total, so it overflows only if total does */
        }
        /* A shape with a zero extent has no elements, however large the others. */
        if (overflow && !empty)
                return -EOVERFLOW;
        if (local > SIZE_MAX / dtype_size(s->spec->dtype))
                return -EOVERFLOW;
        if (local > 0 && !s->dst)
                return -EINVAL;
        if (ret_n_elements)
                *ret_n_elements = local;
        return 0;
}

static void slice_geom(const FillSlice *s, SliceGeom *g) {
        size_t r = s->rank, c = 0;
        uint64_t stride = 1;

        for (size_t d = r; d-- > 0;) {
                g->stride[d] = stride;
                stride *= (uint64_t) s->shape[d];
                g->local[d] = (uint64_t) s->local_shape[d];
                g->offset[d] = (uint64_t) s->global_offset[d];
        }
        /* The last dimension the slice does not span fully; those after it are contiguous. */
        for (size_t d = r; d-- > 0;)
                if (s->local_shape[d] != s->shape[d]) {
                        c = d;
                        break;
                }
        g->n_outer = c;
        g->inner = r > 0 ? g->local[c] * g->stride[c] : 1;
        g->run_offset = r > 0 ? g->offset[c] * g->stride[c] : 0;
}

typedef struct Walker {
        const SliceGeom *g;
        uint64_t l[FILL_RANK_MAX]; /* local index in the outer dimensions */
        uint64_t base;             /* global index of the current run's first element */
        uint64_t o;                /* position in the current run */
} Walker;

static void walker_init(Walker *w, const SliceGeom *g, uint64_t start) {
        uint64_t row = start / g->inner;

        w->g = g;
        w->o = start % g->inner;
        w->base = g->run_offset;
        for (size_t d = g->n_outer; d-- > 0;) {
                w->l[d] = row % g->local[d];
                row /= g->local[d];
                w->base += (g->offset[d] + w->l[d]) * g->stride[d];
        }
}

/* The next n global indices into idx; NULL: only steps over them. */
static void walker_take(Walker *w, uint64_t *idx, size_t n) {
        const SliceGeom *g = w->g;

        for (size_t filled = 0; filled < n;) {
                uint64_t k = g->inner - w->o;
                if (k > n - filled)
                        k = n - filled;
                uint64_t first = w->base + w->o;
                for (size_t j = 0; idx && j < k; j++)
                        idx[filled + j] = first + j;
                filled += k;
                w->o += k;
                if (w->o < g->inner)
                        continue;
                w->o = 0;
                for (size_t d = g->n_outer; d-- > 0;) {
                        w->base += g->stride[d];
                        if (++w->l[d] < g->local[d])
                                break;
                        w->base -= g->local[d] * g->stride[d];
                        w->l[d] = 0;
                }
        }
}

static void store_pattern(void *dst, size_t n, Dtype dtype, float v) {
        if (float_bits(v) == 0) {
                memset(dst, 0, n * dtype_size(dtype));
                return;
        }
        if (dtype == DTYPE_FLOAT32) {
                uint32_t pat = float_bits(v), *q = dst;
                for (size_t i = 0; i < n; i++)
                        q[i] = pat;
        } else {
                uint16_t pat = dtype == DTYPE_BFLOAT16 ? float_to_bfloat16(v) : float_to_float16(v), *q = dst;
                for (size_t i = 0; i < n; i++)
                        q[i] = pat;
        }
}

static void store_converted(void *dst, const float *src, size_t n, Dtype dtype) {
        uint16_t *q = dst;

        switch (dtype) {
        case DTYPE_FLOAT32:
                memcpy(dst, src, n * sizeof(float));
                break;
        case DTYPE_BFLOAT16:
                for (size_t i = 0; i < n; i++)
                        q[i] = bf16_from_bits(float_bits(src[i]));
                break;
        default:
                for (size_t i = 0; i < n; i++)
                        q[i] = f16_from_bits(float_bits(src[i]));
                break;
        }
}

/* Local elements [start, start + n) of a checked slice. */
static void fill_chunk(const FillSlice *s, uint64_t start, uint64_t n) {
        const FillSpec *spec = s->spec;
        size_t size = dtype_size(spec->dtype);
        uint8_t *dst = (uint8_t *) s->dst + start * size;

        if (s->populate)
                (void) memory_populate_write(dst, n * size);
        switch (spec->kind) {
        case INIT_ZEROS:
                store_pattern(dst, n, spec->dtype, 0.0f);
                return;
        case INIT_ONES:
                store_pattern(dst, n, spec->dtype, 1.0f);
                return;
        case INIT_CONSTANT:
                store_pattern(dst, n, spec->dtype, (float) spec->a);
                return;
        default:
                break;
        }

        SliceGeom g;
        Walker w;
        uint64_t idx[FILL_BATCH];
        float tmp[FILL_BATCH];
        GenParams p = gen_params(spec);

        slice_geom(s, &g);
        walker_init(&w, &g, start);
        while (n > 0) {
                size_t m = n < FILL_BATCH ? (size_t) n : FILL_BATCH;
                size_t n_blocks = (m + FILL_BLOCK - 1) / FILL_BLOCK;

                /* Within one run (the common case) the indices are first + [0, m): no array. */
                bool run = w.o + m <= g.inner;
                uint64_t first = w.base + w.o;

                walker_take(&w, run ? NULL : idx, m);
                for (size_t j = m; !run && j < n_blocks * FILL_BLOCK; j++)
                        idx[j] = idx[m - 1]; /* padding lanes: computed, dropped */
                if (spec->dtype == DTYPE_FLOAT32 && m == n_blocks * FILL_BLOCK)
                        generate(spec, &p, run ? NULL : idx, first, m, (float *) (void *) dst);
                else {
                        generate(spec, &p, run ? NULL : idx, first, n_blocks * FILL_BLOCK, tmp);
                        store_converted(dst, tmp, m, spec->dtype);
                }
                dst += m * size;
                n -= m;
        }
}

int fill_slice(const FillSlice *s) {
        uint64_t n;
        int r;

        r = fill_slice_check(s, &n);
        if (r < 0)
                return r;
        for (uint64_t start = 0; start < n; start += FILL_CHUNK)
                fill_chunk(s, start, n - start < FILL_CHUNK ? n - start : FILL_CHUNK);
        return 0;
}

void fill_values(const FillSpec *spec, uint64_t first, size_t n, void *dst) {
        size_t size = dtype_size(spec->dtype);

        if (n <= (uint64_t) INT64_MAX && first <= (uint64_t) INT64_MAX - n) {
                /* A rank-1 slice [first, first + n) of a shape [INT64_MAX]: one contiguous run. */
                int64_t shape = INT64_MAX, local = (int64_t) n, offset = (int64_t) first;
                FillSlice s = {
                        .spec = spec, .rank = 1, .shape = &shape, .local_shape = &local,
                        .global_offset = &offset, .dst = dst,
                };
                for (uint64_t start = 0; start < n; start += FILL_CHUNK)
                        fill_chunk(&s, start, n - start < FILL_CHUNK ? n - start : FILL_CHUNK);
                return;
        }
        /* Indices beyond 2^63 (no shape reaches them; tests do): through the same generator. */
        for (size_t i = 0; i < n; i++) {
                float v = fill_value(spec, first + i);
                store_converted((uint8_t *) dst + i * size, &v, 1, spec->dtype);
        }
}

typedef struct FillJob {
        const FillSlice *slices;
        size_t n_slices;
        const uint64_t *n_elements;
        const uint64_t *first_chunk; /* n_slices + 1 entries, prefix sums */
        atomic_uint_fast64_t next;
        atomic_bool stop;       /* cancelled: threads take no more chunks */
        FillProgress *progress; /* the caller's binding, or NULL */
} FillJob;

static _Thread_local FillContext fill_context_bound = { .group = -1 };

void fill_context_bind(const FillContext *c) {
        fill_context_bound = c ? *c : (FillContext) { .group = -1 };
}

bool fill_bound_cancelled(void) {
        const FillContext *c = &fill_context_bound;

        return c->cancelled && c->cancelled(c->userdata);
}

void fill_bound_progress_add(uint64_t bytes) {
        FillProgress *p = fill_context_bound.progress;

        if (!p)
                return;
        atomic_fetch_add_explicit(&p->bytes, bytes, memory_order_relaxed);
        if (p->on_chunk)
                p->on_chunk(p);
}

/* Chunk id of the job: the slice k with first_chunk[k] <= id < first_chunk[k + 1]. */
static void fill_job_chunk(FillJob *job, uint64_t id) {
        size_t lo = 0, hi = job->n_slices;

        while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                if (job->first_chunk[mid] <= id)
                        lo = mid;
                else
                        hi = mid;
        }
        uint64_t start = (id - job->first_chunk[lo]) * FILL_CHUNK;
        uint64_t n = job->n_elements[lo] - start;
        if (n > FILL_CHUNK)
                n = FILL_CHUNK;
        fill_chunk(&job->slices[lo], start, n);
        if (job->progress) {
                atomic_fetch_add_explicit(&job->progress->bytes,
                                          n * dtype_size(job->slices[lo].spec->dtype),
                                          memory_order_relaxed);
                if (job->progress->on_chunk)
                        job->progress->on_chunk(job->progress);
        }
}

static void fill_pool_chunk(void *userdata, uint64_t chunk) {
        fill_job_chunk(userdata, chunk);
}

/* Takes chunks until none is left or the job stops; the calling thread (ctx non-NULL) asks
 * its binding's cancelled() before each chunk it takes. */
static void fill_job_work(FillJob *job, const FillContext *ctx) {
        uint64_t total = job->first_chunk[job->n_slices];

        for (;;) {
                if (ctx && ctx->cancelled && ctx->cancelled(ctx->userdata))
                        atomic_store(&job->stop, true);
                if (atomic_load_explicit(&job->stop, memory_order_relaxed))
                        return;
                uint64_t id = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
                if (id >= total)
                        return;
                fill_job_chunk(job, id);
        }
}

static void *fill_worker(void *userdata) {
        fill_job_work(userdata, NULL);
        return NULL;
}

/* Helper threads started by all fill_run() calls of the process together: concurrent fills
 * (several Builds at once) share the cores instead of each taking all of them. */
static atomic_uint fill_helpers_running;

static unsigned fill_helpers_take(unsigned want, bool capped) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        unsigned cap = n > 1 ? (unsigned) n - 1 : 0;
        unsigned cur = atomic_load(&fill_helpers_running);

        if (!capped) {
                atomic_fetch_add(&fill_helpers_running, want);
                return want;
        }
        for (;;) {
                unsigned got = cur >= cap ? 0 : MIN(want, cap - cur);
                if (got == 0)
                        return 0;
                if (atomic_compare_exchange_weak(&fill_helpers_running, &cur, cur + got))
                        return got;
        }
}

/* Without a pool: helper threads started for this call, joined before it returns. */
static int fill_run_threads(FillJob *job, unsigned n_threads, const FillContext *ctx) {
        _cleanup_free_ pthread_t *threads = NULL;
        uint64_t n_chunks = job->first_chunk[job->n_slices];
        size_t n_started = 0;

        bool automatic = n_threads == 0;
        if (automatic) {
                long n = sysconf(_SC_NPROCESSORS_ONLN);
                n_threads = n > 0 ? (unsigned) n : 1;
        }
        if (n_threads > FILL_THREADS_MAX)
                n_threads = FILL_THREADS_MAX;
        if (n_threads > n_chunks)
                n_threads = n_chunks > 0 ? (unsigned) n_chunks : 1;

        unsigned helpers = n_threads > 1 ? fill_helpers_take(n_threads - 1, automatic) : 0;
        if (helpers > 0) {
                threads = calloc(helpers, sizeof(pthread_t));
                /* Without memory or threads the calling thread does all the work. */
                for (size_t t = 0; threads && t < helpers; t++) {
                        if (pthread_create(&threads[t], NULL, fill_worker, job) != 0)
                                break;
                        n_started++;
                }
        }
        fill_job_work(job, ctx);
        for (size_t t = 0; t < n_started; t++)
                (void) pthread_join(threads[t], NULL);
        atomic_fetch_sub(&fill_helpers_running, helpers);
        return atomic_load(&job->stop) ? -ECANCELED : 0;
}

int fill_run(const FillSlice *slices, size_t n_slices, unsigned n_threads) {
        _cleanup_free_ uint64_t *n_elements = NULL, *first_chunk = NULL;
        const FillContext *ctx = &fill_context_bound;
        int r;

        if (n_slices > 0 && !slices)
                return -EINVAL;
        if (n_slices == 0)
                return 0;
        n_elements = calloc(n_slices, sizeof(uint64_t));
        first_chunk = calloc(n_slices + 1, sizeof(uint64_t));
        if (!n_elements || !first_chunk)
                return -ENOMEM;
        for (size_t k = 0; k < n_slices; k++) {
                r = fill_slice_check(&slices[k], &n_elements[k]);
                if (r < 0)
                        return r;
                first_chunk[k + 1] = first_chunk[k] + (n_elements[k] + FILL_CHUNK - 1) / FILL_CHUNK;
        }

        FillJob job = {
                .slices = slices,
                .n_slices = n_slices,
                .n_elements = n_elements,
                .first_chunk = first_chunk,
                .progress = ctx->progress,
        };
        atomic_init(&job.next, 0);
        atomic_init(&job.stop, false);

        if (!ctx->pool || n_threads != 0)
                return fill_run_threads(&job, n_threads, ctx);
        FillPoolWork w = {
                .run = fill_pool_chunk,
                .userdata = &job,
                .n_chunks = first_chunk[n_slices],
                .group = ctx->group,
                /* Not bound to a node: only a fill for any node may run here too. */
                .caller_runs = ctx->group < 0,
        };
        return fill_pool_run(ctx->pool, &w, ctx->cancelled, ctx->userdata);
}
