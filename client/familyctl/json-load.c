/* json-load.c: familyctl's JSON input files (--config, --module, validate's model), read with
 * jansson. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

/* Larger input files are refused (EFBIG): they are hand-written configs and models. */
#define JSON_MAX_FILE_BYTES (16u << 20)

static int read_file(const char *path, char **ret, size_t *ret_size) {
        _cleanup_free_ char *buf = NULL;
        size_t n = 0, cap = 0;
        FILE *f;
        int r = 0;

        f = fopen(path, "re");
        if (!f)
                return -errno;
        for (;;) {
                size_t k;

                if (n == cap) {
                        char *grown;

                        if (cap >= JSON_MAX_FILE_BYTES) {
                                r = -EFBIG;
                                break;
                        }
                        cap = cap ? cap * 2 : 4096;
                        grown = realloc(buf, cap);
                        if (!grown) {
                                r = -ENOMEM;
                                break;
                        }
                        buf = grown;
                }
                k = fread(buf + n, 1, cap - n, f);
                n += k;
                if (k == 0)
                        break;
        }
        if (r == 0 && ferror(f))
                r = errno > 0 ? -errno : -EIO;
        fclose(f);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(buf);
        *ret_size = n;
        return 0;
}

/* jansson reports a duplicate key as `duplicate object key near '"KEY"'`: said as
 * `duplicate object key 'KEY'`. */
static int print_duplicate_key(const char *verb, const char *label, const char *path, const json_error_t *e) {
        static const char prefix[] = "duplicate object key near '\"";
        size_t l = strlen(e->text);

        if (strncmp(e->text, prefix, strlen(prefix)) != 0 || l < strlen(prefix) + 2)
                return ctl_usage_error(verb, "%s%s:%d:%d: %s", label, path, e->line, e->column, e->text);
        return ctl_usage_error(verb, "%s%s:%d:%d: duplicate object key '%.*s'", label, path, e->line, e->column,
                               (int) (l - strlen(prefix) - 2), e->text + strlen(prefix));
}

int ctl_json_load(const char *verb, const char *label, const char *path, json_t **ret) {
        _cleanup_free_ char *text = NULL;
        json_error_t e;
        size_t size = 0;
        json_t *doc;
        int r;

        r = read_file(path, &text, &size);
        if (r == -ENOMEM)
                return ctl_fail("read a JSON file", r, NULL);
        if (r < 0)
                return ctl_usage_error(verb, "%s%s: %s", label, path, strerror(-r));

        doc = json_loadb(text ? text : "", size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &e);
        if (doc) {
                *ret = doc;
                return EXIT_OK;
        }
        switch (json_error_code(&e)) {
        case json_error_out_of_memory:
                return ctl_fail("read a JSON file", -ENOMEM, NULL);
        case json_error_duplicate_key:
                return print_duplicate_key(verb, label, path, &e);
        case json_error_invalid_utf8:
        case json_error_premature_end_of_input:
        case json_error_end_of_input_expected:
        case json_error_invalid_syntax:
                /* Not JSON at all (RFC 8259), as opposed to JSON that familyctl refuses. */
                return ctl_usage_error(verb, "%s%s:%d:%d: not JSON: %s", label, path, e.line, e.column, e.text);
        default:
                return ctl_usage_error(verb, "%s%s:%d:%d: %s", label, path, e.line, e.column, e.text);
        }
}
