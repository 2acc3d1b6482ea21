/* repr.c: Python-repr formatting of strings, string lists and tuples, int lists. */
#include <inttypes.h>
#include <stdio.h>

#include "common/macro.h"
#include "repr.h"

typedef struct Buffer {
        char *data;
        size_t n;
        size_t allocated;
        bool oom;
} Buffer;

static void buffer_append(Buffer *b, const char *s, size_t len) {
        if (b->oom)
                return;
        if (!GREEDY_REALLOC(b->data, b->allocated, b->n + len + 1)) {
                b->oom = true;
                return;
        }
        memcpy(b->data + b->n, s, len);
        b->n += len;
        b->data[b->n] = 0;
}

static void buffer_puts(Buffer *b, const char *s) {
        buffer_append(b, s, strlen(s));
}

static char *buffer_finish(Buffer *b) {
        if (b->oom) {
                free(b->data);
                return NULL;
        }
        if (!b->data)
                return strdup("");
        return b->data;
}

/* Python's repr: single quotes unless the text holds ' and no ", backslash escapes. */
static void buffer_repr(Buffer *b, const char *s) {
        char quote = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';

        buffer_append(b, &quote, 1);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                char tmp[8];
                if (*p == '\\')
                        buffer_puts(b, "\\\\");
                else if (*p == (unsigned char) quote) {
                        tmp[0] = '\\';
                        tmp[1] = quote;
                        buffer_append(b, tmp, 2);
                } else if (*p == '\n')
                        buffer_puts(b, "\\n");
                else if (*p == '\r')
                        buffer_puts(b, "\\r");
                else if (*p == '\t')
                        buffer_puts(b, "\\t");
                else if (*p < 0x20 || *p == 0x7f) {
                        snprintf(tmp, sizeof tmp, "\\x%02x", *p);
                        buffer_puts(b, tmp);
                } else
                        buffer_append(b, (const char *) p, 1);
        }
        buffer_append(b, &quote, 1);
}

char *repr_string(const char *s) {
        Buffer b = {};
        buffer_repr(&b, s);
        return buffer_finish(&b);
}

static char *repr_sequence(char *const *items, size_t n, const char *open, const char *close,
                           bool tuple) {
        Buffer b = {};

        buffer_puts(&b, open);
        for (size_t i = 0; i < n; i++) {
                if (i > 0)
                        buffer_puts(&b, ", ");
                buffer_repr(&b, items[i]);
        }
        if (tuple && n == 1)
                buffer_puts(&b, ",");
        buffer_puts(&b, close);
        return buffer_finish(&b);
}

char *repr_string_list(char *const *items, size_t n) {
        return repr_sequence(items, n, "[", "]", false);
}

char *repr_string_tuple(char *const *items, size_t n) {
        return repr_sequence(items, n, "(", ")", true);
}

char *repr_int_list(const int64_t *items, size_t n) {
        Buffer b = {};

        buffer_puts(&b, "[");
        for (size_t i = 0; i < n; i++) {
                char tmp[32];
                snprintf(tmp, sizeof tmp, "%s%" PRId64, i > 0 ? ", " : "", items[i]);
                buffer_puts(&b, tmp);
        }
        buffer_puts(&b, "]");
        return buffer_finish(&b);
}
