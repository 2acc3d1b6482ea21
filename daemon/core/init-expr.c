/* init-expr.c: float expressions for an init's numbers (init-expr.h). */

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init-expr.h"
#include "resource-limits.h"

typedef enum NodeKind {
        NODE_NUMBER,
        NODE_FIELD,
        NODE_FAN_IN,
        NODE_FAN_OUT,
        NODE_NEG,
        NODE_SQRT,
        NODE_ADD,
        NODE_SUB,
        NODE_MUL,
        NODE_DIV,
} NodeKind;

struct InitExpr {
        NodeKind kind;
        double value;   /* NODE_NUMBER */
        char *name;     /* NODE_FIELD */
        InitExpr *lhs;  /* operand of NEG and SQRT */
        InitExpr *rhs;
};

InitExpr *init_expr_free(InitExpr *e) {
        if (!e)
                return NULL;
        init_expr_free(e->lhs);
        init_expr_free(e->rhs);
        free(e->name);
        return mfree(e);
}

typedef struct Parser {
        const char *text;
        size_t pos;
        unsigned depth;
        char *message;
        bool oom;
} Parser;

static int parser_fail(Parser *p, const char *format, ...) _printf_(2, 3);
static int parser_fail(Parser *p, const char *format, ...) {
        va_list ap;

        if (p->message || p->oom)
                return p->oom ? -ENOMEM : -EINVAL;
        va_start(ap, format);
        if (vasprintf(&p->message, format, ap) < 0) {
                p->message = NULL;
                p->oom = true;
        }
        va_end(ap);
        return p->oom ? -ENOMEM : -EINVAL;
}

static void skip_space(Parser *p) {
        while (p->text[p->pos] == ' ' || p->text[p->pos] == '\t')
                p->pos++;
}

