/* test-shard-table.c: handout/token.c and handout/shard-table.c: tokens, lookups by token and asker, the table's bound, concurrent use. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "familyd-v1-shard.pb-c.h"
#include "common/macro.h"
#include "shm/segment.h"
#include "handout/shard-socket.h"
#include "handout/shard-table.h"
#include "handout/token.h"
#include "sealed-segments.h"

typedef Familyd__V1__ShardFdRequest Request;
typedef Familyd__V1__ShardFdReply Reply;

static int token_cmp(const void *a, const void *b) {
        return strcmp(((const ShardToken *) a)->hex, ((const ShardToken *) b)->hex);
}

static void test_token_format_unique(void **state) {
        enum { N = 4096 };
        ShardToken *t = calloc(N, sizeof *t);

        /* Not assert_non_null(): cmocka does not mark its failure path noreturn, so gcc 14 takes
         * t as maybe NULL below and fails the build (-Wstringop-overread at the strcmp). */
        if (!t) {
                fail_msg("calloc of %d tokens failed", N);
                return;
        }
        for (size_t i = 0; i < N; i++) {
                assert_int_equal(shard_token_new(&t[i]), 0);
                assert_int_equal(strlen(t[i].hex), SHARD_TOKEN_LENGTH);
                assert_true(shard_token_is_valid(t[i].hex));
                for (size_t j = 0; j < SHARD_TOKEN_LENGTH; j++)
                        assert_non_null(strchr("0123456789abcdef", t[i].hex[j]));
        }
        qsort(t, N, sizeof *t, token_cmp);
        for (size_t i = 1; i < N; i++)
                assert_true(strcmp(t[i - 1].hex, t[i].hex) < 0);

        /* Every hex digit appears in every position over 4096 draws (a stuck nibble would not). */
        for (size_t pos = 0; pos < SHARD_TOKEN_LENGTH; pos++) {
                unsigned seen = 0;
                for (size_t i = 0; i < N; i++) {
                        char ch = t[i].hex[pos];
                        seen |= 1u << (ch <= '9' ? ch - '0' : ch - 'a' + 10);
                }
                assert_int_equal(seen, 0xffffu);
        }

        char other[SHARD_TOKEN_LENGTH + 2];
        memcpy(other, t[0].hex, SHARD_TOKEN_LENGTH + 1);
        assert_true(shard_token_equal(t[0].hex, other));
        other[SHARD_TOKEN_LENGTH - 1] ^= 1;
        assert_false(shard_token_equal(t[0].hex, other));
        memcpy(other, t[0].hex, SHARD_TOKEN_LENGTH + 1);
        other[0] = other[0] == 'a' ? 'b' : 'a';
        assert_false(shard_token_equal(t[0].hex, other));
        memcpy(other, t[0].hex, SHARD_TOKEN_LENGTH + 1);
        other[SHARD_TOKEN_LENGTH - 1] = 0; /* a prefix */
        assert_false(shard_token_equal(t[0].hex, other));
        assert_false(shard_token_is_valid(other));
        memcpy(other, t[0].hex, SHARD_TOKEN_LENGTH);
        other[SHARD_TOKEN_LENGTH] = '0';
        other[SHARD_TOKEN_LENGTH + 1] = 0; /* one longer */
        assert_false(shard_token_equal(t[0].hex, other));
        assert_false(shard_token_is_valid(other));
        assert_false(shard_token_equal(t[0].hex, ""));
        assert_false(shard_token_equal(t[0].hex, NULL));
        assert_false(shard_token_equal(NULL, t[0].hex));
        assert_false(shard_token_is_valid("0123456789ABCDEF0123456789abcdef"));
        assert_true(shard_token_is_valid("0123456789abcdef0123456789abcdef"));
        free(t);
}

/* ---- segments ---- */

