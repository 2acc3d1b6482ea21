/* config.c: command-line flags and the `key = value` config file, with their defaults. */
#include <ctype.h>
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "resource-limits.h"
#include "log.h"

#include "build-config.h"

#define FAMILYD_DEFAULT_REGISTRY "/etc/familyd/registry"

enum {
        ARG_CONFIG = 0x100,
        ARG_SOCKET,
        ARG_SHARD_SOCKET,
        ARG_REGISTRY,
        ARG_STATE_DIR,
        ARG_HOST_DEVICES,
        ARG_NODE_NAME,
        ARG_NODE_RANK,
        ARG_LISTEN,
        ARG_PEERS,
        ARG_SHM_BUDGET,
        ARG_MAX_BUILDS,
        ARG_HEARTBEAT_MS,
        ARG_SUSPECT_MS,
        ARG_DOWN_MS,
        ARG_FORGET_AFTER_MS,
        ARG_FDSTORE_MAX,
        ARG_THREADS,
        ARG_MAX_CONNECTIONS,
        ARG_MAX_CONNECTIONS_PER_PEER,
        ARG_CONNECTION_IDLE_MS,
        ARG_MAX_WATCHES,
        ARG_MAX_SHARDS,
        ARG_LOG_LEVEL,
        ARG_VERSION,
};

static const struct option options[] = {
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, ARG_VERSION },
        { "config", required_argument, NULL, ARG_CONFIG },
        { "socket", required_argument, NULL, ARG_SOCKET },
        { "shard-socket", required_argument, NULL, ARG_SHARD_SOCKET },
        { "registry", required_argument, NULL, ARG_REGISTRY },
        { "state-dir", required_argument, NULL, ARG_STATE_DIR },
        { "host-devices", required_argument, NULL, ARG_HOST_DEVICES },
        { "node-name", required_argument, NULL, ARG_NODE_NAME },
        { "node-rank", required_argument, NULL, ARG_NODE_RANK },
        { "listen", required_argument, NULL, ARG_LISTEN },
        { "peers", required_argument, NULL, ARG_PEERS },
        { "shm-budget", required_argument, NULL, ARG_SHM_BUDGET },
        { "max-builds", required_argument, NULL, ARG_MAX_BUILDS },
        { "heartbeat-ms", required_argument, NULL, ARG_HEARTBEAT_MS },
        { "suspect-ms", required_argument, NULL, ARG_SUSPECT_MS },
        { "down-ms", required_argument, NULL, ARG_DOWN_MS },
        { "forget-after-ms", required_argument, NULL, ARG_FORGET_AFTER_MS },
        { "fdstore-max", required_argument, NULL, ARG_FDSTORE_MAX },
        { "threads", required_argument, NULL, ARG_THREADS },
        { "max-connections", required_argument, NULL, ARG_MAX_CONNECTIONS },
        { "max-connections-per-peer", required_argument, NULL, ARG_MAX_CONNECTIONS_PER_PEER },
        { "connection-idle-ms", required_argument, NULL, ARG_CONNECTION_IDLE_MS },
        { "max-watches", required_argument, NULL, ARG_MAX_WATCHES },
        { "max-shards", required_argument, NULL, ARG_MAX_SHARDS },
        { "log-level", required_argument, NULL, ARG_LOG_LEVEL },
        {}
};

