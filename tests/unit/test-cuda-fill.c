/* test-cuda-fill.c: the GPU fill kernel's element code and parameters against fill.c, bit for bit,
 * and the checked-in PTX against its sources. No GPU: cuda-fill-kernel.h compiles as C too. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/fill.h"
#include "common/macro.h"
#include "shm/cuda-fill-kernel.h"
#include "shm/cuda-fill-params.h"
#include "shm/materialize.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) {
        /* splitmix64: the cases are reproducible */
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        return z ^ (z >> 31);
}

static float bits_float(uint32_t u) {
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
}

static void check_conversions(uint32_t b) {
        float f = bits_float(b);
        if (fk_bf16(b) != float_to_bfloat16(f) || fk_f16(b) != float_to_float16(f))
                fail_msg("float bits 0x%08x: bf16 %04x/%04x f16 %04x/%04x", b, fk_bf16(b),
                         float_to_bfloat16(f), fk_f16(b), float_to_float16(f));
}

/* Every rounding case: each exponent, the bits around each half-way point, NaNs, infinities,
 * subnormals of both targets, and a sweep through all 2^32 patterns at a prime stride. */
static void test_conversions_match(void **state) {
        for (uint32_t e = 0; e < 256; e++)
                for (uint32_t m = 0; m < 64; m++) {
                        uint32_t low = m, mid = 0x1000u + m - 32, bfmid = 0x8000u + m - 32;
                        for (uint32_t s = 0; s < 2; s++) {
                                uint32_t base = (s << 31) | (e << 23);
                                check_conversions(base | low);
                                check_conversions(base | (mid & 0x7fffffu));
                                check_conversions(base | (bfmid & 0x7fffffu));
                                check_conversions(base | ((0x7fffffu - m) & 0x7fffffu));
                                check_conversions(base | (((0x2000u * m) + 0x1000u) & 0x7fffffu));
                        }
                }
        for (uint64_t b = 0; b <= UINT32_MAX; b += 4099)
                check_conversions((uint32_t) b);
        check_conversions(0x7f800000u);
        check_conversions(0xff800000u);
        check_conversions(0x7fc00001u);
        check_conversions(0x477ff000u);
        check_conversions(0x477fefffu);
        check_conversions(0x33000000u);
        check_conversions(0x33000001u);
}

static void test_philox_matches(void **state) {
        /* docs/semantics.md's known answer: counter 0 and key 0. */
        assert_int_equal(fk_philox_x0(0, 0, 0, 0), 0x6627e8d5u);
        for (unsigned k = 0; k < 100000; k++) {
                uint64_t i = rnd(), seed = rnd();
                uint32_t h = (uint32_t) rnd(), out[4];
                uint32_t counter[4] = { (uint32_t) i, (uint32_t) (i >> 32), h, 0 };
                uint32_t key[2] = { (uint32_t) seed, (uint32_t) (seed >> 32) };

                philox4x32_10(counter, key, out);
                assert_int_equal(fk_philox_x0(i, h, key[0], key[1]), out[0]);
        }
}

typedef struct Case {
        InitKind kind;
        double a, b;
} Case;

/* A random slice of a random shape (rank 0..5) through the kernel's element function and
 * through fill.c, into two buffers that must be equal byte for byte. */
static void check_random_slice(const Case *c, Dtype dtype, uint64_t seed, size_t rank) {
        int64_t shape[6], local[6], offset[6];
        uint64_t n = 1;
        MaterializeSlice m = {};
        FillKernelParams p;

        for (size_t d = 0; d < rank; d++) {
                shape[d] = 1 + (int64_t) (rnd() % 9);
                local[d] = rnd() % 3 == 0 ? shape[d] : 1 + (int64_t) (rnd() % (uint64_t) shape[d]);
                offset[d] = (int64_t) (rnd() % (uint64_t) (shape[d] - local[d] + 1));
                n *= (uint64_t) local[d];
        }
        assert_int_equal(fill_spec_init(&m.spec, c->kind, c->a, c->b, seed, "wq.weight", dtype), 0);
        m.fill = (FillSlice) {
                .spec = &m.spec,
                .rank = rank,
                .shape = shape,
                .local_shape = local,
                .global_offset = offset,
        };
        size_t bytes = (size_t) n * dtype_size(dtype);
        uint8_t *want = calloc(1, bytes + 8), *got = calloc(1, bytes + 8);
        assert_non_null(want);
        assert_non_null(got);
        m.fill.dst = want;
        assert_int_equal(fill_slice(&m.fill), 0);

        m.byte_offset = 8;
        assert_true(cuda_fill_kernel_params(&m, 1000, &p));
        assert_int_equal(p.dst, 1008);
        assert_int_equal(p.n, n);
        /* A launch writes elements in any order: run them backwards. */
        for (uint64_t j = n; j-- > 0;)
                fk_store(&p, got, j);
        if (memcmp(want, got, bytes) != 0)
                fail_msg("kind %d dtype %d rank %zu seed %llu: the kernel's values differ",
                         (int) c->kind, (int) dtype, rank, (unsigned long long) seed);
        free(want);
        free(got);
}

