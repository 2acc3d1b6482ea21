/* test-expr.c: shape expressions: parsing, canonical text, evaluation and its failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "core/expr.h"
#include "common/macro.h"
#include "core/resource-limits.h"

/* Parses text and checks its canonical form, and that the canonical form is a fixed point. */
static void check_canonical(const char *text, const char *want) {
        _cleanup_(expr_freep) Expr *e = NULL, *again = NULL;
        _cleanup_free_ char *s = NULL, *s2 = NULL, *msg = NULL;

        assert_int_equal(expr_parse(text, &e, &msg), 0);
        assert_null(msg);
        s = expr_to_string(e);
        assert_non_null(s);
        assert_string_equal(s, want);

        assert_int_equal(expr_parse(s, &again, NULL), 0);
        s2 = expr_to_string(again);
        assert_non_null(s2);
        assert_string_equal(s2, s);
}

static void check_syntax_error(const char *text, const char *want) {
        _cleanup_free_ char *msg = NULL;
        Expr *e = NULL;

        assert_int_equal(expr_parse(text, &e, &msg), -EINVAL);
        assert_null(e);
        assert_non_null(msg);
        if (want)
                assert_string_equal(msg, want);
}

typedef struct Field {
        const char *name;
        int64_t value;
        bool not_int;
} Field;

static const Field llama[] = {
        { "hidden_size", 4096 },
        { "num_attention_heads", 32 },
        { "num_key_value_heads", 8 },
        { "head_dim", 128 },
        { "moe_intermediate_size", 1408 },
        { "big", INT64_MAX },
        { "small", INT64_MIN },
        { "initializer_range", 0, true },
};

static int lookup(const char *name, int64_t *ret, void *userdata) {
        for (size_t i = 0; i < ELEMENTSOF(llama); i++)
                if (streq(llama[i].name, name)) {
                        if (llama[i].not_int)
                                return -EDOM;
                        *ret = llama[i].value;
                        return 0;
                }
        return -ENOENT;
}

static int64_t eval_ok(const char *text) {
        _cleanup_(expr_freep) Expr *e = NULL;
        ExprEvalError err = {};
        int64_t v = -424242;

        assert_int_equal(expr_parse(text, &e, NULL), 0);
        assert_int_equal(expr_eval(e, lookup, NULL, &v, &err), 0);
        assert_int_equal(err.failure, EXPR_FAILURE_NONE);
        return v;
}

/* ExprEvalError.field is borrowed from the Expr: keep a copy past its lifetime. */
static char failed_field[64];

static ExprEvalError eval_fail(const char *text) {
        _cleanup_(expr_freep) Expr *e = NULL;
        ExprEvalError err = {};
        int64_t v = -424242;

        assert_int_equal(expr_parse(text, &e, NULL), 0);
        assert_int_equal(expr_eval(e, lookup, NULL, &v, &err), -EINVAL);
        assert_int_equal(v, -424242); /* untouched on failure */
        assert_int_not_equal(err.failure, EXPR_FAILURE_NONE);
        snprintf(failed_field, sizeof failed_field, "%s", strempty(err.field));
        err.field = failed_field;
        return err;
}

static void test_canonical_text(void **state) {
        check_canonical("2*moe_intermediate_size", "2 * moe_intermediate_size");
        check_canonical("  4096 ", "4096");
        check_canonical("a+b*c", "a + b * c");
        check_canonical("(a+b)*c", "(a + b) * c");
        check_canonical("a*(b+c)", "a * (b + c)");
        check_canonical("((x))", "x");
        check_canonical("(a*b)+c", "a * b + c");
        check_canonical("a-(b-c)", "a - (b - c)");
        check_canonical("(a-b)-c", "a - b - c");
        check_canonical("a-(b+c)", "a - (b + c)");
        check_canonical("a/(b*c)", "a / (b * c)");
        check_canonical("a/b*c", "a / b * c");
        check_canonical("-(a+b)", "-(a + b)");
        check_canonical("-a*b", "-a * b");
        check_canonical("-(a*b)", "-(a * b)");
        check_canonical("2*-3", "2 * -3");
        check_canonical("- - x", "--x");
        check_canonical("\ta\t+\t_b9", "a + _b9");
        check_canonical("007", "7");
        check_canonical("9223372036854775807", "9223372036854775807");
}

