/* familyctl.h: what the verbs of familyctl share: the context, exit codes, the verb skeleton,
 * tables, JSON input and output helpers. */
#pragma once

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "familyd.h"

/* Exit codes, also listed in `familyctl --help` (scripts and tests rely on them). */
enum {
        EXIT_OK          = 0,   /* the call succeeded */
        EXIT_DAEMON      = 1,   /* the daemon answered an error status (see ctl_fail) */
        EXIT_USAGE       = 2,   /* bad command line; nothing was sent */
        EXIT_UNREACHABLE = 3,   /* no socket, UNAVAILABLE, or DEADLINE_EXCEEDED */
        EXIT_INTERNAL    = 4,   /* INTERNAL, UNKNOWN, DATA_LOSS, or a local failure */
};

/* How tables print: -o/--output, --noheadings, --raw of the verbs that print tables. */
typedef struct TableOptions {
        const char *columns;            /* comma-separated names (case-insensitive); NULL: all */
        bool noheadings;
        bool raw;
} TableOptions;

typedef struct Context {
        const char *socket_path;        /* NULL: $FAMILYD_SOCKET, then the built-in default */
        uint32_t timeout_ms;
        bool timeout_set;
        bool json;
        TableOptions table;
        FamilydClient *client;
} Context;

/* getopt values of the options that verbs share; a verb's own start at 0x100. */
enum {
        ARG_COMMON_SOCKET = 0x1000,
        ARG_COMMON_JSON,
        ARG_COMMON_TIMEOUT,
        ARG_TABLE_NOHEADINGS,
        ARG_TABLE_RAW,
        ARG_AXIS,               /* ARG_AXIS + 0..3: --tp..--pp; + 4..7: the hidden --tp-size.. */
};

/* Options every verb accepts too, so `familyctl families --json` works like `--json families`. */
#define COMMON_LONG_OPTIONS                                                     \
        { "socket",  required_argument, NULL, ARG_COMMON_SOCKET },              \
        { "json",    no_argument,       NULL, ARG_COMMON_JSON },                \
        { "timeout", required_argument, NULL, ARG_COMMON_TIMEOUT },             \
        { "help",    no_argument,       NULL, 'h' }

#define COMMON_OPTIONS_HELP                                                             \
        "  -s, --socket PATH   the daemon's API socket\n"                               \
        "  -j, --json          print the response as proto3 JSON\n"                     \
        "  -t, --timeout MS    deadline of the call in milliseconds (0: none)\n"        \
        "  -h, --help          show this help\n"

/* The axis sizes of a job or a mesh: --tp N, --cp N, --ep N, --pp N, spelt the same by every
 * verb that takes them (resolve, validate, mesh create). --tp-size N, --cp-size N, --ep-size N
 * and --pp-size N, mesh create's spelling in 0.1.0, are kept as hidden aliases (accepted, not
 * in --help) until 0.3.0, so that scripts written for 0.1.0 keep working; remove them then. */
#define AXIS_LONG_OPTIONS                                                       \
        { "tp",      required_argument, NULL, ARG_AXIS + 0 },                   \
        { "cp",      required_argument, NULL, ARG_AXIS + 1 },                   \
        { "ep",      required_argument, NULL, ARG_AXIS + 2 },                   \
        { "pp",      required_argument, NULL, ARG_AXIS + 3 },                   \
        { "tp-size", required_argument, NULL, ARG_AXIS + 4 },                   \
        { "cp-size", required_argument, NULL, ARG_AXIS + 5 },                   \
        { "ep-size", required_argument, NULL, ARG_AXIS + 6 },                   \
        { "pp-size", required_argument, NULL, ARG_AXIS + 7 }

#define AXIS_OPTIONS_HELP                                                               \
        "      --tp N, --cp N, --ep N, --pp N\n"                                        \
        "                      axis sizes (tp_size, cp_size, ep_size, pp_size)\n"

typedef struct AxisSizes {
        int64_t size[4];        /* tp, cp, ep, pp */
        bool set[4];
} AxisSizes;

/* Handles an option of AXIS_LONG_OPTIONS (any integer: the daemon owns "must be a positive
 * integer"); returns EXIT_OK, EXIT_USAGE after the message, or -1 if c is not one. */
int ctl_axis_option(const char *verb, AxisSizes *a, int c, const char *arg);
void ctl_axis_to_context(const AxisSizes *a, Familyd__V1__JobContext *jc);
void ctl_axis_to_mesh(const AxisSizes *a, Familyd__V1__Mesh *m);

/* Handles -s/-j/-t and their long forms; returns EXIT_OK, EXIT_USAGE, or -1 if c is not common. */
int ctl_common_option(Context *ctx, int c, const char *arg);

