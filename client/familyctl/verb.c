/* verb.c: the skeleton every verb runs: its options (its own, the table options, the common
 * ones), the positional arguments, connecting, the call, the human or --json output, freeing. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

/* Room for the common, table and axis options and a verb's own. */
#define VERB_MAX_OPTIONS 40

static const struct option common_options[] = {
        COMMON_LONG_OPTIONS,
};

static const struct option table_options[] = {
        { "output",     required_argument, NULL, 'o' },
        { "noheadings", no_argument,       NULL, ARG_TABLE_NOHEADINGS },
        { "raw",        no_argument,       NULL, ARG_TABLE_RAW },
};

static const char table_options_help[] =
        "Table output:\n"
        "  -o, --output COLUMNS\n"
        "                      the columns to print, comma-separated, in that order\n"
        "                      (names are case-insensitive)\n"
        "      --noheadings    leave out the column headings\n"
        "      --raw           one space between cells; blanks and other special bytes\n"
        "                      in a cell written as \\xHH\n";

static size_t options_add(struct option *to, size_t n, const struct option *from, size_t n_from) {
        for (size_t i = 0; i < n_from && from[i].name; i++) {
                if (n + 1 >= VERB_MAX_OPTIONS)
                        abort();        /* a verb with more options than room: a bug */
                to[n++] = from[i];
        }
        return n;
}

static void verb_help(const VerbDef *def) {
        fputs(def->help, stdout);
        if (def->tables) {
                fputs(table_options_help, stdout);
                for (size_t t = 0; def->tables[t]; t++) {
                        fputs(t == 0 ? "Columns:" : "        ", stdout);
                        for (size_t c = 0; def->tables[t][c]; c++)
                                printf(" %s", def->tables[t][c]);
                        putchar('\n');
                }
                if (def->tables[0] && def->tables[1])
                        fputs("With -o, each table shows the named columns that are its own; a table with\n"
                              "none of them is left out.\n", stdout);
                putchar('\n');
        }
        fputs(COMMON_OPTIONS_HELP, stdout);
}

/* Options other than the verb's own: the table options and the common ones. */
static int verb_shared_option(VerbRun *v, int c, const char *arg) {
        TableOptions *t = &v->ctx->table;
        int r;

        switch (c) {
        case 'o':
                t->columns = arg;
                return EXIT_OK;
        case ARG_TABLE_NOHEADINGS:
                t->noheadings = true;
                return EXIT_OK;
        case ARG_TABLE_RAW:
                t->raw = true;
                return EXIT_OK;
        }
        r = ctl_common_option(v->ctx, c, arg);
        if (r < 0 && v->def->option)
                r = v->def->option(v, c, arg);
        return r < 0 ? EXIT_INTERNAL : r;
}

/* The options, then the positional arguments. EXIT_OK with v->finished after --help. */
static int verb_parse(VerbRun *v, int argc, char **argv) {
        const VerbDef *def = v->def;
        struct option options[VERB_MAX_OPTIONS] = {};
        _cleanup_free_ char *shorts = NULL;
        size_t n = 0;
        int c, r;

        n = options_add(options, n, common_options, ELEMENTSOF(common_options));
        if (def->tables)
                n = options_add(options, n, table_options, ELEMENTSOF(table_options));
        if (def->options)
                n = options_add(options, n, def->options, SIZE_MAX);
        if (asprintf(&shorts, "s:jt:h%s%s", def->tables ? "o:" : "", strempty(def->short_options)) < 0) {
                shorts = NULL;
                return ctl_fail("parse options", -ENOMEM, NULL);
        }

        while ((c = getopt_long(argc, argv, shorts, options, NULL)) >= 0) {
                if (c == 'h') {
                        verb_help(def);
                        v->finished = true;
                        return EXIT_OK;
                }
                if (c == '?')
                        return ctl_usage_error(def->name, "invalid option");
                r = verb_shared_option(v, c, optarg);
                if (r != EXIT_OK)
                        return r;
        }

        v->args = argv + optind;
        v->n_args = (size_t) (argc - optind);
        if (v->n_args < def->min_args)
                return ctl_usage_error(def->name, "%s", def->args_missing);
        if (v->n_args > def->max_args) {
                if (def->args_extra)
                        return ctl_usage_error(def->name, "%s", def->args_extra);
                return ctl_usage_error(def->name, "unexpected argument '%s'", v->args[def->max_args]);
        }
        if (def->tables && v->ctx->table.columns)
                return table_check_columns(def->name, v->ctx->table.columns, def->tables);
        return EXIT_OK;
}

