/* test-fill.c: values (docs/semantics.md, Build step 6): Philox, dtypes, invariance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "core/fill.h"
#include "core/layout.h"

/* test_golden_digest(): fnv1a32 of the fills' bytes, as main computed them (normal: 2026-12-02,
 * float32 Box-Muller, checked element by element against normal_expected() by
 * test_normal_bit_exact(); bfloat16's did not change: 0.5 + 0.02 z rounds to the same 8 bits). */
#define GOLDEN_NORMAL_F32 UINT32_C(0x82f9ca21)
#define GOLDEN_NORMAL_BF16 UINT32_C(0x60f1f2b6)
#define GOLDEN_NORMAL_F16 UINT32_C(0x9c52e7b5)
#define GOLDEN_UNIFORM_F32 UINT32_C(0x2e3d0e23)
/* trunc_normal (2026-12-07): the inverse-CDF fill in double, first computed by this test. */
#define GOLDEN_TRUNC_F32 UINT32_C(0x1845c7ab)
#define GOLDEN_TRUNC_BF16 UINT32_C(0xd3932b16)
#define GOLDEN_TRUNC_UPPER_F32 UINT32_C(0xd872d47b)

static uint32_t bits_of(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        return u;
}

static float float_of(uint32_t u) {
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
}

static void test_philox_known_answers(void **state) {
        const uint32_t zero_c[4] = { 0 }, zero_k[2] = { 0 };
        const uint32_t ones_c[4] = { UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX };
        const uint32_t ones_k[2] = { UINT32_MAX, UINT32_MAX };
        uint32_t x[4];

        philox4x32_10(zero_c, zero_k, x);
        assert_int_equal(x[0], 0x6627e8d5);
        assert_int_equal(x[1], 0xe169c58d);
        assert_int_equal(x[2], 0xbc57ac4c);
        assert_int_equal(x[3], 0x9b00dbd8);

        philox4x32_10(ones_c, ones_k, x);
        assert_int_equal(x[0], 0x408f276d);
        assert_int_equal(x[1], 0x41c83b0e);
        assert_int_equal(x[2], 0xa20bc7c6);
        assert_int_equal(x[3], 0x6d5451fd);
}

static void test_fnv1a32(void **state) {
        assert_int_equal(fnv1a32("", 0), 0x811c9dc5);
        assert_int_equal(fnv1a32_string(""), 0x811c9dc5);
        assert_int_equal(fnv1a32_string(NULL), 0x811c9dc5);
        assert_int_equal(fnv1a32_string("a"), 0xe40c292c);
        assert_int_equal(fnv1a32_string("foobar"), 0xbf9cf968);
        assert_int_equal(fnv1a32("a\0b", 3), fnv1a32("a\0b", 3));
        assert_int_not_equal(fnv1a32("a\0b", 3), fnv1a32_string("a"));
}

static void test_dtype_names(void **state) {
        assert_int_equal(dtype_from_string(NULL), DTYPE_FLOAT32);
        assert_int_equal(dtype_from_string(""), DTYPE_FLOAT32);
        assert_int_equal(dtype_from_string("float32"), DTYPE_FLOAT32);
        assert_int_equal(dtype_from_string("f32"), DTYPE_FLOAT32);
        assert_int_equal(dtype_from_string("fp32"), DTYPE_FLOAT32);
        assert_int_equal(dtype_from_string("bfloat16"), DTYPE_BFLOAT16);
        assert_int_equal(dtype_from_string("bf16"), DTYPE_BFLOAT16);
        assert_int_equal(dtype_from_string("float16"), DTYPE_FLOAT16);
        assert_int_equal(dtype_from_string("f16"), DTYPE_FLOAT16);
        assert_int_equal(dtype_from_string("fp16"), DTYPE_FLOAT16);
        assert_int_equal(dtype_from_string("float64"), _DTYPE_INVALID);
        assert_int_equal(dtype_from_string("Float32"), _DTYPE_INVALID);
        assert_string_equal(dtype_to_string(DTYPE_FLOAT32), "float32");
        assert_string_equal(dtype_to_string(DTYPE_BFLOAT16), "bfloat16");
        assert_string_equal(dtype_to_string(DTYPE_FLOAT16), "float16");
        assert_null(dtype_to_string(_DTYPE_INVALID));
        assert_null(dtype_to_string(_DTYPE_MAX));
        assert_int_equal(dtype_size(DTYPE_FLOAT32), 4);
        assert_int_equal(dtype_size(DTYPE_BFLOAT16), 2);
        assert_int_equal(dtype_size(DTYPE_FLOAT16), 2);
        assert_int_equal(dtype_size(_DTYPE_INVALID), 0);
}

/* The formula of docs/semantics.md, one rounded float32 operation at a time. */
static float uniform_expected(uint64_t seed, const char *name, uint64_t i, float low, float high) {
        uint32_t c[4] = { (uint32_t) i, (uint32_t) (i >> 32), fnv1a32_string(name), 0 };
        uint32_t k[2] = { (uint32_t) seed, (uint32_t) (seed >> 32) };
        uint32_t x[4];

        philox4x32_10(c, k, x);
        volatile float u = (float) (x[0] >> 8);
        u = u * 0x1p-24f;
        volatile float span = high - low;
        volatile float t = span * u;
        volatile float v = low + t;
        return v;
}

