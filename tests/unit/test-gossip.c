/* test-gossip.c: news about members told least often first, each a bounded number of times. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "membership/gossip.h"

/* Least told first, the newest first among equals; an item told `limit` times is gone. */
static void test_pick_order_and_limit(void **state) {
        Gossip g = {};
        GossipItem *picked[4];

        assert_int_equal(gossip_add(&g, "a", 1, false), 0);
        assert_int_equal(gossip_add(&g, "b", 2, false), 0);
        assert_int_equal(gossip_pick(&g, 1, picked), 1);
        assert_string_equal(picked[0]->name, "b");
        gossip_told(&g, 2);
        assert_int_equal(gossip_add(&g, "c", 3, false), 0);
        assert_int_equal(gossip_pick(&g, 4, picked), 3);
        assert_string_equal(picked[0]->name, "c");
        assert_string_equal(picked[1]->name, "a");
        assert_string_equal(picked[2]->name, "b");
        gossip_told(&g, 2); /* b: told twice, dropped */
        assert_int_equal(gossip_pending(&g), 2);
        assert_int_equal(gossip_pick(&g, 4, picked), 2);
        gossip_told(&g, 2);
        assert_int_equal(gossip_pending(&g), 0);
        gossip_done(&g);
}

/* News about a name replaces the item about it, told afresh, with its start and kind. */
static void test_news_replaces(void **state) {
        Gossip g = {};
        GossipItem *picked[2];

        assert_int_equal(gossip_add(&g, "a", 1, false), 0);
        assert_int_equal(gossip_pick(&g, 2, picked), 1);
        gossip_told(&g, 3);
        assert_int_equal(gossip_add(&g, "a", 5, true), 0);
        assert_int_equal(gossip_pending(&g), 1);
        assert_int_equal(gossip_pick(&g, 2, picked), 1);
        assert_int_equal(picked[0]->boot_id, 5);
        assert_true(picked[0]->forgotten);
        assert_int_equal(picked[0]->told, 0);
        gossip_told(&g, 3);
        gossip_done(&g);
}

/* One item per name however the items moved: sorted by a pick, swapped by drops and by the
 * most told going when full (the name index follows them). */
static void test_one_item_per_name(void **state) {
        Gossip g = {};
        GossipItem *picked[GOSSIP_MAX_ITEMS];
        char name[16];

        for (unsigned i = 0; i < 40; i++) {
                snprintf(name, sizeof name, "n%u", i);
                assert_int_equal(gossip_add(&g, name, i, false), 0);
        }
        assert_int_equal(gossip_pick(&g, 10, picked), 10);
        gossip_told(&g, 1); /* the 10 newest dropped: the others swapped into their places */
        assert_int_equal(gossip_pending(&g), 30);
        for (unsigned i = 0; i < 40; i++) {
                snprintf(name, sizeof name, "n%u", i);
                assert_int_equal(gossip_add(&g, name, 100 + i, false), 0);
        }
        assert_int_equal(gossip_pending(&g), 40);
        assert_int_equal(gossip_pick(&g, GOSSIP_MAX_ITEMS, picked), 40);
        for (size_t i = 0; i < 40; i++) {
                unsigned k;
                assert_int_equal(sscanf(picked[i]->name, "n%u", &k), 1);
                assert_int_equal(picked[i]->boot_id, 100 + k);
                for (size_t j = 0; j < i; j++)
                        assert_string_not_equal(picked[i]->name, picked[j]->name);
        }
        gossip_told(&g, 100);
        /* Full: each new name pushes out the most told; news about a kept one replaces it. */
        for (unsigned i = 40; i < GOSSIP_MAX_ITEMS + 20; i++) {
                snprintf(name, sizeof name, "n%u", i);
                assert_int_equal(gossip_add(&g, name, i, false), 0);
        }
        assert_int_equal(gossip_pending(&g), GOSSIP_MAX_ITEMS);
        assert_int_equal(gossip_add(&g, "n1000", 7, true), 0);
        assert_int_equal(gossip_pending(&g), GOSSIP_MAX_ITEMS);
        gossip_done(&g);
}

/* At most GOSSIP_MAX_ITEMS wait: past that the most told goes first. */
static void test_bounded(void **state) {
        Gossip g = {};
        GossipItem *picked[1];
        char name[16];

        assert_int_equal(gossip_add(&g, "old", 1, false), 0);
        assert_int_equal(gossip_pick(&g, 1, picked), 1);
        gossip_told(&g, 100);
        for (unsigned i = 0; i < GOSSIP_MAX_ITEMS; i++) {
                snprintf(name, sizeof name, "n%u", i);
                assert_int_equal(gossip_add(&g, name, i, false), 0);
        }
        assert_int_equal(gossip_pending(&g), GOSSIP_MAX_ITEMS);
        for (size_t i = 0; i < g.n; i++)
                assert_string_not_equal(g.items[i].name, "old");
        gossip_done(&g);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pick_order_and_limit),
                cmocka_unit_test(test_news_replaces),
                cmocka_unit_test(test_bounded),
                cmocka_unit_test(test_one_item_per_name),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