static bool is_ident_start(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

static int fail_here(Parser *p) {
        unsigned char c = (unsigned char) p->text[p->pos];

        if (c == 0)
                return parser_fail(p, "unexpected end of expression at column %zu", p->pos + 1);
        if (c >= 0x20 && c < 0x7f)
                return parser_fail(p, "unexpected '%c' at column %zu", c, p->pos + 1);
        return parser_fail(p, "unexpected byte 0x%02x at column %zu", c, p->pos + 1);
}

static int node_new(Parser *p, NodeKind kind, InitExpr *lhs, InitExpr *rhs, InitExpr **ret) {
        InitExpr *e = calloc(1, sizeof(InitExpr));

        if (!e) {
                init_expr_free(lhs);
                init_expr_free(rhs);
                p->oom = true;
                return -ENOMEM;
        }
        e->kind = kind;
        e->lhs = lhs;
        e->rhs = rhs;
        *ret = e;
        return 0;
}

static int parse_sum(Parser *p, InitExpr **ret);

/* digits [. digits] [e [+-] digits], or . digits ...: the decimal text strtod reads the same way. */
static int parse_number(Parser *p, InitExpr **ret) {
        size_t start = p->pos, i = p->pos, n_digits = 0;
        const char *t = p->text;
        int r;

        while (is_digit(t[i]))
                i++, n_digits++;
        if (t[i] == '.') {
                i++;
                while (is_digit(t[i]))
                        i++, n_digits++;
        }
        if (n_digits == 0)
                return fail_here(p);
        if (t[i] == 'e' || t[i] == 'E') {
                size_t j = i + 1;
                if (t[j] == '+' || t[j] == '-')
                        j++;
                if (!is_digit(t[j])) {
                        p->pos = j;
                        return parser_fail(p, "malformed exponent at column %zu", start + 1);
                }
                while (is_digit(t[j]))
                        j++;
                i = j;
        }

        _cleanup_free_ char *s = strndup(t + start, i - start);
        if (!s) {
                p->oom = true;
                return -ENOMEM;
        }
        double v = strtod(s, NULL);
        if (!isfinite(v))
                return parser_fail(p, "number at column %zu is out of range", start + 1);
        r = node_new(p, NODE_NUMBER, NULL, NULL, ret);
        if (r < 0)
                return r;
        (*ret)->value = v;
        p->pos = i;
        return 0;
}

static int parse_primary(Parser *p, InitExpr **ret) {
        const char *t = p->text;
        int r;

        skip_space(p);
        if (t[p->pos] == '(') {
                size_t open = p->pos;
                p->pos++;
                r = parse_sum(p, ret);
                if (r < 0)
                        return r;
                skip_space(p);
                if (t[p->pos] != ')') {
                        init_expr_free(*ret);
                        *ret = NULL;
                        if (t[p->pos] == 0)
                                return parser_fail(p, "unclosed '(' at column %zu", open + 1);
                        return fail_here(p);
                }
                p->pos++;
                return 0;
        }
        if (is_ident_start(t[p->pos])) {
                size_t start = p->pos;
                while (is_ident_start(t[p->pos]) || is_digit(t[p->pos]))
                        p->pos++;
                size_t len = p->pos - start;
                if (len > FAMILYD_MAX_NAME_LENGTH)
                        return parser_fail(p, "name at column %zu is longer than %u characters",
                                           start + 1, FAMILYD_MAX_NAME_LENGTH);

                skip_space(p);
                if (t[p->pos] == '(') {
                        InitExpr *arg = NULL;
                        if (len != 4 || strncmp(t + start, "sqrt", 4) != 0)
                                return parser_fail(p, "unknown function '%.*s' at column %zu (only sqrt)",
                                                   (int) len, t + start, start + 1);
                        size_t open = p->pos;
                        p->pos++;
                        r = parse_sum(p, &arg);
                        if (r < 0)
                                return r;
                        skip_space(p);
                        if (t[p->pos] != ')') {
                                init_expr_free(arg);
                                if (t[p->pos] == 0)
                                        return parser_fail(p, "unclosed '(' at column %zu", open + 1);
                                return fail_here(p);
                        }
                        p->pos++;
                        return node_new(p, NODE_SQRT, arg, NULL, ret);
                }
                if (len == 4 && strncmp(t + start, "sqrt", 4) == 0)
                        return parser_fail(p, "sqrt at column %zu needs an argument in parentheses",
                                           start + 1);
                if (len == 6 && strncmp(t + start, "fan_in", 6) == 0)
                        return node_new(p, NODE_FAN_IN, NULL, NULL, ret);
                if (len == 7 && strncmp(t + start, "fan_out", 7) == 0)
                        return node_new(p, NODE_FAN_OUT, NULL, NULL, ret);
                r = node_new(p, NODE_FIELD, NULL, NULL, ret);
                if (r < 0)
                        return r;
                (*ret)->name = strndup(t + start, len);
                if (!(*ret)->name) {
                        *ret = init_expr_free(*ret);
                        p->oom = true;
                        return -ENOMEM;
                }
                return 0;
        }
        if (is_digit(t[p->pos]) || t[p->pos] == '.')
                return parse_number(p, ret);
        return fail_here(p);
}

static int parse_unary(Parser *p, InitExpr **ret) {
        InitExpr *x = NULL;
        int r;

        skip_space(p);
        if (p->text[p->pos] != '-')
                return parse_primary(p, ret);
        if (++p->depth > FAMILYD_MAX_EXPR_DEPTH)
                return parser_fail(p, "expression nests deeper than %u at column %zu",
                                   FAMILYD_MAX_EXPR_DEPTH, p->pos + 1);
        p->pos++;
        r = parse_unary(p, &x);
        p->depth--;
        if (r < 0)
                return r;
        return node_new(p, NODE_NEG, x, NULL, ret);
}

static int parse_product(Parser *p, InitExpr **ret) {
        InitExpr *lhs = NULL, *rhs = NULL;
        int r;

        r = parse_unary(p, &lhs);
        if (r < 0)
                return r;
        for (;;) {
                skip_space(p);
                char c = p->text[p->pos];
                if (c != '*' && c != '/')
                        break;
                p->pos++;
                r = parse_unary(p, &rhs);
                if (r < 0) {
                        init_expr_free(lhs);
                        return r;
                }
                r = node_new(p, c == '*' ? NODE_MUL : NODE_DIV, lhs, rhs, &lhs);
                if (r < 0)
                        return r;
        }
        *ret = lhs;
        return 0;
}

static int parse_sum(Parser *p, InitExpr **ret) {
        InitExpr *lhs = NULL, *rhs = NULL;
        int r;

        if (++p->depth > FAMILYD_MAX_EXPR_DEPTH)
                return parser_fail(p, "expression nests deeper than %u at column %zu",
                                   FAMILYD_MAX_EXPR_DEPTH, p->pos + 1);
        r = parse_product(p, &lhs);
        if (r < 0)
                goto done;
        for (;;) {
                skip_space(p);
                char c = p->text[p->pos];
                if (c != '+' && c != '-')
                        break;
                p->pos++;
                r = parse_product(p, &rhs);
                if (r < 0) {
                        init_expr_free(lhs);
                        goto done;
                }
                r = node_new(p, c == '+' ? NODE_ADD : NODE_SUB, lhs, rhs, &lhs);
                if (r < 0)
                        goto done;
        }
        *ret = lhs;
        r = 0;
done:
        p->depth--;
        return r;
}

int init_expr_parse(const char *text, InitExpr **ret, char **ret_message) {
        _cleanup_(init_expr_freep) InitExpr *e = NULL;
        Parser p = { .text = text };
        int r;

        if (!text || !ret)
                return -EINVAL;
        if (strlen(text) > FAMILYD_MAX_EXPR_LENGTH)
                r = parser_fail(&p, "expression is longer than %u characters", FAMILYD_MAX_EXPR_LENGTH);
        else {
                r = parse_sum(&p, &e);
                if (r >= 0) {
                        skip_space(&p);
                        if (text[p.pos] != 0) {
                                e = init_expr_free(e);
                                r = fail_here(&p);
                        }
                }
        }
        if (r < 0 && (p.oom || !p.message))
                r = -ENOMEM;
        if (r < 0) {
                if (r == -EINVAL && ret_message)
                        *ret_message = TAKE_PTR(p.message);
                free(p.message);
                return r;
        }
        *ret = TAKE_PTR(e);
        return 0;
}

/* ---- Canonical text. ---- */

static int precedence(const InitExpr *e) {
        switch (e->kind) {
        case NODE_ADD:
        case NODE_SUB:
                return 1;
        case NODE_MUL:
        case NODE_DIV:
                return 2;
        case NODE_NEG:
                return 3;
        default:
                return 4;
        }
}

static void format_double(double v, char buf[static 32]) {
        /* As registry-parameter.c formats a literal: the shortest of %.15g..%.17g that reads back. */
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, 32, "%.*g", prec, v);
                if (strtod(buf, NULL) == v)
                        return;
        }
}