static void test_elements_match_fill(void **state) {
        static const Case cases[] = {
                { INIT_ZEROS, 0, 0 },          { INIT_ONES, 0, 0 },
                { INIT_CONSTANT, 1.5, 0 },      { INIT_CONSTANT, -2.5, 0 },
                { INIT_CONSTANT, 1e-8, 0 },     { INIT_CONSTANT, 70000.0, 0 },
                { INIT_CONSTANT, 0.1, 0 },      { INIT_UNIFORM, -1, 1 },
                { INIT_UNIFORM, 0, 1 },         { INIT_UNIFORM, -0.02, 0.02 },
                { INIT_UNIFORM, 3.0, 3.0000001 }, { INIT_UNIFORM, -1e6, 1e-3 },
                { INIT_UNIFORM, 0.1, 0.7 },
        };
        for (size_t k = 0; k < ELEMENTSOF(cases); k++)
                for (Dtype d = 0; d < _DTYPE_MAX; d++)
                        for (size_t rank = 0; rank <= 5; rank++)
                                for (unsigned rep = 0; rep < 6; rep++)
                                        check_random_slice(&cases[k], d, rnd(), rank);
}

static void test_params_refuse(void **state) {
        int64_t shape[12], local[12], offset[12];
        MaterializeSlice m = {};
        FillKernelParams p;

        /* normal: fill.c's float32 polynomials, never on the device */
        assert_int_equal(fill_spec_init(&m.spec, INIT_NORMAL, 0, 1, 0, "w", DTYPE_FLOAT32), 0);
        shape[0] = local[0] = 4;
        offset[0] = 0;
        m.fill = (FillSlice) { .spec = &m.spec, .rank = 1, .shape = shape, .local_shape = local,
                               .global_offset = offset };
        assert_false(cuda_fill_kernel_params(&m, 0, &p));
        /* trunc_normal: fill.c's double inverse CDF, never on the device either */
        assert_int_equal(fill_spec_init4(&m.spec, INIT_TRUNC_NORMAL, (const double[4]) { 0, 1, -2, 2 }, 0, "w",
                                         DTYPE_FLOAT32), 0);
        assert_false(cuda_fill_kernel_params(&m, 0, &p));

        /* a walk of more than FK_RANK_MAX outer dimensions */
        assert_int_equal(fill_spec_init(&m.spec, INIT_UNIFORM, 0, 1, 0, "w", DTYPE_FLOAT32), 0);
        for (size_t d = 0; d < 12; d++) {
                shape[d] = 2;
                local[d] = 1;
                offset[d] = 1;
        }
        m.fill.rank = 12;
        assert_false(cuda_fill_kernel_params(&m, 0, &p));
        m.fill.rank = FK_RANK_MAX + 1; /* the last dimension is the run: 8 outer ones */
        assert_true(cuda_fill_kernel_params(&m, 0, &p));
        assert_int_equal(p.n_outer, FK_RANK_MAX);
}

static char *read_file(const char *rel, size_t *ret_size) {
        const char *root = getenv("FAMILYD_SOURCE_ROOT");
        char path[4096];
        FILE *f;

        (void) snprintf(path, sizeof path, "%s/%s", root ? root : "..", rel);
        f = fopen(path, "rb");
        if (!f)
                fail_msg("cannot open %s", path);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        long n = ftell(f);
        assert_true(n >= 0);
        rewind(f);
        char *buf = malloc((size_t) n + 1);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t) n, f), (size_t) n);
        buf[n] = 0;
        fclose(f);
        *ret_size = (size_t) n;
        return buf;
}

