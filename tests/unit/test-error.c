/* test-error.c: FamilyError filling and the cut of over-long status messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "core/error.h"

static void test_set_and_done(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        assert_int_equal(family_error_set(&e, FAMILY_STATUS_NOT_FOUND, "X", "field", "a %d", 1),
                         -EINVAL);
        assert_string_equal(e.message, "a 1");
        assert_string_equal(e.field, "field");
        assert_int_equal(e.status, FAMILY_STATUS_NOT_FOUND);
        family_error_done(&e);
        assert_null(e.message);
        assert_string_equal(family_status_to_string(FAMILY_STATUS_RESOURCE_EXHAUSTED),
                            "RESOURCE_EXHAUSTED");
        assert_int_equal(family_status_from_string("UNIMPLEMENTED"), FAMILY_STATUS_UNIMPLEMENTED);
        assert_int_equal(family_status_from_string("nope"), _FAMILY_STATUS_INVALID);
}

static void test_short_message_untouched(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        (void) family_error_set(&e, FAMILY_STATUS_INVALID_ARGUMENT, "X", NULL, "short");
        assert_int_equal(family_error_truncate(&e, 2048), 0);
        assert_string_equal(e.message, "short");
        family_error_done(&e);
}

static void test_cut_at_a_line(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        char text[20000] = "registry reload failed: ";
        for (int i = 0; i < 300; i++)
                snprintf(text + strlen(text), sizeof text - strlen(text),
                         "f.yaml:%d:1: unknown key 'k%d'\n", i + 1, i);
        text[strlen(text) - 1] = 0;
        (void) family_error_set(&e, FAMILY_STATUS_FAILED_PRECONDITION, "X", NULL, "%s", text);

        assert_int_equal(family_error_truncate(&e, 2048), 0);
        assert_true(strlen(e.message) <= 2048);
        assert_true(strncmp(e.message, "registry reload failed: f.yaml:1:1:", 35) == 0);
        const char *tail = strrchr(e.message, '\n');
        assert_non_null(tail);
        int more = 0;
        assert_int_equal(sscanf(tail, "\n... (%d more lines)", &more), 1);
        /* The kept lines and the counted ones add up to all 300. */
        int kept = 0;
        for (const char *p = e.message; p < tail; p++)
                kept += *p == '\n';
        assert_int_equal(kept + 1 + more, 300);
        family_error_done(&e);
}

static void test_cut_inside_one_line_keeps_utf8_whole(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        char text[8192] = "";
        for (int i = 0; i < 2000; i++)
                strcat(text, "\xc3\xa9"); /* é */
        (void) family_error_set(&e, FAMILY_STATUS_NOT_FOUND, "X", NULL, "%s", text);
        assert_int_equal(family_error_truncate(&e, 1024), 0);
        size_t n = strlen(e.message);
        assert_true(n <= 1024);
        assert_string_equal(e.message + n - 3, "...");
        /* Only whole two-byte sequences before the dots. */
        assert_int_equal((n - 3) % 2, 0);
        family_error_done(&e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_set_and_done),
                cmocka_unit_test(test_short_message_untouched),
                cmocka_unit_test(test_cut_at_a_line),
                cmocka_unit_test(test_cut_inside_one_line_keeps_utf8_whole),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
