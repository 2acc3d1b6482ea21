/* metrics-render.c: a snapshot as Prometheus text (0.0.4) or OpenMetrics 1.0. */

/*
 * The two formats differ in little: OpenMetrics names a counter's family without its _total
 * (the samples keep it), wants canonical floats in le labels (metrics.h's bounds already are)
 * and ends with "# EOF". Every name follows Prometheus's conventions (familyd_ prefix, base
 * units, _total for counters); every label is bounded by the daemon's own tables: methods,
 * status codes, peer states, the node's GPUs, the version. Never a build id or a pid.
 */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build-config.h"
#include "common/macro.h"
#include "metrics-snapshot.h"

/* The device_kind label, in the snapshot's per-kind order. */
static const char *const device_kinds[METRICS_DEVICE_KINDS] = { "host", "cuda" };

typedef struct Text {
        char *data;
        size_t size, allocated;
        bool openmetrics;
        bool oom;
} Text;

_printf_(2, 3) static void text_printf(Text *t, const char *fmt, ...) {
        va_list ap;
        int n;

        if (t->oom)
                return;
        for (;;) {
                size_t room = t->allocated - t->size;
                va_start(ap, fmt);
                n = vsnprintf(t->data ? t->data + t->size : NULL, room, fmt, ap);
                va_end(ap);
                if (n < 0) {
                        t->oom = true;
                        return;
                }
                if ((size_t) n < room) {
                        t->size += (size_t) n;
                        return;
                }
                size_t want = MAX(t->allocated * 2, t->size + (size_t) n + 1);
                want = MAX(want, (size_t) 4096);
                char *p = realloc(t->data, want);
                if (!p) {
                        t->oom = true;
                        return;
                }
                t->data = p;
                t->allocated = want;
        }
}

/* HELP and TYPE of a family; name is the sample name, a counter's with its _total. */
static void text_family(Text *t, const char *name, const char *type, const char *help) {
        size_t n = strlen(name);

        if (t->openmetrics && streq(type, "counter") && n > 6 && streq(name + n - 6, "_total"))
                n -= 6;
        text_printf(t, "# HELP %.*s %s\n# TYPE %.*s %s\n", (int) n, name, help, (int) n, name,
                    type);
}

static void text_u64(Text *t, const char *name, const char *type, const char *help,
                     uint64_t value) {
        text_family(t, name, type, help);
        text_printf(t, "%s %" PRIu64 "\n", name, value);
}

/* Calls per method and status code from first_code on (0: all, 1: all but OK). */
static void render_calls(Text *t, const MetricsSnapshot *s, const char *name, const char *help,
                         unsigned first_code) {
        text_family(t, name, "counter", help);
        for (unsigned i = 0; i < s->n_methods; i++)
                for (unsigned c = first_code; c < METRICS_STATUS_CODES; c++)
                        if (s->methods[i].calls[c] > 0)
                                text_printf(t, "%s{method=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                                            name, s->methods[i].name, metrics_status_name(c),
                                            s->methods[i].calls[c]);
}

static void render_rpc(Text *t, const MetricsSnapshot *s) {
        render_calls(t, s, "familyd_rpc_calls_total",
                     "gRPC calls answered, by method and status code.", 0);
        render_calls(t, s, "familyd_rpc_errors_total",
                     "gRPC calls answered with a status other than OK, by method and code.", 1);

        text_family(t, "familyd_rpc_duration_seconds", "histogram",
                    "Time from a call's arrival to its status, by method.");
        for (unsigned i = 0; i < s->n_methods; i++) {
                const MetricsMethod *m = &s->methods[i];
                uint64_t cumulative = 0;
                for (unsigned b = 0; b <= METRICS_LATENCY_BUCKETS; b++) {
                        cumulative += m->buckets[b];
                        text_printf(t,
                                    "familyd_rpc_duration_seconds_bucket{method=\"%s\",le=\"%s\"} "
                                    "%" PRIu64 "\n",
                                    m->name, metrics_latency_bound(b), cumulative);
                }
                text_printf(t, "familyd_rpc_duration_seconds_sum{method=\"%s\"} %" PRIu64 ".%09"
                               PRIu64 "\n",
                            m->name, m->sum_ns / 1000000000u, m->sum_ns % 1000000000u);
                text_printf(t, "familyd_rpc_duration_seconds_count{method=\"%s\"} %" PRIu64 "\n",
                            m->name, cumulative);
        }
}

