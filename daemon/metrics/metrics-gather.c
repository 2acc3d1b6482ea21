/* metrics-gather.c: one scrape's snapshot, read from what GetStatus reads. */

/*
 * DESIGN: runs on the metrics thread. Everything here is a function the RPC threads already
 * call concurrently (service-admin.c's GetStatus reads the same): reference-counted snapshots
 * of the registry and the topology, the build table's and mesh table's own short locks, the
 * accelerators' budget mutex, atomics. No lock is added and none is held across the render.
 */

#include <stdio.h>
#include <string.h>

#include "build/build.h"
#include "core/manager.h"
#include "metrics-snapshot.h"
#include "shm/accel.h"
#include "handout/shard-socket.h"

static int gather_builds(Manager *m, MetricsSnapshot *s) {
        BuildRecord **list = NULL;
        size_t n = 0;
        int r;

        r = build_table_list(m->builds, &list, &n);
        if (r < 0)
                return r;
        s->builds_live = (unsigned) n;
        for (size_t i = 0; i < n; i++) {
                BuildHolding h;
                if (build_table_holding(m->builds, list[i], &h) < 0)
                        continue; /* released since the list was taken */
                s->builds_pinned += h.pinned;
                s->builds_referenced += h.referenced;
                build_holding_done(&h);
        }
        build_list_free(list, n);
        return 0;
}

/* What uids hold, as the most one uid holds and how many are at their limit: no uid named. */
static int gather_uids(Manager *m, const Builder *builder, MetricsSnapshot *s) {
        _cleanup_free_ BuildUidUse *use = NULL;
        BuildUidLimits l;
        BuildReleasedUse released;
        size_t n = 0;
        int r;

        build_released_use(builder, &released);
        s->shm_released_held_bytes = released.bytes;
        s->shm_released_held_segments = released.segments;
        build_table_uid_limits(m->builds, &l);
        s->uid_limit[0] = l.builds;
        s->uid_limit[1] = l.pins;
        s->uid_limit[2] = l.bytes;
        r = build_table_uid_use(m->builds, &use, &n);
        if (r < 0)
                return r;
        s->uids_holding = (unsigned) n;
        for (size_t i = 0; i < n; i++) {
                uint64_t v[METRICS_UID_RESOURCES] = { use[i].builds, use[i].pins, use[i].bytes };
                for (unsigned k = 0; k < METRICS_UID_RESOURCES; k++) {
                        s->uid_use_max[k] = MAX(s->uid_use_max[k], v[k]);
                        s->uids_at_limit[k] += s->uid_limit[k] > 0 && v[k] >= s->uid_limit[k];
                }
        }
        return 0;
}

static void gather_gpus(const Builder *builder, const Topology *t, MetricsSnapshot *s) {
        if (!builder || !builder->accel)
                return;
        for (size_t i = 0; i < t->n_nodes; i++) {
                const Node *node = &t->nodes[i];
                if (!node->local)
                        continue;
                for (size_t d = 0; d < node->n_devices && s->n_gpus < METRICS_MAX_GPUS; d++) {
                        int32_t index = node->devices[d].local_index;
                        if (!accel_device_is_gpu(builder->accel, index))
                                continue;
                        MetricsGpu *g = &s->gpus[s->n_gpus++];
                        (void) snprintf(g->device, sizeof g->device, "cuda:%d", (int) index);
                        g->budget_bytes = accel_budget(builder->accel, index);
                        g->used_bytes = accel_in_use(builder->accel, index);
                }
        }
}

static void gather_fills(const Builder *builder, MetricsSnapshot *s) {
        AccelFillCounters f;

        accel_fill_counters(builder ? builder->accel : NULL, &f);
        s->materialized_bytes[0] = f.bytes[ACCEL_FILL_KIND_HOST];
        s->materialized_bytes[1] = f.bytes[ACCEL_FILL_KIND_CUDA];
        s->fill_ns[0] = f.ns[ACCEL_FILL_KIND_HOST];
        s->fill_ns[1] = f.ns[ACCEL_FILL_KIND_CUDA];
}

static void gather_shard_socket(ShardServer *server, MetricsSnapshot *s) {
        ShardServerCounters c;

        if (!server)
                return;
        shard_server_counters(server, &c);
        s->shard_connections = c.connections;
        s->shard_connections_total = c.connections_total;
        s->shard_refused_total = c.refused_total;
        s->shard_handouts_total = c.handouts_total;
        s->shard_descriptors_total = c.descriptors_total;
}

static void gather_peers(const Topology *t, MetricsSnapshot *s) {
        s->topology_version = t->version;
        for (size_t i = 0; i < t->n_nodes; i++) {
                if (t->nodes[i].local)
                        continue;
                switch (t->nodes[i].state) {
                case NODE_UP:
                        s->peers_up++;
                        break;
                case NODE_SUSPECT:
                        s->peers_suspect++;
                        break;
                default:
                        s->peers_down++;
                        break;
                }
        }
}

int metrics_snapshot_gather(const MetricsSources *src, MetricsSnapshot *ret) {
        Manager *m = src->manager;
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        _cleanup_(topology_unrefp) Topology *t = manager_topology(m);
        BuildCounters counters;
        int r;

        memset(ret, 0, sizeof *ret);
        r = gather_builds(m, ret);
        if (r < 0)
                return r;
        build_counters(src->builder, &counters);
        ret->builds_in_grace = counters.builds_in_grace;
        ret->fills_started = counters.fills_started;
        ret->checkpoint_ranks = counters.checkpoint_ranks;
        ret->checkpoint_bytes_read = counters.checkpoint_bytes_read;
        ret->checkpoint_reads = counters.checkpoint_reads;
        if (src->builder && src->builder->deposits) {
                CheckpointDepositCounters dc;
                checkpoint_deposits_counters(src->builder->deposits, &dc);
                ret->checkpoint_deposits = (unsigned) dc.deposits;
        }
        gather_fills(src->builder, ret);
        gather_shard_socket(src->shard_server, ret);

        ret->shm_budget_bytes = build_table_budget(m->builds);
        ret->shm_used_bytes = build_table_bytes_in_use(m->builds);
        gather_gpus(src->builder, t, ret);
        r = gather_uids(m, src->builder, ret);
        if (r < 0)
                return r;

        ret->meshes = (unsigned) mesh_table_size(m->meshes);
        gather_peers(t, ret);
        ret->peer_messages_sent = atomic_load_explicit(&m->peer_messages_sent,
                                                       memory_order_relaxed);
        ret->peer_bytes_sent = atomic_load_explicit(&m->peer_bytes_sent, memory_order_relaxed);

        ret->registry_generation = reg->generation;
        ret->families = (unsigned) reg->n_families;
        metrics_reloads_read(&ret->reloads);
        ret->start_time_seconds = src->start_time_seconds;
        ret->n_methods = metrics_methods_read(ret->methods, ELEMENTSOF(ret->methods));
        return 0;
}
