/* format.c: familyctl's parsing of command-line values and human-readable printing of results. */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "familyctl.h"
#include "common/macro.h"

/* Key column of key/value output: wide enough for "registry generation". */
#define FIELD_KEY_WIDTH 21

int ctl_parse_int64(const char *s, int64_t *ret) {
        char *end;
        long long v;

        if (isempty(s))
                return -EINVAL;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (errno != 0 || *end != 0)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* "0,1,2,3" or ranges "0-3,8-11". */
int ctl_parse_ranks(const char *s, int64_t **ret, size_t *ret_n) {
        _cleanup_free_ char *copy = strdup(s);
        _cleanup_free_ int64_t *ranks = NULL;
        char *save = NULL;
        size_t n = 0;

        if (!copy)
                return -ENOMEM;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                char *dash = strchr(tok + 1, '-');   /* +1: a leading '-' is a sign */
                int64_t lo, hi;

                if (dash) {
                        *dash = 0;
                        if (ctl_parse_int64(tok, &lo) < 0 || ctl_parse_int64(dash + 1, &hi) < 0 ||
                            lo > hi || hi - lo >= 1 << 20)
                                return -EINVAL;
                } else {
                        if (ctl_parse_int64(tok, &lo) < 0)
                                return -EINVAL;
                        hi = lo;
                }
                for (int64_t r = lo; r <= hi; r++) {
                        int64_t *grown = realloc(ranks, (n + 1) * sizeof(*ranks));

                        if (!grown)
                                return -ENOMEM;
                        ranks = grown;
                        ranks[n++] = r;
                }
        }
        if (n == 0)
                return -EINVAL;
        *ret = TAKE_PTR(ranks);
        *ret_n = n;
        return 0;
}

/* key=value from the command line: true/false are bools, an integer is an int, a number with
 * '.', 'e' or 'E' is a float, anything else a string. */
int ctl_parse_value(const char *text, Familyd__V1__Value *v) {
        int64_t i;
        char *end;
        double d;

        familyd__v1__value__init(v);
        if (streq(text, "true") || streq(text, "false")) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                v->bool_value = streq(text, "true");
                return 0;
        }
        if (ctl_parse_int64(text, &i) >= 0) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                v->int_value = i;
                return 0;
        }
        if (strpbrk(text, ".eE") && !isempty(text)) {
                errno = 0;
                d = strtod(text, &end);
                if (errno == 0 && *end == 0 && end != text) {
                        v->kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                        v->double_value = d;
                        return 0;
                }
        }
        v->kind_case = FAMILYD__V1__VALUE__KIND_STRING_VALUE;
        v->string_value = (char *) text;
        return 0;
}

void ctl_mesh_dims_free(Familyd__V1__MeshDim **dims, size_t n) {
        for (size_t i = 0; i < n; i++) {
                if (!dims[i])
                        continue;
                free(dims[i]->name);
                free(dims[i]);
        }
        free(dims);
}

int ctl_parse_mesh_dims(const char *s, Familyd__V1__MeshDim ***ret_dims, size_t *ret_n) {
        _cleanup_free_ char *copy = NULL;
        Familyd__V1__MeshDim **dims = NULL;
        size_t n = 0;
        char *save = NULL;

        if (isempty(s))
                return -EINVAL;
        copy = strdup(s);
        if (!copy)
                return -ENOMEM;

        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(tok, '=');
                Familyd__V1__MeshDim **grown;
                int64_t size;

                /* Names and sizes are the daemon's to judge (its messages are the documented
                 * ones); only text that is not NAME=INTEGER is refused here. */
                if (!eq || ctl_parse_int64(eq + 1, &size) < 0) {
                        ctl_mesh_dims_free(dims, n);
                        return -EINVAL;
                }
                *eq = 0;

                grown = realloc(dims, (n + 1) * sizeof(*dims));
                if (!grown) {
                        ctl_mesh_dims_free(dims, n);
                        return -ENOMEM;
                }
                dims = grown;
                dims[n] = malloc(sizeof(**dims));
                if (!dims[n]) {
                        ctl_mesh_dims_free(dims, n);
                        return -ENOMEM;
                }
                familyd__v1__mesh_dim__init(dims[n]);
                dims[n]->size = size;
                dims[n]->name = strdup(tok);
                n++;
                if (!dims[n - 1]->name) {
                        ctl_mesh_dims_free(dims, n);
                        return -ENOMEM;
                }
        }
        if (n == 0)
                return -EINVAL;

        *ret_dims = dims;
        *ret_n = n;
        return 0;
}

