/* config.c: command-line flags and the `key = value` config file, with their defaults. */
#include <ctype.h>
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "codec/codec-registry-digest.h"
#include "membership/membership.h"
#include "membership/peer-protocol.h"
#include "core/registry.h"
#include "core/resource-limits.h"
#include "common/log.h"
#include "peer/peer-key.h"
#include "peer/peer-ucx.h"
#include "codec/codec-coord-member.h"
#include "coord/coord-client.h"
#include "shm/huge-pages.h"

#include "build-config.h"

#define FAMILYD_DEFAULT_REGISTRY "/etc/familyd/registry"
/* What --check-config reads without =FILE or --config: the file the systemd unit passes. */
#define FAMILYD_DEFAULT_CONFIG "/etc/familyd/familyd.conf"

/* What an option's value is, and how it is parsed. */
typedef enum OptionType {
        OPTION_FLAG,      /* no value: sets a bool field, or does its action */
        OPTION_STRING,    /* non-empty text; max > 0: at most max bytes */
        OPTION_PATH,      /* a non-empty path */
        OPTION_UNSIGNED,  /* unsigned in [min, max] */
        OPTION_BYTES,     /* uint64_t in [min, max] */
        OPTION_INT64,     /* int64_t in [min, max] (unset: -1) */
        OPTION_LOG_LEVEL, /* a level name: debug, info, notice, warning, err */
        OPTION_HUGE_PAGES, /* a mode: auto, never, require (shm/huge-pages.h) */
        OPTION_MEMBERSHIP, /* a protocol: all-to-all, swim (membership/peer-protocol.h) */
        OPTION_OPTIONAL,  /* an action that may take a value, only after `=` (--check-config) */
} OptionType;

/* Options that act instead of setting a field. */
typedef enum OptionAction {
        ACTION_NONE,         /* sets its field, from a flag or a config file key */
        ACTION_HELP,         /* print --help and exit */
        ACTION_VERSION,      /* print the version and exit */
        ACTION_PRINT_CONFIG, /* print the example config file and exit */
        ACTION_READ_FILE,    /* --config: read the file; not a key itself */
        ACTION_CHECK_CONFIG, /* check the settings (of =FILE) and their registry, then exit */
        ACTION_CHECK_REGISTRY, /* load and verify a registry directory, then exit */
} OptionAction;

typedef struct ConfigOption {
        const char *name;    /* the long option, and the config file key */
        char short_name;     /* 0: none */
        const char *metavar; /* what --help calls the value; NULL for a flag */
        OptionType type;
        OptionAction action;
        bool hidden;         /* left out of --help (documented in docs/operating.md) */
        const char *alias_of; /* an old name of that option: accepted, never printed */
        uint64_t min, max;   /* integers: the range; OPTION_STRING: the longest (0: any) */
        size_t offset;       /* the Config field it sets */

        /* The default: a fixed value (has_value: def, or def_string for strings), shown as
         * "(default VALUE)" and on the example's key line; default_text follows the value
         * ("; fewer when ...") or, without one, says what familyd does ("(default: TEXT)").
         * Neither: the setting is off until given. */
        bool has_value;
        uint64_t def;
        const char *def_string;
        const char *default_text;

        const char *help; /* the sentence of --help, without the default */
        const char *note; /* more for the example config file, or NULL */
} ConfigOption;