static void test_uniform_bit_exact(void **state) {
        static const uint64_t indices[] = {
                0, 1, 2, 3, 15, 16, 17, 12345, UINT64_C(0xffffffff), UINT64_C(0x100000007),
                UINT64_C(0x123456789abcdef0), UINT64_MAX,
        };
        static const struct {
                uint64_t seed;
                const char *name;
                float low, high;
        } cases[] = {
                { 0, "w", 0.0f, 1.0f },
                { 42, "layers.0.attn.q_proj.weight", -0.1f, 0.1f },
                { UINT64_C(0xdeadbeefcafef00d), "", -3.5f, 1e-3f },
        };

        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                FillSpec spec;
                assert_int_equal(fill_spec_init(&spec, INIT_UNIFORM, cases[c].low, cases[c].high,
                                                cases[c].seed, cases[c].name, DTYPE_FLOAT32), 0);
                for (size_t j = 0; j < ELEMENTSOF(indices); j++) {
                        uint64_t i = indices[j];
                        float want = uniform_expected(cases[c].seed, cases[c].name, i, cases[c].low,
                                                      cases[c].high);
                        float got, run[37];

                        assert_int_equal(bits_of(fill_value(&spec, i)), bits_of(want));
                        fill_values(&spec, i, 1, &got);
                        assert_int_equal(bits_of(got), bits_of(want));
                        /* The same element in the middle of a run. */
                        if (i >= 20 && i <= UINT64_MAX - 17) {
                                fill_values(&spec, i - 20, ELEMENTSOF(run), run);
                                assert_int_equal(bits_of(run[20]), bits_of(want));
                        }
                        assert_true(want >= cases[c].low && want <= cases[c].high);
                }
        }

        /* Hand check of index 0, seed 0, name "w", [0, 1): u is x0 >> 8 scaled exactly. */
        FillSpec spec;
        uint32_t c[4] = { 0, 0, fnv1a32_string("w"), 0 }, k[2] = { 0, 0 }, x[4];
        philox4x32_10(c, k, x);
        assert_int_equal(fill_spec_init(&spec, INIT_UNIFORM, 0, 1, 0, "w", DTYPE_FLOAT32), 0);
        assert_true(fill_value(&spec, 0) == (float) (x[0] >> 8) / 16777216.0f);
}

static void test_constants_exact(void **state) {
        static const struct {
                InitKind kind;
                double a;
                uint32_t f32;
                uint16_t bf16, f16;
        } cases[] = {
                { INIT_ZEROS, 0, 0x00000000, 0x0000, 0x0000 },
                { INIT_ONES, 0, 0x3f800000, 0x3f80, 0x3c00 },
                { INIT_CONSTANT, 1.0, 0x3f800000, 0x3f80, 0x3c00 },
                { INIT_CONSTANT, 0.1, 0x3dcccccd, 0x3dcd, 0x2e66 },
                { INIT_CONSTANT, -0.0, 0x80000000, 0x8000, 0x8000 },
                { INIT_CONSTANT, -2.5, 0xc0200000, 0xc020, 0xc100 },
                { INIT_CONSTANT, 1e6, 0x49742400, 0x4974, 0x7c00 },
        };

        for (size_t c = 0; c < ELEMENTSOF(cases); c++)
                for (Dtype d = 0; d < _DTYPE_MAX; d++) {
                        FillSpec spec;
                        uint8_t buf[1000 * 4];

                        memset(buf, 0xa5, sizeof(buf));
                        assert_int_equal(fill_spec_init(&spec, cases[c].kind, cases[c].a, 0, 7, "c", d), 0);
                        fill_values(&spec, 99, 1000, buf);
                        for (size_t i = 0; i < 1000; i++) {
                                if (d == DTYPE_FLOAT32) {
                                        uint32_t v;
                                        memcpy(&v, buf + 4 * i, 4);
                                        assert_int_equal(v, cases[c].f32);
                                } else {
                                        uint16_t v;
                                        memcpy(&v, buf + 2 * i, 2);
                                        assert_int_equal(v, d == DTYPE_BFLOAT16 ? cases[c].bf16 : cases[c].f16);
                                }
                        }
                        if (d != DTYPE_FLOAT32)
                                assert_int_equal(buf[2000], 0xa5); /* nothing past the end */
                }
}

static void test_bfloat16(void **state) {
        assert_int_equal(float_to_bfloat16(1.0f), 0x3f80);
        assert_int_equal(float_to_bfloat16(-1.0f), 0xbf80);
        assert_int_equal(float_to_bfloat16(1.0f / 3.0f), 0x3eab); /* 0x3eaaaaab rounds up */
        assert_int_equal(float_to_bfloat16(float_of(0x3f808000)), 0x3f80); /* tie to even (down) */
        assert_int_equal(float_to_bfloat16(float_of(0x3f818000)), 0x3f82); /* tie to even (up) */
        assert_int_equal(float_to_bfloat16(float_of(0x3f808001)), 0x3f81);
        assert_int_equal(float_to_bfloat16(float_of(0x7f7fffff)), 0x7f80); /* FLT_MAX: inf */
        assert_int_equal(float_to_bfloat16(INFINITY), 0x7f80);
        assert_int_equal(float_to_bfloat16(-INFINITY), 0xff80);
        assert_int_equal(float_to_bfloat16(float_of(0x00000001)), 0x0000); /* tiny: to zero */
        assert_int_equal(float_to_bfloat16(float_of(0x00010000)), 0x0001); /* subnormal kept */
        assert_int_equal(float_to_bfloat16(float_of(0x00018000)), 0x0002); /* tie to even */
        assert_int_equal(float_to_bfloat16(float_of(0x80000000)), 0x8000);
        /* NaN stays NaN, also a signalling one whose payload sits in the dropped bits. */
        uint16_t n = float_to_bfloat16(NAN);
        assert_int_equal(n & 0x7f80, 0x7f80);
        assert_int_not_equal(n & 0x7f, 0);
        n = float_to_bfloat16(float_of(0x7f800001));
        assert_int_equal(n & 0x7f80, 0x7f80);
        assert_int_not_equal(n & 0x7f, 0);
        n = float_to_bfloat16(float_of(0xffffffff));
        assert_true(isnan(bfloat16_to_float(n)));
        assert_true(bfloat16_to_float(0x3f80) == 1.0f);
}

