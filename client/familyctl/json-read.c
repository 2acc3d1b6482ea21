/* json-read.c: a small strict JSON reader (RFC 8259) for familyctl's --config, --module and model files. */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "macro.h"

#define JSON_MAX_DEPTH 64
#define JSON_MAX_FILE_BYTES (16u << 20)

typedef struct Parser {
        const char *p, *start, *end;
        char *error;
} Parser;

static int parser_fail(Parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int parser_fail(Parser *ps, const char *fmt, ...) {
        _cleanup_free_ char *what = NULL;
        size_t line = 1, col = 1;
        va_list ap;
        int r;

        if (ps->error)
                return -EINVAL;
        for (const char *q = ps->start; q < ps->p; q++) {
                if (*q == '\n') {
                        line++;
                        col = 1;
                } else
                        col++;
        }
        va_start(ap, fmt);
        r = vasprintf(&what, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        if (asprintf(&ps->error, "line %zu, column %zu: %s", line, col, what) < 0) {
                ps->error = NULL;
                return -ENOMEM;
        }
        return -EINVAL;
}

JsonValue *json_value_free(JsonValue *v) {
        if (!v)
                return NULL;
        for (size_t i = 0; i < v->n; i++) {
                json_value_free(v->items[i]);
                if (v->keys)
                        free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
        free(v->string);
        free(v);
        return NULL;
}

static void skip_ws(Parser *ps) {
        while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
                ps->p++;
}

static int hex4(Parser *ps, unsigned *ret) {
        unsigned v = 0;

        if (ps->end - ps->p < 4)
                return parser_fail(ps, "truncated \\u escape");
        for (int i = 0; i < 4; i++) {
                char c = *ps->p++;

                v <<= 4;
                if (c >= '0' && c <= '9')
                        v |= (unsigned) (c - '0');
                else if (c >= 'a' && c <= 'f')
                        v |= (unsigned) (c - 'a' + 10);
                else if (c >= 'A' && c <= 'F')
                        v |= (unsigned) (c - 'A' + 10);
                else
                        return parser_fail(ps, "bad \\u escape");
        }
        *ret = v;
        return 0;
}

static void put_utf8(FILE *f, unsigned cp) {
        if (cp < 0x80)
                fputc((int) cp, f);
        else if (cp < 0x800) {
                fputc((int) (0xc0 | (cp >> 6)), f);
                fputc((int) (0x80 | (cp & 0x3f)), f);
        } else if (cp < 0x10000) {
                fputc((int) (0xe0 | (cp >> 12)), f);
                fputc((int) (0x80 | ((cp >> 6) & 0x3f)), f);
                fputc((int) (0x80 | (cp & 0x3f)), f);
        } else {
                fputc((int) (0xf0 | (cp >> 18)), f);
                fputc((int) (0x80 | ((cp >> 12) & 0x3f)), f);
                fputc((int) (0x80 | ((cp >> 6) & 0x3f)), f);
                fputc((int) (0x80 | (cp & 0x3f)), f);
        }
}

static int parse_string(Parser *ps, char **ret) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;
        int r = 0;

        ps->p++; /* the opening quote */
        f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        for (;;) {
                unsigned char c;

                if (ps->p >= ps->end) {
                        r = parser_fail(ps, "unterminated string");
                        break;
                }
                c = (unsigned char) *ps->p++;
                if (c == '"')
                        break;
                if (c < 0x20) {
                        r = parser_fail(ps, "control character in string");
                        break;
                }
                if (c != '\\') {
                        fputc(c, f);
                        continue;
                }
                if (ps->p >= ps->end) {
                        r = parser_fail(ps, "unterminated string");
                        break;
                }
                c = (unsigned char) *ps->p++;
                switch (c) {
                case '"': case '\\': case '/':
                        fputc(c, f);
                        break;
                case 'b': fputc('\b', f); break;
                case 'f': fputc('\f', f); break;
                case 'n': fputc('\n', f); break;
                case 'r': fputc('\r', f); break;
                case 't': fputc('\t', f); break;
                case 'u': {
                        unsigned cp, lo;

                        r = hex4(ps, &cp);
                        if (r < 0)
                                break;
                        if (cp >= 0xd800 && cp < 0xdc00) {
                                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                                        r = parser_fail(ps, "lone surrogate in \\u escape");
                                        break;
                                }
                                ps->p += 2;
                                r = hex4(ps, &lo);
                                if (r < 0)
                                        break;
                                if (lo < 0xdc00 || lo >= 0xe000) {
                                        r = parser_fail(ps, "bad surrogate pair in \\u escape");
                                        break;
                                }
                                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                        } else if (cp >= 0xdc00 && cp < 0xe000) {
                                r = parser_fail(ps, "lone surrogate in \\u escape");
                                break;
                        } else if (cp == 0) {
                                r = parser_fail(ps, "\\u0000 is not allowed");
                                break;
                        }
                        put_utf8(f, cp);
                        break;
                }
                default:
                        r = parser_fail(ps, "bad escape '\\%c'", c);
                }
                if (r < 0)
                        break;
        }
        if (fclose(f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0) {
                free(buf);
                return r;
        }
        *ret = buf;
        return 0;
}

static int parse_number(Parser *ps, JsonValue *v) {
        const char *s = ps->p;
        _cleanup_free_ char *text = NULL;
        bool is_int = true;
        char *end;

        if (ps->p < ps->end && *ps->p == '-')
                ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
                return parser_fail(ps, "bad number");
        if (*ps->p == '0')
                ps->p++;
        else
                while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
                        ps->p++;
        if (ps->p < ps->end && *ps->p == '.') {
                is_int = false;
                ps->p++;
                if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
                        return parser_fail(ps, "bad number");
                while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
                        ps->p++;
        }
        if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
                is_int = false;
                ps->p++;
                if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
                        ps->p++;
                if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
                        return parser_fail(ps, "bad number");
                while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
                        ps->p++;
        }
        text = strndup(s, (size_t) (ps->p - s));
        if (!text)
                return -ENOMEM;
        v->type = JSON_NUMBER;
        errno = 0;
        v->number = strtod(text, &end);
        if (is_int) {
                errno = 0;
                long long i = strtoll(text, &end, 10);

                /* An integer outside int64 stays a float, as Python's json would not. */
                if (errno == 0) {
                        v->is_int = true;
                        v->integer = i;
                }
        }
        return 0;
}

static int parse_value(Parser *ps, JsonValue **ret, unsigned depth);

static int add_item(JsonValue *v, JsonValue *item, char *key) {
        JsonValue **items = realloc(v->items, (v->n + 1) * sizeof(*items));

        if (!items)
                return -ENOMEM;
        v->items = items;
        if (v->type == JSON_OBJECT) {
                char **keys = realloc(v->keys, (v->n + 1) * sizeof(*keys));

                if (!keys)
                        return -ENOMEM;
                v->keys = keys;
                v->keys[v->n] = key;
        }
        v->items[v->n++] = item;
        return 0;
}

static int parse_container(Parser *ps, JsonValue *v, unsigned depth) {
        bool object = v->type == JSON_OBJECT;
        char close = object ? '}' : ']';
        int r;

        ps->p++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == close) {
                ps->p++;
                return 0;
        }
        for (;;) {
                _cleanup_free_ char *key = NULL;
                JsonValue *item = NULL;

                skip_ws(ps);
                if (object) {
                        if (ps->p >= ps->end || *ps->p != '"')
                                return parser_fail(ps, "expected a string key");
                        r = parse_string(ps, &key);
                        if (r < 0)
                                return r;
                        if (json_object_get(v, key))
                                return parser_fail(ps, "duplicate key '%s'", key);
                        skip_ws(ps);
                        if (ps->p >= ps->end || *ps->p != ':')
                                return parser_fail(ps, "expected ':'");
                        ps->p++;
                }
                r = parse_value(ps, &item, depth + 1);
                if (r < 0)
                        return r;
                r = add_item(v, item, key);
                if (r < 0) {
                        json_value_free(item);
                        return r;
                }
                key = NULL; /* owned by v now */
                skip_ws(ps);
                if (ps->p < ps->end && *ps->p == ',') {
                        ps->p++;
                        continue;
                }
                if (ps->p < ps->end && *ps->p == close) {
                        ps->p++;
                        return 0;
                }
                return parser_fail(ps, "expected ',' or '%c'", close);
        }
}

