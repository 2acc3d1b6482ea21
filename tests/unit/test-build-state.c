/* test-build-state.c: build/build-state.c: a live build's description and counts, and the
 * progress table that WatchBuild, GetStatus and ListBuilds read. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "build/build-private.h"

static unsigned changes;

static void count_change(void *userdata) {
        assert_ptr_equal(userdata, &changes);
        changes++;
}

static void sleep_ms(unsigned ms) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static CodecBuildProgress find(BuildProgressTable *t, const char *id, const char *tag, Arena *a) {
        CodecBuildProgress p = {};

        assert_int_equal(build_progress_find(t, id, tag, a, &p), 0);
        return p;
}

static void test_progress_of_one_build(void **state) {
        _cleanup_(arena_done) Arena a;
        BuildProgressTable *t = NULL;
        BuildProgress *p = NULL;
        CodecBuildProgress v = {};

        (void) state;
        arena_init(&a);
        changes = 0;
        assert_int_equal(build_progress_table_new(count_change, &changes, &t), 0);
        assert_int_equal(build_progress_find(t, "bld-1", NULL, &a, &v), -ENOENT);

        assert_int_equal(build_progress_start(t, "bld-1", "job-7", "attention", 1000, &p), 0);
        assert_int_equal(changes, 1);
        v = find(t, "bld-1", NULL, &a);
        assert_string_equal(v.build_id, "bld-1");
        assert_string_equal(v.progress_tag, "job-7");
        assert_string_equal(v.family, "attention");
        assert_int_equal(v.state, CODEC_BUILD_PROGRESS_FILLING);
        assert_int_equal(v.bytes_filled, 0);
        assert_int_equal(v.bytes_total, 1000);
        assert_null(v.error);
        assert_true(v.started_unix_ms > 0);
        v = find(t, NULL, "job-7", &a); /* by tag */
        assert_string_equal(v.build_id, "bld-1");
        assert_int_equal(build_progress_find(t, NULL, "job-8", &a, &v), -ENOENT);

        /* Filled bytes only go up, and never past the total. */
        build_progress_advance(p, 300);
        assert_int_equal(find(t, "bld-1", NULL, &a).bytes_filled, 300);
        build_progress_advance(p, 200);
        assert_int_equal(find(t, "bld-1", NULL, &a).bytes_filled, 300);
        build_progress_advance(p, 5000);
        assert_int_equal(find(t, "bld-1", NULL, &a).bytes_filled, 1000);

        /* A Build from a checkpoint: what is read of what is to be read. */
        build_progress_reading(p, 500);
        build_progress_add_read(p, 120);
        build_progress_add_read(p, 30);
        v = find(t, "bld-1", NULL, &a);
        assert_int_equal(v.bytes_to_read, 500);
        assert_int_equal(v.bytes_read, 150);

        /* Watchers are told of chunks at most every BUILD_PROGRESS_TICK_MS. */
        FillProgress *fill = build_progress_fill(p);
        assert_non_null(fill);
        changes = 0;
        sleep_ms(BUILD_PROGRESS_TICK_MS + 20);
        fill->on_chunk(fill);
        fill->on_chunk(fill);
        assert_int_equal(changes, 1);
        sleep_ms(BUILD_PROGRESS_TICK_MS + 20);
        build_progress_add_read(p, 1);
        assert_int_equal(changes, 2);

        build_progress_end(p, 0, NULL);
        assert_int_equal(changes, 3);
        v = find(t, "bld-1", NULL, &a);
        assert_int_equal(v.state, CODEC_BUILD_PROGRESS_DONE);
        assert_int_equal(v.bytes_filled, 1000);
        assert_true(v.elapsed_ms >= 2 * BUILD_PROGRESS_TICK_MS);

        /* No hook: nobody told. */
        build_progress_table_set_changed(t, NULL, NULL);
        assert_int_equal(build_progress_start(t, "bld-2", NULL, "mlp", 10, &p), 0);
        assert_int_equal(changes, 3);
        build_progress_end(p, 0, NULL);
        build_progress_table_free(t);
}

