/* test-init-expr.c: an init's float expressions: parsing, canonical text, evaluation, failures. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "common/macro.h"
#include "core/init-expr.h"
#include "core/resource-limits.h"

/* Canonical text, and the canonical text is a fixed point. */
static void check_canonical(const char *text, const char *want) {
        _cleanup_(init_expr_freep) InitExpr *e = NULL, *again = NULL;
        _cleanup_free_ char *s = NULL, *s2 = NULL, *msg = NULL;

        assert_int_equal(init_expr_parse(text, &e, &msg), 0);
        assert_null(msg);
        s = init_expr_to_string(e);
        assert_non_null(s);
        if (!streq(s, want))
                print_message("%s: got '%s', want '%s'\n", text, s, want);
        assert_string_equal(s, want);
        assert_int_equal(init_expr_parse(s, &again, NULL), 0);
        s2 = init_expr_to_string(again);
        assert_string_equal(s2, s);
}

static void check_syntax_error(const char *text, const char *want) {
        _cleanup_(init_expr_freep) InitExpr *e = NULL;
        _cleanup_free_ char *msg = NULL;

        assert_int_equal(init_expr_parse(text, &e, &msg), -EINVAL);
        assert_null(e);
        assert_non_null(msg);
        if (!streq(msg, want))
                print_message("%s: got '%s', want '%s'\n", text, msg, want);
        assert_string_equal(msg, want);
}

static void test_canonical(void **state) {
        check_canonical("initializer_range/sqrt(2*num_layers)", "initializer_range / sqrt(2 * num_layers)");
        check_canonical("1 / sqrt( fan_in )", "1 / sqrt(fan_in)");
        check_canonical("(a + b) * c", "(a + b) * c");
        check_canonical("a + (b * c)", "a + b * c");
        check_canonical("a - (b - c)", "a - (b - c)");
        check_canonical("a + (b + c)", "a + (b + c)");
        check_canonical("(a - b) - c", "a - b - c");
        check_canonical("a / (b / c)", "a / (b / c)");
        check_canonical("-(a * b)", "-(a * b)");
        check_canonical("--a", "--a");
        check_canonical("-a * b", "-a * b");
        check_canonical("0.02", "0.02");
        check_canonical("2e-3", "0.002");
        check_canonical("1E10", "10000000000");
        check_canonical(".5", "0.5");
        check_canonical("1e-7", "1e-07");
        check_canonical("0.1 + 0.2", "0.1 + 0.2");
}

static void test_syntax_errors(void **state) {
        check_syntax_error("", "unexpected end of expression at column 1");
        check_syntax_error("a +", "unexpected end of expression at column 4");
        check_syntax_error("a b", "unexpected 'b' at column 3");
        check_syntax_error("(a", "unclosed '(' at column 1");
        check_syntax_error("sqrt(a", "unclosed '(' at column 5");
        check_syntax_error("a)", "unexpected ')' at column 2");
        check_syntax_error("exp(a)", "unknown function 'exp' at column 1 (only sqrt)");
        check_syntax_error("sqrt + 1", "sqrt at column 1 needs an argument in parentheses");
        check_syntax_error("1e", "malformed exponent at column 1");
        check_syntax_error("1e999", "number at column 1 is out of range");
        check_syntax_error("a ^ 2", "unexpected '^' at column 3");
        check_syntax_error("a\x01", "unexpected byte 0x01 at column 2");
        check_syntax_error(".", "unexpected '.' at column 1");

        /* Nesting and length bounds. */
        char deep[2 * FAMILYD_MAX_EXPR_DEPTH + 8] = "";
        for (unsigned i = 0; i < FAMILYD_MAX_EXPR_DEPTH + 1; i++)
                strcat(deep, "(");
        strcat(deep, "1");
        for (unsigned i = 0; i < FAMILYD_MAX_EXPR_DEPTH + 1; i++)
                strcat(deep, ")");
        _cleanup_free_ char *msg = NULL;
        InitExpr *e = NULL;
        assert_int_equal(init_expr_parse(deep, &e, &msg), -EINVAL);
        assert_non_null(strstr(msg, "nests deeper than"));

        char *longer = malloc(FAMILYD_MAX_EXPR_LENGTH + 2);
        assert_non_null(longer);
        memset(longer, '1', FAMILYD_MAX_EXPR_LENGTH + 1);
        longer[FAMILYD_MAX_EXPR_LENGTH + 1] = 0;
        free(msg);
        msg = NULL;
        assert_int_equal(init_expr_parse(longer, &e, &msg), -EINVAL);
        assert_non_null(strstr(msg, "longer than"));
        free(longer);
}

