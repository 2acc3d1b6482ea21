/* fuzz-expr.c: shape expressions (daemon/core/expr.c): parse, canonical text, fields, eval. */

/*
 * An input is the expression text up to its first NUL; the bytes after it give the fields'
 * values (8 bytes each, little-endian, picked by a hash of the name; a name whose first byte
 * hashes to a multiple of 7 is missing, to 11 is not an integer). Besides "no crash", it checks
 * what the registry loader and Build rely on:
 *  - a failed parse leaves a message; a parse succeeds for the canonical text of an accepted one,
 *    and that text is a fixed point (parse(to_string(e)) prints the same);
 *  - the original and the re-parsed tree evaluate alike (value, or the same failure);
 *  - every field expr_foreach_field() names occurs in the text, once.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/expr.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct Values {
        const uint8_t *bytes;
        size_t size;
} Values;

static uint32_t hash(const char *s) {
        uint32_t h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (uint8_t) *s) * 16777619u;
        return h;
}

static int lookup(const char *name, int64_t *ret, void *userdata) {
        const Values *v = userdata;
        uint32_t h = hash(name);

        if (h % 7 == 0)
                return -ENOENT;
        if (h % 11 == 0)
                return -EDOM;
        if (v->size < 8) {
                *ret = (int64_t) (h % 64); /* small sizes, as in a model config */
                return 0;
        }
        size_t at = (h % (v->size / 8)) * 8;
        uint64_t x = 0;
        for (unsigned i = 0; i < 8; i++)
                x |= (uint64_t) v->bytes[at + i] << (8 * i);
        *ret = (int64_t) x;
        return 0;
}

typedef struct Seen {
        const char *text;
        const char *names[64];
        size_t n;
} Seen;

static int check_field(const char *name, void *userdata) {
        Seen *s = userdata;

        if (!*name || !strstr(s->text, name))
                abort();
        for (size_t i = 0; i < s->n && i < ELEMENTSOF(s->names); i++)
                if (streq(s->names[i], name))
                        abort(); /* named twice */
        if (s->n < ELEMENTSOF(s->names))
                s->names[s->n] = name;
        s->n++;
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const uint8_t *nul = memchr(data, 0, size);
        size_t len = nul ? (size_t) (nul - data) : size;
        Values values = { nul ? nul + 1 : NULL, nul ? size - len - 1 : 0 };
        _cleanup_free_ char *text = strndup((const char *) data, len);
        _cleanup_free_ char *message = NULL, *canonical = NULL, *again = NULL;
        _cleanup_(expr_freep) Expr *e = NULL, *e2 = NULL;

        if (!text)
                abort();
        int r = expr_parse(text, &e, &message);
        if (r < 0) {
                if (r == -EINVAL && !message)
                        abort(); /* a syntax error always says why */
                return 0;
        }

        canonical = expr_to_string(e);
        if (!canonical)
                abort();
        r = expr_parse(canonical, &e2, NULL);
        if (r < 0) {
                fprintf(stderr, "fuzz-expr: canonical text of '%s' does not parse: '%s'\n", text,
                        canonical);
                abort();
        }
        again = expr_to_string(e2);
        if (!again || !streq(again, canonical)) {
                fprintf(stderr, "fuzz-expr: '%s' -> '%s' -> '%s'\n", text, canonical,
                        strempty(again));
                abort();
        }

        Seen seen = { .text = text };
        if (expr_foreach_field(e, check_field, &seen) < 0)
                abort();
        const char *name;
        if (expr_is_field(e, &name) && (seen.n != 1 || !streq(name, seen.names[0])))
                abort();

        int64_t v1 = 0, v2 = 0;
        ExprEvalError err1 = {}, err2 = {};
        int r1 = expr_eval(e, lookup, &values, &v1, &err1);
        int r2 = expr_eval(e2, lookup, &values, &v2, &err2);
        if (r1 != r2 || (r1 >= 0 && v1 != v2) || (r1 < 0 && err1.failure != err2.failure)) {
                fprintf(stderr, "fuzz-expr: '%s' and '%s' evaluate differently\n", text,
                        canonical);
                abort();
        }
        if (r1 < 0 && (err1.failure <= EXPR_FAILURE_NONE || err1.failure >= _EXPR_FAILURE_MAX))
                abort();
        return 0;
}