/* As Python's repr() prints a float, since the daemon's messages quote values that way: the
 * shortest digits that read back exactly, fixed notation for 1e-4 <= |d| < 1e16 with at least
 * one decimal ("1000.0"), exponent notation outside ("1e+16", "1.5e-05"). */
static void double_print(FILE *f, double d) {
        char buf[64];
        int prec, exp;

        if (isnan(d)) {
                fputs("nan", f);
                return;
        }
        if (isinf(d)) {
                fputs(d > 0 ? "inf" : "-inf", f);
                return;
        }
        for (prec = 0; prec < 17; prec++) {
                (void) snprintf(buf, sizeof(buf), "%.*e", prec, d);
                if (strtod(buf, NULL) == d)
                        break;
        }
        exp = atoi(strchr(buf, 'e') + 1);
        if (d == 0 || (exp >= -4 && exp < 16)) {
                (void) snprintf(buf, sizeof(buf), "%.*f", prec - exp > 0 ? prec - exp : 0, d);
                fputs(buf, f);
                if (!strchr(buf, '.'))
                        fputs(".0", f);
                return;
        }
        fputs(buf, f);
}

static void value_print(FILE *f, const Familyd__V1__Value *v) {
        if (!v) {
                fputs("None", f);
                return;
        }
        switch (v->kind_case) {
        case FAMILYD__V1__VALUE__KIND_BOOL_VALUE:
                fputs(v->bool_value ? "true" : "false", f);
                break;
        case FAMILYD__V1__VALUE__KIND_INT_VALUE:
                fprintf(f, "%" PRId64, v->int_value);
                break;
        case FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE:
                double_print(f, v->double_value);
                break;
        case FAMILYD__V1__VALUE__KIND_STRING_VALUE:
                fprintf(f, "'%s'", strempty(v->string_value));
                break;
        case FAMILYD__V1__VALUE__KIND_LIST_VALUE:
                fputc('[', f);
                if (v->list_value)
                        for (size_t i = 0; i < v->list_value->n_values; i++) {
                                if (i > 0)
                                        fputs(", ", f);
                                value_print(f, v->list_value->values[i]);
                        }
                fputc(']', f);
                break;
        default:
                fputs("None", f);
        }
}

char *ctl_value_to_string(const Familyd__V1__Value *v) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        value_print(f, v);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

char *ctl_mesh_dims_to_string(Familyd__V1__MeshDim *const *dims, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%s=%" PRId64, i > 0 ? "," : "", strempty(dims[i]->name), dims[i]->size);
        if (n == 0)
                fputc('-', f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

int64_t ctl_now_unix_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *ctl_time_to_string(int64_t unix_ms) {
        time_t t = (time_t) (unix_ms / 1000);
        char text[64];
        struct tm tm;

        if (!localtime_r(&t, &tm) || strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S%z", &tm) == 0)
                return strdup("-");
        return strdup(text);
}

/* 0,1,2,3,5 prints as 0-3,5: meshes usually hold long runs of consecutive ranks. */
char *ctl_ranks_to_string(const int64_t *ranks, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t i = 0; i < n;) {
                size_t j = i;

                while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
                        j++;
                fprintf(f, "%s%" PRId64, i > 0 ? "," : "", ranks[i]);
                if (j > i)
                        fprintf(f, "%s%" PRId64, j == i + 1 ? "," : "-", ranks[j]);
                i = j + 1;
        }
        if (n == 0)
                fputc('-', f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

void ctl_print_field(const char *key, const char *fmt, ...) {
        va_list ap;

        printf("%-*s ", FIELD_KEY_WIDTH, key);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
}

char *ctl_shape_to_string(const int64_t *dims, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        fputc('[', f);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%" PRId64, i > 0 ? "," : "", dims[i]);
        fputc(']', f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

void ctl_json_string(FILE *f, const char *s) {
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) strempty(s); *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}