static int lookup(const char *name, double *ret, void *userdata) {
        if (streq(name, "initializer_range")) {
                *ret = 0.02;
                return 0;
        }
        if (streq(name, "num_layers")) {
                *ret = 12;
                return 0;
        }
        if (streq(name, "zero")) {
                *ret = 0;
                return 0;
        }
        if (streq(name, "name"))
                return -EDOM;
        return -ENOENT;
}

static double eval_ok(const char *text, const int64_t *shape, size_t n_dims) {
        _cleanup_(init_expr_freep) InitExpr *e = NULL;
        InitExprEnv env = { .lookup = lookup, .shape = shape, .n_dims = n_dims };
        InitExprError err;
        double v;

        assert_int_equal(init_expr_parse(text, &e, NULL), 0);
        assert_int_equal(init_expr_eval(e, &env, &v, &err), 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_NONE);
        return v;
}

static InitExprError eval_fail(const char *text, const int64_t *shape, size_t n_dims) {
        static InitExpr *e = NULL;
        InitExprEnv env = { .lookup = lookup, .shape = shape, .n_dims = n_dims };
        InitExprError err;
        double v;

        e = init_expr_free(e);
        assert_int_equal(init_expr_parse(text, &e, NULL), 0);
        assert_int_equal(init_expr_eval(e, &env, &v, &err), -EINVAL);
        return err; /* err.field points into e, kept until the next call */
}

static void test_eval(void **state) {
        const int64_t linear[2] = { 64, 32 }, conv[4] = { 16, 8, 3, 5 }, vec[1] = { 7 };

        /* Every step an IEEE double operation, as C computes it. */
        assert_true(eval_ok("initializer_range / sqrt(2 * num_layers)", NULL, 0) == 0.02 / sqrt(2.0 * 12));
        assert_true(eval_ok("0.1 + 0.2", NULL, 0) == 0.1 + 0.2);
        assert_true(eval_ok("-2 * -3 - 1", NULL, 0) == 5);
        assert_true(eval_ok("1 - 2 - 3", NULL, 0) == -4);
        assert_true(eval_ok("8 / 4 / 2", NULL, 0) == 1);
        /* torch.nn.init._calculate_fan_in_and_fan_out: in = dim 1 x receptive, out = dim 0 x receptive */
        assert_true(eval_ok("fan_in", linear, 2) == 32);
        assert_true(eval_ok("fan_out", linear, 2) == 64);
        assert_true(eval_ok("fan_in", conv, 4) == 8 * 15);
        assert_true(eval_ok("fan_out", conv, 4) == 16 * 15);
        assert_true(eval_ok("1 / sqrt(fan_in)", linear, 2) == 1 / sqrt(32.0));

        InitExprError err = eval_fail("fan_in", vec, 1);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_FAN_RANK);
        assert_string_equal(err.field, "fan_in");
        err = eval_fail("2 * fan_out", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_FAN_RANK);
        assert_string_equal(err.field, "fan_out");
        err = eval_fail("hidden / 2", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_MISSING_FIELD);
        assert_string_equal(err.field, "hidden");
        err = eval_fail("name", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_NOT_NUMBER);
        assert_string_equal(err.field, "name");
        err = eval_fail("1 / zero", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_NOT_FINITE);
        err = eval_fail("sqrt(zero - 2)", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_SQRT_NEGATIVE);
        assert_true(err.value == -2);
        err = eval_fail("1e300 * 1e300", NULL, 0);
        assert_int_equal(err.failure, INIT_EXPR_FAILURE_NOT_FINITE);
        (void) init_expr_free(NULL);
}

static int collect(const char *name, void *userdata) {
        char *buf = userdata;
        strcat(buf, name);
        strcat(buf, ",");
        return 0;
}

static void test_fields(void **state) {
        _cleanup_(init_expr_freep) InitExpr *e = NULL;
        char buf[128] = "";

        assert_int_equal(init_expr_parse("a * sqrt(b + a) / fan_in - c * b", &e, NULL), 0);
        assert_int_equal(init_expr_foreach_field(e, collect, buf), 0);
        assert_string_equal(buf, "a,b,c,");
        assert_true(init_expr_uses_fan(e));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_canonical),
                cmocka_unit_test(test_syntax_errors),
                cmocka_unit_test(test_eval),
                cmocka_unit_test(test_fields),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
