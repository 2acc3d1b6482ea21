/* expr.c: shape expressions and conditions: a recursive-descent parser, canonical text and checked
 * evaluation. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "expr.h"
#include "resource-limits.h"

typedef enum ExprType {
        EXPR_INT,
        EXPR_FIELD,
        EXPR_NEG,
        EXPR_ADD,
        EXPR_SUB,
        EXPR_MUL,
        EXPR_DIV,
        /* conditions only (expr_parse_condition): 1 when true, 0 when false */
        EXPR_EQ,
        EXPR_NE,
        EXPR_LT,
        EXPR_LE,
        EXPR_GT,
        EXPR_GE,
        EXPR_NOT,
        EXPR_AND,
        EXPR_OR,
        _EXPR_TYPE_MAX,
} ExprType;

struct Expr {
        ExprType type;
        int64_t value;  /* EXPR_INT */
        char *name;     /* EXPR_FIELD */
        Expr *lhs, *rhs; /* EXPR_NEG and EXPR_NOT use lhs only */
};

Expr *expr_free(Expr *e) {
        /* The tree is at most FAMILYD_MAX_EXPR_LENGTH nodes deep (one node per character at
         * worst), so plain recursion is bounded. */
        if (!e)
                return NULL;
        expr_free(e->lhs);
        expr_free(e->rhs);
        free(e->name);
        return mfree(e);
}

typedef struct Parser {
        const char *text;
        size_t pos;
        unsigned depth;
        char *message; /* the first syntax error */
        bool oom;
        bool condition; /* comparisons, not, and, or allowed */
} Parser;

static int parser_fail(Parser *p, const char *format, ...) _printf_(2, 3);
static int parser_fail(Parser *p, const char *format, ...) {
        va_list ap;

        if (p->message || p->oom)
                return -EINVAL;

        va_start(ap, format);
        if (vasprintf(&p->message, format, ap) < 0) {
                p->message = NULL;
                p->oom = true;
        }
        va_end(ap);
        return p->oom ? -ENOMEM : -EINVAL;
}

static void parser_skip_space(Parser *p) {
        while (p->text[p->pos] == ' ' || p->text[p->pos] == '\t')
                p->pos++;
}

