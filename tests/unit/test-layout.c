/* test-layout.c: Build step 5, hand-computed layouts, a tiling property and an independent reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include <inttypes.h>

#include "core/layout.h"
#include "common/macro.h"
#include "core/mesh.h"
#include "core/resource-limits.h"

/* "dp=2 tp=4" -> a view; "" -> an empty view. */
static MeshView view(const char *text) {
        MeshView v = {};
        _cleanup_free_ char *copy = strdup(text);
        char *save = NULL;

        assert_non_null(copy);
        v.dims = calloc(FAMILYD_MAX_MESH_DIMS + 1, sizeof(MeshDim));
        assert_non_null(v.dims);
        for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                char *eq = strrchr(tok, '=');
                assert_non_null(eq);
                *eq = 0;
                v.dims[v.n].name = strdup(tok);
                assert_non_null(v.dims[v.n].name);
                v.dims[v.n].size = strtoll(eq + 1, NULL, 10);
                v.n++;
        }
        return v;
}

/* A mesh over ranks (NULL: 0 .. n-1 in order) of a world of n ranks. */
static Mesh *mesh_make(const char *device, const char *expert, const int64_t *ranks, size_t n) {
        _cleanup_(mesh_spec_done) MeshSpec s = { .device = view(device), .expert = view(expert) };
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;
        int r;

        if (ranks) {
                s.ranks = calloc(n, sizeof(int64_t));
                assert_non_null(s.ranks);
                memcpy(s.ranks, ranks, n * sizeof(int64_t));
                s.n_ranks = n;
        }
        r = mesh_new(&s, (int64_t) n, &m, &e);
        if (r < 0)
                fail_msg("mesh_new: %d %s", r, strempty(e.message));
        return m;
}

#define SHARD(a, d) ((Placement) { .axis = (char *) (a), .kind = PLACEMENT_SHARD, .dim = (d) })
#define REPLICATE(a) ((Placement) { .axis = (char *) (a), .kind = PLACEMENT_REPLICATE })
#define SHAPE(...) ((const int64_t[]) { __VA_ARGS__ }), ELEMENTSOF(((const int64_t[]) { __VA_ARGS__ }))
#define PLACE(...) ((const Placement[]) { __VA_ARGS__ }), ELEMENTSOF(((const Placement[]) { __VA_ARGS__ }))
#define NO_PLACEMENTS NULL, 0

#define F32 DTYPE_FLOAT32
#define BF16 DTYPE_BFLOAT16
#define F16 DTYPE_FLOAT16

static void compute(const Mesh *m, const LayoutParameter *p, size_t n, Dtype dtype, size_t align, Layout *ret) {
        FamilyError e = FAMILY_ERROR_NULL;
        int r;

        r = layout_compute(m, p, n, dtype, align, ret, &e);
        if (r < 0)
                fail_msg("layout_compute: %d %s", r, strempty(e.message));
        assert_false(family_error_is_set(&e));
}

/* Asserts rank position k's slice of parameter i: the box and the bytes. */
static void expect_slice(const Layout *l, size_t k, size_t i, const int64_t *shape, const int64_t *offset,
                         uint64_t byte_offset, uint64_t byte_length) {
        const ShardSlice *s = &l->ranks[k].slices[i];

        assert_int_equal(s->parameter, i);
        assert_string_equal(s->name, l->parameters[i].name);
        assert_int_equal(s->n_dims, l->parameters[i].n_dims);
        for (size_t d = 0; d < s->n_dims; d++) {
                assert_int_equal(s->local_shape[d], shape[d]);
                assert_int_equal(s->global_offset[d], offset[d]);
        }
        assert_int_equal(s->byte_offset, byte_offset);
        assert_int_equal(s->byte_length, byte_length);
}
#define V(...) ((const int64_t[]) { __VA_ARGS__ })

static void test_no_mesh(void **state) {
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "w", SHAPE(3, 5), PLACE(SHARD("tp", 0), REPLICATE("dp")) },
                { "b", SHAPE(7), NO_PLACEMENTS },
                { "s", NULL, 0, NO_PLACEMENTS },
        };

        compute(NULL, p, ELEMENTSOF(p), F32, 64, &l);
        assert_null(l.mesh_id);
        assert_int_equal(l.n_ranks, 1);
        assert_int_equal(l.ranks[0].rank, 0);
        assert_int_equal(l.ranks[0].n_device_coords, 0);
        assert_int_equal(l.ranks[0].n_expert_coords, 0);
        assert_int_equal(l.parameters[0].view, LAYOUT_VIEW_DEVICE);
        assert_int_equal(l.parameters[0].axis_size[0], 1);
        assert_int_equal(l.parameters[0].n_elements, 15);
        expect_slice(&l, 0, 0, V(3, 5), V(0, 0), 0, 60);
        expect_slice(&l, 0, 1, V(7), V(0), 64, 28);
        /* a scalar: one element, no dimensions */
        expect_slice(&l, 0, 2, V(0), V(0), 128, 4);
        assert_int_equal(l.ranks[0].size_bytes, 192);
        assert_int_equal(l.total_bytes, 192);
        assert_ptr_equal(layout_find_rank(&l, 0), &l.ranks[0]);
        assert_null(layout_find_rank(&l, 1));
}