/* The PTX familyd embeds was generated from the kernel sources as they are now. */
static void test_ptx_is_current(void **state) {
        size_t n_cu, n_h, n_ptx;
        char *cu = read_file("daemon/shm/cuda-fill.cu", &n_cu);
        char *h = read_file("daemon/shm/cuda-fill-kernel.h", &n_h);
        char *ptx = read_file("daemon/shm/cuda-fill.ptx", &n_ptx);
        uint32_t hash = 0x811c9dc5u;
        char want[96];

        for (size_t i = 0; i < n_cu; i++)
                hash = (hash ^ (uint8_t) cu[i]) * 0x01000193u;
        for (size_t i = 0; i < n_h; i++)
                hash = (hash ^ (uint8_t) h[i]) * 0x01000193u;
        (void) snprintf(want, sizeof want, "// familyd cuda-fill sources fnv1a32 %08x\n", hash);
        if (strncmp(ptx, want, strlen(want)) != 0)
                fail_msg("daemon/shm/cuda-fill.ptx is stale: regenerate it with "
                         "daemon/shm/gen-cuda-fill-ptx.sh (want \"%.*s\")",
                         (int) strlen(want) - 1, want);
        /* The entry point the daemon looks up, its parameter block, and no contraction. */
        assert_non_null(strstr(ptx, ".visible .entry familyd_fill("));
        assert_non_null(strstr(ptx, "familyd_fill_param_0[264]"));
        assert_null(strstr(ptx, "fma."));
        assert_non_null(strstr(ptx, "mul.rn.f32"));
        assert_non_null(strstr(ptx, "add.rn.f32"));
        free(cu);
        free(h);
        free(ptx);
}

/* A rank's slices take each parameter's own dtype from the layout (the build's dtype is only
 * the default): a float32 norm next to bfloat16 matrices, on the host and in the kernel. */
static void test_materialize_per_parameter_dtype(void **state) {
        const int64_t shape_w[] = { 3, 4 }, shape_n[] = { 4 };
        const LayoutParameter params[] = {
                { "wq", shape_w, 2, NULL, 0 },
                { "norm", shape_n, 1, NULL, 0, true, DTYPE_FLOAT32 },
                { "bias", shape_n, 1, NULL, 0, true, DTYPE_FLOAT16 },
        };
        PlanParameter plan_params[] = {
                { .name = (char *) "wq", .init = { INIT_UNIFORM, -1, 1 } },
                { .name = (char *) "norm", .init = { INIT_ONES } },
                { .name = (char *) "bias", .init = { INIT_CONSTANT, 0.1 } },
        };
        BuildPlan plan = { .parameters = plan_params, .n_parameters = 3 };
        _cleanup_(layout_done) Layout l = {};
        _cleanup_free_ MaterializeSlice *m = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        size_t n = 0;

        assert_int_equal(layout_compute(NULL, params, 3, DTYPE_BFLOAT16, 64, &l, &e), 0);
        assert_int_equal(materialize_slices(&plan, &l, &l.ranks[0], 5, &m, &n), 0);
        assert_int_equal(n, 3);
        assert_int_equal(m[0].spec.dtype, DTYPE_BFLOAT16);
        assert_int_equal(m[1].spec.dtype, DTYPE_FLOAT32);
        assert_int_equal(m[2].spec.dtype, DTYPE_FLOAT16);
        for (size_t i = 0; i < n; i++) {
                FillKernelParams p;
                uint8_t want[64] = {}, got[64] = {};

                assert_int_equal(m[i].byte_length, (uint64_t) l.ranks[0].slices[i].byte_length);
                assert_int_equal(m[i].spec.seed, 5);
                assert_true(cuda_fill_kernel_params(&m[i], 0, &p));
                assert_int_equal(p.dtype, (FkU32) l.parameters[i].dtype);
                FillSlice f = m[i].fill;
                f.dst = want;
                assert_int_equal(fill_slice(&f), 0);
                for (uint64_t j = 0; j < p.n; j++)
                        fk_store(&p, got, j);
                assert_memory_equal(want, got, m[i].byte_length);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_conversions_match),
                cmocka_unit_test(test_philox_matches),
                cmocka_unit_test(test_elements_match_fill),
                cmocka_unit_test(test_materialize_per_parameter_dtype),
                cmocka_unit_test(test_params_refuse),
                cmocka_unit_test(test_ptx_is_current),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