static bool is_ident_start(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(char c) {
        return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* Describes the character at the current position for an error text; static or buf. */
static const char *parser_describe(Parser *p, char buf[static 8]) {
        unsigned char c = (unsigned char) p->text[p->pos];

        if (c == 0)
                return "end of expression";
        if (c < 0x20 || c >= 0x7f)
                snprintf(buf, 8, "\\x%02x", c);
        else
                snprintf(buf, 8, "'%c'", c);
        return buf;
}

static int parser_unexpected(Parser *p) {
        char buf[8];

        if (p->text[p->pos] == 0)
                return parser_fail(p, "unexpected end of expression");
        return parser_fail(p, "unexpected %s at column %zu", parser_describe(p, buf), p->pos + 1);
}

static Expr *expr_new(ExprType type) {
        Expr *e = calloc(1, sizeof(Expr));
        if (e)
                e->type = type;
        return e;
}

static int parse_sum(Parser *p, Expr **ret);
static int parse_or(Parser *p, Expr **ret);

static bool text_eq(const char *s, const char *word, size_t n) {
        return strncmp(s, word, n) == 0;
}

/* In a condition the words not, and, or are operators, never field names. */
static bool is_keyword(const char *s, size_t n) {
        return (n == 3 && (text_eq(s, "not", 3) || text_eq(s, "and", 3))) || (n == 2 && text_eq(s, "or", 2));
}

/* The keyword word at the current position, if any (a whole identifier). */
static bool parser_at_word(Parser *p, const char *word) {
        size_t n = strlen(word);

        return text_eq(p->text + p->pos, word, n) && !is_ident_char(p->text[p->pos + n]);
}

static int parse_primary(Parser *p, Expr **ret) {
        _cleanup_(expr_freep) Expr *e = NULL;
        int r;

        parser_skip_space(p);
        char c = p->text[p->pos];

        if (c >= '0' && c <= '9') {
                size_t start = p->pos;
                int64_t v = 0;

                while (p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
                        if (__builtin_mul_overflow(v, 10, &v) ||
                            __builtin_add_overflow(v, p->text[p->pos] - '0', &v))
                                return parser_fail(p, "integer out of range at column %zu", start + 1);
                        p->pos++;
                }
                /* "12abc" is not a number followed by a name: reject it here rather than report
                 * a confusing "unexpected 'a'" later. */
                if (is_ident_char(p->text[p->pos]))
                        return parser_unexpected(p);

                e = expr_new(EXPR_INT);
                if (!e)
                        return -ENOMEM;
                e->value = v;

        } else if (is_ident_start(c)) {
                size_t start = p->pos;

                while (is_ident_char(p->text[p->pos]))
                        p->pos++;
                if (p->condition && is_keyword(p->text + start, p->pos - start)) {
                        p->pos = start;
                        return parser_unexpected(p);
                }

                e = expr_new(EXPR_FIELD);
                if (!e)
                        return -ENOMEM;
                e->name = strndup(p->text + start, p->pos - start);
                if (!e->name)
                        return -ENOMEM;

        } else if (c == '(') {
                size_t open = p->pos;

                if (++p->depth > FAMILYD_MAX_EXPR_DEPTH)
                        return parser_fail(p, "expression nested too deeply (more than %u levels)",
                                           FAMILYD_MAX_EXPR_DEPTH);
                p->pos++;
                r = p->condition ? parse_or(p, &e) : parse_sum(p, &e);
                if (r < 0)
                        return r;
                parser_skip_space(p);
                if (p->text[p->pos] != ')') {
                        if (p->text[p->pos] == 0)
                                return parser_fail(p, "unclosed '(' at column %zu", open + 1);
                        return parser_unexpected(p);
                }
                p->pos++;
                p->depth--;

        } else
                return parser_unexpected(p);

        *ret = TAKE_PTR(e);
        return 0;
}

static int parse_unary(Parser *p, Expr **ret) {
        _cleanup_(expr_freep) Expr *operand = NULL;
        int r;

        parser_skip_space(p);
        if (p->text[p->pos] != '-')
                return parse_primary(p, ret);

        /* Unary minus recurses like a parenthesis does: "- - - x" counts against the depth. */
        if (++p->depth > FAMILYD_MAX_EXPR_DEPTH)
                return parser_fail(p, "expression nested too deeply (more than %u levels)",
                                   FAMILYD_MAX_EXPR_DEPTH);
        p->pos++;
        r = parse_unary(p, &operand);
        if (r < 0)
                return r;
        p->depth--;

        Expr *e = expr_new(EXPR_NEG);
        if (!e)
                return -ENOMEM;
        e->lhs = TAKE_PTR(operand);
        *ret = e;
        return 0;
}

/* One left-associative precedence level: operand (op operand)*. */
static int parse_level(Parser *p, Expr **ret, char op1, ExprType t1, char op2, ExprType t2,
                       int (*operand)(Parser *p, Expr **ret)) {
        _cleanup_(expr_freep) Expr *lhs = NULL;
        int r;

        r = operand(p, &lhs);
        if (r < 0)
                return r;

        for (;;) {
                _cleanup_(expr_freep) Expr *rhs = NULL;
                ExprType t;

                parser_skip_space(p);
                if (p->text[p->pos] == op1)
                        t = t1;
                else if (p->text[p->pos] == op2)
                        t = t2;
                else
                        break;
                p->pos++;

                r = operand(p, &rhs);
                if (r < 0)
                        return r;

                Expr *e = expr_new(t);
                if (!e)
                        return -ENOMEM;
                e->lhs = TAKE_PTR(lhs);
                e->rhs = TAKE_PTR(rhs);
                lhs = e;
        }

        *ret = TAKE_PTR(lhs);
        return 0;
}

static int parse_product(Parser *p, Expr **ret) {
        return parse_level(p, ret, '*', EXPR_MUL, '/', EXPR_DIV, parse_unary);
}

static int parse_sum(Parser *p, Expr **ret) {
        return parse_level(p, ret, '+', EXPR_ADD, '-', EXPR_SUB, parse_product);
}

/* A sum, or two sums compared (not chained: "a < b < c" is a syntax error). */
static int parse_comparison(Parser *p, Expr **ret) {
        static const struct {
                const char *op;
                ExprType type;
        } ops[] = {
                { "==", EXPR_EQ }, { "!=", EXPR_NE }, { "<=", EXPR_LE },
                { ">=", EXPR_GE }, { "<", EXPR_LT },  { ">", EXPR_GT },
        };
        _cleanup_(expr_freep) Expr *lhs = NULL, *rhs = NULL;
        ExprType t = _EXPR_TYPE_MAX;
        int r;

        r = parse_sum(p, &lhs);
        if (r < 0)
                return r;
        parser_skip_space(p);
        for (size_t i = 0; i < ELEMENTSOF(ops); i++)
                if (text_eq(p->text + p->pos, ops[i].op, strlen(ops[i].op))) {
                        t = ops[i].type;
                        p->pos += strlen(ops[i].op);
                        break;
                }
        if (t == _EXPR_TYPE_MAX) {
                *ret = TAKE_PTR(lhs);
                return 0;
        }
        r = parse_sum(p, &rhs);
        if (r < 0)
                return r;

        Expr *e = expr_new(t);
        if (!e)
                return -ENOMEM;
        e->lhs = TAKE_PTR(lhs);
        e->rhs = TAKE_PTR(rhs);
        *ret = e;
        return 0;
}

static int parse_not(Parser *p, Expr **ret) {
        _cleanup_(expr_freep) Expr *operand = NULL;
        int r;

        parser_skip_space(p);
        if (!parser_at_word(p, "not"))
                return parse_comparison(p, ret);

        if (++p->depth > FAMILYD_MAX_EXPR_DEPTH)
                return parser_fail(p, "expression nested too deeply (more than %u levels)",
                                   FAMILYD_MAX_EXPR_DEPTH);
        p->pos += 3;
        r = parse_not(p, &operand);
        if (r < 0)
                return r;
        p->depth--;

        Expr *e = expr_new(EXPR_NOT);
        if (!e)
                return -ENOMEM;
        e->lhs = TAKE_PTR(operand);
        *ret = e;
        return 0;
}

/* operand (word operand)*, left associative. */
static int parse_words(Parser *p, Expr **ret, const char *word, ExprType type,
                       int (*operand)(Parser *p, Expr **ret)) {
        _cleanup_(expr_freep) Expr *lhs = NULL;
        int r;

        r = operand(p, &lhs);
        if (r < 0)
                return r;
        for (;;) {
                _cleanup_(expr_freep) Expr *rhs = NULL;

                parser_skip_space(p);
                if (!parser_at_word(p, word))
                        break;
                p->pos += strlen(word);
                r = operand(p, &rhs);
                if (r < 0)
                        return r;

                Expr *e = expr_new(type);
                if (!e)
                        return -ENOMEM;
                e->lhs = TAKE_PTR(lhs);
                e->rhs = TAKE_PTR(rhs);
                lhs = e;
        }
        *ret = TAKE_PTR(lhs);
        return 0;
}

static int parse_and(Parser *p, Expr **ret) {
        return parse_words(p, ret, "and", EXPR_AND, parse_not);
}

static int parse_or(Parser *p, Expr **ret) {
        return parse_words(p, ret, "or", EXPR_OR, parse_and);
}

/*
 * The limit counts significant characters, blanks aside, so that the canonical text (which adds
 * blanks around operators but never adds anything else) of an accepted expression is accepted
 * too. Blanks are bounded separately, by the text's total length.
 */
static bool expr_too_long(const char *text) {
        size_t n = 0, total = 0;

        for (const char *c = text; *c; c++) {
                if (++total > 4 * FAMILYD_MAX_EXPR_LENGTH)
                        return true;
                if (*c != ' ' && *c != '\t' && ++n > FAMILYD_MAX_EXPR_LENGTH)
                        return true;
        }
        return false;
}

static int parse_text(const char *text, bool condition, Expr **ret, char **ret_message) {
        _cleanup_(expr_freep) Expr *e = NULL;
        Parser p = { .text = text, .condition = condition };
        int r;

        if (!text || !ret)
                return -EINVAL;

        if (expr_too_long(text))
                r = parser_fail(&p, "expression longer than %u characters", FAMILYD_MAX_EXPR_LENGTH);
        else {
                parser_skip_space(&p);
                if (text[p.pos] == 0)
                        r = parser_fail(&p, "empty expression");
                else {
                        r = condition ? parse_or(&p, &e) : parse_sum(&p, &e);
                        if (r >= 0) {
                                parser_skip_space(&p);
                                if (text[p.pos] != 0)
                                        r = parser_unexpected(&p);
                        }
                }
        }
        if (r < 0 && (p.oom || !p.message))
                r = -ENOMEM; /* every syntax error leaves a message; none means allocation failed */
        if (r < 0) {
                if (r == -EINVAL && ret_message)
                        *ret_message = TAKE_PTR(p.message);
                free(p.message);
                return r;
        }

        *ret = TAKE_PTR(e);
        return 0;
}

int expr_parse(const char *text, Expr **ret, char **ret_message) {
        return parse_text(text, false, ret, ret_message);
}

int expr_parse_condition(const char *text, Expr **ret, char **ret_message) {
        return parse_text(text, true, ret, ret_message);
}

/* Binding strength: a child binding less tightly than its parent needs parentheses. */
static int expr_precedence(const Expr *e) {
        switch (e->type) {
        case EXPR_OR:
                return -3;
        case EXPR_AND:
                return -2;
        case EXPR_NOT:
                return -1;
        case EXPR_EQ:
        case EXPR_NE:
        case EXPR_LT:
        case EXPR_LE:
        case EXPR_GT:
        case EXPR_GE:
                return 0;
        case EXPR_ADD:
        case EXPR_SUB:
                return 1;
        case EXPR_MUL:
        case EXPR_DIV:
                return 2;
        case EXPR_NEG:
                return 3;
        default:
                return 4;
        }
}

static const char *expr_operator(const Expr *e) {
        switch (e->type) {
        case EXPR_ADD:
                return "+";
        case EXPR_SUB:
                return "-";
        case EXPR_MUL:
                return "*";
        case EXPR_DIV:
                return "/";
        case EXPR_EQ:
                return "==";
        case EXPR_NE:
                return "!=";
        case EXPR_LT:
                return "<";
        case EXPR_LE:
                return "<=";
        case EXPR_GT:
                return ">";
        case EXPR_GE:
                return ">=";
        case EXPR_AND:
                return "and";
        case EXPR_OR:
                return "or";
        default:
                return "?";
        }
}

static void expr_print(const Expr *e, FILE *f);

static void expr_print_child(const Expr *child, bool parens, FILE *f) {
        if (parens)
                fputc('(', f);
        expr_print(child, f);
        if (parens)
                fputc(')', f);
}

static void expr_print(const Expr *e, FILE *f) {
        int prec = expr_precedence(e);

        switch (e->type) {
        case EXPR_INT:
                fprintf(f, "%" PRId64, e->value);
                break;
        case EXPR_FIELD:
                fputs(e->name, f);
                break;
        case EXPR_NEG:
                fputc('-', f);
                expr_print_child(e->lhs, expr_precedence(e->lhs) < prec, f);
                break;
        case EXPR_NOT:
                fputs("not ", f);
                expr_print_child(e->lhs, expr_precedence(e->lhs) < prec, f);
                break;
        case EXPR_EQ:
        case EXPR_NE:
        case EXPR_LT:
        case EXPR_LE:
        case EXPR_GT:
        case EXPR_GE:
                /* not associative: both operands parenthesised at equal strength */
                expr_print_child(e->lhs, expr_precedence(e->lhs) <= prec, f);
                fprintf(f, " %s ", expr_operator(e));
                expr_print_child(e->rhs, expr_precedence(e->rhs) <= prec, f);
                break;
        default:
                /* Left associative: the right operand needs parentheses at equal strength too,
                 * so that "a - (b - c)" keeps them and the text parses back to the same tree. */
                expr_print_child(e->lhs, expr_precedence(e->lhs) < prec, f);
                fprintf(f, " %s ", expr_operator(e));
                expr_print_child(e->rhs, expr_precedence(e->rhs) <= prec, f);
                break;
        }
}

char *expr_to_string(const Expr *e) {
        char *buf = NULL;
        size_t size = 0;

        if (!e)
                return NULL;

        FILE *f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        expr_print(e, f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

bool expr_is_field(const Expr *e, const char **ret_name) {
        if (!e || e->type != EXPR_FIELD)
                return false;
        if (ret_name)
                *ret_name = e->name;
        return true;
}

typedef struct FieldList {
        const char **names;
        size_t n;
        size_t allocated;
} FieldList;

static int expr_collect_fields(const Expr *e, FieldList *l) {
        int r;

        if (!e)
                return 0;

        if (e->type == EXPR_FIELD) {
                for (size_t i = 0; i < l->n; i++)
                        if (streq(l->names[i], e->name))
                                return 0;
                if (!GREEDY_REALLOC(l->names, l->allocated, l->n + 1))
                        return -ENOMEM;
                l->names[l->n++] = e->name;
                return 0;
        }

        r = expr_collect_fields(e->lhs, l);
        if (r < 0)
                return r;
        return expr_collect_fields(e->rhs, l);
}

int expr_foreach_field(const Expr *e, int (*f)(const char *name, void *userdata), void *userdata) {
        _cleanup_free_ const char **names = NULL;
        FieldList l = {};
        int r;

        if (!e || !f)
                return -EINVAL;

        r = expr_collect_fields(e, &l);
        names = l.names;
        if (r < 0)
                return r;

        for (size_t i = 0; i < l.n; i++) {
                r = f(l.names[i], userdata);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int eval_fail(ExprEvalError *err, ExprFailure failure, const char *field, int64_t lhs,
                     int64_t rhs) {
        if (err)
                *err = (ExprEvalError) { .failure = failure, .field = field, .lhs = lhs, .rhs = rhs };
        return -EINVAL;
}

static int expr_eval_one(const Expr *e, ExprLookup lookup, void *userdata, int64_t *ret,
                         ExprEvalError *err) {
        int64_t a, b, v;
        int r;

        switch (e->type) {
        case EXPR_INT:
                *ret = e->value;
                return 0;

        case EXPR_FIELD:
                if (!lookup)
                        return eval_fail(err, EXPR_FAILURE_MISSING_FIELD, e->name, 0, 0);
                r = lookup(e->name, &v, userdata);
                if (r == -ENOENT)
                        return eval_fail(err, EXPR_FAILURE_MISSING_FIELD, e->name, 0, 0);
                if (r == -EDOM)
                        return eval_fail(err, EXPR_FAILURE_NOT_INT, e->name, 0, 0);
                if (r < 0)
                        return r == -EINVAL ? -EIO : r; /* keep -EINVAL meaning "see ret_error" */
                *ret = v;
                return 0;

        case EXPR_NEG:
                r = expr_eval_one(e->lhs, lookup, userdata, &a, err);
                if (r < 0)
                        return r;
                if (__builtin_sub_overflow((int64_t) 0, a, &v))
                        return eval_fail(err, EXPR_FAILURE_OVERFLOW, NULL, 0, a);
                *ret = v;
                return 0;

        case EXPR_NOT:
                r = expr_eval_one(e->lhs, lookup, userdata, &a, err);
                if (r < 0)
                        return r;
                *ret = a == 0;
                return 0;

        case EXPR_AND:
        case EXPR_OR:
                /* short-circuit: the right operand is evaluated only when it decides */
                r = expr_eval_one(e->lhs, lookup, userdata, &a, err);
                if (r < 0)
                        return r;
                if ((e->type == EXPR_AND) == (a == 0)) {
                        *ret = a != 0;
                        return 0;
                }
                r = expr_eval_one(e->rhs, lookup, userdata, &b, err);
                if (r < 0)
                        return r;
                *ret = b != 0;
                return 0;

        default:
                break;
        }

        r = expr_eval_one(e->lhs, lookup, userdata, &a, err);
        if (r < 0)
                return r;
        r = expr_eval_one(e->rhs, lookup, userdata, &b, err);
        if (r < 0)
                return r;

        bool overflow;
        switch (e->type) {
        case EXPR_ADD:
                overflow = __builtin_add_overflow(a, b, &v);
                break;
        case EXPR_SUB:
                overflow = __builtin_sub_overflow(a, b, &v);
                break;
        case EXPR_MUL:
                overflow = __builtin_mul_overflow(a, b, &v);
                break;
        case EXPR_DIV:
                if (b == 0)
                        return eval_fail(err, EXPR_FAILURE_DIVISION_BY_ZERO, NULL, a, b);
                if (a == INT64_MIN && b == -1)
                        return eval_fail(err, EXPR_FAILURE_OVERFLOW, NULL, a, b);
                if (a % b != 0)
                        return eval_fail(err, EXPR_FAILURE_NOT_DIVISIBLE, NULL, a, b);
                overflow = false;
                v = a / b;
                break;
        case EXPR_EQ:
        case EXPR_NE:
        case EXPR_LT:
        case EXPR_LE:
        case EXPR_GT:
        case EXPR_GE:
                overflow = false;
                v = e->type == EXPR_EQ ? a == b : e->type == EXPR_NE ? a != b : e->type == EXPR_LT ? a < b :
                    e->type == EXPR_LE ? a <= b : e->type == EXPR_GT ? a > b : a >= b;
                break;
        default:
                return -EINVAL;
        }
        if (overflow)
                return eval_fail(err, EXPR_FAILURE_OVERFLOW, NULL, a, b);

        *ret = v;
        return 0;
}

int expr_eval(const Expr *e, ExprLookup lookup, void *userdata, int64_t *ret,
              ExprEvalError *ret_error) {
        int64_t v;
        int r;

        if (!e)
                return -EINVAL;

        r = expr_eval_one(e, lookup, userdata, &v, ret_error);
        if (r < 0)
                return r;

        if (ret)
                *ret = v;
        return 0;
}