static void render_builds(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_builds", "gauge", "Live builds.", s->builds_live);
        text_u64(t, "familyd_builds_pinned", "gauge", "Live builds pinned.", s->builds_pinned);
        text_u64(t, "familyd_builds_referenced", "gauge",
                 "Live builds held by process references.", s->builds_referenced);
        text_u64(t, "familyd_builds_in_grace", "gauge",
                 "Builds that nothing holds, waiting out their grace period.",
                 s->builds_in_grace);
        text_u64(t, "familyd_fills_total", "counter", "Shard fills started.", s->fills_started);
        text_u64(t, "familyd_checkpoint_ranks_total", "counter",
                 "Ranks whose shards were read from a checkpoint.", s->checkpoint_ranks);
        text_u64(t, "familyd_checkpoint_read_bytes_total", "counter",
                 "Bytes read from checkpoint files into shards (each byte a shard needs, once).",
                 s->checkpoint_bytes_read);
        text_u64(t, "familyd_checkpoint_reads_total", "counter",
                 "Read calls on checkpoint files (each up to 4 MiB, or a band of whole rows of "
                 "up to 16 MiB).",
                 s->checkpoint_reads);
        text_u64(t, "familyd_checkpoint_deposits", "gauge",
                 "Checkpoint deposits held for Builds (shard socket).", s->checkpoint_deposits);
        text_family(t, "familyd_materialized_bytes_total", "counter",
                    "Bytes of shards materialised, by the kind of device that holds them.");
        for (unsigned k = 0; k < METRICS_DEVICE_KINDS; k++)
                text_printf(t, "familyd_materialized_bytes_total{device_kind=\"%s\"} %" PRIu64
                               "\n",
                            device_kinds[k], s->materialized_bytes[k]);
        text_family(t, "familyd_fill_seconds_total", "counter",
                    "Time spent materialising shards, by the kind of device that holds them.");
        for (unsigned k = 0; k < METRICS_DEVICE_KINDS; k++)
                text_printf(t, "familyd_fill_seconds_total{device_kind=\"%s\"} %" PRIu64
                               ".%09" PRIu64 "\n",
                            device_kinds[k], s->fill_ns[k] / 1000000000u,
                            s->fill_ns[k] % 1000000000u);
}

static void render_shard_socket(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_shard_socket_connections", "gauge",
                 "Connections to the shard socket open now.", s->shard_connections);
        text_u64(t, "familyd_shard_socket_connections_accepted_total", "counter",
                 "Connections to the shard socket accepted and served.",
                 s->shard_connections_total);
        text_u64(t, "familyd_shard_socket_connections_refused_total", "counter",
                 "Connections to the shard socket closed at once for a connection limit.",
                 s->shard_refused_total);
        text_u64(t, "familyd_shard_handouts_total", "counter",
                 "Shard socket replies that handed out shard descriptors.",
                 s->shard_handouts_total);
        text_u64(t, "familyd_shard_descriptors_total", "counter",
                 "Shard descriptors handed out over the shard socket.",
                 s->shard_descriptors_total);
}

static void render_memory(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_shm_budget_bytes", "gauge",
                 "Host shared memory budget for shards (--shm-budget).", s->shm_budget_bytes);
        text_u64(t, "familyd_shm_used_bytes", "gauge", "Host shared memory held by builds.",
                 s->shm_used_bytes);
        text_family(t, "familyd_gpu_memory_budget_bytes", "gauge",
                    "A GPU's shard budget: its memory less what is kept free.");
        for (size_t i = 0; i < s->n_gpus; i++)
                text_printf(t, "familyd_gpu_memory_budget_bytes{device=\"%s\"} %" PRIu64 "\n",
                            s->gpus[i].device, s->gpus[i].budget_bytes);
        text_family(t, "familyd_gpu_memory_used_bytes", "gauge",
                    "GPU memory reserved by builds.");
        for (size_t i = 0; i < s->n_gpus; i++)
                text_printf(t, "familyd_gpu_memory_used_bytes{device=\"%s\"} %" PRIu64 "\n",
                            s->gpus[i].device, s->gpus[i].used_bytes);
}

static const char *const uid_resources[METRICS_UID_RESOURCES] = { "builds", "pins", "shm_bytes" };

