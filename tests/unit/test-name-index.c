/* test-name-index.c: the string-keyed index: put, find, move, remove, collisions, growth. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/name-index.h"

#define N_NAMES 2000u

/* An owner like membership.c: names in an array, the index holding positions. */
typedef struct Owner {
        char *names[N_NAMES];
        size_t n;
        NameIndex index;
} Owner;

static const char *owner_key(const void *userdata, uintptr_t i) {
        const Owner *o = userdata;

        assert_true(i < o->n); /* the index never hands out a stale position */
        return o->names[i];
}

static void owner_add(Owner *o, const char *name) {
        o->names[o->n] = strdup(name);
        assert_non_null(o->names[o->n]);
        assert_int_equal(name_index_put(&o->index, name, o->n), 0);
        o->n++;
}

/* Removal by swapping the last element in, as the owners' arrays do. */
static void owner_remove_swap(Owner *o, size_t i) {
        size_t last = o->n - 1;

        assert_true(name_index_remove(&o->index, o->names[i], i));
        free(o->names[i]);
        if (i != last) {
                o->names[i] = o->names[last];
                assert_true(name_index_move(&o->index, o->names[i], last, i));
        }
        o->n--;
}

static void owner_done(Owner *o) {
        for (size_t i = 0; i < o->n; i++)
                free(o->names[i]);
        name_index_done(&o->index);
}

static bool owner_find(const Owner *o, const char *name, size_t *ret) {
        uintptr_t v;

        if (!name_index_find(&o->index, name, owner_key, o, &v))
                return false;
        *ret = v;
        return true;
}

static void test_empty(void **state) {
        (void) state;
        Owner o = {};
        size_t i;

        assert_false(owner_find(&o, "node-a", &i));
        assert_false(name_index_remove(&o.index, "node-a", 0));
        assert_false(name_index_move(&o.index, "node-a", 0, 1));
        assert_int_equal(name_index_count(&o.index), 0);
        owner_done(&o);
}

static void test_put_find(void **state) {
        (void) state;
        Owner o = {};
        size_t i = 99;

        owner_add(&o, "node-a");
        owner_add(&o, "node-b");
        owner_add(&o, "");
        assert_true(owner_find(&o, "node-a", &i));
        assert_int_equal(i, 0);
        assert_true(owner_find(&o, "node-b", &i));
        assert_int_equal(i, 1);
        assert_true(owner_find(&o, "", &i));
        assert_int_equal(i, 2);
        assert_false(owner_find(&o, "node-c", &i));
        assert_false(owner_find(&o, "node-", &i));
        assert_int_equal(name_index_count(&o.index), 3);
        owner_done(&o);
}

static void test_remove_swap(void **state) {
        (void) state;
        Owner o = {};
        size_t i;

        owner_add(&o, "a");
        owner_add(&o, "b");
        owner_add(&o, "c");
        owner_add(&o, "d");
        owner_remove_swap(&o, 1); /* "d" moves to 1 */
        assert_false(owner_find(&o, "b", &i));
        assert_true(owner_find(&o, "d", &i));
        assert_int_equal(i, 1);
        assert_true(owner_find(&o, "c", &i));
        assert_int_equal(i, 2);
        owner_remove_swap(&o, 2); /* the last: nothing moves */
        assert_false(owner_find(&o, "c", &i));
        assert_true(owner_find(&o, "a", &i));
        assert_int_equal(i, 0);
        assert_int_equal(name_index_count(&o.index), 2);
        /* A wrong position is not an entry: nothing removed, nothing moved. */
        assert_false(name_index_remove(&o.index, "a", 1));
        assert_false(name_index_move(&o.index, "a", 1, 0));
        assert_int_equal(name_index_count(&o.index), 2);
        owner_done(&o);
}

static const char *same_key(const void *userdata, uintptr_t value) {
        (void) userdata;
        (void) value;
        return "same";
}

/* Two entries of one name (two members at one address, say): each removed by its value. */
static void test_same_name(void **state) {
        (void) state;
        NameIndex x = {};
        uintptr_t v = 0;

        assert_int_equal(name_index_put(&x, "same", 7), 0);
        assert_int_equal(name_index_put(&x, "same", 8), 0);
        assert_true(name_index_find(&x, "same", same_key, NULL, &v));
        assert_true(v == 7 || v == 8);
        assert_true(name_index_remove(&x, "same", 7));
        assert_false(name_index_remove(&x, "same", 7));
        assert_true(name_index_find(&x, "same", same_key, NULL, &v));
        assert_int_equal(v, 8);
        assert_true(name_index_remove(&x, "same", 8));
        assert_false(name_index_find(&x, "same", same_key, NULL, &v));
        name_index_done(&x);
}