static void test_uneven_and_empty(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("tp=4", "", NULL, 4);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "ten", SHAPE(10, 3), PLACE(SHARD("tp", 0)) }, /* chunk 3: 3 3 3 1 */
                { "three", SHAPE(3), PLACE(SHARD("tp", -1)) },  /* chunk 1: 1 1 1 0 */
                { "five", SHAPE(2, 5), PLACE(SHARD("tp", 1)) }, /* chunk 2: 2 2 1 0 */
        };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        assert_string_equal(l.mesh_id, m->id);
        assert_int_equal(l.n_ranks, 4);
        assert_int_equal(l.parameters[1].placements[0].dim, 0);
        assert_int_equal(l.parameters[1].axis_size[0], 4);
        expect_slice(&l, 0, 0, V(3, 3), V(0, 0), 0, 36);
        expect_slice(&l, 3, 0, V(1, 3), V(9, 0), 0, 12);
        expect_slice(&l, 2, 1, V(1), V(2), 64, 4);
        expect_slice(&l, 3, 1, V(0), V(3), 0, 0);
        expect_slice(&l, 0, 2, V(2, 2), V(0, 0), 128, 16);
        expect_slice(&l, 2, 2, V(2, 1), V(0, 4), 128, 8);
        expect_slice(&l, 3, 2, V(2, 0), V(0, 5), 0, 0);
        assert_int_equal(l.ranks[0].size_bytes, 192);
        assert_int_equal(l.ranks[2].size_bytes, 192);
        assert_int_equal(l.ranks[3].size_bytes, 64);
        assert_int_equal(l.ranks[3].device_coords[0], 3);
}

static void test_all_empty_rank(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("tp=4", "", NULL, 4);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "w", SHAPE(2), PLACE(SHARD("tp", 0)) },
                { "z", SHAPE(0, 8), PLACE(SHARD("tp", 1)) },
        };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        expect_slice(&l, 1, 0, V(1), V(1), 0, 4);
        assert_int_equal(l.ranks[1].size_bytes, 64);
        for (size_t k = 2; k < 4; k++) {
                expect_slice(&l, k, 0, V(0), V(2), 0, 0);
                assert_int_equal(l.ranks[k].size_bytes, 0);
        }
        for (size_t k = 0; k < 4; k++)
                expect_slice(&l, k, 1, V(0, 2), V(0, 2 * (int64_t) k), 0, 0);
        assert_int_equal(l.total_bytes, 128);
}

static void test_nested_axes(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 tp=2", "", NULL, 4);
        _cleanup_(layout_done) Layout l = {};
        /* dp splits 7 as 4 + 3, then tp splits each: 2 + 2 and 2 + 1; placement order is irrelevant. */
        LayoutParameter p[] = {
                { "w", SHAPE(7, 2), PLACE(SHARD("tp", 0), SHARD("dp", -2)) },
        };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        expect_slice(&l, 0, 0, V(2, 2), V(0, 0), 0, 16);
        expect_slice(&l, 1, 0, V(2, 2), V(2, 0), 0, 16);
        expect_slice(&l, 2, 0, V(2, 2), V(4, 0), 0, 16);
        expect_slice(&l, 3, 0, V(1, 2), V(6, 0), 0, 8);
        assert_int_equal(l.ranks[3].device_coords[0], 1);
        assert_int_equal(l.ranks[3].device_coords[1], 1);
}

static void test_nested_three_empty(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 cp=3 tp=2", "", NULL, 12);
        _cleanup_(layout_done) Layout l = {};
        /* dp: 5 -> 3 + 2; cp on 3: 1 1 1, on 2: 1 1 0; tp on 1: 1 0, on 0: 0 0. */
        LayoutParameter p[] = {
                { "w", SHAPE(5), PLACE(SHARD("cp", 0), SHARD("tp", 0), SHARD("dp", 0)) },
        };
        static const int64_t len[12] = { 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0 };
        static const int64_t off[12] = { 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5 };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        for (size_t k = 0; k < 12; k++) {
                expect_slice(&l, k, 0, &len[k], &off[k], 0, (uint64_t) len[k] * 4);
                assert_int_equal(l.ranks[k].size_bytes, len[k] ? 64 : 0);
        }
}

static void test_rank_order(void **state) {
        static const int64_t ranks[] = { 5, 4, 3, 2, 1, 0 };
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 tp=3", "", ranks, 6);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "w", SHAPE(4, 7), PLACE(SHARD("dp", 0), SHARD("tp", 1)) }, /* 2 + 2, 3 + 3 + 1 */
                { "n", SHAPE(9), PLACE(REPLICATE("tp")) },
        };

        compute(m, p, ELEMENTSOF(p), BF16, 128, &l);
        assert_int_equal(l.ranks[0].rank, 5);
        assert_int_equal(l.ranks[5].rank, 0);
        /* position 5 is (dp 1, tp 2): rows 2..4, column 6 */
        expect_slice(&l, 5, 0, V(2, 1), V(2, 6), 0, 4);
        expect_slice(&l, 5, 1, V(9), V(0), 128, 18);
        assert_int_equal(l.ranks[5].size_bytes, 256);
        assert_ptr_equal(layout_find_rank(&l, 0), &l.ranks[5]);
        assert_int_equal(l.parameters[1].placements[0].kind, PLACEMENT_REPLICATE);
        assert_int_equal(l.parameters[1].axis_size[0], 3);
}

