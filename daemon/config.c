/* config.c: command-line flags and the `key = value` config file, with their defaults. */
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "resource-limits.h"
#include "log.h"

#include "build-config.h"

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
               "answers SERVING. SIGHUP reloads the registry; SIGTERM and SIGINT stop.\n",
               FAMILYD_DEFAULT_SOCKET, FAMILYD_MAX_CONNECTIONS, FAMILYD_MAX_CONNECTIONS_PER_PEER,
               FAMILYD_CONNECTION_IDLE_MS, FAMILYD_MAX_WATCHES);
}

static int parse_u64(const char *name, const char *s, uint64_t min, uint64_t max,
                     uint64_t *ret) {
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
        fprintf(stderr, "familyd: --%s: '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n",
                name, strempty(s), min, max);
        return -EINVAL;
}

static int parse_unsigned(const char *name, const char *s, unsigned min, unsigned max,
                          unsigned *ret) {
        uint64_t v;
        int r = parse_u64(name, s, min, max, &v);
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

static int parse_log_level(const char *s, int *ret) {
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
        fprintf(stderr, "familyd: --log-level: unknown level '%s'\n", s);
        return -EINVAL;
}

/* Applies one setting, from a flag or a config file line. */
static int config_apply(Config *c, int key, const char *name, const char *value) {
        uint64_t u;
        int r;

        switch (key) {
        case ARG_CONFIG:
                return set_string(&c->config_file, value);
        case ARG_SOCKET:
                return set_string(&c->socket_path, value);
        case ARG_SHARD_SOCKET:
                return set_string(&c->shard_socket_path, value);
        case ARG_REGISTRY:
                return set_string(&c->registry_path, value);
        case ARG_STATE_DIR:
                return set_string(&c->state_dir, value);
        case ARG_HOST_DEVICES:
                return parse_unsigned(name, value, 1, 4096, &c->host_devices);
        case ARG_NODE_NAME:
                if (isempty(value) || strlen(value) > FAMILYD_MAX_NAME_LENGTH) {
                        fprintf(stderr, "familyd: --node-name must be 1 to %u bytes\n",
                                FAMILYD_MAX_NAME_LENGTH);
                        return -EINVAL;
                }
                return set_string(&c->node_name, value);
        case ARG_NODE_RANK:
                r = parse_u64(name, value, 0, INT32_MAX, &u);
                if (r < 0)
                        return r;
                c->node_rank = (int64_t) u;
                return 0;
        case ARG_LISTEN:
                return set_string(&c->listen_address, value);
        case ARG_PEERS:
                return set_string(&c->peers, value);
        case ARG_SHM_BUDGET:
                return parse_u64(name, value, 0, UINT64_MAX / 2, &c->shm_budget_bytes);
        case ARG_MAX_BUILDS:
                return parse_unsigned(name, value, 1, 1u << 20, &c->max_builds);
        case ARG_HEARTBEAT_MS:
                return parse_unsigned(name, value, 10, 3600000, &c->heartbeat_ms);
        case ARG_SUSPECT_MS:
                return parse_unsigned(name, value, 10, 3600000, &c->suspect_ms);
        case ARG_DOWN_MS:
                return parse_unsigned(name, value, 10, 3600000, &c->down_ms);
        case ARG_FORGET_AFTER_MS:
                return parse_unsigned(name, value, 0, UINT32_MAX, &c->forget_after_ms);
        case ARG_FDSTORE_MAX:
                return parse_unsigned(name, value, 0, 1u << 20, &c->fdstore_max);
        case ARG_THREADS:
                return parse_unsigned(name, value, 1, 64, &c->threads);
        case ARG_MAX_CONNECTIONS:
                return parse_unsigned(name, value, 1, 65536, &c->max_connections);
        case ARG_MAX_CONNECTIONS_PER_PEER:
                return parse_unsigned(name, value, 1, 65536, &c->max_connections_per_peer);
        case ARG_CONNECTION_IDLE_MS:
                return parse_unsigned(name, value, 100, 86400000, &c->connection_idle_ms);
        case ARG_MAX_WATCHES:
                return parse_unsigned(name, value, 1, 1u << 20, &c->max_watches);
        case ARG_MAX_SHARDS:
                return parse_unsigned(name, value, 1, 65536, &c->max_shards);
        case ARG_LOG_LEVEL:
                return parse_log_level(value, &c->log_level);
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

/* A line-oriented file: `key = value`, `#` comments, keys are the long option names. */
static int config_parse_file(Config *c, const char *path) {
        _cleanup_free_ char *line = NULL;
        size_t allocated = 0;
        unsigned lineno = 0;
        FILE *f;

        f = fopen(path, "re");
        if (!f) {
                int r = -errno; /* fprintf may change errno */
                fprintf(stderr, "familyd: cannot open config file %s: %s\n", path, strerror(-r));
                return r;
        }

        for (;;) {
                ssize_t n = getline(&line, &allocated, f);
                if (n < 0)
                        break;
                lineno++;

                char *s = strstrip(line);
                if (*s == 0 || *s == '#')
                        continue;

                char *eq = strchr(s, '=');
                if (!eq) {
                        fprintf(stderr, "familyd: %s:%u: expected `key = value`\n", path, lineno);
                        fclose(f);
                        return -EINVAL;
                }
                *eq = 0;
                char *key = strstrip(s), *value = strstrip(eq + 1);

                const struct option *o = NULL;
                for (const struct option *i = options; i->name; i++)
                        if (i->has_arg == required_argument && i->val != ARG_CONFIG &&
                            streq(i->name, key))
                                o = i;
                if (!o) {
                        fprintf(stderr, "familyd: %s:%u: unknown key '%s'\n", path, lineno, key);
                        fclose(f);
                        return -EINVAL;
                }
                int r = config_apply(c, o->val, o->name, value);
                if (r < 0) {
                        fprintf(stderr, "familyd: %s:%u: invalid value for '%s'\n", path, lineno,
                                key);
                        fclose(f);
                        return r;
                }
        }

        fclose(f);
        return 0;
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
                r = set_string(&c->registry_path, "/etc/familyd/registry");
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
                                r = config_apply(&flags, opt, "config", optarg);
                                if (r < 0) {
                                        config_done(&flags);
                                        return r;
                                }
                        }
                        break;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "familyd: unexpected argument '%s' (see --help)\n", argv[optind]);
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
                r = config_apply(c, opt, name, optarg);
                if (r < 0)
                        return r;
        }

        if (c->suspect_ms < c->heartbeat_ms || c->down_ms < c->suspect_ms) {
                fprintf(stderr, "familyd: need --heartbeat-ms <= --suspect-ms <= --down-ms\n");
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
        *c = (Config) {};
}