static bool literal(Parser *ps, const char *word) {
        size_t l = strlen(word);

        if ((size_t) (ps->end - ps->p) < l || memcmp(ps->p, word, l) != 0)
                return false;
        ps->p += l;
        return true;
}

static int parse_value(Parser *ps, JsonValue **ret, unsigned depth) {
        _cleanup_(json_value_freep) JsonValue *v = NULL;
        int r = 0;

        if (depth > JSON_MAX_DEPTH)
                return parser_fail(ps, "nested deeper than %d", JSON_MAX_DEPTH);
        skip_ws(ps);
        if (ps->p >= ps->end)
                return parser_fail(ps, "unexpected end of input");
        v = calloc(1, sizeof(*v));
        if (!v)
                return -ENOMEM;

        switch (*ps->p) {
        case '{':
                v->type = JSON_OBJECT;
                r = parse_container(ps, v, depth);
                break;
        case '[':
                v->type = JSON_ARRAY;
                r = parse_container(ps, v, depth);
                break;
        case '"':
                v->type = JSON_STRING;
                r = parse_string(ps, &v->string);
                break;
        case 't':
        case 'f':
                v->type = JSON_BOOL;
                v->boolean = *ps->p == 't';
                if (!literal(ps, v->boolean ? "true" : "false"))
                        r = parser_fail(ps, "unexpected text");
                break;
        case 'n':
                v->type = JSON_NULL;
                if (!literal(ps, "null"))
                        r = parser_fail(ps, "unexpected text");
                break;
        default:
                r = parse_number(ps, v);
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(v);
        return 0;
}

int json_parse(const char *text, size_t size, JsonValue **ret, char **ret_error_text) {
        Parser ps = { .p = text, .start = text, .end = text + size };
        JsonValue *v = NULL;
        int r;

        *ret_error_text = NULL;
        if (memchr(text, 0, size)) {
                ps.p = memchr(text, 0, size);
                r = parser_fail(&ps, "NUL byte");
                *ret_error_text = ps.error;
                return r;
        }
        r = parse_value(&ps, &v, 0);
        if (r >= 0) {
                skip_ws(&ps);
                if (ps.p < ps.end) {
                        v = json_value_free(v);
                        r = parser_fail(&ps, "trailing text after the document");
                }
        }
        if (r < 0) {
                *ret_error_text = ps.error;
                return r;
        }
        *ret = v;
        return 0;
}

int json_parse_file(const char *path, JsonValue **ret, char **ret_error_text) {
        _cleanup_free_ char *buf = NULL;
        size_t n = 0, cap = 0;
        FILE *f;

        *ret_error_text = NULL;
        f = fopen(path, "re");
        if (!f)
                return -errno;
        for (;;) {
                size_t k;

                if (n == cap) {
                        char *grown;

                        if (cap >= JSON_MAX_FILE_BYTES) {
                                fclose(f);
                                return -EFBIG;
                        }
                        cap = cap ? cap * 2 : 4096;
                        grown = realloc(buf, cap);
                        if (!grown) {
                                fclose(f);
                                return -ENOMEM;
                        }
                        buf = grown;
                }
                k = fread(buf + n, 1, cap - n, f);
                n += k;
                if (k == 0)
                        break;
        }
        if (ferror(f)) {
                int e = errno ? errno : EIO;

                fclose(f);
                return -e;
        }
        fclose(f);
        return json_parse(buf ? buf : "", n, ret, ret_error_text);
}

const JsonValue *json_object_get(const JsonValue *v, const char *key) {
        if (!v || v->type != JSON_OBJECT)
                return NULL;
        for (size_t i = 0; i < v->n; i++)
                if (v->keys[i] && streq(v->keys[i], key))
                        return v->items[i];
        return NULL;
}
