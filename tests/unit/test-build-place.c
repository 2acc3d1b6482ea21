/* test-build-place.c: build/build-place.c: a Build's dtype, layout, ranks, replicas and bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "build/build-private.h"

/* A mesh dp=2 tp=2 over ranks 0..3 (row-major: rank = 2 dp + tp). */
static Mesh *mesh_dp2_tp2(void) {
        MeshDim dims[2] = { { .name = (char *) "dp", .size = 2 },
                            { .name = (char *) "tp", .size = 2 } };
        MeshSpec s = { .device = { .dims = dims, .n = 2 } };
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;

        if (mesh_new(&s, 4, &m, &e) < 0)
                fail_msg("mesh_new: %s", strempty(e.message));
        return m;
}

static int64_t w_shape[] = { 4, 6 }, b_shape[] = { 6 };
static Placement w_placements[] = { { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 0 } };

/* Two parameters: w (4, 6) sharded over tp on dim 0, b (6) replicated; b in bfloat16 by the
 * request's parameter_dtypes, w in the build's dtype. */
typedef struct Fixture {
        PlanParameter parameters[2];
        ParameterDtype dtypes[1];
        BuildState b;
} Fixture;

static void fixture_init(Fixture *f, Mesh *mesh) {
        *f = (Fixture) {
                .parameters = {
                        { .name = (char *) "w", .shape = w_shape, .n_dims = 2, .n_elements = 24,
                          .placements = w_placements, .n_placements = 1 },
                        { .name = (char *) "b", .shape = b_shape, .n_dims = 1, .n_elements = 6 },
                },
                .dtypes = { { .name = (char *) "b", .dtype = (char *) "bfloat16" } },
        };
        f->b.plan = (BuildPlan) { .mesh = mesh, .parameters = f->parameters, .n_parameters = 2,
                                  .materialize = { .enabled = true },
                                  .parameter_dtypes = f->dtypes, .n_parameter_dtypes = 1 };
}

static void ranks_done(BuildState *b) {
        for (size_t i = 0; i < b->n_ranks; i++)
                free(b->ranks[i].node);
        b->ranks = mfree(b->ranks);
        b->n_ranks = 0;
}

static void fixture_done(Fixture *f) {
        ranks_done(&f->b);
        layout_done(&f->b.layout);
}

/* Nodes "a" (node rank 0, local) and "b" (node rank 1), each with two devices of kind. */
static Topology *topology_two(const char *b_kind) {
        Device a_devices[2] = { { .local_index = 0, .kind = (char *) "host", .numa_node = -1 },
                                { .local_index = 1, .kind = (char *) "host", .numa_node = -1 } };
        Device b_devices[2] = { { .local_index = 0, .kind = (char *) b_kind, .numa_node = -1 },
                                { .local_index = 1, .kind = (char *) b_kind, .numa_node = -1 } };
        Node nodes[2] = {
                { .name = (char *) "a", .address = (char *) "a:1", .node_rank = 0,
                  .devices = a_devices, .n_devices = 2 },
                { .name = (char *) "b", .address = (char *) "b:1", .node_rank = 1,
                  .devices = b_devices, .n_devices = 2 },
        };
        Topology *t = NULL;

        assert_int_equal(topology_new_copy(nodes, 2, "a", 1, &t), 0);
        return t;
}

static void expect_error(int r, FamilyError *e, FamilyStatus status, const char *reason,
                         const char *field, const char *text) {
        assert_true(r < 0);
        assert_int_equal(e->status, status);
        assert_string_equal(e->reason, reason);
        if (field)
                assert_string_equal(e->field, field);
        else
                assert_null(e->field);
        assert_non_null(strstr(e->message, text));
        family_error_done(e);
}

static void test_dtype_of(void **state) {
        Fixture f;
        FamilyError e = FAMILY_ERROR_NULL;
        Dtype d = _DTYPE_INVALID;

        (void) state;
        fixture_init(&f, NULL);
        assert_int_equal(build_dtype_of(&f.b.plan, &d, &e), 0); /* none given: float32 */
        assert_int_equal(d, DTYPE_FLOAT32);
        f.b.plan.materialize.dtype = (char *) "float16";
        assert_int_equal(build_dtype_of(&f.b.plan, &d, &e), 0);
        assert_int_equal(d, DTYPE_FLOAT16);
        assert_false(family_error_is_set(&e));

        d = DTYPE_BFLOAT16;
        f.b.plan.materialize.dtype = (char *) "float64";
        expect_error(build_dtype_of(&f.b.plan, &d, &e), &e, FAMILY_STATUS_INVALID_ARGUMENT,
                     "DTYPE", "materialize.dtype", "dtype 'float64' is not supported");
        assert_int_equal(d, DTYPE_BFLOAT16); /* untouched */

        /* The request's parameter dtypes are checked too (step 7). */
        f.b.plan.materialize.dtype = NULL;
        f.dtypes[0].name = (char *) "nope";
        expect_error(build_dtype_of(&f.b.plan, &d, &e), &e, FAMILY_STATUS_INVALID_ARGUMENT,
                     "DTYPE", "parameter_dtypes", "nope");
        assert_int_equal(d, DTYPE_BFLOAT16);
}