static int print(FILE *f, const InitExpr *e) {
        static const char *const ops[] = { [NODE_ADD] = " + ", [NODE_SUB] = " - ", [NODE_MUL] = " * ",
                                           [NODE_DIV] = " / " };
        char buf[32];
        int r;

        switch (e->kind) {
        case NODE_NUMBER:
                format_double(e->value, buf);
                return fputs(buf, f) < 0 ? -EIO : 0;
        case NODE_FIELD:
                return fputs(e->name, f) < 0 ? -EIO : 0;
        case NODE_FAN_IN:
                return fputs("fan_in", f) < 0 ? -EIO : 0;
        case NODE_FAN_OUT:
                return fputs("fan_out", f) < 0 ? -EIO : 0;
        case NODE_SQRT:
                fputs("sqrt(", f);
                r = print(f, e->lhs);
                if (r < 0)
                        return r;
                return fputc(')', f) < 0 ? -EIO : 0;
        case NODE_NEG: {
                bool paren = precedence(e->lhs) < precedence(e);
                fputs(paren ? "-(" : "-", f);
                r = print(f, e->lhs);
                if (r < 0)
                        return r;
                return paren && fputc(')', f) < 0 ? -EIO : 0;
        }
        default: {
                /* Left associative: a right operand of the same precedence keeps its parentheses
                 * (floating-point a - (b - c) and a + (b + c) are other trees). */
                bool pl = precedence(e->lhs) < precedence(e), pr = precedence(e->rhs) <= precedence(e);
                if (pl)
                        fputc('(', f);
                r = print(f, e->lhs);
                if (r < 0)
                        return r;
                if (pl)
                        fputc(')', f);
                fputs(ops[e->kind], f);
                if (pr)
                        fputc('(', f);
                r = print(f, e->rhs);
                if (r < 0)
                        return r;
                if (pr)
                        fputc(')', f);
                return 0;
        }
        }
}

char *init_expr_to_string(const InitExpr *e) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;
        int r;

        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        r = print(f, e);
        if (fclose(f) != 0 || r < 0)
                return mfree(buf);
        return buf;
}

/* ---- Fields. ---- */

typedef struct FieldWalk {
        const InitExpr *root;
        int (*f)(const char *name, void *userdata);
        void *userdata;
} FieldWalk;

static bool field_seen_before(const InitExpr *e, const InitExpr *stop, const char *name, bool *found) {
        /* True once stop is reached; *found when name appears at a field before it. */
        if (!e)
                return false;
        if (e == stop)
                return true;
        if (e->kind == NODE_FIELD && streq(e->name, name))
                *found = true;
        return field_seen_before(e->lhs, stop, name, found) || field_seen_before(e->rhs, stop, name, found);
}

