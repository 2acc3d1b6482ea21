/* checkpoint-source.c: where a parameter's values come from in a checkpoint: tensor names, stacking, concatenation, transposes. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "checkpoint-source.h"

void checkpoint_source_done(CheckpointSource *s) {
        if (!s)
                return;
        for (size_t i = 0; i < s->n_parts; i++)
                free(s->parts[i].tensor);
        free(s->parts);
        free(s->stack_key);
        free(s->text);
        *s = (CheckpointSource) {};
}

/* The placeholder starting at t[0] == '{': its name's length, or -1 when it is not closed. */
static ssize_t placeholder_length(const char *t) {
        const char *end = strchr(t + 1, '}');
        const char *open = strchr(t + 1, '{');

        if (!end || (open && open < end))
                return -1;
        return end - t - 1;
}

static bool placeholder_is(const char *t, size_t n, const char *name) {
        return name && strlen(name) == n && strncmp(t + 1, name, n) == 0;
}

int checkpoint_template_check(const char *t, const char *stack_key, char *why, size_t why_size) {
        bool has_key = false;

        if (isempty(t) || strlen(t) > CHECKPOINT_TEMPLATE_MAX) {
                (void) snprintf(why, why_size, "a tensor name must have 1 to %d bytes",
                                CHECKPOINT_TEMPLATE_MAX);
                return -EINVAL;
        }
        for (const char *p = t; *p; p++) {
                if (*p == '}') {
                        (void) snprintf(why, why_size, "'}' at column %zu closes no '{'",
                                        (size_t) (p - t) + 1);
                        return -EINVAL;
                }
                if (*p != '{')
                        continue;
                ssize_t n = placeholder_length(p);
                if (n < 0) {
                        (void) snprintf(why, why_size, "'{' at column %zu is not closed",
                                        (size_t) (p - t) + 1);
                        return -EINVAL;
                }
                if (placeholder_is(p, (size_t) n, stack_key))
                        has_key = true;
                else if (!placeholder_is(p, (size_t) n, "prefix")) {
                        (void) snprintf(why, why_size,
                                        "unknown placeholder '{%.*s}' (only {prefix}%s%s%s)",
                                        (int) (n > 64 ? 64 : n), p + 1, stack_key ? " and {" : "",
                                        stack_key ? stack_key : "", stack_key ? "}" : "");
                        return -EINVAL;
                }
                p += n + 1;
        }
        if (stack_key && !has_key) {
                (void) snprintf(why, why_size, "a stacked tensor's name must use {%s}", stack_key);
                return -EINVAL;
        }
        return 0;
}

int checkpoint_tensor_name(const char *t, const char *prefix, const char *stack_key,
                           int64_t index, char **ret) {
        _cleanup_free_ char *out = NULL;
        char number[24];
        size_t at = 0;

        out = malloc(CHECKPOINT_TEMPLATE_MAX + 1);
        if (!out)
                return -ENOMEM;
        (void) snprintf(number, sizeof number, "%" PRId64, index);
        for (const char *p = t; *p;) {
                const char *piece = p;
                size_t len = 1;
                if (*p == '{') {
                        ssize_t n = placeholder_length(p);
                        if (n < 0)
                                return -EINVAL;
                        if (placeholder_is(p, (size_t) n, "prefix")) {
                                piece = strempty(prefix);
                                len = strlen(piece);
                                /* No prefix: no "{prefix}." either. */
                                if (len == 0 && p[n + 2] == '.')
                                        p++;
                        } else if (placeholder_is(p, (size_t) n, stack_key)) {
                                piece = number;
                                len = strlen(number);
                        } else
                                return -EINVAL;
                        p += n + 2;
                } else
                        p++;
                if (at + len > CHECKPOINT_TEMPLATE_MAX)
                        return -ENAMETOOLONG;
                memcpy(out + at, piece, len);
                at += len;
        }
        out[at] = 0;
        *ret = TAKE_PTR(out);
        return 0;
}

int checkpoint_source_make_text(CheckpointSource *s) {
        _cleanup_free_ char *text = NULL;
        size_t size = 64;

        for (size_t i = 0; i < s->n_parts; i++)
                size += strlen(s->parts[i].tensor) + 32;
        text = malloc(size);
        if (!text)
                return -ENOMEM;
        size_t at = 0;
        if (s->stack)
                at += (size_t) snprintf(text + at, size - at, "stack(dim=%" PRId64 ", key=%s): ",
                                        s->stack_dim, s->stack_key);
        if (s->concat)
                at += (size_t) snprintf(text + at, size - at, "concat(dim=%" PRId64 "): ",
                                        s->concat_dim);
        for (size_t i = 0; i < s->n_parts; i++)
                at += (size_t) snprintf(text + at, size - at, "%s%s%s", i ? ", " : "",
                                        s->parts[i].tensor,
                                        s->parts[i].transpose ? " (transposed)" : "");
        free(s->text);
        s->text = TAKE_PTR(text);
        return 0;
}

int checkpoint_source_copy(const CheckpointSource *s, CheckpointSource *ret) {
        _cleanup_(checkpoint_source_done) CheckpointSource c = {
                .concat = s->concat,
                .concat_dim = s->concat_dim,
                .stack = s->stack,
                .stack_dim = s->stack_dim,
        };

        c.parts = calloc(s->n_parts ? s->n_parts : 1, sizeof *c.parts);
        if (!c.parts)
                return -ENOMEM;
        for (size_t i = 0; i < s->n_parts; i++) {
                c.parts[i].transpose = s->parts[i].transpose;
                c.parts[i].tensor = strdup(s->parts[i].tensor);
                if (!c.parts[i].tensor)
                        return -ENOMEM;
                c.n_parts++;
        }
        if ((s->stack_key && !(c.stack_key = strdup(s->stack_key))) ||
            (s->text && !(c.text = strdup(s->text))))
                return -ENOMEM;
        *ret = c;
        c = (CheckpointSource) {};
        return 0;
}