/* offsetof(Config, field), refusing to compile unless the field has type t. */
#define FIELD(field, t)                                                                       \
        (offsetof(Config, field) +                                                            \
         0 * sizeof(struct {                                                                  \
                 _Static_assert(__builtin_types_compatible_p(typeof(((Config *) 0)->field), t), \
                                "Config." #field " is not of type " #t);                      \
                 int dummy;                                                                   \
         }))

#define TYPE_FLAG(field)              .type = OPTION_FLAG, .offset = FIELD(field, bool)
#define TYPE_ACTION(a)                .type = OPTION_FLAG, .action = (a)
#define TYPE_PATH(field)              .type = OPTION_PATH, .offset = FIELD(field, char *)
#define TYPE_STRING(field, longest)   .type = OPTION_STRING, .offset = FIELD(field, char *), \
                                      .max = (longest)
#define TYPE_UNSIGNED(field, lo, hi)  .type = OPTION_UNSIGNED, .offset = FIELD(field, unsigned), \
                                      .min = (lo), .max = (hi)
#define TYPE_BYTES(field, lo, hi)     .type = OPTION_BYTES, .offset = FIELD(field, uint64_t), \
                                      .min = (lo), .max = (hi)
#define TYPE_INT64(field, lo, hi)     .type = OPTION_INT64, .offset = FIELD(field, int64_t), \
                                      .min = (lo), .max = (hi)
#define TYPE_LOG_LEVEL(field)         .type = OPTION_LOG_LEVEL, .offset = FIELD(field, int)
#define TYPE_HUGE_PAGES(field)        .type = OPTION_HUGE_PAGES, .offset = FIELD(field, int)
#define TYPE_MEMBERSHIP(field)        .type = OPTION_MEMBERSHIP, .offset = FIELD(field, int)
#define DEFAULT(v)                    .has_value = true, .def = (v)
#define DEFAULT_STRING(s)             .has_value = true, .def_string = (s)

/* Every option, in the order of --help. --help, the getopt table, the defaults, the config
 * file's keys, value checking and `familyd --print-config` (deploy/systemd/familyd.conf) all
 * come from here. */
static const ConfigOption config_options[] = {
        { .name = "help", .short_name = 'h', TYPE_ACTION(ACTION_HELP),
          .help = "Show this help and exit" },
        { .name = "version", TYPE_ACTION(ACTION_VERSION),
          .help = "Show the version and exit" },
        { .name = "print-config", TYPE_ACTION(ACTION_PRINT_CONFIG), .hidden = true,
          .help = "Print the example config file (every key, commented out, with its default) "
                  "and exit" },
        { .name = "config", .metavar = "FILE", TYPE_PATH(config_file), .action = ACTION_READ_FILE,
          .help = "Read settings from FILE (`key = value` lines, keys as the long options "
                  "below; flags win)" },
        { .name = "socket", .metavar = "PATH", TYPE_PATH(socket_path),
          DEFAULT_STRING(FAMILYD_DEFAULT_SOCKET),
          .help = "API socket",
          .note = "Under systemd, familyd serves on the socket of familyd.socket (named "
                  "\"api\") instead, and binds nothing here." },
        { .name = "shard-socket", .metavar = "PATH", TYPE_PATH(shard_socket_path),
          .default_text = "shard.sock beside the API socket",
          .help = "Shard descriptor socket",
          .note = "Under systemd, the socket of familyd-shard.socket (named \"shard\")." },
        { .name = "registry", .metavar = "DIR", TYPE_PATH(registry_path),
          DEFAULT_STRING(FAMILYD_DEFAULT_REGISTRY),
          .help = "Family registry directory",
          .note = "A directory of *.yaml files, read again on `systemctl reload familyd`." },
        { .name = "state-dir", .metavar = "DIR", TYPE_PATH(state_dir),
          .help = "Keep built shards and their metadata here",
          .note = "For running without systemd's fd store: on a tmpfs, built shards then "
                  "outlive a restart." },
        { .name = "host-devices", .metavar = "N", TYPE_UNSIGNED(host_devices, 1, 4096),
          .default_text = "the node's CUDA GPUs, else one host device",
          .help = "Declare N host-memory devices on this node",
          .note = "For nodes without GPUs, and tests." },
        { .name = "node-name", .metavar = "NAME", TYPE_STRING(node_name, FAMILYD_MAX_NAME_LENGTH),
          .default_text = "the host name",
          .help = "This node's name" },
        { .name = "node-rank", .metavar = "N", TYPE_INT64(node_rank, 0, INT32_MAX),
          .help = "This node's rank in the cluster order",
          .note = "Without ranks, nodes are ordered by name." },
        { .name = "metrics-listen", .metavar = "ADDR:PORT",
          TYPE_STRING(metrics_listen, 255 /* METRICS_MAX_ADDRESS_LENGTH */),
          .help = "Serve Prometheus metrics over HTTP at ADDR:PORT/metrics",
          .note = "For example 127.0.0.1:9464; only that address is bound. Off unless given; "
                  "anyone who reaches the port can read the counters (docs/security.md)." },
        { .name = "coordinator", .metavar = "URL",
          TYPE_STRING(coordinator, COORD_MAX_ENDPOINTS * (COORD_MAX_ENDPOINT_LENGTH + 1) + 7),
          .default_text = "none, the daemons' own membership over UCX",
          .help = "Keep the cluster's membership in etcd at "
                  "etcd://HOST:PORT[,HOST:PORT...]",
          .note = "Each daemon writes its member record and an alive key under "
                  "/familyd/<cluster>/ and builds the topology from a watch of that prefix "
                  "(docs/coordinator.md). Not with --listen or --peers: daemons in etcd mode "
                  "open no links to each other." },
        { .name = "cluster", .metavar = "NAME", TYPE_STRING(cluster, COORD_MAX_CLUSTER_NAME),
          .default_text = "familyd",
          .help = "The cluster's name in etcd",
          .note = "1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'; only with --coordinator." },
        { .name = "coordinator-ca", .metavar = "PATH", TYPE_PATH(coordinator_ca),
          .default_text = "none, plaintext",
          .help = "Speak TLS to etcd and check its certificate against this CA (PEM)" },
        { .name = "coordinator-cert", .metavar = "PATH", TYPE_PATH(coordinator_cert),
          .help = "This daemon's client certificate for etcd (PEM)",
          .note = "With --coordinator-key, for etcd's --client-cert-auth; needs --coordinator-ca." },
        { .name = "coordinator-key", .metavar = "PATH", TYPE_PATH(coordinator_key),
          .help = "The key of --coordinator-cert (PEM)",
          .note = "As secret as write access to the cluster's prefix in etcd." },
        { .name = "listen", .metavar = "ADDR:PORT", TYPE_STRING(listen_address, 0),
          .help = "Peer listener address",
          .note = "Where the other daemons of a cluster reach this one over UCX, for example "
                  "0.0.0.0:7313. Without --listen and --peers, the node is a cluster of its own." },
        { .name = "peers", .metavar = "LIST", TYPE_STRING(peers, 0),
          .help = "Peer daemons, ADDR:PORT[,ADDR:PORT...]",
          .note = "A full list, or one seed that every other member is learnt from, for "
                  "example 10.0.0.2:7313,10.0.0.3:7313." },
        { .name = "cluster-key", .metavar = "PATH", TYPE_PATH(cluster_key_file),
          .default_text = "none, peers are not authenticated",
          .help = "Authenticate peers with the key(s) in the file PATH",
          .note = "Made by `familyctl keygen FILE` and copied to every node: one or two lines of "
                  "64 hexadecimal characters; with two, the first is used to dial and both are "
                  "accepted (rotation). The file must belong to familyd's user and not be "
                  "readable by group or others. Reload and SIGHUP read it again." },
        { .name = "insecure-peers", TYPE_FLAG(insecure_peers),
          .help = "Allow --listen on a non-loopback address without --cluster-key",
          .note = "Anyone who reaches the port can then join the cluster." },
        { .name = "shm-budget", .metavar = "BYTES", TYPE_BYTES(shm_budget_bytes, 0, UINT64_MAX / 2),
          .default_text = "half of RAM",
          .help = "Shared memory held for shards",
          .note = "In bytes." },
        { .name = "huge-pages", .metavar = "MODE", TYPE_HUGE_PAGES(huge_pages),
          DEFAULT(HUGE_PAGES_AUTO),
          .help = "Host shards on huge pages: auto, never or require",
          .note = "auto: on the huge pages the host has reserved (vm.nr_hugepages) while enough "
                  "are free, else on normal pages (logged once), and a shard smaller than one "
                  "huge page on normal pages; require: a Build whose pages "
                  "cannot be reserved fails, and so does a start without any reserved; never: "
                  "normal pages only. A shard on huge pages is rounded up to whole pages, in "
                  "--shm-budget too." },
        { .name = "max-builds", .metavar = "N", TYPE_UNSIGNED(max_builds, 1, 1u << 20),
          DEFAULT(1024),
          .help = "Live builds" },
        { .name = "max-builds-per-uid", .metavar = "N",
          TYPE_UNSIGNED(max_builds_per_uid, 1, 1u << 20),
          .default_text = "half of --max-builds",
          .help = "Live builds made by one uid",
          .note = "Counts the builds a uid's Builds made (layouts too) and those in flight; a "
                  "Build past it is refused with RESOURCE_EXHAUSTED naming the uid's use, after "
                  "that uid's own builds in their grace period gave way. Admins are not held "
                  "to it." },
        { .name = "max-pins-per-uid", .metavar = "N", TYPE_UNSIGNED(max_pins_per_uid, 1, 1u << 20),
          .default_text = "half of --max-builds",
          .help = "Builds one uid keeps pinned",
          .note = "A PinBuild past it is refused with RESOURCE_EXHAUSTED. Admins are not held "
                  "to it." },
        { .name = "shm-budget-per-uid", .metavar = "BYTES",
          TYPE_BYTES(shm_budget_per_uid_bytes, 0, UINT64_MAX / 2),
          .default_text = "half of --shm-budget",
          .help = "Shared memory held for the builds one uid made",
          .note = "In bytes, counted as --shm-budget counts them; 0: no limit of its own. "
                  "Admins are not held to it." },
        { .name = "build-grace-ms", .metavar = "N", TYPE_UNSIGNED(build_grace_ms, 0, 604800000),
          DEFAULT(60000),
          .help = "Free a build that no process holds after N ms",
          .note = "A trainer that asks again within it gets the same build back; 0 frees at "
                  "once. Builds waiting out this period give way to new Builds that need their "
                  "memory or slots, oldest first." },
        { .name = "membership", .metavar = "MODE", TYPE_MEMBERSHIP(membership),
          DEFAULT(PROTOCOL_ALL_TO_ALL),
          .help = "The daemons' membership protocol: all-to-all or swim",
          .note = "all-to-all: every daemon heartbeats every other each --heartbeat-ms. swim, "
                  "for thousands of nodes: each daemon probes one member per --heartbeat-ms, "
                  "through k others when it does not answer, and gossips verdicts on the "
                  "probes (docs/scale.md). Every daemon of a cluster must use the same mode. "
                  "Not swim with --coordinator." },
        { .name = "heartbeat-ms", .metavar = "N", TYPE_UNSIGNED(heartbeat_ms, 10, 3600000),
          DEFAULT(1000),
          .help = "Peer heartbeat interval",
          .note = "heartbeat-ms <= suspect-ms <= down-ms." },
        { .name = "suspect-ms", .metavar = "N", TYPE_UNSIGNED(suspect_ms, 10, 3600000),
          DEFAULT(3000),
          .help = "Silence before a peer is suspect" },
        { .name = "down-ms", .metavar = "N", TYPE_UNSIGNED(down_ms, 10, 3600000),
          DEFAULT(10000),
          .help = "Silence before a peer is down" },
        { .name = "forget-after-ms", .metavar = "N", TYPE_UNSIGNED(forget_after_ms, 0, UINT32_MAX),
          DEFAULT(0), .default_text = ": never",
          .help = "Forget a down peer after N ms" },
        { .name = "max-nodes", .metavar = "N",
          TYPE_UNSIGNED(max_nodes, 2, MEMBERSHIP_MAX_NODES_CEILING),
          DEFAULT(4096),
          .help = "Nodes in the cluster, this one included",
          .note = "A node that would pass it is refused, and so is a peer's whole member list "
                  "that would; in etcd mode the oldest records are the members and a newer one "
                  "waits for a place." },
        { .name = "fdstore-max", .metavar = "N", TYPE_UNSIGNED(fdstore_max, 0, 1u << 20),
          DEFAULT(4096),
          .help = "Descriptors kept in systemd's fd store",
          .note = "Equal to FileDescriptorStoreMax= of familyd.service; a build that would need "
                  "more is refused." },
        { .name = "threads", .metavar = "N", TYPE_UNSIGNED(threads, 1, 64),
          DEFAULT(2),
          .help = "gRPC worker threads" },
        { .name = "fill-threads", .metavar = "N", TYPE_UNSIGNED(fill_threads, 0, 1024),
          DEFAULT(0), .default_text = ": one per online CPU",
          .help = "Threads that fill materialised shards",
          .note = "Started once and shared by every Build; on several NUMA nodes grouped by "
                  "node and bound to its CPUs." },
        { .name = "max-connections", .metavar = "N", TYPE_UNSIGNED(max_connections, 1, 65536),
          DEFAULT(FAMILYD_MAX_CONNECTIONS),
          .default_text = "; fewer when the open-file limit is too low",
          .help = "Concurrent API connections" },
        { .name = "max-connections-per-process", .metavar = "N",
          TYPE_UNSIGNED(max_connections_per_process, 1, 65536),
          DEFAULT(FAMILYD_MAX_CONNECTIONS_PER_PEER),
          .help = "Concurrent API connections from one process" },
        /* Its name before 2026-12-07 ("peer" is a cluster member elsewhere). */
        { .name = "max-connections-per-peer", .metavar = "N",
          TYPE_UNSIGNED(max_connections_per_process, 1, 65536),
          DEFAULT(FAMILYD_MAX_CONNECTIONS_PER_PEER), .hidden = true,
          .alias_of = "max-connections-per-process",
          .help = "Concurrent API connections from one process" },
        { .name = "max-connections-per-uid", .metavar = "N",
          TYPE_UNSIGNED(max_connections_per_uid, 1, 65536),
          .default_text = "half of --max-connections",
          .help = "Concurrent API connections from one uid",
          .note = "A connection over this or another connection cap gets RESOURCE_EXHAUSTED "
                  "on its first call, then is closed." },
        { .name = "max-queued-bytes-per-connection", .metavar = "BYTES",
          TYPE_BYTES(max_queued_bytes_per_connection, 4u << 20, 1ull << 40),
          DEFAULT(64ull << 20),
          .help = "Reply bytes waiting for one connection to read them",
          .note = "In bytes, at least 4 MiB (the largest reply). A call whose reply would "
                  "exceed it gets RESOURCE_EXHAUSTED." },
        { .name = "max-queued-bytes", .metavar = "BYTES",
          TYPE_BYTES(max_queued_bytes, 4u << 20, 1ull << 40),
          DEFAULT(512ull << 20),
          .help = "Reply bytes waiting for all clients to read them",
          .note = "In bytes, at least 4 MiB." },
        { .name = "connection-idle-ms", .metavar = "N",
          TYPE_UNSIGNED(connection_idle_ms, 100, 86400000),
          DEFAULT(FAMILYD_CONNECTION_IDLE_MS),
          .help = "Close a connection with no call for N ms",
          .note = "Clients reconnect on their next call." },
        { .name = "admin-group", .metavar = "NAME",
          TYPE_STRING(admin_group, FAMILYD_MAX_NAME_LENGTH),
          .default_text = "none, only root is an admin",
          .help = "Members of group NAME are admins",
          .note = "Admins see every build's shard tokens, map any build's shards, and may "
                  "release a build with force, delete another user's mesh, Reload and "
                  "ForgetNode; membership counts supplementary groups." },
        { .name = "max-watches", .metavar = "N", TYPE_UNSIGNED(max_watches, 1, 1u << 20),
          DEFAULT(FAMILYD_MAX_WATCHES),
          .help = "Open Watch streams" },
        { .name = "max-watches-per-process", .metavar = "N",
          TYPE_UNSIGNED(max_watches_per_process, 1, 1u << 20),
          DEFAULT(8),
          .help = "Open Watch streams of one process" },
        { .name = "max-shards", .metavar = "N", TYPE_UNSIGNED(max_shards, 1, 65536),
          .default_text = "what the open-file limit leaves, at most 65536",
          .help = "Shard segments held, one descriptor each" },
        { .name = "log-level", .metavar = "LEVEL", TYPE_LOG_LEVEL(log_level),
          DEFAULT(LOG_INFO),
          .help = "debug, info, notice, warning or err",
          .note = "Messages less severe than this are not logged." },
        { .name = "check-config", .metavar = "FILE", .type = OPTION_OPTIONAL,
          .action = ACTION_CHECK_CONFIG,
          .help = "Check the settings of FILE (else of --config, else of "
                  FAMILYD_DEFAULT_CONFIG ") with the flags given, and load the registry they "
                  "name as a start would, then exit" },
        { .name = "check-registry", .metavar = "DIR", TYPE_PATH(check_registry),
          .action = ACTION_CHECK_REGISTRY,
          .help = "Load and verify the registry in DIR as a start or a reload would, then exit" },
};

static const struct {
        const char *name;
        int level;
} log_levels[] = {
        { "debug", LOG_DEBUG },     { "info", LOG_INFO }, { "notice", LOG_NOTICE },
        { "warning", LOG_WARNING }, { "err", LOG_ERR },   { "error", LOG_ERR },
};

/* getopt_long's val for an option: its short name, or one past the characters. */
#define OPTION_VAL_BASE 0x100

static const ConfigOption *option_by_val(int val) {
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++)
                if (config_options[i].short_name ? config_options[i].short_name == val
                                                 : (int) (OPTION_VAL_BASE + i) == val)
                        return &config_options[i];
        return NULL;
}