static void test_precedence_and_associativity(void **state) {
        assert_int_equal(eval_ok("2 + 3 * 4"), 14);
        assert_int_equal(eval_ok("(2 + 3) * 4"), 20);
        assert_int_equal(eval_ok("10 - 4 - 3"), 3);
        assert_int_equal(eval_ok("10 - (4 - 3)"), 9);
        assert_int_equal(eval_ok("64 / 4 / 2"), 8);
        assert_int_equal(eval_ok("64 / (4 / 2)"), 32);
        assert_int_equal(eval_ok("12 / 4 * 3"), 9);
        assert_int_equal(eval_ok("-3 * -2"), 6);
        assert_int_equal(eval_ok("- -5"), 5);
        assert_int_equal(eval_ok("-2 + 5"), 3);
        assert_int_equal(eval_ok("-(2 + 5)"), -7);
        assert_int_equal(eval_ok("num_attention_heads * head_dim"), 4096);
        assert_int_equal(eval_ok("num_key_value_heads*head_dim"), 1024);
        assert_int_equal(eval_ok("2 * moe_intermediate_size"), 2816);
        assert_int_equal(eval_ok("hidden_size / num_attention_heads"), 128);
        assert_int_equal(eval_ok("-6 / 3"), -2);
        assert_int_equal(eval_ok("big"), INT64_MAX);
        assert_int_equal(eval_ok("-big - 1"), INT64_MIN);
        assert_int_equal(eval_ok("small / 1"), INT64_MIN);
        assert_int_equal(eval_ok("0 - 9223372036854775807 - 1"), INT64_MIN);

        /* ret may be NULL when only the check matters. */
        _cleanup_(expr_freep) Expr *e = NULL;
        assert_int_equal(expr_parse("1 + 1", &e, NULL), 0);
        assert_int_equal(expr_eval(e, NULL, NULL, NULL, NULL), 0);
}

static void test_overflow(void **state) {
        ExprEvalError err;

        err = eval_fail("9223372036854775807 + 1");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);
        assert_int_equal(err.lhs, INT64_MAX);
        assert_int_equal(err.rhs, 1);

        err = eval_fail("-9223372036854775807 - 2");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);

        err = eval_fail("4611686018427387904 * 2");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);

        err = eval_fail("big * big");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);

        err = eval_fail("-small");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);

        err = eval_fail("small / -1");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);

        err = eval_fail("small - 1");
        assert_int_equal(err.failure, EXPR_FAILURE_OVERFLOW);
}

static void test_division(void **state) {
        ExprEvalError err;

        err = eval_fail("4096 / 30");
        assert_int_equal(err.failure, EXPR_FAILURE_NOT_DIVISIBLE);
        assert_int_equal(err.lhs, 4096);
        assert_int_equal(err.rhs, 30);

        err = eval_fail("hidden_size / 3");
        assert_int_equal(err.failure, EXPR_FAILURE_NOT_DIVISIBLE);
        assert_int_equal(err.lhs, 4096);
        assert_int_equal(err.rhs, 3);

        err = eval_fail("-7 / 2");
        assert_int_equal(err.failure, EXPR_FAILURE_NOT_DIVISIBLE);

        err = eval_fail("1 / 0");
        assert_int_equal(err.failure, EXPR_FAILURE_DIVISION_BY_ZERO);

        err = eval_fail("hidden_size / (head_dim - 128)");
        assert_int_equal(err.failure, EXPR_FAILURE_DIVISION_BY_ZERO);

        assert_int_equal(eval_ok("0 / 5"), 0);
}

static void test_fields(void **state) {
        ExprEvalError err;

        err = eval_fail("num_attention_heads * nope");
        assert_int_equal(err.failure, EXPR_FAILURE_MISSING_FIELD);
        assert_string_equal(err.field, "nope");

        err = eval_fail("initializer_range * 2");
        assert_int_equal(err.failure, EXPR_FAILURE_NOT_INT);
        assert_string_equal(err.field, "initializer_range");

        /* Left operand first: the first failure in reading order is the answer. */
        err = eval_fail("first + second");
        assert_string_equal(err.field, "first");

        /* No lookup at all: every field is missing. */
        _cleanup_(expr_freep) Expr *e = NULL;
        assert_int_equal(expr_parse("x", &e, NULL), 0);
        assert_int_equal(expr_eval(e, NULL, NULL, NULL, &err), -EINVAL);
        assert_int_equal(err.failure, EXPR_FAILURE_MISSING_FIELD);

        const char *name = NULL;
        assert_true(expr_is_field(e, &name));
        assert_string_equal(name, "x");

        _cleanup_(expr_freep) Expr *g = NULL;
        assert_int_equal(expr_parse("(x)", &g, NULL), 0);
        assert_true(expr_is_field(g, NULL));
        _cleanup_(expr_freep) Expr *h = NULL;
        assert_int_equal(expr_parse("x * 1", &h, NULL), 0);
        assert_false(expr_is_field(h, NULL));
        _cleanup_(expr_freep) Expr *k = NULL;
        assert_int_equal(expr_parse("4", &k, NULL), 0);
        assert_false(expr_is_field(k, NULL));
}

