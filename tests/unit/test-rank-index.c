/* test-rank-index.c: configured node rank -> position, kept in step with a table it reads. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "membership/rank-index.h"

/* The table: ranks by position. */
static int64_t ranks[16];

static int64_t rank_at(const void *userdata, size_t position) {
        return ((const int64_t *) userdata)[position];
}

static size_t find(const RankIndex *x, int64_t rank) {
        size_t at = SIZE_MAX;

        return rank_index_find(x, rank, &at) ? at : SIZE_MAX;
}

/* Ranks below the bound get slots as they come (the index grows and refills from the table);
 * ranks at or past it and negative ones are not covered. */
static void test_put_grows_up_to_the_bound(void **state) {
        RankIndex x;

        rank_index_init(&x, rank_at, ranks);
        ranks[0] = -1;
        ranks[1] = 3;
        rank_index_put(&x, 0, 1, 8); /* no rank */
        assert_false(rank_index_covers(&x, 0));
        rank_index_put(&x, 1, 2, 8);
        assert_true(rank_index_covers(&x, 3));
        assert_int_equal(find(&x, 3), 1);
        assert_int_equal(find(&x, 2), SIZE_MAX); /* covered, nobody holds it */
        ranks[2] = 1;
        ranks[3] = 7;
        ranks[4] = 8; /* at the bound */
        rank_index_put(&x, 2, 3, 8);
        rank_index_put(&x, 3, 4, 8);
        rank_index_put(&x, 4, 5, 8);
        assert_int_equal(x.n, 8);
        assert_int_equal(find(&x, 1), 2);
        assert_int_equal(find(&x, 3), 1); /* refilled when it grew */
        assert_int_equal(find(&x, 7), 3);
        assert_false(rank_index_covers(&x, 8));
        assert_false(rank_index_covers(&x, -1));
        rank_index_done(&x);
}

/* A rank held twice (a bug, or a record in flight): the first holder keeps the slot, and the
 * other takes it when the first drops it; a move follows the holder. */
static void test_drop_and_move(void **state) {
        RankIndex x;

        rank_index_init(&x, rank_at, ranks);
        ranks[0] = 2;
        ranks[1] = 5;
        ranks[2] = 2;
        for (size_t i = 0; i < 3; i++)
                rank_index_put(&x, i, i + 1, 16);
        assert_int_equal(find(&x, 2), 0);
        rank_index_drop(&x, 2, 3); /* not the holder: nothing changes */
        assert_int_equal(find(&x, 2), 0);
        rank_index_drop(&x, 0, 3);
        assert_int_equal(find(&x, 2), 2);
        /* Position 0 leaves: the others shift down. */
        ranks[0] = 5;
        ranks[1] = 2;
        rank_index_moved(&x, 5, 1, 0);
        rank_index_moved(&x, 2, 2, 1);
        assert_int_equal(find(&x, 5), 0);
        assert_int_equal(find(&x, 2), 1);
        rank_index_moved(&x, 9, 3, 2); /* not covered: nothing */
        rank_index_drop(&x, 1, 2);
        assert_int_equal(find(&x, 2), SIZE_MAX);
        rank_index_done(&x);
        assert_false(rank_index_covers(&x, 0));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_put_grows_up_to_the_bound),
                cmocka_unit_test(test_drop_and_move),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