static void test_expert_view(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 tp=2", "edp=1 ep=4", NULL, 4);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                /* ep is only in the expert view: laid out there, where tp has size 1 */
                { "experts", SHAPE(8, 3), PLACE(SHARD("ep", 0), SHARD("tp", -1)) },
                /* no expert-only axis: the device view; pp is in neither view, so of size 1 */
                { "router", SHAPE(6, 4), PLACE(SHARD("tp", 0), REPLICATE("pp")) },
                { "dense", SHAPE(8), PLACE(SHARD("dp", 0)) },
                /* a replicate on an expert-only axis also chooses the expert view */
                { "gate", SHAPE(8), PLACE(SHARD("dp", 0), REPLICATE("edp")) },
        };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        assert_int_equal(l.parameters[0].view, LAYOUT_VIEW_EXPERT);
        assert_int_equal(l.parameters[0].axis_size[0], 4);
        assert_int_equal(l.parameters[0].axis_size[1], 1);
        assert_int_equal(l.parameters[0].placements[1].dim, 1);
        assert_int_equal(l.parameters[1].view, LAYOUT_VIEW_DEVICE);
        assert_int_equal(l.parameters[1].axis_size[1], 1);
        assert_int_equal(l.parameters[2].view, LAYOUT_VIEW_DEVICE);
        assert_int_equal(l.parameters[3].view, LAYOUT_VIEW_EXPERT);
        assert_string_equal(layout_view_to_string(l.parameters[3].view), "expert");
        /* experts: 8 over ep=4, 2 each */
        expect_slice(&l, 0, 0, V(2, 3), V(0, 0), 0, 24);
        expect_slice(&l, 3, 0, V(2, 3), V(6, 0), 0, 24);
        /* router over device tp: rank 3 is (dp 1, tp 1) */
        expect_slice(&l, 3, 1, V(3, 4), V(3, 0), 64, 48);
        expect_slice(&l, 3, 2, V(4), V(4), 128, 16);
        /* gate: dp has size 1 in the expert view, so every rank holds it whole */
        expect_slice(&l, 3, 3, V(8), V(0), 192, 32);
        assert_int_equal(l.ranks[3].n_device_coords, 2);
        assert_int_equal(l.ranks[3].n_expert_coords, 2);
        assert_int_equal(l.ranks[3].expert_coords[0], 0);
        assert_int_equal(l.ranks[3].expert_coords[1], 3);
}

static void test_expert_name_in_both_views(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 tp=2", "ep=2 tp=2", NULL, 4);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "a", SHAPE(4, 4), PLACE(SHARD("tp", 1), SHARD("ep", 0)) },
                { "b", SHAPE(4, 4), PLACE(SHARD("tp", 1)) },
        };

        compute(m, p, ELEMENTSOF(p), F32, 64, &l);
        assert_int_equal(l.parameters[0].view, LAYOUT_VIEW_EXPERT);
        assert_int_equal(l.parameters[1].view, LAYOUT_VIEW_DEVICE);
        expect_slice(&l, 2, 0, V(2, 2), V(2, 0), 0, 16);
        expect_slice(&l, 2, 1, V(4, 2), V(0, 0), 64, 32);
}

static void test_alignment(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("tp=2", "", NULL, 2);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "a", SHAPE(3, 3), PLACE(SHARD("tp", 0)) }, /* 2 + 1 rows */
                { "b", SHAPE(1), NO_PLACEMENTS },
                { "c", SHAPE(5), PLACE(SHARD("tp", 0)) }, /* 3 + 2 */
        };
        FamilyError e = FAMILY_ERROR_NULL;
        Layout bad = {};

        compute(m, p, ELEMENTSOF(p), BF16, 4096, &l);
        expect_slice(&l, 0, 0, V(2, 3), V(0, 0), 0, 12);
        expect_slice(&l, 0, 1, V(1), V(0), 4096, 2);
        expect_slice(&l, 0, 2, V(3), V(0), 8192, 6);
        expect_slice(&l, 1, 2, V(2), V(3), 8192, 4);
        assert_int_equal(l.ranks[0].size_bytes, 3 * 4096);
        assert_int_equal(l.total_bytes, 6 * 4096);

        /* alignment and element size are the caller's business: plain -EINVAL, no error text */
        assert_int_equal(layout_compute(m, p, ELEMENTSOF(p), F32, 32, &bad, &e), -EINVAL);
        assert_int_equal(layout_compute(m, p, ELEMENTSOF(p), F32, 96, &bad, &e), -EINVAL);
        assert_int_equal(layout_compute(m, p, ELEMENTSOF(p), _DTYPE_INVALID, 64, &bad, &e), -EINVAL);
        assert_int_equal(layout_compute(m, p, ELEMENTSOF(p), _DTYPE_MAX, 64, &bad, &e), -EINVAL);
        /* so is a parameter's own dtype */
        p[1].has_dtype = true;
        p[1].dtype = _DTYPE_MAX;
        assert_int_equal(layout_compute(m, p, ELEMENTSOF(p), F32, 64, &bad, &e), -EINVAL);
        assert_false(family_error_is_set(&e));
}

