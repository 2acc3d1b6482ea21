/* familyctl.h: what the verbs of familyctl share: the context, exit codes, output helpers. */
#pragma once

#include <getopt.h>
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

typedef struct Context {
        const char *socket_path;        /* NULL: $FAMILYD_SOCKET, then the built-in default */
        uint32_t timeout_ms;
        bool timeout_set;
        bool json;
        FamilydClient *client;
} Context;

/* Options every verb accepts too, so `familyctl families --json` works like `--json families`. */
enum {
        ARG_COMMON_SOCKET = 0x1000,
        ARG_COMMON_JSON,
        ARG_COMMON_TIMEOUT,
        ARG_COMMON_HELP,
};

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

/* The option loop of a verb that has only the common options: returns from the verb on --help
 * (after printing help_text) and on a bad option. */
#define PARSE_SIMPLE_VERB(verb_name, help_text)                                                 \
        do {                                                                                    \
                static const struct option _opts[] = { COMMON_LONG_OPTIONS, {} };               \
                int _c, _r;                                                                     \
                while ((_c = getopt_long(argc, argv, "s:jt:h", _opts, NULL)) >= 0) {            \
                        if (_c == 'h') {                                                        \
                                fputs(help_text, stdout);                                       \
                                return EXIT_OK;                                                 \
                        }                                                                       \
                        if (_c == '?')                                                          \
                                return ctl_usage_error(verb_name, "invalid option");            \
                        _r = ctl_common_option(ctx, _c, optarg);                                \
                        if (_r != EXIT_OK)                                                      \
                                return _r < 0 ? EXIT_INTERNAL : _r;                             \
                }                                                                               \
        } while (0)

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

/* Key/value lines ("family      x"): column width fixed so that blocks of one verb align. */
void ctl_print_field(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Aligned tables: the header row, then rows of cells; column widths from the widest cell. */
typedef struct Table Table;
Table *table_new(size_t n_columns, ...);
Table *table_free(Table *t);
int table_add_cell(Table *t, const char *text);
int table_add_cellf(Table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int table_print(const Table *t, FILE *f);

static inline void table_freep(Table **t) {
        table_free(*t);
}

/* The verbs: each parses its own options from argv (argv[0] is the verb) and returns an exit code. */
int verb_families(Context *ctx, int argc, char **argv);
int verb_family(Context *ctx, int argc, char **argv);
int verb_resolve(Context *ctx, int argc, char **argv);
int verb_mesh(Context *ctx, int argc, char **argv);
int verb_meshes(Context *ctx, int argc, char **argv);
int verb_topology(Context *ctx, int argc, char **argv);
int verb_forget(Context *ctx, int argc, char **argv);
int verb_status(Context *ctx, int argc, char **argv);
int verb_reload(Context *ctx, int argc, char **argv);
int verb_build(Context *ctx, int argc, char **argv);
int verb_builds(Context *ctx, int argc, char **argv);
int verb_build_info(Context *ctx, int argc, char **argv);
int verb_release(Context *ctx, int argc, char **argv);
int verb_shard(Context *ctx, int argc, char **argv);
int verb_validate(Context *ctx, int argc, char **argv);

/* A small JSON reader for --config and --module files and validate's model file. Numbers keep their text so that
 * integers stay exact; is_int when the text has no '.', 'e' or 'E' and fits int64. */
typedef enum JsonType {
        JSON_NULL,
        JSON_BOOL,
        JSON_NUMBER,
        JSON_STRING,
        JSON_ARRAY,
        JSON_OBJECT,
} JsonType;

typedef struct JsonValue JsonValue;
struct JsonValue {
        JsonType type;
        bool boolean;
        bool is_int;
        int64_t integer;
        double number;
        char *string;           /* JSON_STRING (NUL-terminated; embedded NULs refused) */
        size_t n;               /* items of an array or object */
        JsonValue **items;
        char **keys;            /* JSON_OBJECT: keys[i] names items[i] */
};

JsonValue *json_value_free(JsonValue *v);
/* Parses a whole document; on -EINVAL *ret_error_text (to free()) says why and where. */
int json_parse(const char *text, size_t size, JsonValue **ret, char **ret_error_text);
int json_parse_file(const char *path, JsonValue **ret, char **ret_error_text);
const JsonValue *json_object_get(const JsonValue *v, const char *key);

static inline void json_value_freep(JsonValue **v) {
        json_value_free(*v);
}
