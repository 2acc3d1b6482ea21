/* config.h: familyd's settings, from the command line and an optional --config file (flags win). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"
#include "core/registry.h"


/* Where a key was set in the config file ("FILE:LINE"), for errors found after parsing. */
typedef struct ConfigOrigin {
        char *key;   /* the long option name */
        char *where; /* NULL once a flag overrode it */
} ConfigOrigin;

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
        char *cluster_key_file; /* --cluster-key: NULL: peers are not authenticated */
        bool insecure_peers;    /* --insecure-peers: no key on a non-loopback --listen */
        char *coordinator;      /* --coordinator etcd://HOST:PORT[,...]: NULL: embedded */
        char *cluster;          /* --cluster: default "familyd" with --coordinator */
        char *coordinator_ca;   /* --coordinator-ca, -cert, -key: TLS to etcd */
        char *coordinator_cert;
        char *coordinator_key;
        uint64_t shm_budget_bytes;
        unsigned max_builds;
        unsigned max_builds_per_uid;     /* 0 until derived: half of max_builds */
        unsigned max_pins_per_uid;       /* 0 until derived: half of max_builds */
        uint64_t shm_budget_per_uid_bytes; /* UINT64_MAX until derived: half of shm_budget */
        unsigned build_grace_ms; /* a build nothing holds is freed after this long */
        int membership; /* ProtocolMode: --membership all-to-all | swim */
        unsigned heartbeat_ms;
        unsigned suspect_ms;
        unsigned down_ms;
        unsigned forget_after_ms;
        unsigned max_nodes; /* --max-nodes: the cluster's nodes, this one included */
        unsigned fdstore_max;
        unsigned threads; /* gRPC completion-queue threads */
        unsigned max_connections;
        unsigned connection_idle_ms; /* close a connection with no call for this long */
        unsigned max_watches;
        unsigned max_shards; /* 0: fitted to RLIMIT_NOFILE */
        unsigned max_connections_per_process;
        unsigned max_connections_per_uid; /* 0: half of max_connections */
        unsigned max_watches_per_process;
        uint64_t max_queued_bytes_per_connection; /* reply bytes not yet taken by the client */
        uint64_t max_queued_bytes;
        char *admin_group; /* NULL: only root is an admin */
        char *metrics_listen; /* --metrics-listen ADDR:PORT; NULL: no metrics endpoint */
        int log_level;
        int huge_pages; /* HugePagesMode */
        unsigned fill_threads; /* --fill-threads; 0: one per online CPU */
        bool check_config;    /* --check-config[=FILE]: check the settings, then exit */
        char *check_registry; /* --check-registry DIR: check DIR, then exit; NULL: not asked */
        ConfigOrigin *origins;
        size_t n_origins, allocated_origins;
} Config;

typedef enum ConfigParseResult {
        CONFIG_RUN,  /* go on and run the daemon */
        CONFIG_EXIT, /* done: --help, --version or --print-config printed, or --check-config
                      * or --check-registry found nothing wrong: exit 0 */
} ConfigParseResult;

void config_done(Config *c);

/*
 * Parses argv (and the file named by --config). The options, their defaults, the config
 * file's keys and their checks are one table in config.c, which also makes --help and
 * --print-config (the example config file). 0 or 1 (CONFIG_EXIT) on success; on a usage
 * error, a bad value or an unknown key prints one line to stderr (naming FILE:LINE for the
 * config file) and returns -EINVAL. Reads no file but the config file; with --check-config
 * (which reads FILE, else --config's, else /etc/familyd/familyd.conf), also runs
 * config_check_paths() and config_check_registry() on the settings' registry, and with
 * --check-registry DIR config_check_registry() on DIR, and returns their error (never -EINVAL).
 */
int config_parse(Config *c, int argc, char *argv[]);

/*
 * Checks what the settings name on disk before anything is bound: the registry must be a
 * directory familyd can read. A problem prints one line naming the config file line that set
 * the path (or the flag, or the default) and returns a negative errno other than -EINVAL: a
 * start failure, not a usage error.
 */
int config_check_paths(const Config *c);

/*
 * Loads and verifies the registry in dir as a start or a reload does, keeping nothing: every
 * problem is one "FILE:LINE:COLUMN: text" line on stderr, as a start prints them. 0 when
 * familyd would serve it; else a negative errno other than -EINVAL (a failed check).
 */
int config_check_registry(const char *dir);

/* The cluster key of --cluster-key read and checked (into *ret_keys when not NULL), or, without
 * one, --listen off loopback refused unless --insecure-peers: what a start checks before it
 * binds anything. Logs the one line that says why; the errno of peer_keys_load() or -EPERM. */
struct PeerKeys;
int config_check_peer_security(const Config *c, struct PeerKeys *ret_keys);

/* The endpoints of --coordinator, without its etcd:// (points into c->coordinator), or NULL. */
const char *config_coordinator_endpoints(const Config *c);

/* Logs a failed registry_load() of dir: its diagnostics, one per line, then a summary. Returns
 * error. The one wording for a start, --check-config and --check-registry. */
int config_log_registry_failure(const char *dir, int error, const LoadDiagnostics *diag);

/* "FILE:LINE" where the config file set key (a long option name), or NULL: set by a flag, or
 * not set. For errors about a value found later ("state-dir at /etc/familyd/familyd.conf:7"). */
const char *config_origin(const Config *c, const char *key);