typedef struct Collected {
        char names[8][32];
        size_t n;
        size_t stop_after;
} Collected;

static int collect(const char *name, void *userdata) {
        Collected *c = userdata;

        if (c->stop_after && c->n >= c->stop_after)
                return -ECANCELED;
        snprintf(c->names[c->n++], sizeof c->names[0], "%s", name);
        return 0;
}

static void test_foreach_field(void **state) {
        _cleanup_(expr_freep) Expr *e = NULL, *k = NULL;
        Collected c = {};

        assert_int_equal(expr_parse("a * b + a / (c - b) + 3", &e, NULL), 0);
        assert_int_equal(expr_foreach_field(e, collect, &c), 0);
        assert_int_equal(c.n, 3);
        assert_string_equal(c.names[0], "a");
        assert_string_equal(c.names[1], "b");
        assert_string_equal(c.names[2], "c");

        c = (Collected) { .stop_after = 1 };
        assert_int_equal(expr_foreach_field(e, collect, &c), -ECANCELED);
        assert_int_equal(c.n, 1);

        c = (Collected) {};
        assert_int_equal(expr_parse("-4", &k, NULL), 0);
        assert_int_equal(expr_foreach_field(k, collect, &c), 0);
        assert_int_equal(c.n, 0);
}

static void test_syntax_errors(void **state) {
        char buf[FAMILYD_MAX_EXPR_LENGTH + 64];

        check_syntax_error("", "empty expression");
        check_syntax_error("   ", "empty expression");
        check_syntax_error("a)", "unexpected ')' at column 2");
        check_syntax_error("(a", "unclosed '(' at column 1");
        check_syntax_error("a +", "unexpected end of expression");
        check_syntax_error("a b", "unexpected 'b' at column 3");
        check_syntax_error("a ** b", "unexpected '*' at column 4");
        check_syntax_error("2a", "unexpected 'a' at column 2");
        check_syntax_error("1.5", "unexpected '.' at column 2");
        check_syntax_error("()", "unexpected ')' at column 2");
        check_syntax_error("a % b", "unexpected '%' at column 3");
        check_syntax_error("a\n+ b", "unexpected \\x0a at column 2");
        check_syntax_error("\xc3\xa9", "unexpected \\xc3 at column 1");
        check_syntax_error("9223372036854775808", "integer out of range at column 1");
        check_syntax_error("1 + 99999999999999999999999", "integer out of range at column 5");
        check_syntax_error("+1", "unexpected '+' at column 1");

        /* Length: exactly the limit of significant characters parses, one more does not. */
        memset(buf, '1', FAMILYD_MAX_EXPR_LENGTH);
        buf[FAMILYD_MAX_EXPR_LENGTH] = 0;
        check_syntax_error(buf, "integer out of range at column 1"); /* parsed, then refused */
        for (size_t i = 0; i < FAMILYD_MAX_EXPR_LENGTH; i++)
                buf[i] = i % 2 ? '+' : '1';
        buf[FAMILYD_MAX_EXPR_LENGTH - 2] = '1';
        buf[FAMILYD_MAX_EXPR_LENGTH - 1] = '1'; /* "1+1+...+11" */
        _cleanup_(expr_freep) Expr *e = NULL;
        assert_int_equal(expr_parse(buf, &e, NULL), 0);
        buf[FAMILYD_MAX_EXPR_LENGTH] = 'y';
        buf[FAMILYD_MAX_EXPR_LENGTH + 1] = 0;
        check_syntax_error(buf, "expression longer than 1024 characters");

        /* Blanks do not count, within reason. */
        _cleanup_free_ char *blank = malloc(4 * FAMILYD_MAX_EXPR_LENGTH + 2);
        assert_non_null(blank);
        memset(blank, ' ', 4 * FAMILYD_MAX_EXPR_LENGTH);
        blank[0] = 'x';
        blank[4 * FAMILYD_MAX_EXPR_LENGTH] = 0;
        _cleanup_(expr_freep) Expr *b = NULL;
        assert_int_equal(expr_parse(blank, &b, NULL), 0);
        blank[4 * FAMILYD_MAX_EXPR_LENGTH] = ' ';
        blank[4 * FAMILYD_MAX_EXPR_LENGTH + 1] = 0;
        check_syntax_error(blank, "expression longer than 1024 characters");

        /* Nesting: parentheses and unary minus both count. */
        size_t n = 0;
        for (unsigned i = 0; i < FAMILYD_MAX_EXPR_DEPTH; i++)
                buf[n++] = '(';
        buf[n++] = 'x';
        for (unsigned i = 0; i < FAMILYD_MAX_EXPR_DEPTH; i++)
                buf[n++] = ')';
        buf[n] = 0;
        _cleanup_(expr_freep) Expr *deep = NULL;
        assert_int_equal(expr_parse(buf, &deep, NULL), 0);

        n = 0;
        for (unsigned i = 0; i <= FAMILYD_MAX_EXPR_DEPTH; i++)
                buf[n++] = '(';
        buf[n++] = 'x';
        buf[n] = 0;
        check_syntax_error(buf, "expression nested too deeply (more than 64 levels)");

        n = 0;
        for (unsigned i = 0; i <= FAMILYD_MAX_EXPR_DEPTH; i++)
                buf[n++] = '-';
        buf[n++] = '1';
        buf[n] = 0;
        check_syntax_error(buf, "expression nested too deeply (more than 64 levels)");

        /* A message is optional. */
        Expr *none = NULL;
        assert_int_equal(expr_parse("(", &none, NULL), -EINVAL);
        assert_null(none);
}