static void test_progress_failures_and_lists(void **state) {
        _cleanup_(arena_done) Arena a;
        BuildProgressTable *t = NULL;
        BuildProgress *p[3] = {};
        CodecBuildProgress *list = NULL, v;
        FamilyError e = FAMILY_ERROR_NULL;
        size_t n = 99;

        (void) state;
        arena_init(&a);
        assert_int_equal(build_progress_table_new(NULL, NULL, &t), 0);
        assert_int_equal(build_progress_list(t, &a, &list, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(build_progress_start(t, "bld-1", "same", "attention", 100, &p[0]), 0);
        assert_int_equal(build_progress_start(t, "bld-2", NULL, "mlp", 200, &p[1]), 0);
        assert_int_equal(build_progress_start(t, "bld-3", "same", "mlp", 300, &p[2]), 0);

        /* Filling ones, oldest first; by tag, the latest. */
        assert_int_equal(build_progress_list(t, &a, &list, &n), 0);
        assert_int_equal(n, 3);
        assert_string_equal(list[0].build_id, "bld-1");
        assert_string_equal(list[1].build_id, "bld-2");
        assert_null(list[1].progress_tag);
        assert_string_equal(list[2].build_id, "bld-3");
        assert_string_equal(find(t, NULL, "same", &a).build_id, "bld-3");

        build_progress_end(p[1], -EIO, NULL);
        v = find(t, "bld-2", NULL, &a);
        assert_int_equal(v.state, CODEC_BUILD_PROGRESS_FAILED);
        assert_string_equal(v.error, strerror(EIO));
        assert_int_equal(v.bytes_filled, 0);
        family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "SHM_BUDGET", NULL, "no room");
        build_progress_end(p[2], -EINVAL, &e);
        family_error_done(&e);
        assert_string_equal(find(t, "bld-3", NULL, &a).error, "no room");

        /* Ended builds leave the list, not the table. */
        assert_int_equal(build_progress_list(t, &a, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(list[0].build_id, "bld-1");
        build_progress_end(p[0], 0, NULL); /* done: every byte, whatever was counted */
        assert_int_equal(find(t, "bld-1", NULL, &a).bytes_filled, 100);
        build_progress_table_free(t);
}

/* At most BUILD_PROGRESS_KEEP_ENDED ended builds are kept: the oldest go first. */
static void test_progress_keeps_the_latest_ended(void **state) {
        _cleanup_(arena_done) Arena a;
        BuildProgressTable *t = NULL;
        CodecBuildProgress v;
        char id[32];

        (void) state;
        arena_init(&a);
        assert_int_equal(build_progress_table_new(NULL, NULL, &t), 0);
        for (unsigned k = 0; k < BUILD_PROGRESS_KEEP_ENDED + 2; k++) {
                BuildProgress *p = NULL;
                snprintf(id, sizeof id, "bld-%u", k);
                assert_int_equal(build_progress_start(t, id, NULL, "mlp", 1, &p), 0);
                build_progress_end(p, 0, NULL);
        }
        assert_int_equal(build_progress_find(t, "bld-0", NULL, &a, &v), -ENOENT);
        assert_int_equal(build_progress_find(t, "bld-1", NULL, &a, &v), -ENOENT);
        assert_string_equal(find(t, "bld-2", NULL, &a).build_id, "bld-2");
        snprintf(id, sizeof id, "bld-%u", BUILD_PROGRESS_KEEP_ENDED + 1);
        assert_int_equal(find(t, id, NULL, &a).state, CODEC_BUILD_PROGRESS_DONE);
        build_progress_table_free(t);

        /* NULL progress (a build nobody follows): every call is a no-op. */
        assert_null(build_progress_fill(NULL));
        build_progress_advance(NULL, 1);
        build_progress_reading(NULL, 1);
        build_progress_add_read(NULL, 1);
        build_progress_end(NULL, 0, NULL);
}

/* What the Build messages say of a build: tokens and sizes of the ranks held here only. */
static void test_describe_and_counts(void **state) {
        _cleanup_(arena_done) Arena a;
        BuildRankState ranks[3] = {
                { .node = (char *) "a", .local_device = 0, .materialized = true,
                  .device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST, .allocation_bytes = 4096 },
                { .node = (char *) "a", .local_device = 1, .materialized = true,
                  .device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST, .allocation_bytes = 4096,
                  .replica = true, .primary = 0 },
                { .node = (char *) "b", .local_device = 0, .materialized = false,
                  .device_kind = SHARD_SEGMENT_DEVICE_KIND_CUDA, .allocation_bytes = 777 },
        };
        BuildState b = { .dtype = DTYPE_BFLOAT16, .seed = 9, .writable = true, .ranks = ranks,
                         .n_ranks = 3 };
        CodecBuild view;

        (void) state;
        arena_init(&a);
        snprintf(b.registry_digest, sizeof b.registry_digest, "%s", "sha256:0123");
        snprintf(b.group.hex, sizeof b.group.hex, "%s", "00112233445566778899aabbccddeeff");
        for (size_t k = 0; k < 3; k++)
                snprintf(ranks[k].token.hex, sizeof ranks[k].token.hex, "%032zx", k + 1);
        assert_int_equal(build_state_describe(&b, &a, &view), 0);
        assert_ptr_equal(view.plan, &b.plan);
        assert_ptr_equal(view.layout, &b.layout);
        assert_int_equal(view.dtype, DTYPE_BFLOAT16);
        assert_int_equal(view.seed, 9);
        assert_true(view.writable);
        assert_string_equal(view.group, b.group.hex);
        assert_string_equal(view.registry_digest, "sha256:0123");
        assert_int_equal(view.n_ranks, 3);
        assert_string_equal(view.ranks[0].node, "a");
        assert_string_equal(view.ranks[0].token, ranks[0].token.hex);
        assert_int_equal(view.ranks[0].allocation_bytes, 4096);
        assert_int_equal(view.ranks[1].local_device, 1);
        assert_string_equal(view.ranks[2].node, "b");
        assert_string_equal(view.ranks[2].device_kind, "cuda");
        assert_null(view.ranks[2].token);                /* not held here */
        assert_int_equal(view.ranks[2].allocation_bytes, 0);

        assert_int_equal(build_state_segments(&b), 2);
        assert_int_equal(build_state_own_segments(&b), 1);
        assert_int_equal(build_state_replicas(&b), 1);
        assert_false(build_rank_on_gpu(&ranks[0]));
        assert_true(build_rank_on_gpu(&ranks[2]));
        assert_false(build_state_has_gpu_shards(&b)); /* the GPU rank is not held here */
        ranks[2].materialized = true;
        assert_true(build_state_has_gpu_shards(&b));
        assert_int_equal(build_state_segments(&b), 3);
        assert_int_equal(build_state_own_segments(&b), 2);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_progress_of_one_build),
                cmocka_unit_test(test_progress_failures_and_lists),
                cmocka_unit_test(test_progress_keeps_the_latest_ended),
                cmocka_unit_test(test_describe_and_counts),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