static int verb_print(VerbRun *v) {
        const VerbDef *def = v->def;

        if (!v->ctx->json)
                return def->print ? def->print(v) : EXIT_OK;
        if (def->print_json)
                return def->print_json(v);
        if (!v->response) {
                puts("{}");
                return EXIT_OK;
        }
        return ctl_print_json(v->response);
}

int verb_run(Context *ctx, const VerbDef *def, int argc, char **argv) {
        _cleanup_free_ void *state = NULL;
        VerbRun v = {
                .ctx = ctx,
                .def = def,
                .error = FAMILYD_ERROR_NULL,
        };
        int r;

        if (def->state_size > 0) {
                state = calloc(1, def->state_size);
                if (!state)
                        return ctl_fail("start", -ENOMEM, NULL);
        }
        v.state = state;

        r = verb_parse(&v, argc, argv);
        if (r == EXIT_OK && !v.finished && def->prepare)
                r = def->prepare(&v);
        if (r == EXIT_OK && !v.finished)
                r = ctl_connect(ctx);
        if (r == EXIT_OK && !v.finished) {
                r = def->call(&v);
                r = r < 0 ? ctl_fail(def->what, r, &v.error) : verb_print(&v);
        }

        familyd_error_clear(&v.error);
        if (v.response)
                protobuf_c_message_free_unpacked(v.response, NULL);
        if (def->done)
                def->done(&v);
        return r;
}

/* ---------------------------------------------------------------------------------------- */
/* Axis sizes */

int ctl_axis_option(const char *verb, AxisSizes *a, int c, const char *arg) {
        static const char *const names[] = { "tp", "cp", "ep", "pp", "tp-size", "cp-size", "ep-size", "pp-size" };
        unsigned i;

        if (c < ARG_AXIS || c >= ARG_AXIS + (int) ELEMENTSOF(names))
                return -1;
        i = (unsigned) (c - ARG_AXIS);
        if (ctl_parse_int64(arg, &a->size[i % 4]) < 0)
                return ctl_usage_error(verb, "--%s needs an integer, not '%s'", names[i], arg);
        a->set[i % 4] = true;
        return EXIT_OK;
}

void ctl_axis_to_context(const AxisSizes *a, Familyd__V1__JobContext *jc) {
        if (a->set[0]) {
                jc->_tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
                jc->tp_size = a->size[0];
        }
        if (a->set[1]) {
                jc->_cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                jc->cp_size = a->size[1];
        }
        if (a->set[2]) {
                jc->_ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                jc->ep_size = a->size[2];
        }
        if (a->set[3]) {
                jc->_pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
                jc->pp_size = a->size[3];
        }
}

void ctl_axis_to_mesh(const AxisSizes *a, Familyd__V1__Mesh *m) {
        if (a->set[0]) {
                m->_tp_size_case = FAMILYD__V1__MESH___TP_SIZE_TP_SIZE;
                m->tp_size = a->size[0];
        }
        if (a->set[1]) {
                m->_cp_size_case = FAMILYD__V1__MESH___CP_SIZE_CP_SIZE;
                m->cp_size = a->size[1];
        }
        if (a->set[2]) {
                m->_ep_size_case = FAMILYD__V1__MESH___EP_SIZE_EP_SIZE;
                m->ep_size = a->size[2];
        }
        if (a->set[3]) {
                m->_pp_size_case = FAMILYD__V1__MESH___PP_SIZE_PP_SIZE;
                m->pp_size = a->size[3];
        }
}
