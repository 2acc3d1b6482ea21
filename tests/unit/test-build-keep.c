/* test-build-keep.c: build/build-keep.c: what builds and meshes leave in the store (state/). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include <cmocka.h>

#include "build/build-private.h"
#include "codec/codec-record.h"

#define ID "bld-0000abcd-7"

static int64_t w_shape[] = { 4, 8 };
static Placement w_placements[] = { { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 1 } };

/* A build of w (4, 8) over a dp=2 tp=2 mesh, every rank materialised on this node's host
 * devices: ranks 2 and 3 replicas of 0 and 1 (dp replicates), so two segments of its own. */
typedef struct Fixture {
        Mesh *mesh;
        PlanParameter parameter;
        BuildRankState ranks[4];
        BuildState b;
} Fixture;

static void fixture_init(Fixture *f, State *s) {
        MeshDim dims[2] = { { .name = (char *) "dp", .size = 2 },
                            { .name = (char *) "tp", .size = 2 } };
        MeshSpec spec = { .device = { .dims = dims, .n = 2 } };
        FamilyError e = FAMILY_ERROR_NULL;

        *f = (Fixture) {};
        assert_int_equal(mesh_new(&spec, 4, &f->mesh, &e), 0);
        f->parameter = (PlanParameter) { .name = (char *) "w", .shape = w_shape, .n_dims = 2,
                                         .n_elements = 32, .placements = w_placements,
                                         .n_placements = 1 };
        f->b.plan = (BuildPlan) {
                .request = { .family = (char *) "attention" },
                .resolved = { .family = (char *) "attention", .variant = (char *) "gqa",
                              .constructor = (char *) "Attention" },
                .origin = BUILD_ORIGIN_DIRECT,
                .mesh = f->mesh, .parameters = &f->parameter, .n_parameters = 1,
                .materialize = { .enabled = true },
        };
        f->b.dtype = DTYPE_FLOAT32;
        f->b.seed = 42;
        assert_int_equal(shard_token_new(&f->b.group), 0);
        assert_int_equal(build_compute_layout(&f->b, &e), 0);
        f->b.ranks = f->ranks;
        f->b.n_ranks = 4;
        for (size_t k = 0; k < 4; k++) {
                BuildRankState *rs = &f->ranks[k];
                *rs = (BuildRankState) { .node = (char *) "a", .local_device = (int32_t) k,
                                         .device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST,
                                         .materialized = true,
                                         .allocation_bytes = f->b.layout.ranks[k].size_bytes };
                assert_int_equal(shard_token_new(&rs->token), 0);
        }
        assert_int_equal(build_group_replicas(&f->b), 0);
        assert_int_equal(build_state_own_segments(&f->b), 2);
        for (size_t k = 0; k < 2; k++)
                assert_int_equal(build_keep_segment_new(s, ID, (int64_t) k,
                                                        f->ranks[k].allocation_bytes,
                                                        (int) k, &f->ranks[k].segment), 0);
}

static void fixture_done(Fixture *f) {
        for (size_t k = 0; k < 4; k++)
                shard_segment_unref(f->ranks[k].segment);
        layout_done(&f->b.layout);
        mesh_unref(f->mesh);
}

static bool dir_has(int dir_fd, const char *name) {
        struct stat st;
        return fstatat(dir_fd, name, &st, 0) == 0;
}

/* The record named name in the state dir, decoded. */
static void read_record(int dir_fd, const char *name, StateRecord *ret) {
        _cleanup_close_ int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
        uint8_t buf[65536];
        char why[256];
        ssize_t n;

        assert_true(fd >= 0);
        n = read(fd, buf, sizeof buf);
        assert_true(n > 0 && (size_t) n < sizeof buf);
        if (codec_record_decode(buf, (size_t) n, ret, why, sizeof why) < 0)
                fail_msg("%s: %s", name, why);
}

/* A state dir on /dev/shm (a tmpfs: --state-dir refuses anything else). */
static State *state_in_dir(char *dir) {
        State *s = NULL;
        struct statfs sf;

        assert_int_equal(statfs("/dev/shm", &sf), 0);
        assert_int_equal((unsigned long) sf.f_type, TMPFS_MAGIC);
        assert_non_null(mkdtemp(dir));
        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &s), 0);
        assert_int_equal(state_mode(s), STATE_MODE_DIR);
        return s;
}