static void test_float16(void **state) {
        assert_int_equal(float_to_float16(1.0f), 0x3c00);
        assert_int_equal(float_to_float16(-2.0f), 0xc000);
        assert_int_equal(float_to_float16(1.0f / 3.0f), 0x3555);
        assert_int_equal(float_to_float16(65504.0f), 0x7bff);
        assert_int_equal(float_to_float16(65519.99f), 0x7bff);
        assert_int_equal(float_to_float16(65520.0f), 0x7c00); /* overflow: inf */
        assert_int_equal(float_to_float16(-1e10f), 0xfc00);
        assert_int_equal(float_to_float16(INFINITY), 0x7c00);
        assert_int_equal(float_to_float16(0x1p-14f), 0x0400);  /* smallest normal */
        assert_int_equal(float_to_float16(0x1p-24f), 0x0001);  /* smallest subnormal */
        assert_int_equal(float_to_float16(-0x1p-24f), 0x8001);
        assert_int_equal(float_to_float16(0x1p-25f), 0x0000);  /* tie to even: zero */
        assert_int_equal(float_to_float16(0x1.000002p-25f), 0x0001);
        assert_int_equal(float_to_float16(0x3p-25f), 0x0002);  /* 1.5 units: tie to even 2 */
        assert_int_equal(float_to_float16(0x5p-25f), 0x0002);  /* 2.5 units: tie to even 2 */
        assert_int_equal(float_to_float16(0x1p-26f), 0x0000);
        assert_int_equal(float_to_float16(0x3ffp-24f), 0x03ff); /* largest subnormal */
        assert_int_equal(float_to_float16(0x7ffp-25f), 0x0400); /* rounds up into the normals */
        assert_int_equal(float_to_float16(1.0f + 0x1p-11f), 0x3c00); /* tie to even (down) */
        assert_int_equal(float_to_float16(1.0f + 0x3p-11f), 0x3c02); /* tie to even (up) */
        assert_int_equal(float_to_float16(1.0f + 0x1.2p-11f), 0x3c01);
        assert_int_equal(float_to_float16(0.0f), 0x0000);
        assert_int_equal(float_to_float16(-0.0f), 0x8000);
        uint16_t n = float_to_float16(NAN);
        assert_int_equal(n & 0x7c00, 0x7c00);
        assert_int_not_equal(n & 0x3ff, 0);
        n = float_to_float16(float_of(0x7f800001)); /* payload below float16's mantissa */
        assert_int_equal(n & 0x7c00, 0x7c00);
        assert_int_not_equal(n & 0x3ff, 0);
        /* Widening back is exact for every finite half. */
        for (uint32_t h = 0; h < 0x10000; h++) {
                if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
                        continue;
                assert_int_equal(float_to_float16(float16_to_float((uint16_t) h)), h);
        }
        assert_true(float16_to_float(0x0001) == 0x1p-24f);
        assert_true(isnan(float16_to_float(0x7e00)));
}

/* ---- Invariance: whole tensor vs any slicing, any thread count. ---- */

#define R3 3

static uint64_t rng_state = 0x9e3779b97f4a7c15;