static void test_table_basic(void **state) {
        _cleanup_(shard_table_unrefp) ShardTable *t = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *a = segment_new(10, 0, 1),
                                                     *b = segment_new(20, 1, 2);
        ShardToken ta, tb, tc, td, te;
        ShardSegment *got = NULL, *many[3];
        size_t bad = 99;

        assert_int_equal(shard_table_new(4, &t), 0);
        assert_int_equal(shard_table_add(t, "", a, &ta), -EINVAL);
        assert_int_equal(shard_table_add(t, "bld-1", a, &ta), 0);
        assert_int_equal(shard_table_add(t, "bld-1", b, &tb), 0);
        assert_int_equal(shard_table_add(t, "bld-2", a, &tc), 0);
        assert_int_equal(shard_table_add(t, "bld-2", b, &td), 0);
        assert_int_equal(shard_table_add(t, "bld-3", b, &te), SHARD_TABLE_FULL);
        assert_int_equal(shard_table_size(t), 4);
        assert_true(shard_token_is_valid(ta.hex));
        assert_false(streq(ta.hex, tb.hex));

        assert_int_equal(shard_table_lookup(t, tb.hex, &got), 0);
        assert_ptr_equal(got, b);
        got = shard_segment_unref(got);
        assert_int_equal(shard_table_lookup(t, "0123456789abcdef0123456789abcdef", &got),
                         SHARD_TABLE_NOT_FOUND);
        assert_int_equal(shard_table_lookup(t, "", &got), SHARD_TABLE_NOT_FOUND);
        assert_int_equal(shard_table_lookup(t, NULL, &got), SHARD_TABLE_NOT_FOUND);
        char prefix[SHARD_TOKEN_LENGTH];
        memcpy(prefix, ta.hex, sizeof prefix - 1);
        prefix[sizeof prefix - 1] = 0;
        assert_int_equal(shard_table_lookup(t, prefix, &got), SHARD_TABLE_NOT_FOUND);
        assert_null(got);

        const char *all[] = { ta.hex, td.hex, tb.hex };
        assert_int_equal(shard_table_lookup_many(t, all, 3, many, &bad), 0);
        assert_ptr_equal(many[0], a);
        assert_ptr_equal(many[1], b);
        assert_ptr_equal(many[2], b);
        for (size_t i = 0; i < 3; i++)
                shard_segment_unref(many[i]);
        const char *some[] = { ta.hex, "nope", tb.hex };
        many[0] = many[1] = many[2] = NULL;
        assert_int_equal(shard_table_lookup_many(t, some, 3, many, &bad), SHARD_TABLE_NOT_FOUND);
        assert_int_equal(bad, 1);
        assert_null(many[0]);

        assert_int_equal(shard_table_remove(t, ta.hex), 0);
        assert_int_equal(shard_table_remove(t, ta.hex), SHARD_TABLE_NOT_FOUND);
        assert_int_equal(shard_table_lookup(t, ta.hex, &got), SHARD_TABLE_NOT_FOUND);
        assert_int_equal(shard_table_remove_group(t, "bld-2"), 2);
        assert_int_equal(shard_table_remove_group(t, "bld-2"), 0);
        assert_int_equal(shard_table_lookup(t, tc.hex, &got), SHARD_TABLE_NOT_FOUND);
        assert_int_equal(shard_table_size(t), 1);
        assert_int_equal(shard_table_lookup(t, tb.hex, &got), 0);
        got = shard_segment_unref(got);

        /* Growth past the initial buckets keeps every token findable. */
        _cleanup_(shard_table_unrefp) ShardTable *big = NULL;
        enum { N = 5000 };
        ShardToken *tokens = calloc(N, sizeof *tokens);
        assert_non_null(tokens);
        assert_int_equal(shard_table_new(0, &big), 0);
        for (size_t i = 0; i < N; i++)
                assert_int_equal(shard_table_add(big, i % 2 ? "odd" : "even", i % 3 ? a : b,
                                                 &tokens[i]), 0);
        for (size_t i = 0; i < N; i++) {
                assert_int_equal(shard_table_lookup(big, tokens[i].hex, &got), 0);
                assert_ptr_equal(got, i % 3 ? a : b);
                got = shard_segment_unref(got);
        }
        assert_int_equal(shard_table_remove_group(big, "odd"), N / 2);
        for (size_t i = 0; i < N; i++) {
                assert_int_equal(shard_table_lookup(big, tokens[i].hex, &got),
                                 i % 2 ? SHARD_TABLE_NOT_FOUND : 0);
                got = shard_segment_unref(got);
        }
        free(tokens);
}

typedef struct TableWorker {
        ShardTable *table;
        ShardSegment *segment;
        unsigned index;
        bool ok;
} TableWorker;

#define WORKER_TOKENS 400

static void *table_worker(void *userdata) {
        TableWorker *w = userdata;
        ShardToken tokens[WORKER_TOKENS];
        char group[32];

        (void) snprintf(group, sizeof group, "bld-%u", w->index);
        w->ok = false;
        for (unsigned round = 0; round < 5; round++) {
                for (size_t i = 0; i < WORKER_TOKENS; i++)
                        if (shard_table_add(w->table, group, w->segment, &tokens[i]) != 0)
                                return NULL;
                for (size_t i = 0; i < WORKER_TOKENS; i++) {
                        ShardSegment *got = NULL;
                        if (shard_table_lookup(w->table, tokens[i].hex, &got) != 0 ||
                            got != w->segment)
                                return NULL;
                        shard_segment_unref(got);
                }
                for (size_t i = 0; i < WORKER_TOKENS; i += 2)
                        if (shard_table_remove(w->table, tokens[i].hex) != 0)
                                return NULL;
                if (shard_table_remove_group(w->table, group) != WORKER_TOKENS / 2)
                        return NULL;
                for (size_t i = 0; i < WORKER_TOKENS; i++) {
                        ShardSegment *got = NULL;
                        if (shard_table_lookup(w->table, tokens[i].hex, &got) !=
                            SHARD_TABLE_NOT_FOUND)
                                return NULL;
                }
        }
        w->ok = true;
        return NULL;
}

