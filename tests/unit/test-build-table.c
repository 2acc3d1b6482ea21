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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_limits_and_texts),
                cmocka_unit_test(test_concurrent_reservations_never_overshoot),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