/* A bfloat16 build with a float32 norm and a float16 matrix: each slice counts its own
 * parameter's element size; every offset stays 64-byte aligned. */
static void test_mixed_dtypes(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("tp=2", "", NULL, 2);
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[] = {
                { "q", SHAPE(8, 6), PLACE(SHARD("tp", 0)) },                      /* build's: 2 bytes */
                { "norm", SHAPE(10), PLACE(REPLICATE("tp")), true, F32 },         /* 4 bytes */
                { "o", SHAPE(6, 8), PLACE(SHARD("tp", 1)), true, F16 },           /* 2 bytes */
                { "s", NULL, 0, NO_PLACEMENTS, true, F32 },                       /* a scalar */
                { "bias", SHAPE(3), PLACE(SHARD("tp", 0)), true, BF16 },          /* 2 + 1 */
        };

        compute(m, p, ELEMENTSOF(p), BF16, 64, &l);
        assert_int_equal(l.parameters[0].dtype, BF16);
        assert_int_equal(l.parameters[1].dtype, F32);
        assert_int_equal(l.parameters[2].dtype, F16);
        assert_int_equal(l.parameters[3].dtype, F32);
        assert_int_equal(l.parameters[4].dtype, BF16);
        for (size_t k = 0; k < 2; k++) {
                expect_slice(&l, k, 0, V(4, 6), V(4 * (int64_t) k, 0), 0, 48);
                expect_slice(&l, k, 1, V(10), V(0), 64, 40);
                expect_slice(&l, k, 2, V(6, 4), V(0, 4 * (int64_t) k), 128, 48);
                expect_slice(&l, k, 3, V(0), V(0), 192, 4);
        }
        expect_slice(&l, 0, 4, V(2), V(0), 256, 4);
        expect_slice(&l, 1, 4, V(1), V(2), 256, 2);
        assert_int_equal(l.ranks[0].size_bytes, 320);
        assert_int_equal(l.ranks[1].size_bytes, 320);
        assert_int_equal(l.total_bytes, 640);

        /* the same parameters all float32: twice the bytes where the build's were 2 */
        _cleanup_(layout_done) Layout f = {};
        for (size_t i = 0; i < ELEMENTSOF(p); i++)
                p[i].has_dtype = false;
        compute(m, p, ELEMENTSOF(p), F32, 64, &f);
        expect_slice(&f, 0, 0, V(4, 6), V(0, 0), 0, 96);
        expect_slice(&f, 0, 1, V(10), V(0), 128, 40);
        expect_slice(&f, 0, 2, V(6, 4), V(0, 0), 192, 96);
        assert_int_equal(f.parameters[0].dtype, F32);
}

static void expect_error(const Mesh *m, const LayoutParameter *p, size_t n, Dtype dtype, FamilyStatus status,
                         const char *reason, const char *message) {
        FamilyError e = FAMILY_ERROR_NULL;
        Layout l = { .n_ranks = 77 };

        assert_int_equal(layout_compute(m, p, n, dtype, 64, &l, &e), -EINVAL);
        assert_int_equal(l.n_ranks, 77);
        assert_int_equal(e.status, status);
        assert_string_equal(e.reason, reason);
        assert_string_equal(e.message, message);
        family_error_done(&e);
}

/* Experts split over ep must divide evenly: an uneven split is refused, never laid out. */
static void test_experts_uneven(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=2 tp=2", "edp=1 ep=4", NULL, 4);
        _cleanup_(mesh_unrefp) Mesh *nested = mesh_make("edp=2 ep=2", "", NULL, 4);
        _cleanup_(mesh_unrefp) Mesh *device_ep = mesh_make("ep=4", "", NULL, 4);
        LayoutParameter six[] = {
                { "router", SHAPE(6, 4), PLACE(SHARD("tp", 0)) }, /* tp stays allowed uneven */
                { "experts", SHAPE(6, 3), PLACE(SHARD("ep", 0), SHARD("tp", -1)) },
        };
        /* edp splits 6 as 3 + 3 first: 3 experts do not divide over ep=2 */
        LayoutParameter inner[] = { { "w", SHAPE(6, 2), PLACE(SHARD("ep", 0), SHARD("edp", 0)) } };
        /* dimension 1, counted after normalising shard(-1) */
        LayoutParameter last[] = { { "w", SHAPE(2, 5), PLACE(SHARD("ep", -1)) } };
        LayoutParameter ok[] = {
                { "w", SHAPE(4, 2), PLACE(SHARD("ep", 0), SHARD("edp", 0)) },
                { "z", SHAPE(0, 3), PLACE(SHARD("ep", 0)) }, /* no experts divide evenly */
                { "r", SHAPE(3), PLACE(REPLICATE("ep")) },   /* replicated: nothing to split */
        };
        _cleanup_(layout_done) Layout l = {};

        expect_error(m, six, 2, F32, FAMILY_STATUS_INVALID_ARGUMENT, "EXPERTS_UNEVEN",
                     "parameter 'experts': 6 experts (dimension 0) do not divide over ep=4; "
                     "each ep rank must hold the same number of experts");
        expect_error(nested, inner, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "EXPERTS_UNEVEN",
                     "parameter 'w': 3 experts (dimension 0) do not divide over ep=2; "
                     "each ep rank must hold the same number of experts");
        expect_error(device_ep, last, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "EXPERTS_UNEVEN",
                     "parameter 'w': 5 experts (dimension 1) do not divide over ep=4; "
                     "each ep rank must hold the same number of experts");
        {
                FamilyError e = FAMILY_ERROR_NULL;
                Layout bad = {};

                assert_int_equal(layout_compute(m, six, 2, F32, 64, &bad, &e), -EINVAL);
                assert_string_equal(e.field, "experts");
                family_error_done(&e);
        }

        compute(nested, ok, ELEMENTSOF(ok), F32, 64, &l);
        expect_slice(&l, 3, 0, V(1, 2), V(3, 0), 0, 8);
        /* without a mesh, or with ep of size 1, nothing is split */
        _cleanup_(layout_done) Layout whole = {};
        compute(NULL, six, 2, F32, 64, &whole);
        expect_slice(&whole, 0, 1, V(6, 3), V(0, 0), 128, 72);
}