static uint64_t rng(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

/* Cuts [0, n) at up to k random points: sorted boundaries in cuts[0..ret], cuts[0] = 0. */
static size_t random_cuts(int64_t n, size_t k, int64_t *cuts) {
        size_t m = 1;
        cuts[0] = 0;
        for (size_t j = 0; j < k; j++) {
                int64_t c = (int64_t) (rng() % (uint64_t) (n + 1));
                size_t p = m;
                while (p > 0 && cuts[p - 1] > c) {
                        cuts[p] = cuts[p - 1];
                        p--;
                }
                cuts[p] = c; /* duplicates give empty slices: allowed */
                m++;
        }
        cuts[m] = n;
        return m;
}

static void check_invariance(const FillSpec *spec, const int64_t shape[R3]) {
        size_t size = dtype_size(spec->dtype);
        uint64_t n = (uint64_t) (shape[0] * shape[1] * shape[2]);
        const int64_t zero[R3] = { 0, 0, 0 };
        uint8_t *whole = malloc(n * size), *assembled = malloc(n * size);
        FillSlice s = { .spec = spec, .rank = R3, .shape = shape, .local_shape = shape,
                        .global_offset = zero, .dst = whole };

        assert_non_null(whole);
        assert_non_null(assembled);
        assert_int_equal(fill_slice(&s), 0);

        /* Whole == consecutive values == one element at a time. */
        uint8_t *flat = malloc(n * size);
        assert_non_null(flat);
        fill_values(spec, 0, n, flat);
        assert_memory_equal(whole, flat, n * size);
        for (uint64_t i = 0; i < n; i += 97) {
                float v = fill_value(spec, i);
                if (spec->dtype == DTYPE_FLOAT32)
                        assert_int_equal(bits_of(v), ((uint32_t *) flat)[i]);
                else
                        assert_int_equal(spec->dtype == DTYPE_BFLOAT16 ? float_to_bfloat16(v)
                                                                      : float_to_float16(v),
                                         ((uint16_t *) flat)[i]);
        }
        free(flat);

        static const unsigned thread_counts[] = { 1, 2, 7, 0 };
        for (size_t round = 0; round < ELEMENTSOF(thread_counts); round++) {
                int64_t cuts[R3][8];
                size_t m[R3];
                for (size_t d = 0; d < R3; d++)
                        m[d] = random_cuts(shape[d], round == 0 ? 0 : 1 + rng() % 5, cuts[d]);

                size_t n_slices = m[0] * m[1] * m[2];
                FillSlice *slices = calloc(n_slices, sizeof(FillSlice));
                int64_t (*geom)[2][R3] = calloc(n_slices, sizeof(*geom));
                uint8_t **bufs = calloc(n_slices, sizeof(uint8_t *));
                assert_non_null(slices);
                assert_non_null(geom);
                assert_non_null(bufs);

                size_t k = 0;
                for (size_t a = 0; a < m[0]; a++)
                        for (size_t b = 0; b < m[1]; b++)
                                for (size_t c = 0; c < m[2]; c++, k++) {
                                        size_t ix[R3] = { a, b, c };
                                        uint64_t cnt = 1;
                                        for (size_t d = 0; d < R3; d++) {
                                                geom[k][0][d] = cuts[d][ix[d] + 1] - cuts[d][ix[d]];
                                                geom[k][1][d] = cuts[d][ix[d]];
                                                cnt *= (uint64_t) geom[k][0][d];
                                        }
                                        bufs[k] = malloc(cnt * size + 1);
                                        assert_non_null(bufs[k]);
                                        slices[k] = (FillSlice) { .spec = spec, .rank = R3, .shape = shape,
                                                                  .local_shape = geom[k][0],
                                                                  .global_offset = geom[k][1],
                                                                  .dst = bufs[k] };
                                }
                assert_int_equal(fill_run(slices, n_slices, thread_counts[round]), 0);

                memset(assembled, 0x5a, n * size);
                for (k = 0; k < n_slices; k++) {
                        const int64_t *l = geom[k][0], *o = geom[k][1];
                        size_t p = 0;
                        for (int64_t x = 0; x < l[0]; x++)
                                for (int64_t y = 0; y < l[1]; y++)
                                        for (int64_t z = 0; z < l[2]; z++, p++) {
                                                uint64_t g = (uint64_t) (((o[0] + x) * shape[1] + o[1] + y) * shape[2] +
                                                                         o[2] + z);
                                                memcpy(assembled + g * size, bufs[k] + p * size, size);
                                        }
                        free(bufs[k]);
                }
                assert_memory_equal(whole, assembled, n * size);
                free(bufs);
                free(geom);
                free(slices);
        }
        free(whole);
        free(assembled);
}

static void test_invariance(void **state) {
        static const int64_t shapes[][R3] = {
                { 7, 13, 29 },
                { 3, 300, 257 }, /* several chunks per slice */
                { 1, 1, 70001 },
        };
        static const struct {
                InitKind kind;
                double a, b;
        } inits[] = {
                { INIT_UNIFORM, -0.25, 0.75 },
                { INIT_NORMAL, 0.5, 2.0 },
                { INIT_CONSTANT, 0.1, 0 },
        };

        for (size_t sh = 0; sh < ELEMENTSOF(shapes); sh++)
                for (size_t i = 0; i < ELEMENTSOF(inits); i++)
                        for (Dtype d = 0; d < _DTYPE_MAX; d++) {
                                FillSpec spec;
                                assert_int_equal(fill_spec_init(&spec, inits[i].kind, inits[i].a, inits[i].b,
                                                                1234 + sh, "layers.3.mlp.w", d), 0);
                                check_invariance(&spec, shapes[sh]);
                        }
        /* trunc_normal, both in the lower half and mirrored (bounds above the mean). */
        static const double truncs[][4] = { { 0, 0.02, -0.04, 0.04 }, { 0, 1, 0.5, 3 } };
        for (size_t sh = 0; sh < ELEMENTSOF(shapes); sh++)
                for (size_t i = 0; i < ELEMENTSOF(truncs); i++)
                        for (Dtype d = 0; d < _DTYPE_MAX; d++) {
                                FillSpec spec;
                                assert_int_equal(fill_spec_init4(&spec, INIT_TRUNC_NORMAL, truncs[i], 77 + sh,
                                                                 "layers.3.mlp.w", d), 0);
                                check_invariance(&spec, shapes[sh]);
                        }
}

/* Phi^-1 against libm's erfc: z relative to the root of Phi(z) = p (found by Newton steps
 * from it, in double) within 1.2e-9, Acklam's bound, at both tails and the centre, through
 * fill.c's own logarithm. */
static void test_normal_quantile(void **state) {
        double worst = 0;

        for (int k = -1000; k <= 1000; k++) {
                double p = k < 0 ? pow(10, -1 - (k + 1000) * 0.012) : k == 0 ? 0.5 : 0.5 + 0.4999999 * k / 1000.0;
                for (int side = 0; side < 2; side++) {
                        double q = side ? 1 - p : p;
                        if (!(q > 0 && q < 1) || q == 0.5)
                                continue;
                        double z = fill_normal_quantile(q), x = z;
                        for (int it = 0; it < 4; it++) {
                                /* Phi(x) - q, from the tail q lies in, for precision. */
                                double f = q < 0.5 ? 0.5 * erfc(-x / sqrt(2)) - q : (1 - q) - 0.5 * erfc(x / sqrt(2));
                                x -= f / (exp(-x * x / 2) / sqrt(2 * M_PI));
                        }
                        double rel = fabs(z - x) / fabs(x);
                        worst = rel > worst ? rel : worst;
                }
        }
        print_message("worst relative error of Phi^-1: %.3g\n", worst);
        assert_true(worst < 1.2e-9);
        assert_true(fill_normal_quantile(0.5) == 0);
}

/* Draws of 2^20 elements: all within [a, b], mean and std of the truncated distribution. */
static void check_trunc_statistics(const double t[4]) {
        const size_t n = 1u << 20;
        float *v = malloc(n * sizeof(float));
        FillSpec spec;
        double sum = 0, sum2 = 0;
        double mean = t[0], std = t[1];
        double alpha = (t[2] - mean) / std, beta = (t[3] - mean) / std;
        double phi_a = exp(-alpha * alpha / 2) / sqrt(2 * M_PI), phi_b = exp(-beta * beta / 2) / sqrt(2 * M_PI);
        double zmass = 0.5 * erfc(-beta / sqrt(2)) - 0.5 * erfc(-alpha / sqrt(2));
        double want_mean = mean + std * (phi_a - phi_b) / zmass;
        double want_var = std * std *
                          (1 + (alpha * phi_a - beta * phi_b) / zmass - pow((phi_a - phi_b) / zmass, 2));

        assert_non_null(v);
        assert_int_equal(fill_spec_init4(&spec, INIT_TRUNC_NORMAL, t, 5, "t", DTYPE_FLOAT32), 0);
        fill_values(&spec, 0, n, v);
        for (size_t i = 0; i < n; i++) {
                assert_true(v[i] >= (float) t[2] && v[i] <= (float) t[3]);
                sum += v[i];
                sum2 += (double) v[i] * v[i];
        }
        double m = sum / n, var = sum2 / n - m * m;
        print_message("trunc_normal(%g, %g, %g, %g): mean %.6g (want %.6g), std %.6g (want %.6g)\n", t[0],
                      t[1], t[2], t[3], m, want_mean, sqrt(var), sqrt(want_var));
        /* 2^20 draws: the mean's standard error is std/1024; 5 of them. */
        assert_true(fabs(m - want_mean) < 5 * sqrt(want_var) / 1024);
        assert_true(fabs(sqrt(var) / sqrt(want_var) - 1) < 0.01);
        free(v);
}

static void test_trunc_normal_statistics(void **state) {
        static const double cases[][4] = {
                { 0, 0.02, -0.04, 0.04 }, /* timm's ViT init: +-2 std */
                { 0, 1, -2, 2 },          /* torch's defaults */
                { 1, 2, 0, 10 },          /* asymmetric */
                { 0, 1, 1.5, 4 },         /* bounds above the mean: the mirrored path */
                { 0, 1, -6, -4 },         /* far in the lower tail */
        };

        for (size_t c = 0; c < ELEMENTSOF(cases); c++)
                check_trunc_statistics(cases[c]);

        FillSpec spec;
        assert_int_equal(fill_spec_init4(&spec, INIT_TRUNC_NORMAL, (const double[4]) { 0, 0, -1, 1 }, 0, "t",
                                         DTYPE_FLOAT32), -EINVAL);
        assert_int_equal(fill_spec_init4(&spec, INIT_TRUNC_NORMAL, (const double[4]) { 0, 1, 1, 1 }, 0, "t",
                                         DTYPE_FLOAT32), -EINVAL);
}

static void test_slice_errors(void **state) {
        FillSpec spec;
        float buf[16];
        int64_t shape[2] = { 4, 4 }, local[2] = { 2, 2 }, off[2] = { 3, 0 };
        FillSlice s = { .spec = &spec, .rank = 2, .shape = shape, .local_shape = local,
                        .global_offset = off, .dst = buf };
        uint64_t n = 0;

        assert_int_equal(fill_spec_init(&spec, INIT_ONES, 0, 0, 0, "x", DTYPE_FLOAT32), 0);
        assert_int_equal(fill_spec_init(&spec, _INIT_KIND_MAX, 0, 0, 0, "x", DTYPE_FLOAT32), -EINVAL);
        assert_int_equal(fill_spec_init(&spec, INIT_ONES, 0, 0, 0, "x", _DTYPE_INVALID), -EINVAL);
        assert_int_equal(fill_slice_check(&s, &n), -EINVAL); /* 3 + 2 > 4 */
        assert_int_equal(fill_run(&s, 1, 2), -EINVAL);
        off[0] = 2;
        assert_int_equal(fill_slice_check(&s, &n), 0);
        assert_int_equal(n, 4);
        local[1] = -1;
        assert_int_equal(fill_slice(&s), -EINVAL);
        local[1] = 2;
        s.dst = NULL;
        assert_int_equal(fill_slice(&s), -EINVAL);
        s.dst = buf;
        s.rank = FILL_RANK_MAX + 1;
        assert_int_equal(fill_slice_check(&s, NULL), -E2BIG);

        /* A shape past 2^64 elements. */
        int64_t big[3] = { INT64_C(1) << 40, INT64_C(1) << 30, 1 }, bl[3] = { 1, 1, 1 }, bo[3] = { 0 };
        FillSlice b = { .spec = &spec, .rank = 3, .shape = big, .local_shape = bl, .global_offset = bo,
                        .dst = buf };
        assert_int_equal(fill_slice_check(&b, NULL), -EOVERFLOW);
        /* A zero extent: no elements, however large the others. */
        int64_t zs[3] = { INT64_C(1) << 40, 0, INT64_C(1) << 40 }, zl[3] = { 1, 0, 1 };
        FillSlice e = { .spec = &spec, .rank = 3, .shape = zs, .local_shape = zl, .global_offset = bo };
        assert_int_equal(fill_slice_check(&e, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(fill_run(&e, 1, 4), 0);
        big[0] = INT64_C(1) << 33;
        assert_int_equal(fill_slice(&b), 0);
        assert_true(buf[0] == 1.0f);

        /* Rank 0: one element, index 0; empty slices write nothing. */
        FillSlice z = { .spec = &spec, .rank = 0, .dst = buf };
        assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0, 1, 5, "s", DTYPE_FLOAT32), 0);
        buf[0] = NAN;
        assert_int_equal(fill_run(&z, 1, 0), 0);
        assert_int_equal(bits_of(buf[0]), bits_of(fill_value(&spec, 0)));
        assert_int_equal(fill_run(NULL, 0, 0), 0);
}

static void test_normal_statistics(void **state) {
        const size_t n = 1u << 20;
        float *v = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float));
        FillSpec spec;
        int64_t shape = (int64_t) n, off = 0;
        FillSlice s = { .spec = &spec, .rank = 1, .shape = &shape, .local_shape = &shape,
                        .global_offset = &off, .dst = v };
        double sum = 0, sum2 = 0, max_err = 0;
        size_t tail = 0;

        assert_non_null(v);
        assert_non_null(w);
        assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0, 1, 0, "w", DTYPE_FLOAT32), 0);
        assert_int_equal(fill_run(&s, 1, 0), 0);
        for (size_t i = 0; i < n; i++) {
                assert_true(isfinite(v[i]));
                sum += v[i];
                sum2 += (double) v[i] * v[i];
                tail += fabsf(v[i]) > 3.0f;
                assert_true(fabsf(v[i]) <= 5.8f); /* sqrt(-2 ln 2^-24) = 5.77 */
        }
        double mean = sum / n, std = sqrt(sum2 / n - mean * mean);
        assert_true(fabs(mean) < 0.005);
        assert_true(fabs(std - 1.0) < 0.005);
        /* P(|z| > 3) = 0.0027 */
        assert_true(tail > n * 0.0022 && tail < n * 0.0032);

        /* The float32 polynomials against libm, in double: a few ulps of float32 (the bound is
         * test_normal_ulps()'s), so under 2e-6 absolute for |z| < 8. */
        for (size_t i = 0; i < 20000; i++) {
                uint32_t c[4] = { (uint32_t) i, 0, fnv1a32_string("w"), 0 }, k[2] = { 0, 0 }, x[4];
                philox4x32_10(c, k, x);
                double u1 = ((x[0] >> 8) + 1) * 0x1p-24, u2 = (x[1] >> 8) * 0x1p-24;
                double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
                double err = fabs((double) v[i] - z);
                if (err > max_err)
                        max_err = err;
        }
        assert_true(max_err < 2e-6);

        /* Mean and std apply; another seed or name gives other values. */
        assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 2.0, 3.0, 0, "w", DTYPE_FLOAT32), 0);
        s.dst = w;
        assert_int_equal(fill_run(&s, 1, 0), 0);
        for (size_t i = 0; i < n; i += 101)
                assert_true(fabs(w[i] - (2.0 + 3.0 * v[i])) < 1e-5 * (1.0 + fabs(w[i])));

        static const struct {
                uint64_t seed;
                const char *name;
        } others[] = { { 1, "w" }, { 0, "b" }, { UINT64_C(1) << 32, "w" } };
        for (size_t o = 0; o < ELEMENTSOF(others); o++) {
                size_t same = 0;
                assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0, 1, others[o].seed, others[o].name,
                                                DTYPE_FLOAT32), 0);
                fill_values(&spec, 0, 4096, w);
                for (size_t i = 0; i < 4096; i++)
                        same += bits_of(w[i]) == bits_of(v[i]);
                assert_true(same < 4);
        }
        free(v);
        free(w);
}

