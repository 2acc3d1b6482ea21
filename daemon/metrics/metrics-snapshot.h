/* metrics-snapshot.h: what one scrape shows, gathered as GetStatus gathers it, and its text. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

struct Manager;
struct Builder;

/* GPUs shown with a budget of their own; more are left out of the scrape. */
#define METRICS_MAX_GPUS 64u

typedef struct MetricsGpu {
        char device[32]; /* "cuda:0": the local device index, bounded by the node's GPUs */
        uint64_t budget_bytes;
        uint64_t used_bytes;
} MetricsGpu;

typedef struct MetricsSnapshot {
        /* builds */
        unsigned builds_live, builds_pinned, builds_referenced, builds_in_grace;
        uint64_t fills_started, bytes_filled;
        /* memory */
        uint64_t shm_budget_bytes, shm_used_bytes;
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

/* What a scrape reads: the manager (registry, topology, meshes, the build table) and the
 * Build use-case (its counters, the accelerators' budgets; NULL: host builds only). */
typedef struct MetricsSources {
        struct Manager *manager;
        const struct Builder *builder;
        double start_time_seconds; /* Unix time the process started */
} MetricsSources;

/* Fills *ret from src and the counters (metrics.h); -ENOMEM. */
int metrics_snapshot_gather(const MetricsSources *src, MetricsSnapshot *ret);

/* The exposition of s: the Prometheus text format 0.0.4, or OpenMetrics 1.0 (with "# EOF").
 * *ret is malloc'd, NUL-terminated; -ENOMEM. */
int metrics_render(const MetricsSnapshot *s, bool openmetrics, char **ret, size_t *ret_size);

#define METRICS_CONTENT_TYPE_TEXT "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_CONTENT_TYPE_OPENMETRICS "application/openmetrics-text; version=1.0.0; charset=utf-8"
