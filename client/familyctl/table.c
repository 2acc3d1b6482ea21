/* table.c: familyctl's tables, printed by libsmartcols: -o/--output picks and orders the
 * columns, --noheadings leaves out the headings, --raw prints libsmartcols' raw form. */

#include <errno.h>
#include <libsmartcols.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "familyctl.h"
#include "common/macro.h"

struct Table {
        struct libscols_table *tb;
        size_t n_columns;                       /* every column of the table */
        struct libscols_column **shown;         /* per column: libsmartcols', NULL if -o omits it */
        size_t n_shown;
        struct libscols_line *line;             /* the row being filled */
        size_t n_cells;                         /* cells added so far */
};

static size_t columns_count(const char *const *columns) {
        size_t n = 0;

        while (columns[n])
                n++;
        return n;
}

static ssize_t column_index(const char *const *columns, const char *name) {
        for (size_t i = 0; columns[i]; i++)
                if (strcasecmp(columns[i], name) == 0)
                        return (ssize_t) i;
        return -1;
}

static int table_show(Table *t, const char *const *columns, size_t i) {
        if (t->shown[i])
                return 0;
        t->shown[i] = scols_table_new_column(t->tb, columns[i], 0, 0);
        if (!t->shown[i])
                return -ENOMEM;
        t->n_shown++;
        return 0;
}

/* The columns o->columns names, in its order; those of other tables are skipped (the list was
 * checked against all of the verb's tables). */
static int table_show_listed(Table *t, const char *const *columns, const char *list) {
        _cleanup_free_ char *copy = strdup(list);
        char *p = copy, *name;

        if (!copy)
                return -ENOMEM;
        while ((name = strsep(&p, ","))) {
                ssize_t i = column_index(columns, name);

                if (i >= 0 && table_show(t, columns, (size_t) i) < 0)
                        return -ENOMEM;
        }
        return 0;
}

Table *table_new(const TableOptions *o, const char *const *columns) {
        Table *t;
        int r = 0;

        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        t->n_columns = columns_count(columns);
        t->shown = calloc(t->n_columns, sizeof(*t->shown));
        t->tb = scols_new_table();
        if (!t->shown || !t->tb)
                return table_free(t);

        /* The same output on a terminal and in a pipe: nothing is cut to the terminal's width. */
        (void) scols_table_set_termforce(t->tb, SCOLS_TERMFORCE_NEVER);
        if (o->raw)
                (void) scols_table_enable_raw(t->tb, 1);
        else
                r = scols_table_set_column_separator(t->tb, "  ");
        if (o->noheadings)
                (void) scols_table_enable_noheadings(t->tb, 1);

        if (r >= 0 && o->columns)
                r = table_show_listed(t, columns, o->columns);
        else
                for (size_t i = 0; r >= 0 && i < t->n_columns; i++)
                        r = table_show(t, columns, i);
        if (r < 0)
                return table_free(t);
        return t;
}

Table *table_free(Table *t) {
        if (!t)
                return NULL;
        scols_unref_table(t->tb);
        free(t->shown);
        free(t);
        return NULL;
}

int table_add_cell(Table *t, const char *text) {
        size_t col = t->n_cells % t->n_columns;

        if (col == 0) {
                t->line = scols_table_new_line(t->tb, NULL);
                if (!t->line)
                        return -ENOMEM;
        }
        t->n_cells++;
        if (!t->shown[col])
                return 0;
        return scols_line_set_column_data(t->line, t->shown[col], isempty(text) ? "-" : text);
}

int table_add_cellf(Table *t, const char *fmt, ...) {
        _cleanup_free_ char *s = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (r < 0) {
                s = NULL;
                return -ENOMEM;
        }
        return table_add_cell(t, s);
}

int table_print(Table *t, bool blank_line_before) {
        int r;

        if (t->n_shown == 0)
                return EXIT_OK;
        if (blank_line_before)
                putchar('\n');
        r = scols_print_table(t->tb);
        if (r < 0)
                return ctl_fail("print a table", r, NULL);
        return EXIT_OK;
}

/* "NAME, BASELINE, ...": every column of the verb's tables, each once. */
static char *columns_known(const char *const *const *tables) {
        char *buf = NULL;
        size_t size = 0;
        bool first = true;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t t = 0; tables[t]; t++)
                for (size_t c = 0; tables[t][c]; c++) {
                        bool seen = false;

                        for (size_t u = 0; u < t && !seen; u++)
                                seen = column_index(tables[u], tables[t][c]) >= 0;
                        if (seen)
                                continue;
                        fprintf(f, "%s%s", first ? "" : ", ", tables[t][c]);
                        first = false;
                }
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static bool column_known(const char *const *const *tables, const char *name) {
        for (size_t t = 0; tables[t]; t++)
                if (column_index(tables[t], name) >= 0)
                        return true;
        return false;
}

int table_check_columns(const char *verb, const char *list, const char *const *const *tables) {
        _cleanup_free_ char *copy = strdup(list);
        char *p = copy, *name;

        if (!copy)
                return ctl_fail("parse --output", -ENOMEM, NULL);
        while ((name = strsep(&p, ","))) {
                if (isempty(name))
                        return ctl_usage_error(verb, "--output needs column names separated by commas, not '%s'", list);
                if (!column_known(tables, name)) {
                        _cleanup_free_ char *known = columns_known(tables);

                        return ctl_usage_error(verb, "unknown column '%s' (columns: %s)", name, strempty(known));
                }
                /* The names before this one: copy holds them NUL-separated. */
                for (const char *q = copy; q < name; q += strlen(q) + 1)
                        if (strcasecmp(q, name) == 0)
                                return ctl_usage_error(verb, "column '%s' given twice in --output", name);
        }
        return EXIT_OK;
}
