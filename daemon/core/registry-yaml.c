/* registry-yaml.c: a YAML file to a small tree of YNodes, and YAML 1.2 core-schema scalar typing. */

/*
 * libyaml's event parser feeds a small tree of our own instead of yaml_parser_load()'s document:
 * the document API turns aliases into shared nodes (a DAG, even a cycle through an ancestor, so a
 * naive walk explodes or never ends) and forgets whether a scalar was plain or quoted, which
 * decides its type. The builder rejects aliases, bounds nesting and node count, and keeps
 * explicit tags. Problems go to the caller's diagnostic function, positions 1-based.
 *
 * Scalars resolve like the YAML 1.2 core schema: plain null/~, true/false (any case style of
 * the spec), decimal, 0o and 0x integers, floats with .inf/.nan; quoted and block scalars are
 * strings; explicit !!str/!!int/!!float/!!bool/!!null tags are honoured; other tags are errors.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "registry-yaml.h"
#include "repr.h"

/* Bounds of our own: what a legitimate registry never comes near. */
#define YAML_MAX_DEPTH          32u      /* the schema itself is 8 levels deep */
#define YAML_MAX_NODES          262144u  /* per file; a family takes about 50 */

YNode *ynode_free(YNode *n) {
        /* Depth is bounded by YAML_MAX_DEPTH, so recursion is too. */
        if (!n)
                return NULL;
        for (size_t i = 0; i < n->n_items; i++)
                ynode_free(n->items[i]);
        free(n->items);
        free(n->tag);
        free(n->text);
        return mfree(n);
}

static bool tag_is_allowed(const char *tag, YNodeKind kind) {
        if (!tag || streq(tag, "!"))
                return true;
        switch (kind) {
        case YNODE_SCALAR:
                return streq(tag, YAML_STR_TAG) || streq(tag, YAML_INT_TAG) ||
                       streq(tag, YAML_FLOAT_TAG) || streq(tag, YAML_BOOL_TAG) ||
                       streq(tag, YAML_NULL_TAG);
        case YNODE_SEQUENCE:
                return streq(tag, YAML_SEQ_TAG);
        case YNODE_MAPPING:
                return streq(tag, YAML_MAP_TAG);
        }
        return false;
}

typedef struct TreeBuilder {
        YNodeDiagFunc diag;
        void *userdata;
        YNode *root;
        YNode *stack[YAML_MAX_DEPTH];
        unsigned depth;
        size_t n_nodes;
        unsigned n_documents;
        bool done;
} TreeBuilder;

static int tree_diag(TreeBuilder *b, unsigned line, unsigned column, const char *format, ...)
        _printf_(4, 5);
static int tree_diag(TreeBuilder *b, unsigned line, unsigned column, const char *format, ...) {
        va_list ap;
        int r;

        va_start(ap, format);
        r = b->diag(b->userdata, line, column, format, ap);
        va_end(ap);
        return r;
}

static int tree_add_node(TreeBuilder *b, const yaml_event_t *ev, YNodeKind kind,
                         const yaml_char_t *tag) {
        _cleanup_(ynode_freep) YNode *n = NULL;
        unsigned line = ev->start_mark.line + 1, column = ev->start_mark.column + 1;

        if (++b->n_nodes > YAML_MAX_NODES)
                return tree_diag(b, line, column, "more than %u YAML nodes in one file",
                                 YAML_MAX_NODES);
        if (!tag_is_allowed((const char *) tag, kind)) {
                _cleanup_free_ char *q = repr_string((const char *) tag);
                if (!q)
                        return -ENOMEM;
                return tree_diag(b, line, column,
                                 "unsupported YAML tag %s (only !!str, !!int, !!float, !!bool, !!null, !!seq, !!map)",
                                 q);
        }

        n = calloc(1, sizeof(YNode));
        if (!n)
                return -ENOMEM;
        n->kind = kind;
        n->line = line;
        n->column = column;
        if (tag) {
                n->tag = strdup((const char *) tag);
                if (!n->tag)
                        return -ENOMEM;
        }

        if (kind == YNODE_SCALAR) {
                size_t len = ev->data.scalar.length;
                if (memchr(ev->data.scalar.value, 0, len))
                        return tree_diag(b, line, column,
                                         "scalar contains a NUL character");
                n->text = strndup((const char *) ev->data.scalar.value, len);
                if (!n->text)
                        return -ENOMEM;
                n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        }

        YNode *added = n;
        if (b->depth == 0) {
                if (b->root) /* cannot happen in one document; be safe anyway */
                        return tree_diag(b, line, column, "unexpected second root node");
                b->root = TAKE_PTR(n);
        } else {
                YNode *parent = b->stack[b->depth - 1];
                if (!GREEDY_REALLOC(parent->items, parent->allocated, parent->n_items + 1))
                        return -ENOMEM;
                parent->items[parent->n_items++] = TAKE_PTR(n);
        }

        if (kind != YNODE_SCALAR) {
                if (b->depth >= YAML_MAX_DEPTH)
                        return tree_diag(b, line, column,
                                         "YAML nested deeper than %u levels", YAML_MAX_DEPTH);
                b->stack[b->depth++] = added;
        }
        return 0;
}