/*
 * The normal formula of docs/semantics.md written out again, one rounded float32 operation at a
 * time (volatile: no contraction, no reassociation), with the coefficients the spec names:
 * fill.c must give these bits exactly.
 */
static float normal_expected(uint32_t x0, uint32_t x1, float mean, float std) {
        static const float q_coef[] = { -0x1.4136acp-4f, 0x1.069f1ap-3f, -0x1.0c8b34p-3f,
                                        0x1.229882p-3f, -0x1.548196p-3f, 0x1.99a3b6p-3f,
                                        -0x1.00022cp-2f, 0x1.55554ep-2f, -0x1.fffffep-2f };
        static const float s_coef[] = { 0x1.413080p-13f, -0x1.328aeep-8f, 0x1.466b8ap-4f,
                                        -0x1.4abbdap-1f, 0x1.921fb6p+0f };
        /* ln u1: u1 = 2^k f, f in [sqrt(1/2), sqrt(2)), by frexp on the exact float */
        uint32_t n1 = (x0 >> 8) + 1;
        int e;
        float f = frexpf((float) n1, &e); /* n1 = f 2^e, f in [1/2, 1) */
        if (f <= (float) M_SQRT1_2) { /* fill.c halves only above float32 sqrt(2) */
                f = f * 2.0f;
                e = e - 1;
        }
        volatile float k = (float) (e - 24);
        volatile float t = f - 1.0f;
        volatile float q = q_coef[0];
        for (size_t j = 1; j < ELEMENTSOF(q_coef); j++) {
                q = q * t;
                q = q + q_coef[j];
        }
        volatile float t2 = t * t, a = t2 * q, b = k * 0x1.2fefa4p-17f, lo = a + b;
        volatile float hi = k * 0x1.62e300p-1f, mid = t + lo, ln_u1 = hi + mid;
        volatile float rad = sqrtf(-2.0f * ln_u1);
        /* cos(2 pi u2) = sin((pi/2) g), g = 1 - 4 u2 folded into [-1, 1] */
        int32_t m = (int32_t) (x1 >> 8), T = (1 << 22) - m;
        if (T < -(1 << 22))
                T = -(1 << 23) - T;
        volatile float g = (float) T * 0x1p-22f, y = g * g;
        volatile float s = s_coef[0];
        for (size_t j = 1; j < ELEMENTSOF(s_coef); j++) {
                s = s * y;
                s = s + s_coef[j];
        }
        volatile float c = g * s, z = rad * c, v = std * z;
        return mean + v;
}

