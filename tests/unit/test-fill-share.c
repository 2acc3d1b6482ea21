/* test-fill-share.c: an equal host fill under way is copied, not computed again; failures and
 * cancellations fall back or stop; unequal fills never share. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "shm/fill-share.h"

/* Two parameters of a rank, several chunks each, with a gap between them (layout padding). */
#define ROWS 300
#define COLS 1001
#define GAP 4096
#define SEG_SIZE (2 * ROWS * COLS * 4 + 2 * GAP)

static const int64_t shape[2] = { 2 * ROWS, COLS };
static const int64_t local_shape[2] = { ROWS, COLS };
static const int64_t offsets[2][2] = { { 0, 0 }, { ROWS, 0 } };

typedef struct Rank {
        FillSpec spec[2];
        MaterializeSlice slices[2];
} Rank;

static void rank_init(Rank *r, uint64_t seed) {
        assert_int_equal(fill_spec_init(&r->spec[0], INIT_NORMAL, 0.0, 0.02, seed, "w1", DTYPE_FLOAT32), 0);
        assert_int_equal(fill_spec_init(&r->spec[1], INIT_UNIFORM, -1.0, 1.0, seed, "w2", DTYPE_FLOAT32), 0);
        for (size_t k = 0; k < 2; k++)
                r->slices[k] = (MaterializeSlice) {
                        .fill = { .spec = &r->spec[k], .rank = 2, .shape = shape,
                                  .local_shape = local_shape, .global_offset = offsets[k] },
                        .byte_offset = k * (ROWS * COLS * 4 + GAP),
                        .byte_length = ROWS * COLS * 4,
                };
}

/* The segment's bytes as a plain fill of r writes them. */
static void assert_filled(ShardSegment *seg, const Rank *r) {
        uint8_t *got = malloc(SEG_SIZE), *want = calloc(1, SEG_SIZE);

        assert_non_null(got);
        assert_non_null(want);
        assert_int_equal(pread(shard_segment_fd(seg), got, SEG_SIZE, 0), SEG_SIZE);
        for (size_t k = 0; k < 2; k++) {
                FillSlice s = r->slices[k].fill;
                s.dst = want + r->slices[k].byte_offset;
                assert_int_equal(fill_slice(&s), 0);
        }
        assert_memory_equal(got, want, SEG_SIZE);
        free(got);
        free(want);
}

typedef struct Caller {
        FillShare *share;
        Rank rank;
        ShardSegment *seg;
        /* What the caller's fill binding does between chunks / while waiting. */
        bool (*cancelled)(void *userdata);
        FillProgress progress;
        int result;
        atomic_bool done;
} Caller;

static Caller *follower_of_test; /* the other caller, for the leaders' callbacks */
/* Set by the leaders' callbacks (cmocka's asserts belong to the test's thread): the leader is
 * inside its fill (registered), and a wait of theirs timed out. */
static atomic_bool leader_in_fill, callback_timed_out;

static void *caller_run(void *userdata) {
        Caller *c = userdata;

        fill_context_bind(&(FillContext) { .group = -1, .progress = &c->progress,
                                             .cancelled = c->cancelled, .userdata = c });
        c->result = fill_share_host_fill(c->share, c->seg, c->rank.slices, 2);
        fill_context_bind(NULL);
        atomic_store(&c->done, true);
        return NULL;
}

static bool wait_until(bool (*cond)(Caller *c), Caller *c) {
        for (unsigned i = 0; i < 20000; i++) {
                if (cond(c))
                        return true;
                (void) usleep(500);
        }
        return false;
}

static bool someone_waits(Caller *c) {
        return fill_share_waiting(c->share) > 0;
}

static bool follower_done(Caller *c) {
        return atomic_load(&follower_of_test->done);
}

/* A leader that holds its fill (between its first chunks) until a follower waits for it. */
static bool leader_waits_for_follower(void *userdata) {
        static _Thread_local bool once;
        atomic_store(&leader_in_fill, true);
        if (!once && !wait_until(someone_waits, userdata))
                atomic_store(&callback_timed_out, true);
        once = true;
        return false;
}

/* The same, then cancelled. */
static bool leader_cancelled_after_follower(void *userdata) {
        atomic_store(&leader_in_fill, true);
        if (!wait_until(someone_waits, userdata))
                atomic_store(&callback_timed_out, true);
        return true;
}

/* A leader that holds its fill until the follower has returned. */
static bool leader_waits_for_follower_done(void *userdata) {
        static _Thread_local bool once;
        atomic_store(&leader_in_fill, true);
        if (!once && !wait_until(follower_done, userdata))
                atomic_store(&callback_timed_out, true);
        once = true;
        return false;
}

static bool always_cancelled(void *userdata) {
        return true;
}

static void caller_init(Caller *c, FillShare *share, uint64_t seed, bool (*cancelled)(void *)) {
        *c = (Caller) { .share = share, .cancelled = cancelled };
        rank_init(&c->rank, seed);
        atomic_init(&c->progress.bytes, 0);
        atomic_init(&c->done, false);
        assert_int_equal(shard_segment_new_host("test-fill-share", SEG_SIZE, 0, &c->seg), 0);
}

