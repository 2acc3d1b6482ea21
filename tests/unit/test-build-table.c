/* test-build-table.c: build ids, the build limit and the shm budget, under threads too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/build-table.h"

static int freed;
static void payload_free(void *p) {
        freed++;
        free(p);
}

static void test_limits_and_texts(void **state) {
        _cleanup_(build_table_freep) BuildTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *a = NULL, *b = NULL;

        assert_int_equal(build_table_new(2, 4194304, 0xabcdef01, &t), 0);

        assert_int_equal(build_table_reserve(t, 3145728, &e), 0);
        assert_int_equal(build_table_commit(t, 3145728, malloc(1), payload_free, &a), 0);
        assert_string_equal(a->id, "bld-abcdef01-1");

        /* Budget: the exact text of docs/semantics.md. */
        assert_int_equal(build_table_reserve(t, 1048577, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "SHM_BUDGET");
        assert_string_equal(e.message,
                            "shm budget exceeded: build needs 1048577 bytes, 3145728 of 4194304 in use");
        family_error_done(&e);

        assert_int_equal(build_table_reserve(t, 1048576, &e), 0);
        assert_int_equal(build_table_commit(t, 1048576, malloc(1), payload_free, &b), 0);
        assert_int_equal(build_table_count(t), 2);
        assert_int_equal(build_table_bytes_in_use(t), 4194304);

        /* Count: limit reached, even for an empty build. */
        assert_int_equal(build_table_reserve(t, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "BUILD_LIMIT");
        assert_string_equal(e.message, "build limit reached: 2 builds");
        family_error_done(&e);

        /* Release: unknown id, then a real one returns its bytes; the payload lives while the
         * caller holds a reference. */
        assert_int_equal(build_table_remove(t, "bld-nope", &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_NOT_FOUND);
        assert_string_equal(e.message, "build 'bld-nope' not found");
        family_error_done(&e);

        freed = 0;
        assert_int_equal(build_table_remove(t, a->id, &e), 0);
        assert_int_equal(freed, 0);
        assert_int_equal(build_table_bytes_in_use(t), 1048576);
        BuildRecord *g = NULL;
        assert_int_equal(build_table_get(t, a->id, &g, &e), -EINVAL);
        family_error_done(&e);
        build_record_unref(a);
        assert_int_equal(freed, 1);

        /* A cancelled reservation gives everything back. */
        assert_int_equal(build_table_reserve(t, 100, &e), 0);
        build_table_cancel(t, 100);
        assert_int_equal(build_table_bytes_in_use(t), 1048576);

        BuildRecord **list = NULL;
        size_t n = 0;
        assert_int_equal(build_table_list(t, &list, &n), 0);
        assert_int_equal(n, 1);
        assert_ptr_equal(list[0], b);
        build_list_free(list, n);
        build_record_unref(b);
}

static BuildTable *shared;
static atomic_int committed;

static void *racer(void *arg) {
        for (int i = 0; i < 200; i++) {
                FamilyError e = FAMILY_ERROR_NULL;
                if (build_table_reserve(shared, 1000, &e) < 0) {
                        family_error_done(&e);
                        continue;
                }
                BuildRecord *r = NULL;
                assert_int_equal(build_table_commit(shared, 1000, NULL, NULL, &r), 0);
                atomic_fetch_add(&committed, 1);
                build_record_unref(r);
        }
        return NULL;
}

static void test_concurrent_reservations_never_overshoot(void **state) {
        pthread_t th[8];
        assert_int_equal(build_table_new(100000, 50000, 1, &shared), 0);
        for (int i = 0; i < 8; i++)
                assert_int_equal(pthread_create(&th[i], NULL, racer, NULL), 0);
        for (int i = 0; i < 8; i++)
                pthread_join(th[i], NULL);
        assert_int_equal(committed, 50);
        assert_int_equal(build_table_bytes_in_use(shared), 50000);
        shared = build_table_free(shared);
}

/* References, pins and grace: who holds a build, and which build a new one may push out. */
static void test_holders_pins_and_grace(void **state) {
        _cleanup_(build_table_freep) BuildTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *a = NULL, *b = NULL, *got = NULL;
        char id[BUILD_TABLE_ID_MAX];
        static const uint8_t key_a[] = "key-a", key_b[] = "key-b";

        assert_int_equal(build_table_new(8, 1 << 20, 0x1, &t), 0);
        assert_int_equal(build_table_reserve(t, 100, &e), 0);
        assert_int_equal(build_table_commit(t, 100, NULL, NULL, &a), 0);
        assert_int_equal(build_table_reserve(t, 100, &e), 0);
        assert_int_equal(build_table_commit(t, 100, NULL, NULL, &b), 0);
        build_table_init_holding(t, a, &(BuildRecordInit) { .referenced = true,
                                                              .key = (uint8_t *) strdup("key-a"),
                                                              .key_size = sizeof key_a });
        build_table_init_holding(t, b, &(BuildRecordInit) { .referenced = true });

        /* Found by its key only. */
        assert_int_equal(build_table_find_key(t, key_a, sizeof key_a, &got), 0);
        assert_ptr_equal(got, a);
        got = build_record_unref(got);
        assert_int_equal(build_table_find_key(t, key_b, sizeof key_b, &got), -ENOENT);

        /* Two processes hold a; the same pid with another start time is another process. */
        BuildHolder p1 = { .pid = 10, .uid = 1, .start_time = 100 };
        BuildHolder p2 = { .pid = 11, .uid = 1, .start_time = 100 };
        assert_int_equal(build_table_hold(t, a, &p1), 0);
        assert_int_equal(build_table_hold(t, a, &p1), 0); /* listed once, counted twice */
        assert_int_equal(build_table_hold(t, a, &p2), 0);
        assert_int_equal(build_table_unhold(t, a, 10, 100, 1000, 50, &e), 0);
        assert_true(build_table_process_holds(t, 10, 100));
        assert_int_equal(build_table_unhold(t, a, 10, 999, 1000, 50, &e), -EINVAL);
        assert_string_equal(e.reason, "NOT_HELD");
        assert_int_equal(e.status, FAMILY_STATUS_FAILED_PRECONDITION);
        family_error_done(&e);
        assert_int_equal(build_table_unhold(t, a, 10, 100, 1000, 50, &e), 0);
        assert_true(build_table_process_holds(t, 11, 100));
        /* The last one exits: grace starts. */
        assert_int_equal(build_table_drop_process(t, 11, 100, 2000, 50), 1);
        assert_int_equal(build_table_next_deadline(t), 2050);
        assert_int_equal(build_table_count_idle(t), 1);

        /* Only builds in grace may be taken by eviction or expiry, and expiry only when due. */
        assert_int_equal(build_table_take(t, b->id, BUILD_TAKE_IDLE, 0, &got, &e), -EBUSY);
        assert_int_equal(build_table_take(t, a->id, BUILD_TAKE_EXPIRED, 2049, &got, &e), -EBUSY);
        /* A pin stops the grace period; unpinned it starts again. */
        assert_int_equal(build_table_pin(t, a, true, 2010, 50), 0);
        assert_int_equal(build_table_count_idle(t), 0);
        assert_int_equal(build_table_oldest_idle(t, id), -ENOENT);
        assert_int_equal(build_table_pin(t, a, false, 2020, 50), 1);
        assert_int_equal(build_table_oldest_idle(t, id), 0);
        assert_string_equal(id, a->id);
        assert_int_equal(build_table_take(t, a->id, BUILD_TAKE_EXPIRED, 2070, &got, &e), 0);
        assert_ptr_equal(got, a);
        got = build_record_unref(got);
        /* Gone: a new holder cannot take it back. */
        assert_int_equal(build_table_hold(t, a, &p1), -ESTALE);
        build_record_unref(a);

        /* A build with no holder and no grace yet (restored) starts its grace on request. */
        assert_int_equal(build_table_start_grace(t, 3000, 0), 1);
        assert_int_equal(build_table_take(t, b->id, BUILD_TAKE_EXPIRED, 3000, &got, &e), 0);
        got = build_record_unref(got);
        build_record_unref(b);
        assert_int_equal(build_table_count(t), 0);
}

/* Per-uid limits: a charged uid is refused at its builds or bytes with its use in the sentence,
 * another uid and an exempt one are not; commit and cancel move the charge. */
static void test_uid_limits(void **state) {
        _cleanup_(build_table_freep) BuildTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        BuildCharge a = { .charged = true, .uid = 1001 }, b = { .charged = true, .uid = 1002 };
        BuildCharge admin = { .charged = true, .exempt = true, .uid = 1001 };
        BuildRecord *r1 = NULL, *r2 = NULL;
        BuildUidUse *use = NULL;
        size_t n = 0;

        assert_int_equal(build_table_new(16, 1000, 1, &t), 0);
        build_table_set_uid_limits(t, &(BuildUidLimits) { .builds = 2, .pins = 1, .bytes = 300 });
        assert_int_equal(build_table_reserve_for(t, &a, 200, &e), 0);
        assert_int_equal(build_table_commit_id_for(t, &a, "bld-00000001-1", 200, NULL, NULL, &r1),
                         0);
        assert_true(r1->charged);
        assert_int_equal(r1->charged_uid, 1001);
        /* Bytes: 200 held, 200 more would pass 300. */
        assert_int_equal(build_table_reserve_for(t, &a, 200, &e), -EINVAL);
        assert_string_equal(e.reason, "UID_SHM_BUDGET");
        assert_string_equal(e.message, "uid 1001 holds 200 of its 300 bytes of shards "
                                       "(--shm-budget-per-uid); the build needs 200 more");
        family_error_done(&e);
        /* A reservation in flight counts. */
        assert_int_equal(build_table_reserve_for(t, &a, 0, &e), 0);
        assert_int_equal(build_table_reserve_for(t, &a, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "UID_BUILD_LIMIT");
        assert_string_equal(e.message, "uid 1001 holds 2 of its 2 builds (--max-builds-per-uid); "
                                       "release one of them first");
        family_error_done(&e);
        /* Another uid, and the same uid as an admin, go on. */
        assert_int_equal(build_table_reserve_for(t, &b, 300, &e), 0);
        assert_int_equal(build_table_reserve_for(t, &admin, 400, &e), 0);
        assert_int_equal(build_table_uid_use(t, &use, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(use[0].uid, 1001);
        assert_int_equal(use[0].builds, 3);
        assert_int_equal(use[0].bytes, 600);
        assert_int_equal(use[1].uid, 1002);
        use = mfree(use);
        build_table_cancel_for(t, &admin, 400);
        build_table_cancel_for(t, &b, 300);
        build_table_cancel_for(t, &a, 0);
        /* Released: the uid builds again. */
        assert_int_equal(build_table_remove(t, r1->id, &e), 0);
        r1 = build_record_unref(r1);
        assert_int_equal(build_table_uid_use(t, &use, &n), 0);
        assert_int_equal(n, 0);
        assert_ptr_equal(use, NULL);
        assert_int_equal(build_table_reserve_for(t, &a, 300, &e), 0);
        assert_int_equal(build_table_commit_id_for(t, &a, "bld-00000001-2", 300, NULL, NULL, &r2),
                         0);
        build_record_unref(r2);
}

/* Pins: by the owner, a uid holding the build, or an admin; unpinned only by the uid that
 * pinned (an admin takes every pin); at most --max-pins-per-uid pins a uid. */
static void test_pin_rules(void **state) {
        _cleanup_(build_table_freep) BuildTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *x = NULL, *y = NULL;
        BuildPinner owner = { .uid = 1001 }, other = { .uid = 1002 }, holder = { .uid = 1003 };
        BuildPinner admin = { .uid = 0, .admin = true };
        BuildHolding h = {};

        assert_int_equal(build_table_new(16, 1000, 1, &t), 0);
        build_table_set_uid_limits(t, &(BuildUidLimits) { .builds = 8, .pins = 1 });
        assert_int_equal(build_table_reserve(t, 0, &e), 0);
        assert_int_equal(build_table_commit(t, 0, NULL, NULL, &x), 0);
        assert_int_equal(build_table_reserve(t, 0, &e), 0);
        assert_int_equal(build_table_commit(t, 0, NULL, NULL, &y), 0);
        build_table_init_holding(t, x, &(BuildRecordInit) { .referenced = true, .has_owner = true,
                                                             .owner_uid = 1001 });
        build_table_init_holding(t, y, &(BuildRecordInit) { .referenced = true, .has_owner = true,
                                                             .owner_uid = 1001 });
        assert_int_equal(build_table_hold(t, x, &(BuildHolder) { .pid = 5, .uid = 1003,
                                                                 .start_time = 1 }),
                         0);

        assert_int_equal(build_table_pin_as(t, x, &other, true, 0, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "PIN_NOT_ALLOWED");
        assert_int_equal(e.status, FAMILY_STATUS_PERMISSION_DENIED);
        family_error_done(&e);
        assert_int_equal(build_table_pin_as(t, x, &owner, true, 0, 0, &e), 0);
        assert_int_equal(build_table_pin_as(t, x, &owner, true, 0, 0, &e), 0); /* once */
        assert_int_equal(build_table_pin_as(t, x, &holder, true, 0, 0, &e), 0);
        /* The owner's second pin passes --max-pins-per-uid 1. */
        assert_int_equal(build_table_pin_as(t, y, &owner, true, 0, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "UID_PIN_LIMIT");
        assert_string_equal(e.message, "uid 1001 holds 1 of its 1 pins (--max-pins-per-uid); "
                                       "unpin one first");
        family_error_done(&e);
        /* Another uid cannot take either pin. */
        assert_int_equal(build_table_pin_as(t, x, &other, false, 0, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "UNPIN_NOT_ALLOWED");
        family_error_done(&e);
        /* The holder takes its own; the owner's stays. */
        assert_int_equal(build_table_pin_as(t, x, &holder, false, 0, 0, &e), 0);
        assert_int_equal(build_table_holding(t, x, &h), 0);
        assert_true(h.pinned);
        assert_int_equal(h.n_pinners, 1);
        build_holding_done(&h);
        /* An admin takes every pin; nothing pinned, an unpin changes nothing. */
        assert_int_equal(build_table_pin_as(t, x, &owner, true, 0, 0, &e), 0);
        assert_int_equal(build_table_pin_as(t, x, &admin, false, 0, 0, &e), 0);
        assert_int_equal(build_table_holding(t, x, &h), 0);
        assert_false(h.pinned);
        assert_int_equal(h.n_pinners, 0);
        build_holding_done(&h);
        assert_int_equal(build_table_pin_as(t, x, &other, false, 0, 0, &e), 0);
        build_record_unref(x);
        build_record_unref(y);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_limits_and_texts),
                cmocka_unit_test(test_concurrent_reservations_never_overshoot),
                cmocka_unit_test(test_holders_pins_and_grace),
                cmocka_unit_test(test_uid_limits),
                cmocka_unit_test(test_pin_rules),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