/* A config file key: an option that takes a value and only sets its field. */
static bool option_is_key(const ConfigOption *o) {
        return o->type != OPTION_FLAG && o->action == ACTION_NONE;
}

static const ConfigOption *option_by_key(const char *key) {
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++)
                if (option_is_key(&config_options[i]) && streq(config_options[i].name, key))
                        return &config_options[i];
        return NULL;
}

/* The getopt_long tables, made from config_options. */
static struct option getopt_options[ELEMENTSOF(config_options) + 1];
static char getopt_short[2 * ELEMENTSOF(config_options) + 1];

static void getopt_tables(void) {
        size_t n_short = 0;

        if (getopt_options[0].name)
                return;
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                getopt_options[i] = (struct option) {
                        .name = o->name,
                        .has_arg = o->type == OPTION_FLAG       ? no_argument
                                   : o->type == OPTION_OPTIONAL ? optional_argument
                                                                : required_argument,
                        .val = o->short_name ? o->short_name : (int) (OPTION_VAL_BASE + i),
                };
                if (o->short_name) {
                        getopt_short[n_short++] = o->short_name;
                        if (o->type != OPTION_FLAG)
                                getopt_short[n_short++] = ':';
                }
        }
}

/* The default as a value, as the config file writes it; "" when there is none. */
static const char *option_default_value(const ConfigOption *o, char *buf, size_t size) {
        *buf = 0;
        if (!o->has_value)
                return buf;
        switch (o->type) {
        case OPTION_STRING:
        case OPTION_PATH:
                return o->def_string;
        case OPTION_LOG_LEVEL:
                for (size_t i = 0; i < ELEMENTSOF(log_levels); i++)
                        if (log_levels[i].level == (int) o->def)
                                return log_levels[i].name;
                return buf;
        case OPTION_HUGE_PAGES:
                return huge_pages_mode_to_string((HugePagesMode) o->def);
        case OPTION_MEMBERSHIP:
                return protocol_mode_to_string((ProtocolMode) o->def);
        case OPTION_INT64:
                (void) snprintf(buf, size, "%" PRId64, (int64_t) o->def);
                return buf;
        default:
                (void) snprintf(buf, size, "%" PRIu64, o->def);
                return buf;
        }
}