/* A build's tokens go to its owner's uid and admins once restricted; open otherwise. */
static void test_table_access(void **state) {
        _cleanup_(shard_table_unrefp) ShardTable *t = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *a = segment_new(10, 0, 1);
        ShardToken ta, tb;
        ShardSegment *many[2] = {};
        size_t bad = 99;
        ShardAsker owner = { .uid = 1000 }, other = { .uid = 1001 },
                   admin = { .uid = 1001, .admin = true };

        assert_int_equal(shard_table_new(8, &t), 0);
        assert_int_equal(shard_table_add(t, "g1", a, &ta), 0);
        assert_int_equal(shard_table_add(t, "g2", a, &tb), 0);
        const char *both[] = { tb.hex, ta.hex };

        /* Not yet restricted: open to anyone. */
        assert_int_equal(shard_table_lookup_many_as(t, both, 2, &other, many, &bad), 0);
        shard_segment_unref(many[0]);
        shard_segment_unref(many[1]);

        shard_table_set_access(t, "g1", &(ShardAccess) { .restricted = true, .owner_uid = 1000 });
        many[0] = many[1] = NULL;
        assert_int_equal(shard_table_lookup_many_as(t, both, 2, &other, many, &bad),
                         SHARD_TABLE_DENIED);
        assert_int_equal(bad, 1);
        assert_null(many[0]);
        for (size_t k = 0; k < 2; k++) {
                const ShardAsker *ok = k == 0 ? &owner : &admin;
                assert_int_equal(shard_table_lookup_many_as(t, both, 2, ok, many, &bad), 0);
                shard_segment_unref(many[0]);
                shard_segment_unref(many[1]);
        }
        /* Shared with the group again: open. */
        shard_table_set_access(t, "g1", &(ShardAccess) { .restricted = false, .owner_uid = 1000 });
        assert_int_equal(shard_table_lookup_many_as(t, both, 2, &other, many, &bad), 0);
        shard_segment_unref(many[0]);
        shard_segment_unref(many[1]);
}

/* A training handout's tokens go to their one process (pid and start time) only: not to
 * another process of the owner's uid, not to an admin, not to a process that cannot be named. */
static void test_table_bound(void **state) {
        _cleanup_(shard_table_unrefp) ShardTable *t = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *a = segment_new(10, 0, 1);
        ShardToken ta, tb;
        ShardSegment *many[2] = {};
        size_t bad = 99;
        ShardAsker maker = { .uid = 1000, .pid = 42, .start_time = 7 },
                   sibling = { .uid = 1000, .pid = 43, .start_time = 7 },
                   reused = { .uid = 1000, .pid = 42, .start_time = 8 },
                   unnamed = { .uid = 1000 },
                   admin = { .uid = 0, .admin = true, .pid = 1, .start_time = 1 };

        assert_int_equal(shard_table_new(8, &t), 0);
        assert_int_equal(shard_table_add(t, "g1", a, &ta), 0);
        assert_int_equal(shard_table_add(t, "g2", a, &tb), 0);
        const char *both[] = { tb.hex, ta.hex };

        shard_table_set_access(t, "g1", &(ShardAccess) { .restricted = true, .owner_uid = 1000,
                                                         .bound = true, .pid = 42,
                                                         .start_time = 7 });
        const ShardAsker *refused[] = { &sibling, &reused, &unnamed, &admin };
        for (size_t k = 0; k < ELEMENTSOF(refused); k++) {
                bad = 99;
                assert_int_equal(shard_table_lookup_many_as(t, both, 2, refused[k], many, &bad),
                                 SHARD_TABLE_OTHER_PROCESS);
                assert_int_equal(bad, 1);
                assert_null(many[0]);
        }
        assert_int_equal(shard_table_lookup_many_as(t, both, 2, &maker, many, &bad), 0);
        shard_segment_unref(many[0]);
        shard_segment_unref(many[1]);
        /* Lookups without an asker (the daemon's own) are not refused. */
        assert_int_equal(shard_table_lookup(t, ta.hex, &many[0]), 0);
        shard_segment_unref(many[0]);
}

static void test_table_threads(void **state) {
        _cleanup_(shard_table_unrefp) ShardTable *t = NULL;
        enum { N = 8 };
        ShardSegment *segments[N];
        TableWorker workers[N];
        pthread_t threads[N];

        assert_int_equal(shard_table_new(0, &t), 0);
        for (unsigned i = 0; i < N; i++) {
                segments[i] = segment_new(64 + i, (int) i, (uint8_t) i);
                workers[i] = (TableWorker) { .table = t, .segment = segments[i], .index = i };
                assert_int_equal(pthread_create(&threads[i], NULL, table_worker, &workers[i]), 0);
        }
        for (unsigned i = 0; i < N; i++) {
                assert_int_equal(pthread_join(threads[i], NULL), 0);
                assert_true(workers[i].ok);
                shard_segment_unref(segments[i]);
        }
        assert_int_equal(shard_table_size(t), 0);
}

/* ---- the socket: a small client ---- */

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_token_format_unique),
                cmocka_unit_test(test_table_basic),
                cmocka_unit_test(test_table_access),
                cmocka_unit_test(test_table_bound),
                cmocka_unit_test(test_table_threads),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