/* In a state dir: the shards are its files from the start, the record is written beside
 * them and lists the replicas; forgetting takes both away, discarding the files alone. */
static void test_keep_in_a_state_dir(void **state) {
        char dir[] = "/dev/shm/test-build-keep-XXXXXX";
        State *s = state_in_dir(dir);
        int dir_fd = state_segment_dir(s);
        FamilyError e = FAMILY_ERROR_NULL;
        StateRecord rec = {};
        Fixture f;

        (void) state;
        fixture_init(&f, s);
        assert_true(dir_has(dir_fd, "shard-" ID "-0"));
        assert_true(dir_has(dir_fd, "shard-" ID "-1"));
        assert_false(dir_has(dir_fd, "shard-" ID "-2")); /* replicas have none */
        assert_int_equal(shard_segment_size(f.ranks[0].segment), f.ranks[0].allocation_bytes);

        assert_int_equal(build_keep_reserve(s, &f.b, &e), 0);
        assert_false(dir_has(dir_fd, "meta-" ID));
        assert_int_equal(build_keep_save(s, ID, &f.b, &e), 0);
        assert_false(family_error_is_set(&e));
        read_record(dir_fd, "meta-" ID, &rec);
        assert_int_equal(rec.kind, STATE_RECORD_BUILD);
        assert_string_equal(rec.id, ID);
        assert_string_equal(rec.mesh->id, f.mesh->id);
        assert_int_equal(rec.build->seed, 42);
        assert_string_equal(rec.build->group, f.b.group.hex);
        assert_int_equal(rec.build->n_ranks, 4);
        assert_int_equal(rec.build->bytes, 2 * f.ranks[0].allocation_bytes);
        for (size_t k = 0; k < 4; k++) {
                assert_string_equal(rec.build->ranks[k].token, f.ranks[k].token.hex);
                assert_int_equal(rec.build->ranks[k].replica, k >= 2);
                if (k >= 2)
                        assert_int_equal(rec.build->ranks[k].primary, k - 2);
        }
        codec_record_done(&rec);

        build_keep_forget(s, ID, &f.b);
        assert_false(dir_has(dir_fd, "meta-" ID));
        assert_false(dir_has(dir_fd, "shard-" ID "-0"));
        assert_false(dir_has(dir_fd, "shard-" ID "-1"));
        fixture_done(&f);

        /* A build that failed before its record: its files go, nothing else. */
        fixture_init(&f, s);
        build_keep_discard(s, ID, &f.b);
        assert_false(dir_has(dir_fd, "shard-" ID "-0"));
        assert_false(dir_has(dir_fd, "shard-" ID "-1"));
        fixture_done(&f);

        /* A mesh's record. */
        _cleanup_(mesh_unrefp) Mesh *m = NULL;
        MeshDim dims[1] = { { .name = (char *) "tp", .size = 4 } };
        assert_int_equal(mesh_new(&(MeshSpec) { .device = { .dims = dims, .n = 1 } }, 4, &m, &e),
                         0);
        char meta[STATE_NAME_MAX];
        assert_int_equal(state_name_record(m->id, meta), 0);
        assert_int_equal(mesh_keep_save(s, m, &e), 0);
        read_record(dir_fd, meta, &rec);
        assert_int_equal(rec.kind, STATE_RECORD_MESH);
        assert_string_equal(rec.mesh->id, m->id);
        codec_record_done(&rec);
        assert_int_equal(unlinkat(dir_fd, meta, 0), 0);

        assert_int_equal(build_keep_dir_full_error(s, 12345, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "STATE_DIR_FULL");
        assert_non_null(strstr(e.message, dir));
        assert_non_null(strstr(e.message, "12345 bytes"));
        family_error_done(&e);

        state_free(s);
        assert_int_equal(rmdir(dir), 0);
}

/* GPU shards are never kept: no reservation, no record, nothing forgotten. */
static void test_gpu_builds_are_not_kept(void **state) {
        char dir[] = "/dev/shm/test-build-keep-XXXXXX";
        State *s = state_in_dir(dir);
        int dir_fd = state_segment_dir(s);
        FamilyError e = FAMILY_ERROR_NULL;
        Fixture f;

        (void) state;
        fixture_init(&f, s);
        f.ranks[3].replica = false;
        f.ranks[3].device_kind = SHARD_SEGMENT_DEVICE_KIND_CUDA;
        assert_int_equal(build_keep_save(s, ID, &f.b, &e), 0);
        assert_false(dir_has(dir_fd, "meta-" ID));
        build_keep_discard(s, ID, &f.b);
        assert_true(dir_has(dir_fd, "shard-" ID "-0")); /* not this code's to remove */
        build_keep_forget(s, ID, &f.b);
        assert_true(dir_has(dir_fd, "shard-" ID "-0"));
        f.ranks[3].device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST;
        build_keep_discard(s, ID, &f.b);
        assert_false(dir_has(dir_fd, "shard-" ID "-0"));
        fixture_done(&f);
        state_free(s);
        assert_int_equal(rmdir(dir), 0);
}

/* The service manager's fd store, as the shell hands it to the store: what it was told. */
static char told[16][STATE_NAME_MAX + 8];
static size_t n_told;

static int fdstore_add(const char *name, int fd) {
        assert_true(fcntl(fd, F_GETFD) >= 0);
        assert_true(n_told < ELEMENTSOF(told));
        snprintf(told[n_told++], sizeof told[0], "+%s", name);
        return 1;
}

static int fdstore_remove(const char *name) {
        assert_true(n_told < ELEMENTSOF(told));
        snprintf(told[n_told++], sizeof told[0], "-%s", name);
        return 1;
}

/* In the fd store: room for the segments of its own and the record, reserved first; the
 * descriptors pushed before the record, the record removed before them; replicas none. */
static void test_keep_in_the_fd_store(void **state) {
        _cleanup_(state_freep) State *s = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        size_t used, max;
        Fixture f;

        (void) state;
        n_told = 0;
        assert_int_equal(state_new(&(StateParams) { .under_manager = true, .fdstore_max = 5,
                                                    .fdstore_add = fdstore_add,
                                                    .fdstore_remove = fdstore_remove }, &s), 0);
        assert_int_equal(state_mode(s), STATE_MODE_FDSTORE);
        fixture_init(&f, s);

        assert_int_equal(build_keep_reserve(s, &f.b, &e), 0); /* 2 segments + the record */
        assert_int_equal(build_keep_reserve(s, &f.b, &e), -EINVAL); /* 6 > 5 */
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "FDSTORE_LIMIT");
        assert_non_null(strstr(e.message, "build"));
        family_error_done(&e);
        build_keep_unreserve(s, &f.b);
        assert_int_equal(build_keep_reserve(s, &f.b, &e), 0); /* 3 given back: fits again */

        assert_int_equal(build_keep_save(s, ID, &f.b, &e), 0);
        assert_int_equal(n_told, 3);
        assert_string_equal(told[0], "+shard-" ID "-0");
        assert_string_equal(told[1], "+shard-" ID "-1");
        assert_string_equal(told[2], "+meta-" ID);
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 3);
        assert_int_equal(max, 5);
        assert_int_equal(build_keep_reserve(s, &f.b, &e), -EINVAL); /* 3 used: 6 > 5 */
        family_error_done(&e);

        n_told = 0;
        build_keep_forget(s, ID, &f.b);
        assert_true(n_told >= 3);
        assert_string_equal(told[0], "-meta-" ID);
        assert_string_equal(told[n_told - 2], "-shard-" ID "-0");
        assert_string_equal(told[n_told - 1], "-shard-" ID "-1");
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 0);
        fixture_done(&f);
}

/* Without a store (mode none) nothing is kept and nothing fails; shards are memfds. */
static void test_keep_without_a_store(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        char link[PATH_MAX], path[64];
        ssize_t n;
        Fixture f;

        (void) state;
        fixture_init(&f, NULL);
        snprintf(path, sizeof path, "/proc/self/fd/%d", shard_segment_fd(f.ranks[1].segment));
        n = readlink(path, link, sizeof link - 1);
        assert_true(n > 0);
        link[n] = 0;
        assert_non_null(strstr(link, "memfd:familyd-shard-" ID "-1"));
        assert_int_equal(build_keep_reserve(NULL, &f.b, &e), 0);
        assert_int_equal(build_keep_save(NULL, ID, &f.b, &e), 0);
        assert_false(family_error_is_set(&e));
        build_keep_forget(NULL, ID, &f.b);
        fixture_done(&f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_keep_in_a_state_dir),
                cmocka_unit_test(test_gpu_builds_are_not_kept),
                cmocka_unit_test(test_keep_in_the_fd_store),
                cmocka_unit_test(test_keep_without_a_store),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