/* Between words of a line, a space where the line must not break ("(default 4096)"). */
#define GLUE '\x1f'

/* The option's help sentence with its default: "Live builds (default 1024)". */
static char *option_sentence(const ConfigOption *o) {
        char value[64];
        char *s = NULL;
        int r;

        if (o->has_value)
                r = asprintf(&s, "%s (default%c%s%s)", o->help, GLUE,
                             option_default_value(o, value, sizeof value),
                             strempty(o->default_text));
        else if (o->default_text)
                r = asprintf(&s, "%s (default: %s)", o->help, o->default_text);
        else
                r = asprintf(&s, "%s", o->help);
        return r < 0 ? NULL : s;
}

/* Writes text from column col on, breaking lines between words before they pass width
 * columns; each new line starts with indent. Ends the line. */
static void write_wrapped(FILE *f, const char *text, size_t col, const char *indent,
                          size_t width) {
        bool line_empty = true;

        for (const char *p = text; *p;) {
                size_t n = strcspn(p, " ");
                if (n > 0) {
                        if (!line_empty && col + 1 + n > width) {
                                fprintf(f, "\n%s", indent);
                                col = strlen(indent);
                                line_empty = true;
                        }
                        if (!line_empty) {
                                fputc(' ', f);
                                col++;
                        }
                        for (size_t i = 0; i < n; i++)
                                fputc(p[i] == GLUE ? ' ' : p[i], f);
                        col += n;
                        line_empty = false;
                }
                p += n;
                p += strspn(p, " ");
        }
        fputc('\n', f);
}

#define HELP_WIDTH 81 /* the longest line, --fdstore-max's, is 81 columns */
#define HELP_TEXT_COLUMN 28

