/* expr.h: shape expressions (integers, field names, + - * /, unary -, parentheses) and conditions. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

typedef struct Expr Expr;

/*
 * Parses text (usual precedence, left associative). On a syntax error returns -EINVAL and, if
 * ret_message is not NULL, a newly allocated description ("unexpected ')' at column 7").
 * Integers out of int64 range are syntax errors. Nesting and length are bounded (resource-limits.h).
 */
int expr_parse(const char *text, Expr **ret, char **ret_message);
/*
 * Parses a condition: an expression as expr_parse() takes, or such expressions compared (==, !=,
 * <, <=, >, >=; not chained), combined with not, and, or (in rising strength: or, and, not,
 * comparison), parentheses around any of them. Its value is an int: a comparison, not, and, or
 * give 1 or 0; and/or evaluate their right operand only when it decides. In a condition the
 * words not, and, or are never field names.
 */
int expr_parse_condition(const char *text, Expr **ret, char **ret_message);
Expr *expr_free(Expr *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(Expr *, expr_free);

/* The canonical text of e (as parsed; spacing normalised: "2 * moe_intermediate_size"). */
char *expr_to_string(const Expr *e);

/* True when e is a lone field name; *ret_name (borrowed) set then. */
bool expr_is_field(const Expr *e, const char **ret_name);

/* Calls f for each distinct field name in e, in first-appearance order; stops at f's first < 0. */
int expr_foreach_field(const Expr *e, int (*f)(const char *name, void *userdata), void *userdata);

typedef enum ExprFailure {
        EXPR_FAILURE_NONE,
        EXPR_FAILURE_MISSING_FIELD, /* field: the name */
        EXPR_FAILURE_NOT_INT,       /* field: the name */
        EXPR_FAILURE_NOT_DIVISIBLE, /* lhs / rhs does not divide exactly */
        EXPR_FAILURE_DIVISION_BY_ZERO,
        EXPR_FAILURE_OVERFLOW,
        _EXPR_FAILURE_MAX,
        _EXPR_FAILURE_INVALID = -EINVAL,
} ExprFailure;

typedef struct ExprEvalError {
        ExprFailure failure;
        const char *field; /* borrowed from the Expr */
        int64_t lhs, rhs;
} ExprEvalError;

/*
 * Looks up a field: 0 and *ret_value, -ENOENT when absent, -EDOM when present but not an int.
 */
typedef int (*ExprLookup)(const char *name, int64_t *ret_value, void *userdata);

/* Evaluates with 64-bit signed arithmetic; on failure returns -EINVAL and fills *ret_error. */
int expr_eval(const Expr *e, ExprLookup lookup, void *userdata, int64_t *ret,
              ExprEvalError *ret_error);
