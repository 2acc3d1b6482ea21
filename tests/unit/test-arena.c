/* test-arena.c: the per-call bump allocator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/arena.h"

static void test_inline_then_chunks(void **state) {
        Arena a;
        arena_init(&a);

        /* Small allocations come from the inline chunk: no heap chunk yet. */
        char *s = arena_strdup(&a, "hello");
        assert_string_equal(s, "hello");
        assert_null(a.chunks);
        assert_string_equal(arena_strdup(&a, NULL), "");

        /* Every allocation is zeroed and 16-byte aligned. */
        for (size_t i = 1; i < 200; i++) {
                unsigned char *p = arena_alloc(&a, i * 7);
                assert_non_null(p);
                assert_int_equal((uintptr_t) p % 16, 0);
                for (size_t j = 0; j < i * 7; j++)
                        assert_int_equal(p[j], 0);
                memset(p, 0xab, i * 7);
        }
        assert_non_null(a.chunks);
        /* The first string is untouched by later allocations. */
        assert_string_equal(s, "hello");

        /* One allocation larger than any chunk gets a chunk of its own. */
        unsigned char *big = arena_alloc(&a, 1u << 20);
        assert_non_null(big);
        big[(1u << 20) - 1] = 1;

        arena_done(&a);
        assert_null(a.chunks);
        assert_non_null(arena_alloc(&a, 8));
        arena_done(&a);
}

static void test_overflow_refused(void **state) {
        Arena a;
        arena_init(&a);
        assert_null(arena_alloc_array(&a, SIZE_MAX / 2, 4));
        assert_null(arena_alloc(&a, SIZE_MAX - 8));
        assert_non_null(arena_alloc_array(&a, 0, 8));
        arena_done(&a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_inline_then_chunks),
                cmocka_unit_test(test_overflow_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