static int help(void) {
        printf("Usage: familyd [OPTIONS]\n"
               "\n"
               "Per-node service for distributed training: the family registry, Resolve,\n"
               "job meshes and node topology over gRPC on a Unix socket.\n"
               "\n");
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                char column[128];
                _cleanup_free_ char *sentence = NULL;

                if (o->hidden)
                        continue;
                sentence = option_sentence(o);
                if (!sentence)
                        return -ENOMEM;
                if (o->short_name)
                        (void) snprintf(column, sizeof column, "  -%c --%s%s%s", o->short_name,
                                        o->name, o->metavar ? " " : "", strempty(o->metavar));
                else if (o->type == OPTION_OPTIONAL)
                        (void) snprintf(column, sizeof column, "     --%s[=%s]", o->name,
                                        o->metavar);
                else
                        (void) snprintf(column, sizeof column, "     --%s%s%s", o->name,
                                        o->metavar ? " " : "", strempty(o->metavar));
                size_t n = strlen(column);
                if (n + 1 <= HELP_TEXT_COLUMN)
                        printf("%-*s", HELP_TEXT_COLUMN, column);
                else
                        printf("%s\n%*s", column, HELP_TEXT_COLUMN, "");
                write_wrapped(stdout, sentence, HELP_TEXT_COLUMN, "                            ",
                              HELP_WIDTH);
        }
        printf("\n"
               "Readiness: once the API socket accepts calls, grpc.health.v1.Health/Check\n"
               "answers SERVING. SIGHUP reloads the registry; SIGTERM and SIGINT stop.\n"
               "\n"
               "Config file: one `key = value` per line, keys as the long options above\n"
               "without dashes; `#` or `;` starts a comment line; a later line wins.\n"
               "\n"
               "Under systemd: given listening sockets named api and shard (LISTEN_FDS and\n"
               "LISTEN_FDNAMES, FileDescriptorName= in the socket units), familyd serves on\n"
               "them instead of binding --socket and --shard-socket. It reports readiness,\n"
               "reloads and stopping with sd_notify (NOTIFY_SOCKET), pings the watchdog at\n"
               "half of WATCHDOG_USEC, and logs to the journal with fields when stderr is\n"
               "the journal (JOURNAL_STREAM).\n");
        return 0;
}

#define EXAMPLE_WIDTH 92

/* The example config file (deploy/systemd/familyd.conf): every key, commented out, with its
 * help, its default and a note. */
static int print_config(void) {
        static const char *const header[] = {
                "/etc/familyd/familyd.conf: familyd's settings, read with `familyd --config "
                "FILE` (the systemd unit passes this file). Every key is a long command-line "
                "option without its dashes; a flag on the command line wins over the file. One "
                "`key = value` per line; `#` or `;` starts a comment line; a value may be quoted "
                "(\"...\" or '...'); a later line wins over an earlier one. An unknown key or a "
                "bad value stops familyd, naming FILE:LINE.",
                "",
                "Every key is listed below, commented out, with its default; a key with nothing "
                "after `=` has no fixed default (its comment says what familyd does without it). "
                "`familyd\x1f--print-config` prints this file; "
                "`familyd\x1f--check-config\x1f--config\x1f" "FILE` checks a file.",
        };

        for (size_t i = 0; i < ELEMENTSOF(header); i++) {
                if (isempty(header[i])) {
                        puts("#");
                        continue;
                }
                fputs("# ", stdout);
                write_wrapped(stdout, header[i], 2, "# ", EXAMPLE_WIDTH);
        }
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                _cleanup_free_ char *sentence = NULL, *comment = NULL;
                char value[64];

                if (!option_is_key(o) || o->alias_of)
                        continue;
                sentence = option_sentence(o);
                if (!sentence || asprintf(&comment, "%s.%s%s", sentence, o->note ? " " : "",
                                          strempty(o->note)) < 0)
                        return -ENOMEM;
                fputs("\n# ", stdout);
                write_wrapped(stdout, comment, 2, "# ", EXAMPLE_WIDTH);
                const char *v = option_default_value(o, value, sizeof value);
                printf("#%s =%s%s\n", o->name, *v ? " " : "", v);
        }
        return 0;
}

/* Where a setting comes from: a line of the config file, or the command line (path NULL). */
typedef struct ConfigSource {
        const char *path;
        unsigned line;
} ConfigSource;

static const ConfigSource command_line = {};

/* One line on stderr naming the culprit: "FILE:LINE: key: ..." or "--key: ...". Returns
 * -EINVAL. */
_printf_(3, 4) static int config_error(const ConfigSource *src, const char *name,
                                       const char *format, ...) {
        char text[512];
        va_list ap;

        va_start(ap, format);
        (void) vsnprintf(text, sizeof text, format, ap);
        va_end(ap);
        if (src->path)
                log_error("%s:%u: %s: %s", src->path, src->line, name, text);
        else
                log_error("--%s: %s", name, text);
        return -EINVAL;
}

static int parse_u64(const ConfigSource *src, const char *name, const char *s, uint64_t min,
                     uint64_t max, uint64_t *ret) {
        char *end = NULL;

        if (isempty(s) || !isdigit((unsigned char) s[0]))
                goto fail;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno != 0 || *end != 0 || v < min || v > max)
                goto fail;
        *ret = v;
        return 0;
fail:
        return config_error(src, name, "'%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]",
                            strempty(s), min, max);
}

static int parse_unsigned(const ConfigSource *src, const char *name, const char *s, unsigned min,
                          unsigned max, unsigned *ret) {
        uint64_t v;
        int r = parse_u64(src, name, s, min, max, &v);
        if (r < 0)
                return r;
        *ret = (unsigned) v;
        return 0;
}

static int set_string(char **field, const char *value) {
        char *s = strdup(value);
        if (!s)
                return -ENOMEM;
        free(*field);
        *field = s;
        return 0;
}

static int parse_log_level(const ConfigSource *src, const char *name, const char *s, int *ret) {
        for (size_t i = 0; i < ELEMENTSOF(log_levels); i++)
                if (streq(log_levels[i].name, s)) {
                        *ret = log_levels[i].level;
                        return 0;
                }
        return config_error(src, name, "unknown level '%s' (debug, info, notice, warning, err)",
                            s);
}

static int parse_huge_pages(const ConfigSource *src, const char *name, const char *s,
                            int *ret) {
        HugePagesMode m = huge_pages_mode_from_string(s);

        if (m < 0)
                return config_error(src, name, "unknown mode '%s' (auto, never, require)", s);
        *ret = (int) m;
        return 0;
}

static int parse_membership(const ConfigSource *src, const char *name, const char *s,
                            int *ret) {
        ProtocolMode m = protocol_mode_from_string(s);

        if (m < 0)
                return config_error(src, name, "unknown mode '%s' (all-to-all, swim)", s);
        *ret = (int) m;
        return 0;
}