static void help(void) {
        printf("Usage: familyd [OPTIONS]\n"
               "\n"
               "Per-node service for distributed training: the family registry, Resolve,\n"
               "job meshes and node topology over gRPC on a Unix socket.\n"
               "\n"
               "  -h --help                 Show this help and exit\n"
               "     --version              Show the version and exit\n"
               "     --config FILE          Read settings from FILE (`key = value` lines, keys\n"
               "                            as the long options below; flags win)\n"
               "     --socket PATH          API socket (default %s)\n"
               "     --shard-socket PATH    Shard descriptor socket (default: shard.sock beside\n"
               "                            the API socket)\n"
               "     --registry DIR         Family registry directory (default\n"
               "                            /etc/familyd/registry)\n"
               "     --state-dir DIR        Keep built shards and their metadata here\n"
               "     --host-devices N       Declare N host-memory devices on this node\n"
               "     --node-name NAME       This node's name (default: the host name)\n"
               "     --node-rank N          This node's rank in the cluster order\n"
               "     --listen ADDR:PORT     Peer listener address\n"
               "     --peers LIST           Peer daemons, ADDR:PORT[,ADDR:PORT...]\n"
               "     --shm-budget BYTES     Shared memory held for shards (default: half of RAM)\n"
               "     --max-builds N         Live builds (default 1024)\n"
               "     --heartbeat-ms N       Peer heartbeat interval (default 1000)\n"
               "     --suspect-ms N         Silence before a peer is suspect (default 3000)\n"
               "     --down-ms N            Silence before a peer is down (default 10000)\n"
               "     --forget-after-ms N    Forget a down peer after N ms (default: never)\n"
               "     --fdstore-max N        Descriptors kept in systemd's fd store (default 4096)\n"
               "     --threads N            gRPC worker threads (default 2)\n"
               "     --max-connections N    Concurrent API connections (default %u; fewer\n"
               "                            when the open-file limit is too low)\n"
               "     --max-connections-per-peer N\n"
               "                            Concurrent API connections from one process\n"
               "                            (default %u)\n"
               "     --connection-idle-ms N Close a connection with no call for N ms\n"
               "                            (default %u)\n"
               "     --max-watches N        Open Watch streams (default %u)\n"
               "     --max-shards N         Shard segments held (one descriptor each; default:\n"
               "                            what the open-file limit leaves, at most 65536)\n"
               "     --log-level LEVEL      debug, info, notice, warning or err (default info)\n"
               "\n"
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
               "the journal (JOURNAL_STREAM).\n",
               FAMILYD_DEFAULT_SOCKET, FAMILYD_MAX_CONNECTIONS, FAMILYD_MAX_CONNECTIONS_PER_PEER,
               FAMILYD_CONNECTION_IDLE_MS, FAMILYD_MAX_WATCHES);
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
        static const struct {
                const char *name;
                int level;
        } table[] = {
                { "debug", LOG_DEBUG },     { "info", LOG_INFO }, { "notice", LOG_NOTICE },
                { "warning", LOG_WARNING }, { "err", LOG_ERR },   { "error", LOG_ERR },
        };
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (streq(table[i].name, s)) {
                        *ret = table[i].level;
                        return 0;
                }
        return config_error(src, name, "unknown level '%s' (debug, info, notice, warning, err)",
                            s);
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

/* Applies one setting, from a flag or a config file line. */
static int config_apply(Config *c, const ConfigSource *src, int key, const char *name,
                        const char *value) {
        uint64_t u;
        int r;

        r = config_set_origin(c, src, name);
        if (r < 0)
                return r;

        switch (key) {
        case ARG_CONFIG:
                return parse_string(src, name, value, &c->config_file);
        case ARG_SOCKET:
                return parse_string(src, name, value, &c->socket_path);
        case ARG_SHARD_SOCKET:
                return parse_string(src, name, value, &c->shard_socket_path);
        case ARG_REGISTRY:
                return parse_string(src, name, value, &c->registry_path);
        case ARG_STATE_DIR:
                return parse_string(src, name, value, &c->state_dir);
        case ARG_HOST_DEVICES:
                return parse_unsigned(src, name, value, 1, 4096, &c->host_devices);
        case ARG_NODE_NAME:
                if (isempty(value) || strlen(value) > FAMILYD_MAX_NAME_LENGTH)
                        return config_error(src, name, "must be 1 to %u bytes",
                                            FAMILYD_MAX_NAME_LENGTH);
                return set_string(&c->node_name, value);
        case ARG_NODE_RANK:
                r = parse_u64(src, name, value, 0, INT32_MAX, &u);
                if (r < 0)
                        return r;
                c->node_rank = (int64_t) u;
                return 0;
        case ARG_LISTEN:
                return parse_string(src, name, value, &c->listen_address);
        case ARG_PEERS:
                return parse_string(src, name, value, &c->peers);
        case ARG_SHM_BUDGET:
                return parse_u64(src, name, value, 0, UINT64_MAX / 2, &c->shm_budget_bytes);
        case ARG_MAX_BUILDS:
                return parse_unsigned(src, name, value, 1, 1u << 20, &c->max_builds);
        case ARG_HEARTBEAT_MS:
                return parse_unsigned(src, name, value, 10, 3600000, &c->heartbeat_ms);
        case ARG_SUSPECT_MS:
                return parse_unsigned(src, name, value, 10, 3600000, &c->suspect_ms);
        case ARG_DOWN_MS:
                return parse_unsigned(src, name, value, 10, 3600000, &c->down_ms);
        case ARG_FORGET_AFTER_MS:
                return parse_unsigned(src, name, value, 0, UINT32_MAX, &c->forget_after_ms);
        case ARG_FDSTORE_MAX:
                return parse_unsigned(src, name, value, 0, 1u << 20, &c->fdstore_max);
        case ARG_THREADS:
                return parse_unsigned(src, name, value, 1, 64, &c->threads);
        case ARG_MAX_CONNECTIONS:
                return parse_unsigned(src, name, value, 1, 65536, &c->max_connections);
        case ARG_MAX_CONNECTIONS_PER_PEER:
                return parse_unsigned(src, name, value, 1, 65536, &c->max_connections_per_peer);
        case ARG_CONNECTION_IDLE_MS:
                return parse_unsigned(src, name, value, 100, 86400000, &c->connection_idle_ms);
        case ARG_MAX_WATCHES:
                return parse_unsigned(src, name, value, 1, 1u << 20, &c->max_watches);
        case ARG_MAX_SHARDS:
                return parse_unsigned(src, name, value, 1, 65536, &c->max_shards);
        case ARG_LOG_LEVEL:
                return parse_log_level(src, name, value, &c->log_level);
        default:
                return -EINVAL;
        }
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

static bool key_is_setting(const struct option *o) {
        return o->has_arg == required_argument && o->val != ARG_CONFIG;
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

                const struct option *o = NULL;
                for (const struct option *i = options; i->name; i++)
                        if (key_is_setting(i) && streq(i->name, key))
                                o = i;
                if (!o) {
                        log_error("%s:%u: unknown key '%s'", path, src.line, key);
                        r = -EINVAL;
                        break;
                }
                r = config_apply(c, &src, o->val, o->name, value);
                if (r < 0)
                        break;
        }

        fclose(f);
        return r;
}

static void config_defaults(Config *c) {
        *c = (Config) {
                .node_rank = -1,
                .shm_budget_bytes = UINT64_MAX, /* unset: half of RAM, in config_fill_derived */
                .max_builds = 1024,
                .heartbeat_ms = 1000,
                .suspect_ms = 3000,
                .down_ms = 10000,
                .fdstore_max = 4096,
                .threads = 2,
                .max_connections = FAMILYD_MAX_CONNECTIONS,
                .max_connections_per_peer = FAMILYD_MAX_CONNECTIONS_PER_PEER,
                .connection_idle_ms = FAMILYD_CONNECTION_IDLE_MS,
                .max_watches = FAMILYD_MAX_WATCHES,
                .log_level = LOG_INFO,
        };
}

static int config_fill_derived(Config *c) {
        int r;

        if (!c->socket_path) {
                r = set_string(&c->socket_path, FAMILYD_DEFAULT_SOCKET);
                if (r < 0)
                        return r;
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
        if (!c->registry_path) {
                r = set_string(&c->registry_path, FAMILYD_DEFAULT_REGISTRY);
                if (r < 0)
                        return r;
        }
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

int config_parse(Config *c, int argc, char *argv[]) {
        /* Flags are applied twice: first to find --config, then again over the file's values,
         * so that flags win whatever their order. */
        Config flags;
        int opt, r;

        config_defaults(c);
        config_defaults(&flags);

        optind = 0;
        while ((opt = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (opt) {
                case 'h':
                        help();
                        config_done(&flags);
                        return CONFIG_EXIT;
                case ARG_VERSION:
                        printf("familyd %s\n", FAMILYD_VERSION);
                        config_done(&flags);
                        return CONFIG_EXIT;
                case '?':
                        config_done(&flags);
                        return -EINVAL;
                default:
                        if (opt == ARG_CONFIG) {
                                r = config_apply(&flags, &command_line, opt, "config",
                                                 optarg);
                                if (r < 0) {
                                        config_done(&flags);
                                        return r;
                                }
                        }
                        break;
                }
        }
        if (optind < argc) {
                log_error("unexpected argument '%s' (see --help)", argv[optind]);
                config_done(&flags);
                return -EINVAL;
        }

        if (flags.config_file) {
                /* Flags win: config_parse applies them again after the file. */
                r = config_parse_file(c, flags.config_file);
                if (r < 0) {
                        config_done(&flags);
                        return r;
                }
                c->config_file = TAKE_PTR(flags.config_file);
        }
        config_done(&flags);

        optind = 0;
        while ((opt = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                const char *name = NULL;
                for (const struct option *i = options; i->name; i++)
                        if (i->val == opt)
                                name = i->name;
                if (opt == ARG_CONFIG)
                        continue;
                r = config_apply(c, &command_line, opt, name, optarg);
                if (r < 0)
                        return r;
        }

        if (c->suspect_ms < c->heartbeat_ms || c->down_ms < c->suspect_ms) {
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

        r = config_fill_derived(c);
        if (r < 0)
                return r;
        return CONFIG_RUN;
}

void config_done(Config *c) {
        if (!c)
                return;
        free(c->config_file);
        free(c->socket_path);
        free(c->shard_socket_path);
        free(c->registry_path);
        free(c->state_dir);
        free(c->node_name);
        free(c->listen_address);
        free(c->peers);
        for (size_t i = 0; i < c->n_origins; i++) {
                free(c->origins[i].key);
                free(c->origins[i].where);
        }
        free(c->origins);
        *c = (Config) {};
}