static void test_normal_bit_exact(void **state) {
        static const uint64_t indices[] = {
                0, 1, 2, 15, 16, 17, 12345, UINT64_C(0xffffffff), UINT64_C(0x123456789abcdef0), UINT64_MAX,
        };
        static const uint32_t words[] = {
                0, 0xff, 0x100, 0x3fffff00, 0x40000000, 0x400000ff, 0x7fffff00, 0x80000000,
                0xbfffff00, 0xc0000000, 0xc0000100, 0xffffff00, 0xfffffeff, 0xffffffff, 0x12345678,
                /* u1's reduction at float32 sqrt(2) (mantissa 0x3504f3) and just above it */
                UINT32_C(0xb504f2) << 8, UINT32_C(0xb504f3) << 8, UINT32_C(0x5a8279) << 8,
                UINT32_C(0x5a827a) << 8,
        };
        FillSpec spec;

        /* Through Philox, fill_value() and fill_values() (vector stage, scalar lanes alike). */
        assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0.5, 0.02, 7, "experts.w", DTYPE_FLOAT32), 0);
        for (size_t j = 0; j < ELEMENTSOF(indices); j++) {
                uint64_t i = indices[j];
                uint32_t c[4] = { (uint32_t) i, (uint32_t) (i >> 32), fnv1a32_string("experts.w"), 0 };
                uint32_t k[2] = { 7, 0 }, x[4];
                float got;

                philox4x32_10(c, k, x);
                float want = normal_expected(x[0], x[1], 0.5f, 0.02f);
                assert_int_equal(bits_of(fill_value(&spec, i)), bits_of(want));
                fill_values(&spec, i, 1, &got);
                assert_int_equal(bits_of(got), bits_of(want));
        }
        /* The ends of both grids and the quadrant edges of u2, every pair. */
        for (size_t a = 0; a < ELEMENTSOF(words); a++)
                for (size_t b = 0; b < ELEMENTSOF(words); b++) {
                        float got;
                        fill_normal_from_bits(-1.0f, 3.0f, &words[a], &words[b], 1, &got);
                        assert_int_equal(bits_of(got), bits_of(normal_expected(words[a], words[b], -1.0f, 3.0f)));
                }
        /* u2 = 1/4, 3/4: exactly mean; u1 = 1: the radius is exactly 0. */
        float v[3];
        const uint32_t x0s[3] = { 0x12345600, 0x12345600, 0xffffff00 };
        const uint32_t x1s[3] = { UINT32_C(1) << 30, UINT32_C(3) << 30, 0x12345600 };
        fill_normal_from_bits(0.25f, 2.0f, x0s, x1s, 3, v);
        assert_true(v[0] == 0.25f && v[1] == 0.25f && v[2] == 0.25f);
}

/* One float32 ulp at x (normal range; below it, the subnormals' spacing). */
static double ulp_float(double x) {
        int e;

        x = fabs(x);
        if (x < 0x1p-126)
                return 0x1p-149;
        (void) frexp(x, &e);
        return ldexp(1.0, e - 24);
}

/*
 * Errors of n values v[i] (x0 = a[i] << 8, x1 = b[i] << 8) against the libm reference in double,
 * sqrt(-2 log(u1)) cos(2 pi u2) for u1 = (a + 1) 2^-24, u2 = b 2^-24: the largest in float32
 * ulps, except at the zeros of cos (u2 = 1/4, 3/4) and at u1 = 1, where the value is 0 and
 * libm's is off by the rounding of pi (6e-17 times the radius): there the absolute error. The
 * radius and the cosine of the last a and b are kept: along a grid one of them is fixed, so
 * libm runs once per value, not twice (test-fill also runs under valgrind).
 */
typedef struct NormalErr {
        double max_ulps, max_abs_at_zero;
        uint32_t a, b; /* of rad and cos below; a > 0xffffff: none yet */
        double rad, cos;
} NormalErr;

#define NORMAL_ERR_INIT { .a = UINT32_MAX, .b = UINT32_MAX }