/* Remembers that name was set at src (a config file line), or forgets it (a flag). */
static int config_set_origin(Config *c, const ConfigSource *src, const char *name) {
        ConfigOrigin *o = NULL;

        for (size_t i = 0; i < c->n_origins; i++)
                if (streq(c->origins[i].key, name))
                        o = &c->origins[i];
        if (!src->path) {
                if (o)
                        o->where = mfree(o->where);
                return 0;
        }
        if (!o) {
                if (!GREEDY_REALLOC(c->origins, c->allocated_origins, c->n_origins + 1))
                        return -ENOMEM;
                o = &c->origins[c->n_origins];
                *o = (ConfigOrigin) { .key = strdup(name) };
                if (!o->key)
                        return -ENOMEM;
                c->n_origins++;
        }
        free(o->where);
        if (asprintf(&o->where, "%s:%u", src->path, src->line) < 0) {
                o->where = NULL;
                return -ENOMEM;
        }
        return 0;
}

const char *config_origin(const Config *c, const char *key) {
        for (size_t i = 0; i < c->n_origins; i++)
                if (streq(c->origins[i].key, key))
                        return c->origins[i].where;
        return NULL;
}

/* A string setting: never empty (an empty path or address is always a mistake). */
static int parse_string(const ConfigSource *src, const char *name, const char *value,
                        char **field) {
        if (isempty(value))
                return config_error(src, name, "empty value");
        return set_string(field, value);
}

/* Applies one setting, from a flag or a config file line: value parsed as o's type into o's
 * field (NULL for a flag). */
static int config_apply(Config *c, const ConfigSource *src, const ConfigOption *o,
                        const char *value) {
        void *field = (uint8_t *) c + o->offset;
        uint64_t u;
        int r;

        r = config_set_origin(c, src, o->alias_of ? o->alias_of : o->name);
        if (r < 0)
                return r;

        switch (o->type) {
        case OPTION_FLAG:
                if (o->action != ACTION_NONE)
                        return -EINVAL;
                *(bool *) field = true;
                return 0;
        case OPTION_PATH:
                return parse_string(src, o->name, value, field);
        case OPTION_STRING:
                if (o->max == 0)
                        return parse_string(src, o->name, value, field);
                if (isempty(value) || strlen(value) > o->max)
                        return config_error(src, o->name, "must be 1 to %" PRIu64 " bytes",
                                            o->max);
                return set_string(field, value);
        case OPTION_UNSIGNED:
                return parse_unsigned(src, o->name, value, (unsigned) o->min, (unsigned) o->max,
                                      field);
        case OPTION_BYTES:
                return parse_u64(src, o->name, value, o->min, o->max, field);
        case OPTION_INT64:
                r = parse_u64(src, o->name, value, o->min, o->max, &u);
                if (r < 0)
                        return r;
                *(int64_t *) field = (int64_t) u;
                return 0;
        case OPTION_LOG_LEVEL:
                return parse_log_level(src, o->name, value, field);
        case OPTION_HUGE_PAGES:
                return parse_huge_pages(src, o->name, value, field);
        case OPTION_MEMBERSHIP:
                return parse_membership(src, o->name, value, field);
        case OPTION_OPTIONAL:
                return -EINVAL; /* an action: config_parse handles it */
        }
        return -EINVAL;
}

static char *strstrip(char *s) {
        while (isspace((unsigned char) *s))
                s++;
        size_t n = strlen(s);
        while (n > 0 && isspace((unsigned char) s[n - 1]))
                s[--n] = 0;
        return s;
}

/* A value in matching double or single quotes loses them ("a b" keeps its inner spaces). */
static char *unquote(char *s) {
        size_t n = strlen(s);
        if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) {
                s[n - 1] = 0;
                return s + 1;
        }
        return s;
}

/* Line-oriented: `key = value`, `#` and `;` comment lines, keys are the long option names, a
 * later line wins over an earlier one. Every problem names the file and the line. */
static int config_parse_file(Config *c, const char *path) {
        _cleanup_free_ char *line = NULL;
        size_t allocated = 0;
        ConfigSource src = { .path = path };
        FILE *f;
        int r = 0;

        f = fopen(path, "re");
        if (!f) {
                r = -errno;
                return log_error_errno(r, "cannot open config file %s: %m", path);
        }

        for (;;) {
                errno = 0;
                ssize_t n = getline(&line, &allocated, f);
                if (n < 0) {
                        if (errno != 0 && !feof(f)) {
                                r = -errno;
                                log_error("%s:%u: read error: %s", path, src.line + 1,
                                          strerror(-r));
                        }
                        break;
                }
                src.line++;

                if (memchr(line, 0, (size_t) n)) {
                        log_error("%s:%u: contains a NUL byte", path, src.line);
                        r = -EINVAL;
                        break;
                }
                char *s = strstrip(line);
                if (*s == 0 || *s == '#' || *s == ';')
                        continue;

                char *eq = strchr(s, '=');
                if (!eq) {
                        log_error("%s:%u: expected `key = value`", path, src.line);
                        r = -EINVAL;
                        break;
                }
                *eq = 0;
                char *key = strstrip(s), *value = unquote(strstrip(eq + 1));

                const ConfigOption *o = option_by_key(key);
                if (!o) {
                        log_error("%s:%u: unknown key '%s'", path, src.line, key);
                        r = -EINVAL;
                        break;
                }
                r = config_apply(c, &src, o, value);
                if (r < 0)
                        break;
        }

        fclose(f);
        return r;
}

/* The table's fixed defaults; what has none stays unset (NULL, 0, -1 for node-rank,
 * UINT64_MAX for shm-budget) until config_fill_derived. Strings are filled there too. */
static void config_defaults(Config *c) {
        *c = (Config) {};
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                void *field = (uint8_t *) c + o->offset;

                switch (o->type) {
                case OPTION_UNSIGNED:
                        *(unsigned *) field = o->has_value ? (unsigned) o->def : 0;
                        break;
                case OPTION_BYTES:
                        *(uint64_t *) field = o->has_value ? o->def : UINT64_MAX;
                        break;
                case OPTION_INT64:
                        *(int64_t *) field = o->has_value ? (int64_t) o->def : -1;
                        break;
                case OPTION_LOG_LEVEL:
                case OPTION_HUGE_PAGES:
                case OPTION_MEMBERSHIP:
                        *(int *) field = (int) o->def;
                        break;
                default:
                        break;
                }
        }
}