static int tree_handle_event(TreeBuilder *b, const yaml_event_t *ev) {
        unsigned line = ev->start_mark.line + 1, column = ev->start_mark.column + 1;

        switch (ev->type) {
        case YAML_STREAM_END_EVENT:
                b->done = true;
                return 0;
        case YAML_DOCUMENT_START_EVENT:
                if (++b->n_documents > 1)
                        return tree_diag(b, line, column,
                                         "a registry file holds one YAML document");
                return 0;
        case YAML_ALIAS_EVENT:
                return tree_diag(b, line, column, "YAML aliases are not supported");
        case YAML_SCALAR_EVENT:
                return tree_add_node(b, ev, YNODE_SCALAR, ev->data.scalar.tag);
        case YAML_SEQUENCE_START_EVENT:
                return tree_add_node(b, ev, YNODE_SEQUENCE, ev->data.sequence_start.tag);
        case YAML_MAPPING_START_EVENT:
                return tree_add_node(b, ev, YNODE_MAPPING, ev->data.mapping_start.tag);
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
                if (b->depth > 0)
                        b->depth--;
                return 0;
        default:
                return 0;
        }
}

int ynode_parse(const char *buf, size_t size, YNodeDiagFunc diag, void *userdata, YNode **ret) {
        TreeBuilder b = { .diag = diag, .userdata = userdata };
        yaml_parser_t parser;
        int r = 0;

        if (!yaml_parser_initialize(&parser))
                return -ENOMEM;
        yaml_parser_set_input_string(&parser, (const unsigned char *) buf, size);

        while (!b.done) {
                yaml_event_t ev;

                if (!yaml_parser_parse(&parser, &ev)) {
                        if (parser.error == YAML_MEMORY_ERROR)
                                r = -ENOMEM;
                        else if (parser.error == YAML_READER_ERROR)
                                r = tree_diag(&b, 0, 0,
                                              "invalid YAML input at byte %zu: %s",
                                              parser.problem_offset,
                                              strempty(parser.problem));
                        else if (parser.context)
                                r = tree_diag(&b, parser.problem_mark.line + 1,
                                              parser.problem_mark.column + 1,
                                              "invalid YAML: %s (%s)", strempty(parser.problem),
                                              parser.context);
                        else
                                r = tree_diag(&b, parser.problem_mark.line + 1,
                                              parser.problem_mark.column + 1,
                                              "invalid YAML: %s", strempty(parser.problem));
                        break;
                }

                r = tree_handle_event(&b, &ev);
                yaml_event_delete(&ev);
                if (r < 0)
                        break;
        }
        yaml_parser_delete(&parser);

        if (r < 0) {
                ynode_free(b.root);
                return r;
        }
        *ret = b.root;
        return 0;
}

/* ---- scalars ---- */

static bool is_one_of(const char *s, const char *const *set, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (streq(s, set[i]))
                        return true;
        return false;
}

static bool span_digits(const char **p, const char *set) {
        const char *start = *p;
        while (**p && strchr(set, **p))
                (*p)++;
        return *p > start;
}

#define DIGITS "0123456789"

