/* metrics-snapshot.h: what one scrape shows, gathered as GetStatus gathers it, and its text. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

struct Manager;
struct Builder;
struct ShardServer;

/* GPUs shown with a budget of their own; more are left out of the scrape. */
#define METRICS_MAX_GPUS 64u
/* The device_kind label's values, in the order of the per-kind arrays below (accel.h's). */
#define METRICS_DEVICE_KINDS 2u
/* The resource label's values (per-uid limits): builds, pins, shm_bytes, in this order. */
#define METRICS_UID_RESOURCES 3u

typedef struct MetricsGpu {
        char device[32]; /* "cuda:0": the local device index, bounded by the node's GPUs */
        uint64_t budget_bytes;
        uint64_t used_bytes;
} MetricsGpu;

typedef struct MetricsSnapshot {
        /* builds */
        unsigned builds_live, builds_pinned, builds_referenced, builds_in_grace;
        uint64_t fills_started;
        uint64_t checkpoint_ranks, checkpoint_bytes_read, checkpoint_reads; /* from checkpoints */
        unsigned checkpoint_deposits;                     /* held on the shard socket now */
        uint64_t materialized_bytes[METRICS_DEVICE_KINDS]; /* by device kind: host, cuda */
        uint64_t fill_ns[METRICS_DEVICE_KINDS];
        /* the shard socket */
        unsigned shard_connections;
        uint64_t shard_connections_total, shard_refused_total;
        uint64_t shard_handouts_total, shard_descriptors_total;
        /* memory */
        uint64_t shm_budget_bytes, shm_used_bytes;
        uint64_t shm_released_held_bytes; /* freed builds' shards clients still hold */
        unsigned shm_released_held_segments;
        /* per uid, by resource, without naming a uid (docs/security.md, "Metrics port") */
        unsigned uids_holding;
        uint64_t uid_limit[METRICS_UID_RESOURCES];
        uint64_t uid_use_max[METRICS_UID_RESOURCES];
        unsigned uids_at_limit[METRICS_UID_RESOURCES];
        MetricsGpu gpus[METRICS_MAX_GPUS];
        size_t n_gpus;
        /* meshes and peers */
        unsigned meshes;
        unsigned peers_up, peers_suspect, peers_down;
        uint64_t topology_version;
        uint64_t peer_messages_sent, peer_bytes_sent;
        /* registry */
        uint64_t registry_generation;
        unsigned families;
        MetricsReloads reloads;
        /* the process */
        double start_time_seconds; /* Unix time */
        /* calls */
        MetricsMethod methods[METRICS_MAX_METHODS + 2];
        unsigned n_methods;
} MetricsSnapshot;

/* What a scrape reads: the manager (registry, topology, meshes, the build table), the
 * Build use-case (its counters, the accelerators' budgets and fill counters; NULL: host builds
 * only) and the shard socket (its counters; NULL: none, all zero). */
typedef struct MetricsSources {
        struct Manager *manager;
        const struct Builder *builder;
        struct ShardServer *shard_server;
        double start_time_seconds; /* Unix time the process started */
} MetricsSources;

/* Fills *ret from src and the counters (metrics.h); -ENOMEM. */
int metrics_snapshot_gather(const MetricsSources *src, MetricsSnapshot *ret);

/* The exposition of s: the Prometheus text format 0.0.4, or OpenMetrics 1.0 (with "# EOF").
 * *ret is malloc'd, NUL-terminated; -ENOMEM. */
int metrics_render(const MetricsSnapshot *s, bool openmetrics, char **ret, size_t *ret_size);

#define METRICS_CONTENT_TYPE_TEXT "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_CONTENT_TYPE_OPENMETRICS "application/openmetrics-text; version=1.0.0; charset=utf-8"