static int config_fill_derived(Config *c) {
        int r;

        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                char **field = (char **) ((uint8_t *) c + o->offset);

                if ((o->type == OPTION_STRING || o->type == OPTION_PATH) && o->has_value &&
                    !*field) {
                        r = set_string(field, o->def_string);
                        if (r < 0)
                                return r;
                }
        }
        if (!c->shard_socket_path) {
                const char *slash = strrchr(c->socket_path, '/');
                int n = slash ? (int) (slash - c->socket_path) : 0;
                if (asprintf(&c->shard_socket_path, "%.*s%sshard.sock", n, c->socket_path,
                             slash ? "/" : "") < 0) {
                        c->shard_socket_path = NULL;
                        return -ENOMEM;
                }
        }
        if (c->shm_budget_bytes == UINT64_MAX) {
                long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
                c->shm_budget_bytes = pages > 0 && page > 0
                                              ? (uint64_t) pages * (uint64_t) page / 2
                                              : UINT64_C(1) << 30;
        }
        if (c->max_builds_per_uid == 0)
                c->max_builds_per_uid = MAX(c->max_builds / 2, 1u);
        if (c->max_pins_per_uid == 0)
                c->max_pins_per_uid = MAX(c->max_builds / 2, 1u);
        if (c->shm_budget_per_uid_bytes == UINT64_MAX)
                c->shm_budget_per_uid_bytes = c->shm_budget_bytes / 2;
        if (!c->node_name) {
                char host[256] = {};
                if (gethostname(host, sizeof host - 1) < 0 || !*host)
                        strcpy(host, "localhost");
                r = set_string(&c->node_name, host);
                if (r < 0)
                        return r;
        }
        return 0;
}

int config_check_paths(const Config *c) {
        const char *origin = config_origin(c, "registry");
        DIR *d = opendir(c->registry_path);
        if (d) {
                closedir(d);
                return 0;
        }
        int r = -errno;
        if (origin)
                log_error("%s: registry: cannot read the directory %s: %s", origin,
                          c->registry_path, strerror(-r));
        else
                log_error("cannot read the registry directory %s%s: %s", c->registry_path,
                          streq(c->registry_path, FAMILYD_DEFAULT_REGISTRY)
                                  ? " (the default; see --registry)"
                                  : "",
                          strerror(-r));
        return r == -EINVAL ? -EIO : r;
}

int config_log_registry_failure(const char *dir, int error, const LoadDiagnostics *diag) {
        if (diag->n == 0)
                return log_error_errno(error, "Failed to load the registry %s: %m", dir);
        for (size_t i = 0; i < diag->n; i++)
                log_error("%s", diag->lines[i]);
        return log_error_errno(error, "Failed to load the registry %s (%zu problem%s).", dir,
                               diag->n, diag->n == 1 ? "" : "s");
}

int config_check_registry(const char *dir) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        char digest[REGISTRY_DIGEST_LENGTH + 1];
        int r;

        /* What manager_new() and manager_reload() do before anything is served: the load,
         * then the digest the topology carries. */
        r = registry_load(dir, 1, &reg, &diag);
        if (r < 0)
                r = config_log_registry_failure(dir, r, &diag);
        else {
                r = codec_registry_digest(reg, digest);
                if (r < 0)
                        r = log_error_errno(r, "Failed to digest the registry %s: %m", dir);
        }
        /* A problem with the registry is a failed check (1), not a usage error (2). */
        return r == -EINVAL ? -EIO : r;
}

/* The first pass over argv: the options that act (--help, --version, --print-config are done
 * here), the file to read (--config, --check-config=FILE, or the default when checking) and
 * the directory of --check-registry, into flags. CONFIG_RUN to go on. */
static int config_parse_actions(Config *flags, int argc, char *argv[]) {
        const char *check_file = NULL;
        int opt, r;

        optind = 0;
        while ((opt = getopt_long(argc, argv, getopt_short, getopt_options, NULL)) >= 0) {
                const ConfigOption *o = option_by_val(opt);

                if (!o) /* '?': getopt_long has said what is wrong */
                        return -EINVAL;
                switch (o->action) {
                case ACTION_HELP:
                        r = help();
                        return r < 0 ? r : CONFIG_EXIT;
                case ACTION_VERSION:
                        printf("familyd %s\n", FAMILYD_VERSION);
                        return CONFIG_EXIT;
                case ACTION_PRINT_CONFIG:
                        r = print_config();
                        return r < 0 ? r : CONFIG_EXIT;
                case ACTION_CHECK_CONFIG:
                        flags->check_config = true;
                        if (optarg)
                                check_file = optarg;
                        break;
                case ACTION_READ_FILE:
                case ACTION_CHECK_REGISTRY:
                        r = config_apply(flags, &command_line, o, optarg);
                        if (r < 0)
                                return r;
                        break;
                case ACTION_NONE:
                        break;
                }
        }
        if (optind < argc) {
                log_error("unexpected argument '%s' (see --help)", argv[optind]);
                return -EINVAL;
        }

        if (check_file) {
                if (isempty(check_file))
                        return config_error(&command_line, "check-config", "empty value");
                if (flags->config_file) {
                        log_error("--check-config=%s and --config %s: name the file once",
                                  check_file, flags->config_file);
                        return -EINVAL;
                }
                return set_string(&flags->config_file, check_file);
        }
        if (flags->check_config && !flags->config_file)
                return set_string(&flags->config_file, FAMILYD_DEFAULT_CONFIG);
        return CONFIG_RUN;
}

int config_check_peer_security(const Config *c, PeerKeys *ret_keys) {
        PeerKeys keys = {};
        int r;

        if (c->cluster_key_file) {
                r = peer_keys_load(c->cluster_key_file, &keys);
                if (r >= 0 && ret_keys)
                        *ret_keys = keys;
                peer_keys_wipe(&keys);
                return r < 0 ? r : 0;
        }
        if (c->listen_address && !c->insecure_peers &&
            !peer_address_is_loopback(c->listen_address))
                return log_error_errno(-EPERM, "--listen %s is not a loopback address and there "
                                               "is no --cluster-key: anyone who reaches the port "
                                               "could join the cluster. Make a key with "
                                               "`familyctl keygen FILE`, give it to every node "
                                               "with --cluster-key, or pass --insecure-peers.",
                                       c->listen_address);
        return 0;
}

#define COORDINATOR_SCHEME "etcd://"

const char *config_coordinator_endpoints(const Config *c) {
        if (!c->coordinator || strncmp(c->coordinator, COORDINATOR_SCHEME,
                                       strlen(COORDINATOR_SCHEME)) != 0)
                return NULL;
        return c->coordinator + strlen(COORDINATOR_SCHEME);
}