static void test_compute_layout(void **state) {
        _cleanup_(mesh_unrefp) Mesh *mesh = mesh_dp2_tp2();
        FamilyError e = FAMILY_ERROR_NULL;
        Fixture f;

        (void) state;
        fixture_init(&f, mesh);
        f.b.dtype = DTYPE_FLOAT32;
        assert_int_equal(build_compute_layout(&f.b, &e), 0);
        assert_int_equal(f.b.layout.n_parameters, 2);
        assert_int_equal(f.b.layout.parameters[0].dtype, DTYPE_FLOAT32);
        assert_int_equal(f.b.layout.parameters[1].dtype, DTYPE_BFLOAT16);
        assert_int_equal(f.b.layout.n_ranks, 4);
        for (size_t k = 0; k < 4; k++) {
                const RankLayout *rl = &f.b.layout.ranks[k];
                assert_int_equal(rl->rank, (int64_t) k);
                assert_int_equal(rl->n_slices, 2);
                /* w: rows 2 tp .. 2 tp + 1 of 4, all 6 columns, float32 */
                assert_int_equal(rl->slices[0].local_shape[0], 2);
                assert_int_equal(rl->slices[0].local_shape[1], 6);
                assert_int_equal(rl->slices[0].global_offset[0], (int64_t) (k % 2) * 2);
                assert_int_equal(rl->slices[0].byte_length, 2 * 6 * 4);
                /* b: whole, bfloat16 */
                assert_int_equal(rl->slices[1].local_shape[0], 6);
                assert_int_equal(rl->slices[1].byte_length, 6 * 2);
        }
        fixture_done(&f);
}

static void place(Fixture *f, const Topology *t, int r_expected) {
        FamilyError e = FAMILY_ERROR_NULL;

        ranks_done(&f->b);
        assert_int_equal(build_place_ranks(&f->b, t, NULL, &e), r_expected);
        if (r_expected == 0)
                assert_false(family_error_is_set(&e));
        family_error_done(&e);
}

static void test_place_ranks(void **state) {
        _cleanup_(topology_unrefp) Topology *t = topology_two("cuda");
        _cleanup_(mesh_unrefp) Mesh *mesh = mesh_dp2_tp2();
        FamilyError e = FAMILY_ERROR_NULL;
        int64_t asked[1];
        Fixture f;

        (void) state;
        fixture_init(&f, mesh);
        f.b.dtype = DTYPE_FLOAT32;
        assert_int_equal(build_compute_layout(&f.b, &e), 0);

        /* Every local rank with bytes: a's two; b's are b's, on its GPUs. */
        place(&f, t, 0);
        assert_int_equal(f.b.n_ranks, 4);
        for (size_t k = 0; k < 4; k++) {
                const BuildRankState *rs = &f.b.ranks[k];
                assert_string_equal(rs->node, k < 2 ? "a" : "b");
                assert_int_equal(rs->local_device, (int32_t) (k % 2));
                assert_int_equal(rs->materialized, k < 2);
                assert_string_equal(rs->device_kind, k < 2 ? "host" : "cuda");
                assert_int_equal(rs->allocation_bytes, k < 2 ? f.b.layout.ranks[k].size_bytes : 0);
        }

        /* materialize.ranks: those only. */
        asked[0] = 1;
        f.b.plan.materialize.ranks = asked;
        f.b.plan.materialize.n_ranks = 1;
        place(&f, t, 0);
        assert_false(f.b.ranks[0].materialized);
        assert_true(f.b.ranks[1].materialized);

        /* A rank of another node is refused. */
        asked[0] = 2;
        ranks_done(&f.b);
        expect_error(build_place_ranks(&f.b, t, NULL, &e), &e, FAMILY_STATUS_INVALID_ARGUMENT,
                     "RANK_NOT_LOCAL", "materialize.ranks", "rank 2 is not local to this node");

        /* Not materialising: the ranks are placed, none held here. */
        f.b.plan.materialize = (MaterializeOptions) { .enabled = false };
        place(&f, t, 0);
        for (size_t k = 0; k < 4; k++)
                assert_false(f.b.ranks[k].materialized);
        assert_string_equal(f.b.ranks[3].node, "b");
        fixture_done(&f);
}

/* Four ranks materialised on one node's host devices (as on a node with four). */
static void four_host_ranks(Fixture *f, Mesh *mesh) {
        FamilyError e = FAMILY_ERROR_NULL;

        fixture_init(f, mesh);
        f->b.dtype = DTYPE_FLOAT32;
        assert_int_equal(build_compute_layout(&f->b, &e), 0);
        f->b.ranks = calloc(4, sizeof(BuildRankState));
        assert_non_null(f->b.ranks);
        f->b.n_ranks = 4;
        for (size_t k = 0; k < 4; k++)
                f->b.ranks[k] = (BuildRankState) {
                        .node = strdup("a"), .local_device = (int32_t) k, .materialized = true,
                        .device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST,
                        .allocation_bytes = f->b.layout.ranks[k].size_bytes };
}