/* Prints "familyctl: TEXT" and a pointer to --help on stderr; returns EXIT_USAGE. */
int ctl_usage_error(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Creates ctx->client on first use; returns EXIT_OK or an exit code after printing why not. */
int ctl_connect(Context *ctx);

/* Prints the failure of a library call on stderr and returns its exit code. */
int ctl_fail(const char *what, int r, const FamilydError *error);

/* Prints m as pretty proto3 JSON on stdout; returns an exit code. */
int ctl_print_json(const ProtobufCMessage *m);

/* ---------------------------------------------------------------------------------------- */
/* The verb skeleton (verb.c): options, positional arguments, connect, call, print, free. */

typedef struct VerbRun VerbRun;

typedef struct VerbDef {
        const char *name;                       /* in messages: "families", "mesh create" */
        const char *help;                       /* --help, before the table and common options */
        const struct option *options;           /* the verb's own long options, {}-ended, or NULL */
        const char *short_options;              /* the verb's own short options, or NULL */
        int (*option)(VerbRun *v, int c, const char *arg);      /* one of them: an exit code */
        unsigned min_args, max_args;            /* positional arguments */
        const char *args_missing;               /* the usage error for fewer than min_args */
        const char *args_extra;                 /* for more than max_args; NULL: "unexpected
                                                 * argument 'X'" */
        const char *const *const *tables;       /* the columns of each table it prints,
                                                 * NULL-ended; NULL: no tables, no -o */
        size_t state_size;                      /* bytes of v->state (zeroed) */
        int (*prepare)(VerbRun *v);             /* after the options, before connecting: an
                                                 * exit code (see VerbRun.finished) */
        int (*call)(VerbRun *v);                /* the library call: 0 or a negative errno; the
                                                 * answer in v->response, errors in v->error */
        const char *what;                       /* what failed, for ctl_fail: "list families" */
        int (*print)(VerbRun *v);               /* the human form: an exit code; NULL: nothing */
        int (*print_json)(VerbRun *v);          /* NULL: v->response as proto3 JSON, {} if none */
        void (*done)(VerbRun *v);               /* frees what the hooks left in v->state */
} VerbDef;

struct VerbRun {
        Context *ctx;
        const VerbDef *def;
        char **args;                            /* the positional arguments */
        size_t n_args;
        void *state;                            /* def->state_size bytes, the verb's own */
        ProtobufCMessage *response;             /* freed by the skeleton */
        FamilydError error;
        bool finished;                          /* set by prepare: its exit code ends the verb */
};

/* Runs a verb: argv[0] is the verb's name, the options follow in any order with the
 * positional arguments. Returns the exit code. */
int verb_run(Context *ctx, const VerbDef *def, int argc, char **argv);

/* ---------------------------------------------------------------------------------------- */
/* Parsing and formatting (format.c) */

/* Parsing helpers: 0, or -EINVAL when the text is not entirely one number. */
int ctl_parse_int64(const char *s, int64_t *ret);
/* "0,1,2,3" or ranges "0-3,8-11" into a malloc()ed array; -EINVAL on bad text or no ranks. */
int ctl_parse_ranks(const char *s, int64_t **ret, size_t *ret_n);
/* KEY=VALUE's VALUE: true/false -> bool, an integer -> int, a number with '.', 'e' or 'E' ->
 * float, anything else -> string (v->string_value points into text). */
int ctl_parse_value(const char *text, Familyd__V1__Value *v);
/* "dp=2,tp=4" into MeshDim messages (freed with ctl_mesh_dims_free). */
int ctl_parse_mesh_dims(const char *s, Familyd__V1__MeshDim ***ret_dims, size_t *ret_n);
void ctl_mesh_dims_free(Familyd__V1__MeshDim **dims, size_t n);

/* Human output of values: Python-like repr, since the daemon's messages quote that way. */
char *ctl_value_to_string(const Familyd__V1__Value *v);
char *ctl_mesh_dims_to_string(Familyd__V1__MeshDim *const *dims, size_t n);
char *ctl_ranks_to_string(const int64_t *ranks, size_t n);
/* Now, and a time in ms since the Unix epoch as local ISO 8601 ("2026-12-01T13:05:09+0000"). */
int64_t ctl_now_unix_ms(void);
char *ctl_time_to_string(int64_t unix_ms);
/* "[8,64,64]" */
char *ctl_shape_to_string(const int64_t *dims, size_t n);
/* s as a JSON string literal, quotes included. */
void ctl_json_string(FILE *f, const char *s);

/* Key/value lines ("family      x"): column width fixed so that blocks of one verb align. */
void ctl_print_field(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------------------------------- */
/* Tables (table.c, libsmartcols) */

/* A table of the given columns, shown as o asks: the columns -o names that are this table's,
 * in -o's order (none of them: the table is not printed), or all of them. Empty cells print
 * as "-". NULL on OOM. */
typedef struct Table Table;
Table *table_new(const TableOptions *o, const char *const *columns);
Table *table_free(Table *t);
/* Cells fill the rows left to right, a full row of all the table's columns each. */
int table_add_cell(Table *t, const char *text);
int table_add_cellf(Table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the table on stdout, after a blank line when blank_line_before; nothing for a table
 * that -o left without columns. Returns an exit code. */
int table_print(Table *t, bool blank_line_before);
/* Checks -o's names against the verb's tables; a usage error names the valid ones. */
int table_check_columns(const char *verb, const char *list, const char *const *const *tables);

static inline void table_freep(Table **t) {
        table_free(*t);
}

/* ---------------------------------------------------------------------------------------- */
/* JSON input (json-load.c, jansson) */

/* Reads the file path as one JSON document (any value at the top; duplicate object keys
 * refused). On failure prints a usage error of verb and returns its exit code: a file that
 * cannot be read as "LABELPATH: why", a document jansson refuses as "LABELPATH:LINE:COLUMN:
 * why" in jansson's words (prefixed "not JSON: " when the text is not JSON at all). */
int ctl_json_load(const char *verb, const char *label, const char *path, json_t **ret);
/* jansson's json_decrefp() releases a _cleanup_(json_decrefp) json_t *. */

/* ---------------------------------------------------------------------------------------- */
/* familyctl build's progress bar (build-progress.c): started only when stderr is a terminal
 * and --json is not given (*ret NULL otherwise: nothing to do); the Build then carries its
 * tag. Stopping clears the bar's line. */
typedef struct ProgressBar ProgressBar;
int progress_bar_start(const Context *ctx, ProgressBar **ret);
const char *progress_bar_tag(const ProgressBar *b);
ProgressBar *progress_bar_stop(ProgressBar *b);

/* The verbs: each parses its own options from argv (argv[0] is the verb) and returns an exit code. */
int verb_families(Context *ctx, int argc, char **argv);
int verb_family(Context *ctx, int argc, char **argv);
int verb_resolve(Context *ctx, int argc, char **argv);
int verb_mesh(Context *ctx, int argc, char **argv);
int verb_meshes(Context *ctx, int argc, char **argv);
int verb_topology(Context *ctx, int argc, char **argv);
int verb_forget(Context *ctx, int argc, char **argv);
int verb_status(Context *ctx, int argc, char **argv);
int verb_version(Context *ctx, int argc, char **argv);
int verb_reload(Context *ctx, int argc, char **argv);
int verb_keygen(Context *ctx, int argc, char **argv);
int verb_build(Context *ctx, int argc, char **argv);
int verb_builds(Context *ctx, int argc, char **argv);
int verb_build_info(Context *ctx, int argc, char **argv);
int verb_release(Context *ctx, int argc, char **argv);
int verb_pin(Context *ctx, int argc, char **argv);
int verb_unpin(Context *ctx, int argc, char **argv);
int verb_publish(Context *ctx, int argc, char **argv);
int verb_shard(Context *ctx, int argc, char **argv);
int verb_validate(Context *ctx, int argc, char **argv);
int verb_checkpoint(Context *ctx, int argc, char **argv);

/* Shared between verbs */

/* The human form of a topology (topology, its --watch, forget): fields, then the node table
 * and, with devices, the device table. Returns an exit code. */
int print_topology(const TableOptions *o, const Familyd__V1__Topology *topo, bool devices);
/* topology --watch: until the daemon ends it, count topologies were printed (0: no limit),
 * SIGINT or SIGTERM, or stdout's reader leaves. Returns an exit code. */
int topology_watch(Context *ctx, bool devices, uint64_t count);

/* The BuildRequest of `familyctl build` (build-request.c). Each returns an exit code, after a
 * message when not EXIT_OK. */
/* --arg KEY=VALUE: a selector or argument (a later one replaces an earlier of the same key). */
int build_request_argument(Familyd__V1__BuildRequest *req, const char *kv);
/* --dtype-of NAME=DTYPE: one parameter's dtype (BuildRequest.parameter_dtypes). */
int build_request_parameter_dtype(Familyd__V1__BuildRequest *req, const char *kv);
/* KEY=VALUE: a config field, over --config's. */
int build_request_config_field(Familyd__V1__BuildRequest *req, const char *kv);
/* --config FILE.json: a JSON object of field names to numbers, strings, bools, lists of them. */
int build_request_config_file(Familyd__V1__BuildRequest *req, const char *path);
/* --module FILE.json: {"fqn": ..., "parameters": [{"name", "shape", "dtype"}]}. */
int build_request_module_file(Familyd__V1__BuildRequest *req, const char *path);

/* validate's model file into req (validate-model.c): its boundaries and context (req->context
 * must be allocated). Returns an exit code, after a message when not EXIT_OK: "PATH: WHERE:
 * WHAT" for a file that is JSON but not a model. */
int validate_model_load(const char *path, Familyd__V1__ValidateRequest *req);