/* Whether the endpoints of --coordinator are HOST:PORT[,HOST:PORT...], at most
 * COORD_MAX_ENDPOINTS, each port 1 to 65535. */
static bool coordinator_endpoints_valid(const char *list) {
        size_t n = 0;

        if (isempty(list))
                return false;
        for (const char *p = list;; n++) {
                size_t len = strcspn(p, ",");
                const char *colon = memrchr(p, ':', len);
                char *end;

                if (n >= COORD_MAX_ENDPOINTS || len == 0 || len > COORD_MAX_ENDPOINT_LENGTH ||
                    !colon || colon == p || !isdigit((unsigned char) colon[1]))
                        return false;
                unsigned long port = strtoul(colon + 1, &end, 10);
                if (end != p + len || port == 0 || port > 65535)
                        return false;
                if (p[len] == '\0')
                        return true;
                p += len + 1;
        }
}

/* etcd mode's settings among themselves and against the embedded membership's. */
static int config_check_coordinator(Config *c) {
        if (!c->coordinator) {
                const char *alone[] = { "cluster", "coordinator-ca", "coordinator-cert",
                                        "coordinator-key" };
                const char *const values[] = { c->cluster, c->coordinator_ca,
                                               c->coordinator_cert, c->coordinator_key };
                for (size_t i = 0; i < ELEMENTSOF(alone); i++)
                        if (values[i])
                                return config_error(&command_line, alone[i],
                                                    "needs --coordinator (the cluster's etcd)");
                return 0;
        }
        if (!coordinator_endpoints_valid(config_coordinator_endpoints(c)))
                return config_error(&command_line, "coordinator",
                                    "'%s' is not etcd://HOST:PORT[,HOST:PORT...] (at most %u "
                                    "endpoints, ports 1 to 65535)",
                                    c->coordinator, COORD_MAX_ENDPOINTS);
        if (c->listen_address || c->peers)
                return config_error(&command_line, "coordinator",
                                    "not with --%s: in etcd mode daemons open no links to each "
                                    "other, the membership is in etcd",
                                    c->listen_address ? "listen" : "peers");
        /* all-to-all is the default, spelled out (the example config file's line); swim asks
         * for a protocol etcd mode does not run. */
        if (c->membership == PROTOCOL_SWIM)
                return config_error(&command_line, "membership",
                                    "swim not with --coordinator: in etcd mode daemons run no "
                                    "membership protocol, the membership is in etcd");
        if (c->cluster && !coord_cluster_name_valid(c->cluster))
                return config_error(&command_line, "cluster",
                                    "'%s' is not 1 to %u of A-Z, a-z, 0-9, '.', '_', '-'",
                                    c->cluster, COORD_MAX_CLUSTER_NAME);
        if (!c->coordinator_cert != !c->coordinator_key)
                return config_error(&command_line, c->coordinator_cert ? "coordinator-cert"
                                                                       : "coordinator-key",
                                    "--coordinator-cert and --coordinator-key go together");
        if (c->coordinator_cert && !c->coordinator_ca)
                return config_error(&command_line, "coordinator-cert",
                                    "needs --coordinator-ca (a client certificate is for TLS)");
        if (!c->cluster)
                return set_string(&c->cluster, "familyd");
        return 0;
}

/* The checks of --check-config and --check-registry, once every setting is parsed: those of a
 * start up to binding anything. */
static int config_run_checks(const Config *c) {
        int r;

        if (c->check_config) {
                r = config_check_paths(c);
                if (r < 0)
                        return r;
                r = config_check_registry(c->registry_path);
                if (r < 0)
                        return r;
                r = config_check_peer_security(c, NULL);
                if (r < 0)
                        return r;
        }
        if (c->check_registry) {
                r = config_check_registry(c->check_registry);
                if (r < 0)
                        return r;
        }
        return CONFIG_EXIT;
}

int config_parse(Config *c, int argc, char *argv[]) {
        /* Flags are applied twice: first to find --config, then again over the file's values,
         * so that flags win whatever their order. */
        _cleanup_(config_done) Config flags = {};
        int opt, r;

        getopt_tables();
        config_defaults(c);
        config_defaults(&flags);

        r = config_parse_actions(&flags, argc, argv);
        if (r != CONFIG_RUN)
                return r;
        c->check_config = flags.check_config;
        c->check_registry = TAKE_PTR(flags.check_registry);

        if (flags.config_file) {
                /* Flags win: config_parse applies them again after the file. */
                r = config_parse_file(c, flags.config_file);
                if (r < 0)
                        return r;
                c->config_file = TAKE_PTR(flags.config_file);
        }

        optind = 0;
        while ((opt = getopt_long(argc, argv, getopt_short, getopt_options, NULL)) >= 0) {
                const ConfigOption *o = option_by_val(opt);

                if (!o || o->action != ACTION_NONE)
                        continue;
                r = config_apply(c, &command_line, o, optarg);
                if (r < 0)
                        return r;
        }

        /* In etcd mode only --down-ms counts (the lease's TTL): nobody heartbeats. */
        if (!c->coordinator && (c->suspect_ms < c->heartbeat_ms || c->down_ms < c->suspect_ms)) {
                const char *keys[] = { "heartbeat-ms", "suspect-ms", "down-ms" };
                char where[512] = "";
                for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                        if (config_origin(c, keys[i])) {
                                size_t used = strlen(where);
                                (void) snprintf(where + used, sizeof where - used,
                                                "; %s is set at %s", keys[i],
                                                config_origin(c, keys[i]));
                        }
                log_error("need --heartbeat-ms <= --suspect-ms <= --down-ms%s", where);
                return -EINVAL;
        }

        r = config_check_coordinator(c);
        if (r < 0)
                return r;

        r = config_fill_derived(c);
        if (r < 0)
                return r;

        if (c->check_config || c->check_registry)
                return config_run_checks(c);
        return CONFIG_RUN;
}

void config_done(Config *c) {
        if (!c)
                return;
        for (size_t i = 0; i < ELEMENTSOF(config_options); i++) {
                const ConfigOption *o = &config_options[i];
                if (o->type == OPTION_STRING || o->type == OPTION_PATH)
                        free(*(char **) ((uint8_t *) c + o->offset));
        }
        for (size_t i = 0; i < c->n_origins; i++) {
                free(c->origins[i].key);
                free(c->origins[i].where);
        }
        free(c->origins);
        *c = (Config) {};
}