static void test_replicas(void **state) {
        _cleanup_(mesh_unrefp) Mesh *mesh = mesh_dp2_tp2();
        uint64_t size;
        Fixture f;

        (void) state;
        four_host_ranks(&f, mesh);
        size = f.b.layout.ranks[0].size_bytes;
        assert_true(size > 0);
        /* dp replicates: ranks 0 and 2 (tp 0) hold the same bytes, as do 1 and 3. */
        assert_true(build_ranks_same_bytes(&f.b.layout, 0, 2));
        assert_true(build_ranks_same_bytes(&f.b.layout, 1, 3));
        assert_false(build_ranks_same_bytes(&f.b.layout, 0, 1));
        assert_false(build_ranks_same_bytes(&f.b.layout, 2, 3));
        /* Any difference of a slice tells them apart: its shape (the same bytes long), its
         * offset in the parameter, its length. */
        ShardSlice *w2 = &f.b.layout.ranks[2].slices[0], *b2 = &f.b.layout.ranks[2].slices[1];
        w2->local_shape[0] = 6;
        w2->local_shape[1] = 2;
        assert_false(build_ranks_same_bytes(&f.b.layout, 0, 2));
        w2->local_shape[0] = 2;
        w2->local_shape[1] = 6;
        b2->global_offset[0] = 1;
        assert_false(build_ranks_same_bytes(&f.b.layout, 0, 2));
        b2->global_offset[0] = 0;
        b2->byte_length--;
        assert_false(build_ranks_same_bytes(&f.b.layout, 0, 2));
        b2->byte_length++;
        assert_true(build_ranks_same_bytes(&f.b.layout, 0, 2));

        assert_int_equal(build_host_bytes(&f.b), 4 * size);
        assert_int_equal(build_group_replicas(&f.b), 0);
        assert_false(f.b.ranks[0].replica);
        assert_false(f.b.ranks[1].replica);
        assert_true(f.b.ranks[2].replica);
        assert_int_equal(f.b.ranks[2].primary, 0);
        assert_true(f.b.ranks[3].replica);
        assert_int_equal(f.b.ranks[3].primary, 1);
        assert_int_equal(build_state_own_segments(&f.b), 2);
        assert_int_equal(build_state_replicas(&f.b), 2);
        assert_int_equal(build_state_segments(&f.b), 4);
        assert_int_equal(build_host_bytes(&f.b), 2 * size); /* each segment once */
        assert_int_equal(build_gpu_bytes(&f.b), 0);
        fixture_done(&f);
}

/* No replicas in a writable build; none in GPU memory; none of a rank not held here. */
static void test_replicas_refused(void **state) {
        _cleanup_(mesh_unrefp) Mesh *mesh = mesh_dp2_tp2();
        uint64_t size;
        Fixture f;

        (void) state;
        four_host_ranks(&f, mesh);
        size = f.b.layout.ranks[0].size_bytes;
        f.b.writable = true;
        assert_int_equal(build_group_replicas(&f.b), 0);
        assert_int_equal(build_state_replicas(&f.b), 0);
        assert_int_equal(build_host_bytes(&f.b), 4 * size);

        f.b.writable = false;
        f.b.ranks[2].device_kind = SHARD_SEGMENT_DEVICE_KIND_CUDA; /* rank 2 on a GPU */
        f.b.ranks[1].materialized = false;                        /* rank 1 elsewhere */
        assert_int_equal(build_group_replicas(&f.b), 0);
        assert_false(f.b.ranks[2].replica);
        assert_false(f.b.ranks[3].replica); /* its twin, rank 1, has no bytes here */
        assert_int_equal(build_state_replicas(&f.b), 0);
        assert_int_equal(build_host_bytes(&f.b), 2 * size); /* ranks 0 and 3 */
        assert_int_equal(build_gpu_bytes(&f.b), size);      /* rank 2 */
        fixture_done(&f);
}

/* Each materialised rank takes a token of the shard table (the daemon's descriptor budget). */
static void test_shard_room(void **state) {
        _cleanup_(mesh_unrefp) Mesh *mesh = mesh_dp2_tp2();
        _cleanup_(shard_table_unrefp) ShardTable *small = NULL, *enough = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        Fixture f;

        (void) state;
        four_host_ranks(&f, mesh);
        assert_int_equal(shard_table_new(3, &small), 0);
        assert_int_equal(shard_table_new(4, &enough), 0);
        expect_error(build_check_shard_room(&f.b, small, &e), &e,
                     FAMILY_STATUS_RESOURCE_EXHAUSTED, "SHARD_LIMIT", NULL,
                     "build needs 4 shards, 0 of 3 held");
        assert_int_equal(build_check_shard_room(&f.b, enough, &e), 0);
        assert_false(family_error_is_set(&e));
        f.b.ranks[0].materialized = false;
        assert_int_equal(build_check_shard_room(&f.b, small, &e), 0);
        fixture_done(&f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_dtype_of),
                cmocka_unit_test(test_compute_layout),
                cmocka_unit_test(test_place_ranks),
                cmocka_unit_test(test_replicas),
                cmocka_unit_test(test_replicas_refused),
                cmocka_unit_test(test_shard_room),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