static void normal_err_add(NormalErr *e, const uint32_t *a, const uint32_t *b, const float *v, size_t n) {
        for (size_t i = 0; i < n; i++) {
                if (a[i] != e->a) {
                        e->a = a[i];
                        e->rad = sqrt(-2.0 * log((a[i] + 1) * 0x1p-24));
                }
                if (b[i] != e->b) {
                        e->b = b[i];
                        e->cos = cos(2.0 * M_PI * (b[i] * 0x1p-24));
                }
                double z = e->rad * e->cos;
                if (b[i] == UINT32_C(1) << 22 || b[i] == UINT32_C(3) << 22 || a[i] == 0xffffff) {
                        e->max_abs_at_zero = fmax(e->max_abs_at_zero, fabs((double) v[i] - z));
                        continue;
                }
                e->max_ulps = fmax(e->max_ulps, fabs((double) v[i] - z) / ulp_float(z));
        }
}

/*
 * normal(0, 1) against a libm reference in double (log, cos, sqrt of the same u1, u2) through
 * the bulk fill's own code: within NORMAL_MAX_ULPS of float32, the bound docs/semantics.md
 * states, over the whole u1 grid (2^24 values) at several u2 (0: cos 1; next to the zeros of
 * cos), the whole u2 grid (2^24) at several u1 (the largest and smallest radius; where the worst
 * errors were found), and 2^23 values of real fills; at the zeros of cos, where the value is
 * exactly 0, absolute error.
 */
#define NORMAL_MAX_ULPS 4.5
#define NORMAL_MAX_ABS_AT_ZERO 2e-15
static void test_normal_ulps(void **state) {
        static const uint32_t fixed_u2[] = { 0, (UINT32_C(1) << 22) - 1, (UINT32_C(3) << 22) - 7 };
        static const uint32_t fixed_u1[] = { 0, 2262799, 16260322, 0xfffffe };
        /* Under valgrind (its preload library is in LD_PRELOAD), every 16th value of each grid:
         * it checks memory, not values, and runs this 50 times slower. */
        const char *preload = getenv("LD_PRELOAD");
        const uint32_t step = preload && strstr(preload, "vgpreload") ? 16 : 1;
        const size_t n = (UINT32_C(1) << 24) / step;
        uint32_t *a = malloc(n * sizeof(uint32_t)), *b = malloc(n * sizeof(uint32_t));
        uint32_t *x0 = malloc(n * sizeof(uint32_t)), *x1 = malloc(n * sizeof(uint32_t));
        float *v = malloc(n * sizeof(float));
        NormalErr grid = NORMAL_ERR_INIT, fills = NORMAL_ERR_INIT;

        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(x0);
        assert_non_null(x1);
        assert_non_null(v);
        for (size_t g = 0; g < ELEMENTSOF(fixed_u2) + ELEMENTSOF(fixed_u1); g++) {
                bool u1_grid = g < ELEMENTSOF(fixed_u2);
                for (uint32_t i = 0; i < n; i++) {
                        a[i] = u1_grid ? i * step : fixed_u1[g - ELEMENTSOF(fixed_u2)];
                        b[i] = u1_grid ? fixed_u2[g] : i * step;
                        x0[i] = a[i] << 8 | (i & 0xff); /* the low 8 bits are not used */
                        x1[i] = b[i] << 8 | (~i & 0xff);
                }
                fill_normal_from_bits(0.0f, 1.0f, x0, x1, n, v);
                normal_err_add(&grid, a, b, v, n);
        }

        /* Real fills: Philox words of consecutive indices. */
        uint32_t h = fnv1a32_string("layers.0.w");
        for (uint64_t seed = 0; seed < 2; seed++) {
                FillSpec spec;
                assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0, 1, seed, "layers.0.w",
                                                DTYPE_FLOAT32), 0);
                fill_values(&spec, 0, n / 4, v);
                for (size_t i = 0; i < n / 4; i++) {
                        uint32_t c[4] = { (uint32_t) i, 0, h, 0 }, k[2] = { (uint32_t) seed, 0 }, x[4];
                        philox4x32_10(c, k, x);
                        a[i] = x[0] >> 8;
                        b[i] = x[1] >> 8;
                }
                normal_err_add(&fills, a, b, v, n / 4);
        }
        print_message("normal(0, 1): max error %.4f ulp over the grids (%zu values), %.4f ulp over "
                      "%zu fill values; at the zeros %.3g absolute\n", grid.max_ulps,
                      (ELEMENTSOF(fixed_u2) + ELEMENTSOF(fixed_u1)) * n, fills.max_ulps, n / 2,
                      fmax(grid.max_abs_at_zero, fills.max_abs_at_zero));
        free(a);
        free(b);
        free(x0);
        free(x1);
        free(v);
        assert_true(grid.max_ulps <= NORMAL_MAX_ULPS);
        assert_true(fills.max_ulps <= NORMAL_MAX_ULPS);
        assert_true(grid.max_abs_at_zero <= NORMAL_MAX_ABS_AT_ZERO);
        assert_true(fills.max_abs_at_zero <= NORMAL_MAX_ABS_AT_ZERO);
}

/*
 * The bytes of fixed fills, hashed: the same in this executable and in test-fill-scalar (this
 * file with fill.c built without intrinsics, clones or vectorisation), so the vector paths
 * (AVX-512, AVX2, SSE2, whichever this CPU runs) and the scalar one agree bit for bit, and the
 * values never change unnoticed.
 */
static void test_golden_digest(void **state) {
        const int64_t shape[2] = { 333, 1025 }, local[2] = { 200, 1000 }, offset[2] = { 77, 13 };
        static const struct {
                InitKind kind;
                double a, b;
                Dtype dtype;
                uint32_t digest;
        } cases[] = {
                { INIT_NORMAL, 0.0, 1.0, DTYPE_FLOAT32, GOLDEN_NORMAL_F32 },
                { INIT_NORMAL, 0.5, 0.02, DTYPE_BFLOAT16, GOLDEN_NORMAL_BF16 },
                { INIT_NORMAL, -1.0, 3.0, DTYPE_FLOAT16, GOLDEN_NORMAL_F16 },
                { INIT_UNIFORM, -0.25, 0.75, DTYPE_FLOAT32, GOLDEN_UNIFORM_F32 },
                { INIT_TRUNC_NORMAL, 0.0, 0.02, DTYPE_FLOAT32, GOLDEN_TRUNC_F32 },
                { INIT_TRUNC_NORMAL, 0.5, 1.0, DTYPE_BFLOAT16, GOLDEN_TRUNC_BF16 },
                { INIT_TRUNC_NORMAL, -1.0, 3.0, DTYPE_FLOAT32, GOLDEN_TRUNC_UPPER_F32 },
        };
        /* trunc_normal's bounds, by case (a, b); the others have none. */
        static const double bounds[][2] = { [4] = { -0.04, 0.04 }, [5] = { -1.5, 2.5 }, [6] = { 2.0, 11.0 } };
        uint8_t *buf = malloc(200 * 1000 * 4);
        uint32_t got[ELEMENTSOF(cases)];

        assert_non_null(buf);
        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                FillSpec spec;
                assert_int_equal(fill_spec_init4(&spec, cases[c].kind,
                                                 (const double[4]) { cases[c].a, cases[c].b, bounds[c][0],
                                                                     bounds[c][1] },
                                                 99, "experts.gate_up_proj", cases[c].dtype), 0);
                FillSlice s = { .spec = &spec, .rank = 2, .shape = shape, .local_shape = local,
                                .global_offset = offset, .dst = buf };
                assert_int_equal(fill_run(&s, 1, 0), 0);
                got[c] = fnv1a32(buf, 200 * 1000 * dtype_size(cases[c].dtype));
                print_message("case %zu: digest 0x%08x\n", c, got[c]);
        }
        free(buf);
        for (size_t c = 0; c < ELEMENTSOF(cases); c++)
                assert_int_equal(got[c], cases[c].digest);
}