static bool text_is_float(const char *s) {
        static const char *const special[] = {
                ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF",
                ".nan", ".NaN", ".NAN",
        };
        const char *p = s;

        if (is_one_of(s, special, ELEMENTSOF(special)))
                return true;
        if (*p == '-' || *p == '+')
                p++;
        if (*p == '.') {
                p++;
                if (!span_digits(&p, DIGITS))
                        return false;
        } else {
                if (!span_digits(&p, DIGITS))
                        return false;
                if (*p == '.') {
                        p++;
                        (void) span_digits(&p, DIGITS);
                }
        }
        if (*p == 'e' || *p == 'E') {
                p++;
                if (*p == '-' || *p == '+')
                        p++;
                if (!span_digits(&p, DIGITS))
                        return false;
        }
        return *p == 0;
}

int ynode_scalar_resolve(const YNode *n, Value *ret, const char **ret_problem) {
        static const char *const nulls[] = { "", "~", "null", "Null", "NULL" };
        static const char *const trues[] = { "true", "True", "TRUE" };
        static const char *const falses[] = { "false", "False", "FALSE" };
        const char *s = n->text, *tag = n->tag;
        Value v = { .kind = VALUE_STRING };

        if ((!tag && !n->plain) || (tag && (streq(tag, YAML_STR_TAG) || streq(tag, "!")))) {
                v.s = strdup(s);
                if (!v.s)
                        return -ENOMEM;
                *ret = v;
                return 0;
        }

        if (is_one_of(s, nulls, ELEMENTSOF(nulls)))
                v.kind = VALUE_NONE;
        else if (is_one_of(s, trues, ELEMENTSOF(trues)))
                v = (Value) { .kind = VALUE_BOOL, .b = true };
        else if (is_one_of(s, falses, ELEMENTSOF(falses)))
                v = (Value) { .kind = VALUE_BOOL, .b = false };
        else {
                const char *p = s, *digits;
                int base = 10;

                if (strncmp(s, "0o", 2) == 0 && s[2]) {
                        base = 8;
                        digits = s + 2;
                } else if (strncmp(s, "0x", 2) == 0 && s[2]) {
                        base = 16;
                        digits = s + 2;
                } else {
                        if (*p == '-' || *p == '+')
                                p++;
                        digits = s;
                }

                p = base == 10 ? p : digits;
                if (span_digits(&p, base == 8 ? "01234567" : base == 16 ? DIGITS "abcdefABCDEF" : DIGITS) &&
                    *p == 0) {
                        char *end;
                        errno = 0;
                        long long i = strtoll(digits, &end, base);
                        if (errno == ERANGE || *end) {
                                *ret_problem = "integer out of range";
                                return -EINVAL;
                        }
                        v = (Value) { .kind = VALUE_INT, .i = i };
                } else if (text_is_float(s)) {
                        double f;
                        const char *q = s + (*s == '-' || *s == '+');

                        if (*q == '.' && (q[1] == 'i' || q[1] == 'I'))
                                f = *s == '-' ? -INFINITY : INFINITY;
                        else if (*q == '.' && (q[1] == 'n' || q[1] == 'N'))
                                f = NAN;
                        else {
                                /* strtod follows LC_NUMERIC; familyd never calls setlocale(), so
                                 * this is the "C" locale's '.'. */
                                errno = 0;
                                f = strtod(s, NULL);
                                if (errno == ERANGE && isinf(f)) {
                                        *ret_problem = "number out of range";
                                        return -EINVAL;
                                }
                        }
                        v = (Value) { .kind = VALUE_FLOAT, .f = f };
                } else {
                        v.s = strdup(s);
                        if (!v.s)
                                return -ENOMEM;
                }
        }

        if (tag) {
                bool ok;
                if (streq(tag, YAML_INT_TAG))
                        ok = v.kind == VALUE_INT;
                else if (streq(tag, YAML_FLOAT_TAG)) {
                        ok = v.kind == VALUE_FLOAT || v.kind == VALUE_INT;
                        if (v.kind == VALUE_INT)
                                v = (Value) { .kind = VALUE_FLOAT, .f = (double) v.i };
                } else if (streq(tag, YAML_BOOL_TAG))
                        ok = v.kind == VALUE_BOOL;
                else
                        ok = v.kind == VALUE_NONE;
                if (!ok) {
                        value_done(&v);
                        *ret_problem = "value does not match its tag";
                        return -EINVAL;
                }
        }

        *ret = v;
        return 0;
}