static void test_long_chain(void **state) {
        /* A long flat chain is not nesting: 1 + 1 + ... within the length limit parses, and its
         * evaluation, printing and freeing recurse over a deep left spine without trouble. */
        char buf[FAMILYD_MAX_EXPR_LENGTH + 1];
        size_t n = 0;

        buf[n++] = '1';
        while (n + 2 <= FAMILYD_MAX_EXPR_LENGTH) {
                buf[n++] = '+';
                buf[n++] = '1';
        }
        buf[n] = 0;

        _cleanup_(expr_freep) Expr *e = NULL;
        assert_int_equal(expr_parse(buf, &e, NULL), 0);
        assert_int_equal(eval_ok(buf), (int64_t) (n + 1) / 2);
        /* Its canonical text is twice as long, and still accepted: blanks do not count. */
        _cleanup_free_ char *s = expr_to_string(e);
        assert_non_null(s);
        assert_true(strlen(s) > FAMILYD_MAX_EXPR_LENGTH);
        _cleanup_(expr_freep) Expr *again = NULL;
        assert_int_equal(expr_parse(s, &again, NULL), 0);
}

/* Conditions: the job's facts as fields. */
static int job_lookup(const char *name, int64_t *ret, void *userdata) {
        static const Field job[] = {
                { "tp_size", 2 }, { "cp_size", 1 }, { "ep_size", 4 }, { "pp_size", 1 },
                { "sequence_parallel", 1 }, { "loss_parallel", 0 },
        };

        for (size_t i = 0; i < ELEMENTSOF(job); i++)
                if (streq(job[i].name, name)) {
                        *ret = job[i].value;
                        return 0;
                }
        return -ENOENT;
}

static int64_t cond_ok(const char *text, const char *canonical) {
        _cleanup_(expr_freep) Expr *e = NULL, *again = NULL;
        _cleanup_free_ char *s = NULL, *s2 = NULL, *msg = NULL;
        ExprEvalError err = {};
        int64_t v = -424242, v2 = -424242;

        assert_int_equal(expr_parse_condition(text, &e, &msg), 0);
        assert_null(msg);
        s = expr_to_string(e);
        assert_non_null(s);
        assert_string_equal(s, canonical);
        assert_int_equal(expr_eval(e, job_lookup, NULL, &v, &err), 0);
        /* the canonical text is a fixed point with the same value */
        assert_int_equal(expr_parse_condition(s, &again, NULL), 0);
        s2 = expr_to_string(again);
        assert_string_equal(s2, s);
        assert_int_equal(expr_eval(again, job_lookup, NULL, &v2, &err), 0);
        assert_int_equal(v, v2);
        return v;
}