static void test_errors(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("tp=2", "", NULL, 2);
        LayoutParameter over[] = { { "w", SHAPE(INT64_MAX / 2, 3), NO_PLACEMENTS } };
        LayoutParameter bytes[] = { { "w", SHAPE(INT64_MAX / 2, 1), NO_PLACEMENTS } };
        /* the same count in the build's 2-byte dtype fits: the parameter's own 4 bytes do not */
        LayoutParameter own_bytes[] = { { "w", SHAPE(INT64_MAX / 2, 1), NO_PLACEMENTS, true, F32 } };
        LayoutParameter neg[] = { { "w", SHAPE(4, -3), NO_PLACEMENTS } };
        LayoutParameter dim[] = { { "w", SHAPE(4, 4), PLACE(SHARD("tp", 2)) } };
        LayoutParameter ndim[] = { { "w", SHAPE(4, 4), PLACE(SHARD("tp", -3)) } };
        LayoutParameter twice[] = { { "w", SHAPE(4), PLACE(SHARD("tp", 0), REPLICATE("tp")) } };
        LayoutParameter deep[] = { { "w", SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), NO_PLACEMENTS } };
        /* each fits alone; together one rank's segment passes INT64_MAX */
        LayoutParameter sum[] = {
                { "a", SHAPE(INT64_MAX / 6), NO_PLACEMENTS },
                { "b", SHAPE(INT64_MAX / 6), NO_PLACEMENTS },
        };
        /* empty tensors with huge dimensions are fine */
        LayoutParameter zero[] = { { "z", SHAPE(INT64_MAX, INT64_MAX, 0), PLACE(SHARD("tp", 0)) } };
        _cleanup_(layout_done) Layout l = {};

        expect_error(m, over, 1, BF16, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w' has more than 9223372036854775807 elements");
        expect_error(m, bytes, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w' needs more than 9223372036854775807 bytes");
        expect_error(m, own_bytes, 1, BF16, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w' needs more than 9223372036854775807 bytes");
        expect_error(m, neg, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w': dimension 1 must not be negative, got -3");
        expect_error(m, dim, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w': shard(2) on 'tp' is out of range for 2 dimensions");
        expect_error(m, ndim, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w': shard(-3) on 'tp' is out of range for 2 dimensions");
        expect_error(m, twice, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w' places axis 'tp' twice");
        expect_error(m, deep, 1, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "parameter 'w' has 17 dimensions, at most 16 are supported");
        expect_error(NULL, sum, 2, F32, FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE",
                     "rank 0 needs more than 9223372036854775807 bytes");

        compute(m, zero, 1, F32, 64, &l);
        expect_slice(&l, 1, 0, V(INT64_MAX / 2, INT64_MAX, 0), V(INT64_MAX / 2 + 1, 0, 0), 0, 0);
        assert_int_equal(l.total_bytes, 0);
}

static void test_limits(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make("dp=64 tp=64", "", NULL, 4096);
        _cleanup_free_ LayoutParameter *p = calloc(LAYOUT_MAX_PARAMETERS + 1, sizeof(LayoutParameter));
        static const int64_t shape[] = { 4 };
        _cleanup_(layout_done) Layout l = {};

        assert_non_null(p);
        for (size_t i = 0; i <= LAYOUT_MAX_PARAMETERS; i++)
                p[i] = (LayoutParameter) { .name = "w", .shape = shape, .n_dims = 1 };
        expect_error(NULL, p, LAYOUT_MAX_PARAMETERS + 1, F32, FAMILY_STATUS_RESOURCE_EXHAUSTED, "LAYOUT_LIMIT",
                     "layout limit reached: 65537 parameters, at most 65536");
        /* 4096 ranks * (2 coordinates + 1024 * 2) = 8396800 > 2^23 entries */
        expect_error(m, p, 1024, F32, FAMILY_STATUS_RESOURCE_EXHAUSTED, "LAYOUT_LIMIT",
                     "layout limit reached: 4096 ranks by 1024 parameters exceed 8388608 entries");
        compute(m, p, 1000, F32, 64, &l);
        assert_int_equal(l.n_ranks, 4096);
        assert_int_equal(l.total_bytes, 4096 * 1000 * 64);
}

/* A small deterministic generator, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rnd(uint64_t n) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state % n;
}

static const char *const axis_names[] = { "dp", "cp", "tp", "ep", "edp", "pp" };

/* "a=2 b=3" over distinct names whose sizes multiply to n. */
static void random_view_text(size_t n, char *buf, size_t size) {
        size_t k = 1 + rnd(3), sizes[3] = { 1, 1, 1 }, used = 0;
        const char *names[3];

        for (size_t p = 2; n > 1; p++)
                while (n % p == 0) {
                        sizes[rnd(k)] *= p;
                        n /= p;
                }
        while (used < k) {
                const char *c = axis_names[rnd(ELEMENTSOF(axis_names))];
                bool dup = false;

                for (size_t i = 0; i < used; i++)
                        dup = dup || streq(names[i], c);
                if (!dup)
                        names[used++] = c;
        }
        buf[0] = 0;
        for (size_t i = 0; i < k; i++)
                snprintf(buf + strlen(buf), size - strlen(buf), "%s%s=%zu", i ? " " : "", names[i], sizes[i]);
}

/*
 * Every element of each tensor is held by exactly as many ranks as the product of the sizes of
 * the view's dimensions that do not shard it; no rank's byte ranges overlap.
 */
static void test_tiling_property(void **state) {
        static const size_t sizes[] = { 1, 2, 3, 4, 6, 8, 12, 16 };

        for (unsigned iter = 0; iter < 400; iter++) {
                size_t n = sizes[rnd(ELEMENTSOF(sizes))];
                char dev[128], exp[128] = "";
                int64_t shapes[4][3];
                Placement pl[4][6];
                LayoutParameter p[4];
                size_t np = 1 + rnd(4);
                _cleanup_(mesh_unrefp) Mesh *m = NULL;
                _cleanup_(layout_done) Layout l = {};

                random_view_text(n, dev, sizeof dev);
                if (rnd(2))
                        random_view_text(n, exp, sizeof exp);
                m = mesh_make(dev, exp, NULL, n);
                for (size_t i = 0; i < np; i++) {
                        size_t rank = 1 + rnd(3), npl = 0;

                        for (size_t d = 0; d < rank; d++)
                                shapes[i][d] = (int64_t) rnd(12);
                        for (size_t a = 0; a < ELEMENTSOF(axis_names); a++) {
                                if (rnd(3) == 0)
                                        continue;
                                pl[i][npl++] = rnd(4) ? SHARD(axis_names[a], (int64_t) rnd(2 * rank) - (int64_t) rank)
                                                      : REPLICATE(axis_names[a]);
                        }
                        /* experts divide over ep (else refused, test_experts_uneven): a multiple of
                         * n divides over every nesting of the view's sizes, which multiply to n */
                        for (size_t j = 0; j < npl; j++)
                                if (pl[i][j].kind == PLACEMENT_SHARD && streq(pl[i][j].axis, "ep"))
                                        shapes[i][pl[i][j].dim < 0 ? pl[i][j].dim + (int64_t) rank : pl[i][j].dim] =
                                                (int64_t) (n * rnd(3));
                        /* mixed element sizes: some parameters name their own dtype */
                        p[i] = (LayoutParameter) { "p", shapes[i], rank, pl[i], npl, rnd(2) == 0,
                                                   (Dtype) rnd(_DTYPE_MAX) };
                }
                Dtype dtype = (Dtype) rnd(_DTYPE_MAX);
                compute(m, p, np, dtype, 64, &l);

                for (size_t i = 0; i < np; i++) {
                        const ParameterLayout *pp = &l.parameters[i];
                        const MeshView *v = pp->view == LAYOUT_VIEW_EXPERT ? &m->spec.expert : &m->spec.device;
                        int64_t replication = 1;
                        _cleanup_free_ unsigned *count = calloc(pp->n_elements + 1, sizeof(unsigned));

                        assert_non_null(count);
                        for (size_t k = 0; k < v->n; k++) {
                                bool shards = false;

                                for (size_t j = 0; j < pp->n_placements; j++)
                                        shards = shards || (pp->placements[j].kind == PLACEMENT_SHARD &&
                                                            streq(pp->placements[j].axis, v->dims[k].name));
                                if (!shards)
                                        replication *= v->dims[k].size;
                        }
                        for (size_t r = 0; r < l.n_ranks; r++) {
                                const ShardSlice *s = &l.ranks[r].slices[i];
                                uint64_t n_local = 1;

                                for (size_t d = 0; d < s->n_dims; d++) {
                                        assert_true(s->global_offset[d] >= 0 && s->local_shape[d] >= 0);
                                        assert_true(s->global_offset[d] + s->local_shape[d] <= pp->shape[d]);
                                        n_local *= (uint64_t) s->local_shape[d];
                                }
                                assert_int_equal(pp->dtype, p[i].has_dtype ? p[i].dtype : dtype);
                                assert_int_equal(s->byte_length, n_local * dtype_size(pp->dtype));
                                for (uint64_t e = 0; e < n_local; e++) {
                                        uint64_t rem = e, flat = 0;
                                        int64_t idx[3];

                                        for (size_t d = s->n_dims; d > 0; d--) {
                                                idx[d - 1] = s->global_offset[d - 1] + (int64_t) (rem % (uint64_t) s->local_shape[d - 1]);
                                                rem /= (uint64_t) s->local_shape[d - 1];
                                        }
                                        for (size_t d = 0; d < s->n_dims; d++)
                                                flat = flat * (uint64_t) pp->shape[d] + (uint64_t) idx[d];
                                        count[flat]++;
                                }
                        }
                        for (uint64_t e = 0; e < pp->n_elements; e++)
                                assert_int_equal(count[e], replication);
                }
                for (size_t r = 0; r < l.n_ranks; r++) {
                        uint64_t end = 0;

                        for (size_t i = 0; i < np; i++) {
                                const ShardSlice *s = &l.ranks[r].slices[i];

                                if (s->byte_length == 0) {
                                        assert_int_equal(s->byte_offset, 0);
                                        continue;
                                }
                                assert_int_equal(s->byte_offset % 64, 0);
                                assert_true(s->byte_offset >= end);
                                end = s->byte_offset + s->byte_length;
                        }
                        assert_true(l.ranks[r].size_bytes >= end && l.ranks[r].size_bytes < end + 64);
                        assert_int_equal(l.ranks[r].size_bytes % 64, 0);
                }
        }
}

/* The reference's output, as whitespace-separated tokens. */
typedef struct Tokens {
        char *text;
        char *save;
} Tokens;

static const char *tok(Tokens *t) {
        char *s = strtok_r(t->text, " \t\n", &t->save);

        t->text = NULL;
        if (!s)
                fail_msg("layout_reference.py output ended early");
        return s;
}

static void tok_expect(Tokens *t, const char *word) {
        const char *s = tok(t);

        if (!streq(s, word))
                fail_msg("layout_reference.py: expected '%s', got '%s'", word, s);
}

static int64_t tok_int(Tokens *t) {
        const char *s = tok(t);
        char *end;
        long long v = strtoll(s, &end, 10);

        if (*end)
                fail_msg("layout_reference.py: expected a number, got '%s'", s);
        return (int64_t) v;
}

static char *tok_view(Tokens *t) {
        size_t n = (size_t) tok_int(t), len = 0;
        char *buf = calloc(1, 512);

        assert_non_null(buf);
        for (size_t i = 0; i < n; i++) {
                const char *name = tok(t);
                int64_t size = tok_int(t);

                len += (size_t) snprintf(buf + len, 512 - len, "%s%s=%" PRId64, i ? " " : "", name, size);
        }
        return buf;
}

typedef struct RefParam {
        char *name;
        int64_t shape[FAMILYD_MAX_SHAPE_RANK];
        Placement placements[16];
        size_t n_placements;
} RefParam;

static size_t n_refused;

static const char *check_case(Tokens *t) {
        static char name[128];
        _cleanup_(mesh_unrefp) Mesh *m = NULL;
        _cleanup_(layout_done) Layout l = {};
        LayoutParameter p[8];
        RefParam rp[8];
        size_t np = 0, elem, align;
        const char *s;

        snprintf(name, sizeof name, "%s", tok(t));
        tok_expect(t, "elem");
        elem = (size_t) tok_int(t);
        tok_expect(t, "align");
        align = (size_t) tok_int(t);
        tok_expect(t, "mesh");
        s = tok(t);
        if (!streq(s, "none")) {
                size_t n = (size_t) strtoull(s, NULL, 10);
                _cleanup_free_ int64_t *ranks = calloc(n, sizeof(int64_t));
                _cleanup_free_ char *dev = NULL, *exp = NULL;

                assert_non_null(ranks);
                tok_expect(t, "ranks");
                for (size_t i = 0; i < n; i++)
                        ranks[i] = tok_int(t);
                tok_expect(t, "device");
                dev = tok_view(t);
                tok_expect(t, "expert");
                exp = tok_view(t);
                m = mesh_make(dev, exp, ranks, n);
        }

        for (s = tok(t); streq(s, "param"); s = tok(t)) {
                RefParam *r = &rp[np];

                assert_true(np < ELEMENTSOF(rp));
                r->name = (char *) tok(t);
                p[np] = (LayoutParameter) { .name = r->name, .shape = r->shape };
                p[np].n_dims = (size_t) tok_int(t);
                for (size_t d = 0; d < p[np].n_dims; d++)
                        r->shape[d] = tok_int(t);
                r->n_placements = (size_t) tok_int(t);
                for (size_t j = 0; j < r->n_placements; j++) {
                        r->placements[j].axis = (char *) tok(t);
                        r->placements[j].kind = streq(tok(t), "shard") ? PLACEMENT_SHARD : PLACEMENT_REPLICATE;
                        r->placements[j].dim = tok_int(t);
                }
                p[np].placements = r->placements;
                p[np].n_placements = r->n_placements;
                np++;
        }
        /* The reference counts bytes per element (1, 2, 4 or 8); dtypes have 2 or 4, and the
         * others' boxes are still compared. */
        bool bytes = elem == 2 || elem == 4;
        if (streq(s, "refused")) {
                FamilyError e = FAMILY_ERROR_NULL;
                Layout bad = {};

                n_refused++;
                assert_int_equal(layout_compute(m, p, np, elem == 2 ? BF16 : F32, align, &bad, &e), -EINVAL);
                assert_string_equal(e.reason, "EXPERTS_UNEVEN");
                assert_string_equal(e.field, tok(t));
                family_error_done(&e);
                tok_expect(t, "end");
                return name;
        }
        compute(m, p, np, elem == 2 ? BF16 : F32, align, &l);

        for (size_t i = 0; i < np; i++, s = tok(t)) {
                const ParameterLayout *pl = &l.parameters[i];

                if (!streq(s, "expect_param"))
                        fail_msg("%s: expected expect_param, got '%s'", name, s);
                assert_string_equal(tok(t), pl->name);
                assert_string_equal(tok(t), layout_view_to_string(pl->view));
                assert_int_equal(tok_int(t), pl->n_placements);
                for (size_t j = 0; j < pl->n_placements; j++) {
                        assert_string_equal(tok(t), pl->placements[j].axis);
                        assert_string_equal(tok(t), placement_kind_to_string(pl->placements[j].kind));
                        assert_int_equal(tok_int(t), pl->placements[j].dim);
                        assert_int_equal(tok_int(t), pl->axis_size[j]);
                }
        }
        for (size_t k = 0; k < l.n_ranks; k++, s = tok(t)) {
                const RankLayout *rl = &l.ranks[k];

                if (!streq(s, "expect_rank"))
                        fail_msg("%s: expected expect_rank, got '%s'", name, s);
                assert_int_equal(tok_int(t), rl->rank);
                int64_t size_bytes = tok_int(t);
                if (bytes)
                        assert_int_equal(size_bytes, rl->size_bytes);
                assert_int_equal(tok_int(t), rl->n_device_coords);
                for (size_t c = 0; c < rl->n_device_coords; c++)
                        assert_int_equal(tok_int(t), rl->device_coords[c]);
                assert_int_equal(tok_int(t), rl->n_expert_coords);
                for (size_t c = 0; c < rl->n_expert_coords; c++)
                        assert_int_equal(tok_int(t), rl->expert_coords[c]);
                for (size_t i = 0; i < np; i++) {
                        const ShardSlice *sl = &rl->slices[i];

                        tok_expect(t, "expect_slice");
                        assert_int_equal(tok_int(t), sl->n_dims);
                        for (size_t d = 0; d < sl->n_dims; d++)
                                assert_int_equal(tok_int(t), sl->local_shape[d]);
                        for (size_t d = 0; d < sl->n_dims; d++)
                                assert_int_equal(tok_int(t), sl->global_offset[d]);
                        int64_t byte_offset = tok_int(t), byte_length = tok_int(t);
                        if (bytes) {
                                assert_int_equal(byte_offset, sl->byte_offset);
                                assert_int_equal(byte_length, sl->byte_length);
                        }
                }
        }
        if (!streq(s, "end"))
                fail_msg("%s: expected end, got '%s'", name, s);
        return name;
}

static void test_reference(void **state) {
        const char *root = getenv("FAMILYD_SOURCE_ROOT");
        _cleanup_free_ char *cmd = NULL, *text = NULL;
        size_t size = 0, n_cases = 0;
        FILE *f;
        Tokens t = {};

        /* meson sets the root for every unit test: its absence is a broken setup, not a skip */
        if (!root)
                fail_msg("FAMILYD_SOURCE_ROOT is not set");
        if (access("/usr/bin/python3", X_OK) < 0)
                skip();
        assert_true(asprintf(&cmd, "/usr/bin/python3 '%s/tests/unit/layout_reference.py' 250", root) > 0);
        f = popen(cmd, "r");
        assert_non_null(f);
        assert_true(getdelim(&text, &size, '\0', f) > 0);
        assert_int_equal(pclose(f), 0);

        t.text = text;
        for (char *c; (c = strtok_r(t.text, " \t\n", &t.save)); n_cases++) {
                t.text = NULL;
                if (!streq(c, "case"))
                        fail_msg("layout_reference.py: expected case, got '%s'", c);
                (void) check_case(&t);
        }
        /* the hand cases and every random one were compared, refusals among them */
        assert_true(n_cases >= 250);
        assert_true(n_refused >= 2 && n_refused < n_cases / 4);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_no_mesh),
                cmocka_unit_test(test_uneven_and_empty),
                cmocka_unit_test(test_all_empty_rank),
                cmocka_unit_test(test_nested_axes),
                cmocka_unit_test(test_nested_three_empty),
                cmocka_unit_test(test_rank_order),
                cmocka_unit_test(test_expert_view),
                cmocka_unit_test(test_expert_name_in_both_views),
                cmocka_unit_test(test_experts_uneven),
                cmocka_unit_test(test_alignment),
                cmocka_unit_test(test_mixed_dtypes),
                cmocka_unit_test(test_errors),
                cmocka_unit_test(test_limits),
                cmocka_unit_test(test_tiling_property),
                cmocka_unit_test(test_reference),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
