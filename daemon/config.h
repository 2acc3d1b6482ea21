/* config.h: familyd's settings, from the command line and an optional --config file (flags win). */
#pragma once

#include <stdint.h>

#include "macro.h"


typedef struct Config {
        char *config_file;
        char *socket_path;
        char *shard_socket_path; /* default: shard.sock beside the API socket */
        char *registry_path;
        char *state_dir;
        unsigned host_devices; /* 0: not given */
        char *node_name;       /* default: the host name */
        int64_t node_rank;     /* -1: not given */
        char *listen_address;
        char *peers;
        uint64_t shm_budget_bytes;
        unsigned max_builds;
        unsigned heartbeat_ms;
        unsigned suspect_ms;
        unsigned down_ms;
        unsigned forget_after_ms;
        unsigned fdstore_max;
        unsigned threads; /* gRPC completion-queue threads */
        unsigned max_connections;
        unsigned connection_idle_ms; /* close a connection with no call for this long */
        unsigned max_watches;
        unsigned max_shards; /* 0: fitted to RLIMIT_NOFILE */
        unsigned max_connections_per_peer;
        int log_level;
} Config;

typedef enum ConfigParseResult {
        CONFIG_RUN,  /* go on and run the daemon */
        CONFIG_EXIT, /* --help or --version was printed: exit 0 */
} ConfigParseResult;

void config_done(Config *c);

/* Parses argv (and the file named by --config). 0 or 1 (CONFIG_EXIT) on success; on a usage
 * error prints one line to stderr and returns -EINVAL. */
int config_parse(Config *c, int argc, char *argv[]);