static bool in_fill(Caller *c) {
        return atomic_load(&leader_in_fill);
}

/* Leader and follower in two threads: the follower started once the leader is inside its
 * fill (its first cancelled() call comes after it registered). */
static void run_pair(Caller *leader, Caller *follower) {
        pthread_t a, b;

        follower_of_test = follower;
        atomic_store(&leader_in_fill, false);
        atomic_store(&callback_timed_out, false);
        assert_int_equal(pthread_create(&a, NULL, caller_run, leader), 0);
        assert_true(wait_until(in_fill, leader));
        assert_int_equal(pthread_create(&b, NULL, caller_run, follower), 0);
        assert_int_equal(pthread_join(a, NULL), 0);
        assert_int_equal(pthread_join(b, NULL), 0);
        assert_false(atomic_load(&callback_timed_out));
}

static void test_equal_fill_copied(void **state) {
        _cleanup_(fill_share_freep) FillShare *share = NULL;
        Caller leader, follower;

        assert_int_equal(fill_share_new(&share), 0);
        caller_init(&leader, share, 7, leader_waits_for_follower);
        caller_init(&follower, share, 7, NULL);
        run_pair(&leader, &follower);
        assert_int_equal(leader.result, FILL_SHARE_FILLED);
        assert_int_equal(follower.result, FILL_SHARE_COPIED);
        assert_filled(leader.seg, &leader.rank);
        assert_filled(follower.seg, &follower.rank);
        /* The follower's watchers see its bytes as a fill's. */
        assert_int_equal(atomic_load(&follower.progress.bytes), 2 * ROWS * COLS * 4);
        /* Both mappings dropped, as after a plain fill. */
        assert_null(shard_segment_data(leader.seg));
        assert_null(shard_segment_data(follower.seg));
        assert_int_equal(fill_share_waiting(share), 0);
        shard_segment_unref(leader.seg);
        shard_segment_unref(follower.seg);
}

static void test_leader_fails_follower_fills(void **state) {
        _cleanup_(fill_share_freep) FillShare *share = NULL;
        Caller leader, follower;

        assert_int_equal(fill_share_new(&share), 0);
        caller_init(&leader, share, 8, leader_cancelled_after_follower);
        caller_init(&follower, share, 8, NULL);
        run_pair(&leader, &follower);
        assert_int_equal(leader.result, -ECANCELED);
        assert_int_equal(follower.result, FILL_SHARE_FILLED);
        assert_filled(follower.seg, &follower.rank);
        shard_segment_unref(leader.seg);
        shard_segment_unref(follower.seg);
}

static void test_follower_cancelled_while_waiting(void **state) {
        _cleanup_(fill_share_freep) FillShare *share = NULL;
        Caller leader, follower;

        assert_int_equal(fill_share_new(&share), 0);
        caller_init(&leader, share, 9, leader_waits_for_follower_done);
        caller_init(&follower, share, 9, always_cancelled);
        run_pair(&leader, &follower);
        assert_int_equal(follower.result, -ECANCELED);
        assert_int_equal(leader.result, FILL_SHARE_FILLED);
        assert_filled(leader.seg, &leader.rank);
        shard_segment_unref(leader.seg);
        shard_segment_unref(follower.seg);
}

/* Another seed, or another place of a slice: no sharing even while the other fill runs. */
static void test_unequal_fills_not_shared(void **state) {
        _cleanup_(fill_share_freep) FillShare *share = NULL;
        Caller leader, other;

        assert_int_equal(fill_share_new(&share), 0);
        for (unsigned variant = 0; variant < 2; variant++) {
                caller_init(&leader, share, 10, leader_waits_for_follower_done);
                caller_init(&other, share, variant == 0 ? 11 : 10, NULL);
                if (variant == 1)
                        other.rank.slices[1].byte_offset += 4; /* same values, elsewhere */
                run_pair(&leader, &other);
                assert_int_equal(leader.result, FILL_SHARE_FILLED);
                assert_int_equal(other.result, FILL_SHARE_FILLED);
                assert_filled(leader.seg, &leader.rank);
                assert_filled(other.seg, &other.rank);
                shard_segment_unref(leader.seg);
                shard_segment_unref(other.seg);
        }
}

/* Without a share (a NULL Accel): a plain fill. */
static void test_no_share(void **state) {
        Caller c;

        caller_init(&c, NULL, 12, NULL);
        caller_run(&c);
        assert_int_equal(c.result, FILL_SHARE_FILLED);
        assert_filled(c.seg, &c.rank);
        shard_segment_unref(c.seg);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_equal_fill_copied),
                cmocka_unit_test(test_leader_fails_follower_fills),
                cmocka_unit_test(test_follower_cancelled_while_waiting),
                cmocka_unit_test(test_unequal_fills_not_shared),
                cmocka_unit_test(test_no_share),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
