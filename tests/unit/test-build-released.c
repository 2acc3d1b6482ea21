/* test-build-released.c: build/build-released.c: freed host shards clients still hold (memfds). */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "build/build-private.h"

#define SIZE (3 * 4096u)

/* A host shard as the daemon hands it out: made, unmapped, sealed. */
static ShardSegment *sealed_segment(const char *name) {
        ShardSegment *s = NULL;

        assert_int_equal(shard_segment_new_host(name, SIZE, 0, &s), 0);
        shard_segment_unmap(s);
        assert_int_equal(shard_segment_seal(s), 0);
        return s;
}

/* A client's descriptor of s, as the shard socket gives it. */
static int client_fd(const ShardSegment *s) {
        int fd = -1;

        assert_int_equal(shard_segment_open(s, false, &fd), 0);
        assert_true(fd >= 0);
        return fd;
}

static BuildReleasedUse sweep(BuildReleased *r) {
        BuildReleasedUse use = { .bytes = UINT64_MAX, .segments = UINT_MAX };

        build_released_sweep(r, &use);
        return use;
}

/* A build freed while a client holds its shard's descriptor: counted until the client closes
 * it, then let go (and never counted again). */
static void test_released_held_by_descriptor(void **state) {
        BuildReleased *r = NULL;
        BuildRankState rank = { .materialized = true, .segment = sealed_segment("held-fd") };
        BuildState b = { .ranks = &rank, .n_ranks = 1 };
        BuildReleasedUse use;
        int fd = client_fd(rank.segment);
        uint64_t bytes = shard_segment_size(rank.segment); /* SIZE, or a huge page */

        (void) state;
        assert_true(bytes >= SIZE);
        assert_int_equal(build_released_new(&r), 0);
        use = sweep(r);
        assert_int_equal(use.segments, 0);
        assert_int_equal(use.bytes, 0);

        build_released_add(r, &b);
        rank.segment = shard_segment_unref(rank.segment); /* the free lets its memory go */
        use = sweep(r);
        assert_int_equal(use.segments, 1);
        assert_int_equal(use.bytes, bytes);
        use = sweep(r); /* still held: still counted */
        assert_int_equal(use.segments, 1);

        safe_close(fd);
        use = sweep(r);
        assert_int_equal(use.segments, 0);
        assert_int_equal(use.bytes, 0);
        build_released_free(r);
}

/* A mapping holds the file after its descriptor is closed: the pages live until it goes. */
static void test_released_held_by_mapping(void **state) {
        BuildReleased *r = NULL;
        BuildRankState rank = { .materialized = true, .segment = sealed_segment("held-map") };
        BuildState b = { .ranks = &rank, .n_ranks = 1 };
        BuildReleasedUse use;
        int fd = client_fd(rank.segment);
        uint64_t bytes = shard_segment_size(rank.segment);
        void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);

        (void) state;
        assert_true(map != MAP_FAILED);
        safe_close(fd);
        assert_int_equal(build_released_new(&r), 0);
        build_released_add(r, &b);
        rank.segment = shard_segment_unref(rank.segment);
        use = sweep(r);
        assert_int_equal(use.segments, 1);
        assert_int_equal(use.bytes, bytes);

        assert_int_equal(munmap(map, bytes), 0);
        use = sweep(r);
        assert_int_equal(use.segments, 0);
        assert_int_equal(use.bytes, 0);
        build_released_free(r);
}

/* Only a read-only build's own host segments are followed: not a writable build's, not a
 * replica's (its primary's memory), not a rank materialised elsewhere. */
static void test_released_follows_own_segments_only(void **state) {
        BuildReleased *r = NULL;
        BuildRankState ranks[4] = {
                { .materialized = true, .segment = sealed_segment("own-0") },
                { .materialized = true, .segment = sealed_segment("own-1") },
                { .materialized = true, .replica = true, .primary = 0 },
                { .materialized = false },
        };
        BuildState b = { .ranks = ranks, .n_ranks = 4, .writable = true };
        BuildReleasedUse use;
        int fds[2] = { client_fd(ranks[0].segment), client_fd(ranks[1].segment) };
        uint64_t bytes = shard_segment_size(ranks[0].segment);

        (void) state;
        assert_int_equal(shard_segment_size(ranks[1].segment), bytes);
        /* The replica's segment: its own descriptor of its primary's memory. */
        assert_int_equal(shard_segment_adopt(client_fd(ranks[0].segment), 0, &ranks[2].segment),
                         0);
        assert_int_equal(build_released_new(&r), 0);

        build_released_add(r, &b); /* writable: nothing followed */
        use = sweep(r);
        assert_int_equal(use.segments, 0);

        b.writable = false;
        build_released_add(r, &b);
        for (size_t i = 0; i < 3; i++)
                ranks[i].segment = shard_segment_unref(ranks[i].segment);
        use = sweep(r);
        assert_int_equal(use.segments, 2);
        assert_int_equal(use.bytes, 2 * bytes);

        safe_close(fds[1]);
        use = sweep(r);
        assert_int_equal(use.segments, 1);
        assert_int_equal(use.bytes, bytes);
        safe_close(fds[0]);
        use = sweep(r);
        assert_int_equal(use.segments, 0);
        build_released_free(r);
}

/* Without a list (no sharing) nothing is followed and a sweep reports nothing. */
static void test_released_without_list(void **state) {
        BuildRankState rank = { .materialized = true, .segment = sealed_segment("no-list") };
        BuildState b = { .ranks = &rank, .n_ranks = 1 };
        BuildReleasedUse use;

        (void) state;
        build_released_add(NULL, &b);
        use = sweep(NULL);
        assert_int_equal(use.segments, 0);
        assert_int_equal(use.bytes, 0);
        shard_segment_unref(rank.segment);
        assert_null(build_released_free(NULL));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_released_held_by_descriptor),
                cmocka_unit_test(test_released_held_by_mapping),
                cmocka_unit_test(test_released_follows_own_segments_only),
                cmocka_unit_test(test_released_without_list),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