static void test_uniform_statistics(void **state) {
        const size_t n = 1u << 20;
        float *v = malloc(n * sizeof(float));
        FillSpec spec;
        double sum = 0;
        float lo = INFINITY, hi = -INFINITY;

        assert_non_null(v);
        assert_int_equal(fill_spec_init(&spec, INIT_UNIFORM, -1.0, 3.0, 9, "u", DTYPE_FLOAT32), 0);
        fill_values(&spec, 0, n, v);
        for (size_t i = 0; i < n; i++) {
                sum += v[i];
                lo = v[i] < lo ? v[i] : lo;
                hi = v[i] > hi ? v[i] : hi;
        }
        assert_true(fabs(sum / n - 1.0) < 0.01);
        assert_true(lo >= -1.0f && lo < -0.99f);
        assert_true(hi < 3.0f && hi > 2.99f);
        free(v);
}

/*
 * A rank's segment as a Build lays it out: a float32 norm between bfloat16 matrices, each slice
 * filled in its own parameter's dtype at its own byte offset. The float32 slice holds the
 * float32 values, each bfloat16 slice those values rounded; no slice touches another's bytes.
 */
static void test_mixed_dtype_segment(void **state) {
        static const char *const names[] = { "wq", "norm", "wo" };
        const int64_t shape_w[] = { 5, 7 }, shape_n[] = { 7 };
        const LayoutParameter params[] = {
                { "wq", shape_w, 2, NULL, 0 },
                { "norm", shape_n, 1, NULL, 0, true, DTYPE_FLOAT32 },
                { "wo", shape_w, 2, NULL, 0 },
        };
        _cleanup_(layout_done) Layout l = {};
        FamilyError e = FAMILY_ERROR_NULL;
        FillSpec spec[3];
        FillSlice fills[3];

        assert_int_equal(layout_compute(NULL, params, 3, DTYPE_BFLOAT16, 64, &l, &e), 0);
        const RankLayout *rl = &l.ranks[0];
        assert_int_equal(rl->slices[0].byte_length, 35 * 2);
        assert_int_equal(rl->slices[1].byte_offset, 128);
        assert_int_equal(rl->slices[1].byte_length, 7 * 4);
        assert_int_equal(rl->slices[2].byte_offset, 192);
        assert_int_equal(rl->slices[2].byte_length, 35 * 2);

        _cleanup_free_ uint8_t *seg = malloc(rl->size_bytes);
        assert_non_null(seg);
        memset(seg, 0xa5, rl->size_bytes);
        for (size_t i = 0; i < 3; i++) {
                const ShardSlice *sl = &rl->slices[i];
                assert_int_equal(fill_spec_init(&spec[i], INIT_UNIFORM, -1, 1, 99, names[i],
                                                l.parameters[i].dtype), 0);
                fills[i] = (FillSlice) {
                        .spec = &spec[i], .rank = sl->n_dims, .shape = l.parameters[i].shape,
                        .local_shape = sl->local_shape, .global_offset = sl->global_offset,
                        .dst = seg + sl->byte_offset,
                };
        }
        assert_int_equal(fill_run(fills, 3, 2), 0);

        for (size_t i = 0; i < 3; i++) {
                const ShardSlice *sl = &rl->slices[i];
                FillSpec f32;
                uint64_t n = sl->byte_length / dtype_size(l.parameters[i].dtype);

                assert_int_equal(fill_spec_init(&f32, INIT_UNIFORM, -1, 1, 99, names[i], DTYPE_FLOAT32), 0);
                for (uint64_t k = 0; k < n; k++) {
                        float v = fill_value(&f32, k);
                        const uint8_t *at = seg + sl->byte_offset;
                        if (l.parameters[i].dtype == DTYPE_FLOAT32) {
                                uint32_t got;
                                memcpy(&got, at + 4 * k, 4);
                                assert_int_equal(got, bits_of(v));
                        } else {
                                uint16_t got;
                                memcpy(&got, at + 2 * k, 2);
                                assert_int_equal(got, float_to_bfloat16(v));
                        }
                }
                /* the padding up to the next slice is untouched */
                uint64_t end = i + 1 < 3 ? rl->slices[i + 1].byte_offset : rl->size_bytes;
                for (uint64_t b = sl->byte_offset + sl->byte_length; b < end; b++)
                        assert_int_equal(seg[b], 0xa5);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_philox_known_answers),
                cmocka_unit_test(test_fnv1a32),
                cmocka_unit_test(test_dtype_names),
                cmocka_unit_test(test_uniform_bit_exact),
                cmocka_unit_test(test_constants_exact),
                cmocka_unit_test(test_bfloat16),
                cmocka_unit_test(test_float16),
                cmocka_unit_test(test_invariance),
                cmocka_unit_test(test_mixed_dtype_segment),
                cmocka_unit_test(test_slice_errors),
                cmocka_unit_test(test_normal_statistics),
                cmocka_unit_test(test_uniform_statistics),
                cmocka_unit_test(test_normal_quantile),
                cmocka_unit_test(test_trunc_normal_statistics),
                cmocka_unit_test(test_normal_bit_exact),
                cmocka_unit_test(test_normal_ulps),
                cmocka_unit_test(test_golden_digest),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