static void check_condition_error(const char *text, const char *want) {
        _cleanup_free_ char *msg = NULL;
        Expr *e = NULL;

        assert_int_equal(expr_parse_condition(text, &e, &msg), -EINVAL);
        assert_null(e);
        assert_non_null(msg);
        assert_string_equal(msg, want);
}

static void test_conditions(void **state) {
        assert_int_equal(cond_ok("sequence_parallel", "sequence_parallel"), 1);
        assert_int_equal(cond_ok("ep_size>1", "ep_size > 1"), 1);
        assert_int_equal(cond_ok("ep_size == 1", "ep_size == 1"), 0);
        assert_int_equal(cond_ok("tp_size != 2", "tp_size != 2"), 0);
        assert_int_equal(cond_ok("tp_size <= 2", "tp_size <= 2"), 1);
        assert_int_equal(cond_ok("tp_size < 2", "tp_size < 2"), 0);
        assert_int_equal(cond_ok("ep_size >= tp_size * 2", "ep_size >= tp_size * 2"), 1);
        assert_int_equal(cond_ok("not loss_parallel", "not loss_parallel"), 1);
        assert_int_equal(cond_ok("not not ep_size", "not not ep_size"), 1);
        /* or binds less tightly than and, and than not, and than a comparison */
        assert_int_equal(cond_ok("loss_parallel and tp_size > 1 or sequence_parallel",
                                 "loss_parallel and tp_size > 1 or sequence_parallel"), 1);
        assert_int_equal(cond_ok("loss_parallel and (tp_size > 1 or sequence_parallel)",
                                 "loss_parallel and (tp_size > 1 or sequence_parallel)"), 0);
        assert_int_equal(cond_ok("not (loss_parallel or cp_size > 1)", "not (loss_parallel or cp_size > 1)"), 1);
        assert_int_equal(cond_ok("(ep_size > 1) + (tp_size > 1)", "(ep_size > 1) + (tp_size > 1)"), 2);
        assert_int_equal(cond_ok("((tp_size))", "tp_size"), 2);
        /* a comparison's operands are sums; comparisons nest only in parentheses */
        assert_int_equal(cond_ok("(tp_size == 2) == 1", "(tp_size == 2) == 1"), 1);
        /* and/or decide without their right operand: no division by zero */
        assert_int_equal(cond_ok("loss_parallel and 1 / 0", "loss_parallel and 1 / 0"), 0);
        assert_int_equal(cond_ok("sequence_parallel or 1 / 0", "sequence_parallel or 1 / 0"), 1);
        {
                _cleanup_(expr_freep) Expr *e = NULL;
                ExprEvalError err = {};
                int64_t v;

                assert_int_equal(expr_parse_condition("sequence_parallel and 1 / 0", &e, NULL), 0);
                assert_int_equal(expr_eval(e, job_lookup, NULL, &v, &err), -EINVAL);
                assert_int_equal(err.failure, EXPR_FAILURE_DIVISION_BY_ZERO);
        }

        check_condition_error("tp_size < 2 < 3", "unexpected '<' at column 13");
        check_condition_error("and", "unexpected 'a' at column 1");
        check_condition_error("tp_size and", "unexpected end of expression");
        check_condition_error("not", "unexpected end of expression");
        check_condition_error("tp_size = 2", "unexpected '=' at column 9");
        check_condition_error("tp_size andx", "unexpected 'a' at column 9");
        check_condition_error("(tp_size or", "unexpected end of expression");
        /* shapes keep their grammar: no comparisons, and, or, not there */
        check_syntax_error("a > 1", "unexpected '>' at column 3");
        check_syntax_error("a and b", "unexpected 'a' at column 3");
        _cleanup_(expr_freep) Expr *field = NULL;
        assert_int_equal(expr_parse("not", &field, NULL), 0); /* a field named not */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_canonical_text),
                cmocka_unit_test(test_precedence_and_associativity),
                cmocka_unit_test(test_overflow),
                cmocka_unit_test(test_division),
                cmocka_unit_test(test_fields),
                cmocka_unit_test(test_foreach_field),
                cmocka_unit_test(test_syntax_errors),
                cmocka_unit_test(test_long_chain),
                cmocka_unit_test(test_conditions),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