/* Equal hashes are told apart by the owner's names: a key that always hands back another name
 * makes every slot whose hash agrees a miss. */
static const char *other_key(const void *userdata, uintptr_t value) {
        (void) userdata;
        (void) value;
        return "not-this-one";
}

static void test_hash_match_name_differs(void **state) {
        (void) state;
        NameIndex x = {};
        uintptr_t v;

        assert_int_equal(name_index_put(&x, "node-a", 1), 0);
        assert_false(name_index_find(&x, "node-a", other_key, NULL, &v));
        name_index_done(&x);
}

/* Many names in few slots: long probe runs, then removals in a scattered order (each one
 * shifts the run behind it back), with every remaining name still found at its position. */
static void test_collisions(void **state) {
        (void) state;
        Owner o = {};
        char name[32];
        size_t i, step = 0;

        for (unsigned k = 0; k < N_NAMES; k++) {
                snprintf(name, sizeof name, "node-%u", k);
                owner_add(&o, name);
        }
        while (o.n > 0) {
                step = (step * 7 + 13) % o.n;
                owner_remove_swap(&o, step);
                if (o.n % 97 == 0 || o.n < 20)
                        for (size_t j = 0; j < o.n; j++) {
                                assert_true(owner_find(&o, o.names[j], &i));
                                assert_int_equal(i, j);
                        }
        }
        for (unsigned k = 0; k < N_NAMES; k++) {
                snprintf(name, sizeof name, "node-%u", k);
                assert_false(owner_find(&o, name, &i));
        }
        assert_int_equal(name_index_count(&o.index), 0);
        owner_done(&o);
}

/* The slots follow the entries: at least 1.5 times, at most three times (past the minimum), and
 * no growth from a churn of puts and removes at one size. */
static void test_growth_bounded(void **state) {
        (void) state;
        Owner o = {};
        char name[32];
        size_t i, slots;

        for (unsigned k = 0; k < N_NAMES; k++) {
                snprintf(name, sizeof name, "peer-%u:4433", k);
                owner_add(&o, name);
                assert_true(2 * o.index.n_slots >= 3 * o.n);
                assert_true(o.index.n_slots <= 3 * o.n || o.index.n_slots == 8);
        }
        slots = o.index.n_slots;
        for (unsigned k = 0; k < 10 * N_NAMES; k++) {
                owner_remove_swap(&o, k % o.n);
                snprintf(name, sizeof name, "churn-%u", k);
                owner_add(&o, name);
        }
        assert_int_equal(o.index.n_slots, slots);
        assert_int_equal(name_index_count(&o.index), N_NAMES);
        for (size_t j = 0; j < o.n; j++) {
                assert_true(owner_find(&o, o.names[j], &i));
                assert_int_equal(i, j);
        }
        owner_done(&o);
}

static void test_reserve(void **state) {
        (void) state;
        NameIndex x = {};

        assert_int_equal(name_index_reserve(&x, 100), 0);
        assert_int_equal(x.n_slots, 256);
        assert_int_equal(name_index_reserve(&x, 10), 0); /* never shrinks under its entries */
        assert_int_equal(x.n_slots, 256);
        assert_int_equal(name_index_reserve(&x, SIZE_MAX / 2), -ENOMEM);
        assert_int_equal(x.n_slots, 256); /* unchanged on failure */
        assert_int_equal(name_index_put(&x, "a", 1), 0);
        name_index_clear(&x);
        assert_int_equal(name_index_count(&x), 0);
        assert_false(name_index_remove(&x, "a", 1));
        name_index_done(&x);
        name_index_done(NULL);
}

/* The hash is FNV-1a with a final mix: fixed, and different for near names. */
static void test_hash(void **state) {
        (void) state;
        assert_true(name_index_hash("node-1") == name_index_hash("node-1"));
        assert_true(name_index_hash("node-1") != name_index_hash("node-2"));
        assert_true(name_index_hash("") != name_index_hash("a"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_empty),
                cmocka_unit_test(test_put_find),
                cmocka_unit_test(test_remove_swap),
                cmocka_unit_test(test_same_name),
                cmocka_unit_test(test_hash_match_name_differs),
                cmocka_unit_test(test_collisions),
                cmocka_unit_test(test_growth_bounded),
                cmocka_unit_test(test_reserve),
                cmocka_unit_test(test_hash),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
