/* init-expr.h: an init's numbers as float expressions (docs/registry.md, "init"). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

/*
 * Numbers (ints and decimal floats, e.g. 0.02, 1e-5), config field names, fan_in and fan_out,
 * + - * / (usual precedence, left associative), unary -, parentheses and sqrt(x). Evaluated in
 * IEEE double precision, every operation correctly rounded, so the result never depends on the
 * machine.
 */
typedef struct InitExpr InitExpr;

/* Parses text. A syntax error: -EINVAL and, when ret_message is not NULL, a newly allocated
 * description ("unexpected ')' at column 7"). Length and nesting are bounded
 * (resource-limits.h). */
int init_expr_parse(const char *text, InitExpr **ret, char **ret_message);
InitExpr *init_expr_free(InitExpr *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(InitExpr *, init_expr_free);

/* The canonical text: single spaces around binary operators, only the parentheses the tree
 * needs ("initializer_range / sqrt(2 * num_layers)"), numbers as the shortest text that reads
 * back as the same double. */
char *init_expr_to_string(const InitExpr *e);

/* Calls f for each distinct config field name in e, first appearance first (not fan_in or
 * fan_out); stops at f's first < 0 and returns it. */
int init_expr_foreach_field(const InitExpr *e, int (*f)(const char *name, void *userdata), void *userdata);

/* True when e uses fan_in or fan_out. */
bool init_expr_uses_fan(const InitExpr *e);

typedef enum InitExprFailure {
        INIT_EXPR_FAILURE_NONE,
        INIT_EXPR_FAILURE_MISSING_FIELD, /* field: the name */
        INIT_EXPR_FAILURE_NOT_NUMBER,    /* field: the name */
        INIT_EXPR_FAILURE_FAN_RANK,      /* fan_in/fan_out of a parameter with < 2 dimensions */
        INIT_EXPR_FAILURE_NOT_FINITE,    /* a step's result is not finite (division by zero...) */
        INIT_EXPR_FAILURE_SQRT_NEGATIVE, /* sqrt of a negative number; value: it */
        _INIT_EXPR_FAILURE_MAX,
        _INIT_EXPR_FAILURE_INVALID = -EINVAL,
} InitExprFailure;

typedef struct InitExprError {
        InitExprFailure failure;
        const char *field; /* borrowed from the InitExpr; fan_in or fan_out for FAN_RANK */
        double value;
} InitExprError;

/* Looks up a field: 0 and *ret_value, -ENOENT when absent, -EDOM when present but no number. */
typedef int (*InitExprLookup)(const char *name, double *ret_value, void *userdata);

typedef struct InitExprEnv {
        InitExprLookup lookup;
        void *userdata;
        const int64_t *shape; /* the parameter's global shape, for fan_in and fan_out */
        size_t n_dims;
} InitExprEnv;

/* torch.nn.init's fans of a shape: dim 1 (in) or dim 0 (out) times the receptive field (the
 * product of the dimensions after the first two). -EDOM for fewer than 2 dimensions. */
int init_expr_fans(const int64_t *shape, size_t n_dims, double *ret_fan_in, double *ret_fan_out);

/* Evaluates e; a failure returns -EINVAL and fills *ret_error; other errors from lookup as is. */
int init_expr_eval(const InitExpr *e, const InitExprEnv *env, double *ret, InitExprError *ret_error);