static void render_uids(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_shm_released_held_bytes", "gauge",
                 "Host shard memory of freed builds that clients still map or hold: outside "
                 "familyd_shm_used_bytes, still taken from the node.",
                 s->shm_released_held_bytes);
        text_u64(t, "familyd_shm_released_held_segments", "gauge",
                 "The shards those bytes are in.", s->shm_released_held_segments);
        text_u64(t, "familyd_uids_holding", "gauge",
                 "Uids holding a build, a Build in flight or a pin.", s->uids_holding);
        text_family(t, "familyd_uid_limit", "gauge",
                    "What one uid may hold, by resource (--max-builds-per-uid, "
                    "--max-pins-per-uid, --shm-budget-per-uid; 0: none); admins are exempt.");
        for (unsigned k = 0; k < METRICS_UID_RESOURCES; k++)
                text_printf(t, "familyd_uid_limit{resource=\"%s\"} %" PRIu64 "\n",
                            uid_resources[k], s->uid_limit[k]);
        text_family(t, "familyd_uid_use_max", "gauge",
                    "The most any one uid holds, by resource (familyctl status names the uids).");
        for (unsigned k = 0; k < METRICS_UID_RESOURCES; k++)
                text_printf(t, "familyd_uid_use_max{resource=\"%s\"} %" PRIu64 "\n",
                            uid_resources[k], s->uid_use_max[k]);
        text_family(t, "familyd_uids_at_limit", "gauge",
                    "Uids holding as much as their limit allows, by resource.");
        for (unsigned k = 0; k < METRICS_UID_RESOURCES; k++)
                text_printf(t, "familyd_uids_at_limit{resource=\"%s\"} %u\n", uid_resources[k],
                            s->uids_at_limit[k]);
}

static void render_cluster(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_meshes", "gauge", "Meshes known to this node.", s->meshes);
        text_family(t, "familyd_peers", "gauge", "Other nodes of the cluster, by state.");
        text_printf(t, "familyd_peers{state=\"up\"} %u\n", s->peers_up);
        text_printf(t, "familyd_peers{state=\"suspect\"} %u\n", s->peers_suspect);
        text_printf(t, "familyd_peers{state=\"down\"} %u\n", s->peers_down);
        text_u64(t, "familyd_topology_version", "gauge", "Version of the cluster topology.",
                 s->topology_version);
        text_u64(t, "familyd_peer_sent_messages_total", "counter",
                 "Messages sent to peer daemons.", s->peer_messages_sent);
        text_u64(t, "familyd_peer_sent_bytes_total", "counter", "Bytes sent to peer daemons.",
                 s->peer_bytes_sent);
}

static void render_registry(Text *t, const MetricsSnapshot *s) {
        text_u64(t, "familyd_registry_generation", "gauge",
                 "Generation of the registry in force.", s->registry_generation);
        text_u64(t, "familyd_registry_families", "gauge", "Families in the registry in force.",
                 s->families);
        text_family(t, "familyd_registry_reloads_total", "counter",
                    "Registry reloads (Reload, SIGHUP), by result.");
        text_printf(t, "familyd_registry_reloads_total{result=\"ok\"} %" PRIu64 "\n",
                    s->reloads.ok);
        text_printf(t, "familyd_registry_reloads_total{result=\"failed\"} %" PRIu64 "\n",
                    s->reloads.failed);
        text_family(t, "familyd_registry_last_reload_timestamp_seconds", "gauge",
                    "When the last reload ended (the start's load until one happens).");
        text_printf(t, "familyd_registry_last_reload_timestamp_seconds %" PRId64 ".%03" PRId64
                       "\n",
                    s->reloads.last_unix_ms / 1000, s->reloads.last_unix_ms % 1000);
        text_u64(t, "familyd_registry_last_reload_success", "gauge",
                 "1 if the last reload succeeded, 0 if it failed and the previous registry "
                 "stayed.",
                 s->reloads.last_ok);
}

static void render_process(Text *t, const MetricsSnapshot *s) {
        text_family(t, "familyd_process_start_time_seconds", "gauge",
                    "When familyd started, in seconds since the Unix epoch.");
        text_printf(t, "familyd_process_start_time_seconds %.3f\n", s->start_time_seconds);
        /* OpenMetrics has a type for it: the family "familyd_build", the sample _info. */
        if (t->openmetrics)
                text_printf(t, "# HELP familyd_build familyd's version; always 1.\n"
                               "# TYPE familyd_build info\n");
        else
                text_family(t, "familyd_build_info", "gauge", "familyd's version; always 1.");
        text_printf(t, "familyd_build_info{version=\"%s\"} 1\n", FAMILYD_VERSION);
}

int metrics_render(const MetricsSnapshot *s, bool openmetrics, char **ret, size_t *ret_size) {
        Text t = { .openmetrics = openmetrics };

        render_process(&t, s);
        render_rpc(&t, s);
        render_builds(&t, s);
        render_memory(&t, s);
        render_uids(&t, s);
        render_shard_socket(&t, s);
        render_cluster(&t, s);
        render_registry(&t, s);
        if (openmetrics)
                text_printf(&t, "# EOF\n");
        if (t.oom || !t.data) {
                free(t.data);
                return -ENOMEM;
        }
        *ret = t.data;
        *ret_size = t.size;
        return 0;
}
