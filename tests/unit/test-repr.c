/* test-repr.c: Python-repr formatting used by error texts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/repr.h"
#include "common/macro.h"
#include "core/value.h"

static void check(char *got, const char *want) {
        assert_non_null(got);
        assert_string_equal(got, want);
        free(got);
}

static void test_string_quoting(void **state) {
        check(repr_string("x"), "'x'");
        check(repr_string("it's"), "\"it's\"");
        check(repr_string("a'b\"c"), "'a\\'b\"c'");
        check(repr_string("back\\slash"), "'back\\\\slash'");
        check(repr_string("nl\n"), "'nl\\n'");
}

static void test_sequences(void **state) {
        char *two[] = { "dp", "tp" };
        check(repr_string_tuple(two, 2), "('dp', 'tp')");
        check(repr_string_tuple(two, 1), "('dp',)");
        check(repr_string_tuple(NULL, 0), "()");
        check(repr_string_list(two, 2), "['dp', 'tp']");
        check(repr_string_list(NULL, 0), "[]");
        int64_t ints[] = { 1, 2 };
        check(repr_int_list(ints, 2), "[1, 2]");
}

static void test_value_types(void **state) {
        Value i = { .kind = VALUE_INT, .i = 1 }, b = { .kind = VALUE_BOOL, .b = true };
        Value f = { .kind = VALUE_FLOAT, .f = 1.5 }, none = { .kind = VALUE_NONE };
        assert_true(value_matches_type(&i, FIELD_TYPE_INT));
        assert_true(value_matches_type(&i, FIELD_TYPE_FLOAT));
        assert_false(value_matches_type(&i, FIELD_TYPE_BOOL));
        assert_false(value_matches_type(&b, FIELD_TYPE_INT));
        assert_false(value_matches_type(&f, FIELD_TYPE_INT));
        for (FieldType t = 0; t < _FIELD_TYPE_MAX; t++)
                assert_false(value_matches_type(&none, t));
}

static void test_value_map_last_wins(void **state) {
        _cleanup_(value_map_done) ValueMap m = {};
        Value v = { .kind = VALUE_INT, .i = 1 };
        assert_int_equal(value_map_put(&m, "k", &v), 0);
        v = (Value) { .kind = VALUE_STRING, .s = strdup("x") };
        assert_int_equal(value_map_put(&m, "k", &v), 0);
        assert_int_equal(m.n, 1);
        assert_int_equal(value_map_get(&m, "k")->kind, VALUE_STRING);
        v = (Value) { .kind = VALUE_BOOL, .b = true };
        assert_int_equal(value_map_put(&m, "a", &v), 0);
        value_map_sort(&m);
        assert_string_equal(m.items[0].name, "a");

        _cleanup_(value_map_done) ValueMap copy = {};
        assert_int_equal(value_map_copy(&m, &copy), 0);
        assert_true(value_equal(value_map_get(&copy, "k"), value_map_get(&m, "k")));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_string_quoting),
                cmocka_unit_test(test_sequences),
                cmocka_unit_test(test_value_types),
                cmocka_unit_test(test_value_map_last_wins),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
