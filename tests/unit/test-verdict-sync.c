/* test-verdict-sync.c: when swim pulls verdicts, in how many buckets, and how answers are cut. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/resource-limits.h"
#include "membership/verdict-sync.h"

#define HB 1000u

/* A difference is pulled once it has lasted `rounds` heartbeats; a digest equal to ours
 * starts the wait again; none sent is no difference. */
static void test_pull_waits_for_rounds(void **state) {
        VerdictPull v = {};

        assert_false(verdict_pull_due(&v, 5, 0, 100, HB, 2)); /* none sent */
        assert_false(v.differs);
        assert_false(verdict_pull_due(&v, 5, 6, 100, HB, 2));
        assert_false(verdict_pull_due(&v, 5, 6, 2099, HB, 2));
        assert_false(verdict_pull_due(&v, 5, 5, 2100, HB, 2)); /* equal: wait again */
        assert_false(verdict_pull_due(&v, 5, 6, 2200, HB, 2));
        assert_false(verdict_pull_due(&v, 5, 6, 4199, HB, 2));
        assert_true(verdict_pull_due(&v, 5, 6, 4200, HB, 2));
        assert_int_equal(v.pulled_at_ms, 4200);
        assert_int_equal(v.pulled_digest, 5);
}

/* At most one pull per half heartbeat; while ours does not move between pulls the wait
 * doubles, up to 2^VERDICT_SYNC_BACKOFF times; a pull that moved ours brings it back. */
static void test_pull_backs_off_while_fruitless(void **state) {
        VerdictPull v = {};
        int64_t t = 1000, half = HB / 2; /* pulled_at_ms 0 is "never" */

        assert_true(verdict_pull_due(&v, 5, 6, t, HB, 0));
        assert_false(verdict_pull_due(&v, 7, 6, t + half - 1, HB, 0));
        t += half;
        assert_true(verdict_pull_due(&v, 7, 6, t, HB, 0)); /* ours moved: not fruitless */
        assert_int_equal(v.fruitless, 0);
        for (unsigned k = 1; k <= VERDICT_SYNC_BACKOFF + 2; k++) {
                unsigned shift = k - 1 < VERDICT_SYNC_BACKOFF ? k - 1 : VERDICT_SYNC_BACKOFF;
                int64_t wait = half << shift;
                /* ours stays 7: the last pull changed nothing */
                assert_false(verdict_pull_due(&v, 7, 6, t + wait - 1, HB, 0));
                t += wait;
                assert_true(verdict_pull_due(&v, 7, 6, t, HB, 0));
                assert_int_equal(v.fruitless, k < VERDICT_SYNC_BACKOFF ? k : VERDICT_SYNC_BACKOFF);
        }
        assert_false(verdict_pull_due(&v, 8, 6, t + half - 1, HB, 0));
        assert_true(verdict_pull_due(&v, 8, 6, t + half, HB, 0));
        assert_int_equal(v.fruitless, 0);
}

/* Big answers pace the next pull: n verdicts answered wait n / VERDICT_SYNC_PACE heartbeats
 * after the last pull (the half heartbeat when that is longer), never past the longest
 * backoff, and a pull starts the count again. */
static void test_pull_paced_by_answers(void **state) {
        VerdictPull v = {};
        int64_t t = 1000, paced = (int64_t) 5 * HB;

        assert_true(verdict_pull_due(&v, 5, 6, t, HB, 0));
        verdict_pull_took(&v, 3 * VERDICT_SYNC_PACE);
        verdict_pull_took(&v, 2 * VERDICT_SYNC_PACE); /* answers add up */
        assert_false(verdict_pull_due(&v, 7, 6, t + HB / 2, HB, 0));
        assert_false(verdict_pull_due(&v, 7, 6, t + paced - 1, HB, 0));
        assert_true(verdict_pull_due(&v, 7, 6, t + paced, HB, 0));
        assert_int_equal(v.taken, 0);
        t += paced;
        /* Small answers leave the half heartbeat as the bound. */
        verdict_pull_took(&v, VERDICT_SYNC_PACE / 4);
        assert_false(verdict_pull_due(&v, 8, 6, t + HB / 2 - 1, HB, 0));
        assert_true(verdict_pull_due(&v, 8, 6, t + HB / 2, HB, 0));
        t += HB / 2;
        /* A flood of answers nobody asked for waits the longest backoff, no longer. */
        verdict_pull_took(&v, SIZE_MAX);
        verdict_pull_took(&v, SIZE_MAX);
        assert_int_equal(v.taken, SIZE_MAX);
        int64_t longest = ((int64_t) HB / 2) << VERDICT_SYNC_BACKOFF;
        assert_false(verdict_pull_due(&v, 9, 6, t + longest - 1, HB, 0));
        assert_true(verdict_pull_due(&v, 9, 6, t + longest, HB, 0));
}

/* About 2 sqrt(n) buckets, a power of two, at most PEER_MAX_VERDICT_BUCKETS. */
static void test_bucket_counts(void **state) {
        assert_int_equal(verdict_sync_buckets(1), 2);
        assert_int_equal(verdict_sync_buckets(10), 8);
        assert_int_equal(verdict_sync_buckets(100), 32);
        assert_int_equal(verdict_sync_buckets(1000), 64);
        assert_int_equal(verdict_sync_buckets(10000), 256);
        assert_int_equal(verdict_sync_buckets(1000000), PEER_MAX_VERDICT_BUCKETS);
        for (size_t n = 1; n < 70000; n = n * 3 + 1) {
                unsigned b = verdict_sync_buckets(n);
                assert_int_equal(b & (b - 1), 0);
        }
}

/* An answer message holds at most PEER_MAX_VERDICTS verdicts and about half the message
 * limit of names; a single verdict always goes. */
static void test_answer_chunks(void **state) {
        enum { N = PEER_MAX_VERDICTS + 10 };
        PeerUpdate *list = calloc(N, sizeof(PeerUpdate));
        char *longname = malloc(FAMILYD_MAX_PEER_MESSAGE_BYTES);

        assert_non_null(list);
        assert_non_null(longname);
        for (size_t i = 0; i < N; i++)
                list[i].name = "node-1234";
        assert_int_equal(verdict_sync_chunk(list, N, 0), PEER_MAX_VERDICTS);
        assert_int_equal(verdict_sync_chunk(list, N, PEER_MAX_VERDICTS), 10);
        assert_int_equal(verdict_sync_chunk(list, N, N), 0);

        memset(longname, 'x', 255);
        longname[255] = 0;
        for (size_t i = 0; i < N; i++)
                list[i].name = longname;
        size_t k = verdict_sync_chunk(list, N, 0);
        assert_true(k < PEER_MAX_VERDICTS);
        assert_true(k * (255 + 32) <= FAMILYD_MAX_PEER_MESSAGE_BYTES / 2);
        assert_true((k + 1) * (255 + 32) > FAMILYD_MAX_PEER_MESSAGE_BYTES / 2);

        memset(longname, 'x', FAMILYD_MAX_PEER_MESSAGE_BYTES - 1);
        longname[FAMILYD_MAX_PEER_MESSAGE_BYTES - 1] = 0;
        assert_int_equal(verdict_sync_chunk(list, N, 0), 1);
        free(longname);
        free(list);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pull_waits_for_rounds),
                cmocka_unit_test(test_pull_backs_off_while_fruitless),
                cmocka_unit_test(test_pull_paced_by_answers),
                cmocka_unit_test(test_bucket_counts),
                cmocka_unit_test(test_answer_chunks),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
