/* table.c: aligned text tables for familyctl's human output. */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "macro.h"

/* Cells are stored row-major; the first n_columns are the headers. */
struct Table {
        size_t n_columns;
        char **cells;
        size_t n_cells;
};

Table *table_new(size_t n_columns, ...) {
        Table *t;
        va_list ap;

        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        t->n_columns = n_columns;

        va_start(ap, n_columns);
        for (size_t i = 0; i < n_columns; i++)
                if (table_add_cell(t, va_arg(ap, const char *)) < 0) {
                        va_end(ap);
                        return table_free(t);
                }
        va_end(ap);
        return t;
}

Table *table_free(Table *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_cells; i++)
                free(t->cells[i]);
        free(t->cells);
        free(t);
        return NULL;
}

static int table_take_cell(Table *t, char *s) {
        char **grown;

        if (!s)
                return -ENOMEM;
        grown = realloc(t->cells, (t->n_cells + 1) * sizeof(*t->cells));
        if (!grown) {
                free(s);
                return -ENOMEM;
        }
        t->cells = grown;
        t->cells[t->n_cells++] = s;
        return 0;
}

int table_add_cell(Table *t, const char *text) {
        return table_take_cell(t, strdup(isempty(text) ? "-" : text));
}

int table_add_cellf(Table *t, const char *fmt, ...) {
        char *s;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        return table_take_cell(t, s);
}

int table_print(const Table *t, FILE *f) {
        _cleanup_free_ size_t *width = NULL;

        width = calloc(t->n_columns, sizeof(*width));
        if (!width)
                return -ENOMEM;
        for (size_t i = 0; i < t->n_cells; i++) {
                size_t l = strlen(t->cells[i]);

                if (l > width[i % t->n_columns])
                        width[i % t->n_columns] = l;
        }

        for (size_t i = 0; i < t->n_cells; i++) {
                size_t col = i % t->n_columns;
                bool last = col == t->n_columns - 1 || i == t->n_cells - 1;

                /* No trailing blanks: the last column is not padded. */
                if (last)
                        fprintf(f, "%s\n", t->cells[i]);
                else
                        fprintf(f, "%-*s  ", (int) width[col], t->cells[i]);
        }
        return 0;
}