static int walk_fields(FieldWalk *w, const InitExpr *e) {
        int r;

        if (!e)
                return 0;
        if (e->kind == NODE_FIELD) {
                bool found = false;
                (void) field_seen_before(w->root, e, e->name, &found);
                if (!found) {
                        r = w->f(e->name, w->userdata);
                        if (r < 0)
                                return r;
                }
                return 0;
        }
        r = walk_fields(w, e->lhs);
        if (r < 0)
                return r;
        return walk_fields(w, e->rhs);
}

int init_expr_foreach_field(const InitExpr *e, int (*f)(const char *name, void *userdata), void *userdata) {
        FieldWalk w = { .root = e, .f = f, .userdata = userdata };

        return walk_fields(&w, e);
}

bool init_expr_uses_fan(const InitExpr *e) {
        if (!e)
                return false;
        if (e->kind == NODE_FAN_IN || e->kind == NODE_FAN_OUT)
                return true;
        return init_expr_uses_fan(e->lhs) || init_expr_uses_fan(e->rhs);
}

/* ---- Evaluation. ---- */

int init_expr_fans(const int64_t *shape, size_t n_dims, double *ret_fan_in, double *ret_fan_out) {
        double receptive = 1;

        if (n_dims < 2)
                return -EDOM;
        for (size_t d = 2; d < n_dims; d++)
                receptive *= (double) shape[d];
        if (ret_fan_in)
                *ret_fan_in = (double) shape[1] * receptive;
        if (ret_fan_out)
                *ret_fan_out = (double) shape[0] * receptive;
        return 0;
}

static int fail(InitExprError *err, InitExprFailure failure, const char *field, double value) {
        if (err)
                *err = (InitExprError) { .failure = failure, .field = field, .value = value };
        return -EINVAL;
}

static int eval(const InitExpr *e, const InitExprEnv *env, double *ret, InitExprError *err) {
        double x, y, v;
        int r;

        switch (e->kind) {
        case NODE_NUMBER:
                *ret = e->value;
                return 0;
        case NODE_FIELD:
                if (!env->lookup)
                        return fail(err, INIT_EXPR_FAILURE_MISSING_FIELD, e->name, 0);
                r = env->lookup(e->name, &v, env->userdata);
                if (r == -ENOENT)
                        return fail(err, INIT_EXPR_FAILURE_MISSING_FIELD, e->name, 0);
                if (r == -EDOM)
                        return fail(err, INIT_EXPR_FAILURE_NOT_NUMBER, e->name, 0);
                if (r < 0)
                        return r;
                if (!isfinite(v))
                        return fail(err, INIT_EXPR_FAILURE_NOT_FINITE, e->name, v);
                *ret = v;
                return 0;
        case NODE_FAN_IN:
        case NODE_FAN_OUT:
                if (init_expr_fans(env->shape, env->n_dims, &x, &y) < 0)
                        return fail(err, INIT_EXPR_FAILURE_FAN_RANK,
                                    e->kind == NODE_FAN_IN ? "fan_in" : "fan_out", (double) env->n_dims);
                *ret = e->kind == NODE_FAN_IN ? x : y;
                return 0;
        default:
                break;
        }

        r = eval(e->lhs, env, &x, err);
        if (r < 0)
                return r;
        if (e->rhs) {
                r = eval(e->rhs, env, &y, err);
                if (r < 0)
                        return r;
        }
        switch (e->kind) {
        case NODE_NEG:
                v = -x;
                break;
        case NODE_SQRT:
                if (x < 0)
                        return fail(err, INIT_EXPR_FAILURE_SQRT_NEGATIVE, NULL, x);
                v = sqrt(x);
                break;
        case NODE_ADD:
                v = x + y;
                break;
        case NODE_SUB:
                v = x - y;
                break;
        case NODE_MUL:
                v = x * y;
                break;
        default:
                v = x / y;
                break;
        }
        if (!isfinite(v))
                return fail(err, INIT_EXPR_FAILURE_NOT_FINITE, NULL, v);
        *ret = v;
        return 0;
}

int init_expr_eval(const InitExpr *e, const InitExprEnv *env, double *ret, InitExprError *ret_error) {
        if (!e || !env || !ret)
                return -EINVAL;
        if (ret_error)
                *ret_error = (InitExprError) {};
        return eval(e, env, ret, ret_error);
}
