/* build-fill.c: the Builds' fill threads: one pool for the daemon's life, near each rank's memory. */

/*
 * DESIGN: the pool (core/fill-pool.c) is started once with the Build use-case and stopped after
 * the last Build thread has returned. On a machine with several NUMA nodes its threads are
 * grouped by node and bound to the node's CPUs (hw/numa.c); each rank's fill is handed to the
 * group of the node its device is on (Device.numa_node, which hwloc found for a GPU's PCI bus
 * or spread host devices over), so first touch puts the rank's pages on that node. On one node
 * the threads are not bound and every fill may use all of them, as before.
 */

#include "build-private.h"
#include "common/log.h"
#include "hw/numa.h"

struct BuildFill {
        FillPool *pool;
        NumaLayout numa;
};

static void build_fill_free(BuildFill *f) {
        if (!f)
                return;
        fill_pool_free(f->pool);
        numa_layout_done(&f->numa);
        free(f);
}

int build_fill_start(Builder *builder, unsigned n_threads) {
        _cleanup_free_ FillPoolGroup *groups = NULL;
        BuildFill *f;
        int r;

        if (builder->fill)
                return 0;
        f = calloc(1, sizeof *f);
        if (!f)
                return -ENOMEM;
        r = numa_layout_probe(NULL, &f->numa);
        if (r < 0)
                (void) log_warning_errno(r, "Failed to read the NUMA nodes, filling on any CPU: %m");
        groups = calloc(f->numa.n_nodes ? f->numa.n_nodes : 1, sizeof(FillPoolGroup));
        if (!groups) {
                build_fill_free(f);
                return -ENOMEM;
        }
        for (size_t i = 0; i < f->numa.n_nodes; i++)
                groups[i] = (FillPoolGroup) { .cpus = f->numa.nodes[i].cpus,
                                              .n_cpus = f->numa.nodes[i].n_cpus };
        r = fill_pool_new(n_threads, groups, f->numa.n_nodes, &f->pool);
        if (r < 0) {
                build_fill_free(f);
                return log_error_errno(r, "Failed to start the fill threads: %m");
        }
        log_debug("Fill threads: %u, in %zu NUMA groups.", fill_pool_threads(f->pool),
                  fill_pool_groups(f->pool));
        builder->fill = f;
        return 0;
}

void build_fill_stop(Builder *builder) {
        build_fill_free(builder->fill);
        builder->fill = NULL;
}

/* The NUMA node of this node's device local_device, or -1. */
static int32_t device_numa(const Builder *builder, int32_t local_device) {
        _cleanup_(topology_unrefp) Topology *t = manager_topology(builder->manager);
        const Node *n = t ? topology_local_node(t) : NULL;

        for (size_t i = 0; n && i < n->n_devices; i++)
                if (n->devices[i].local_index == local_device)
                        return n->devices[i].numa_node;
        return -1;
}

void build_fill_bind(const Builder *builder, int32_t local_device, FillProgress *progress,
                     bool (*cancelled)(void *userdata), void *userdata) {
        BuildFill *f = builder->fill;
        int group = -1;

        if (f && f->numa.n_nodes > 1)
                group = numa_layout_choose(&f->numa, device_numa(builder, local_device));
        fill_context_bind(&(FillContext) {
                .pool = f ? f->pool : NULL,
                .group = group,
                .progress = progress,
                .cancelled = cancelled,
                .userdata = userdata,
        });
}

int build_fill_run(const Builder *builder, int32_t local_device, const FillPoolWork *w,
                   bool (*cancelled)(void *userdata), void *userdata) {
        BuildFill *f = builder->fill;
        FillPoolWork work = *w;

        if (!f) {
                for (uint64_t i = 0; i < w->n_chunks; i++) {
                        if (cancelled && cancelled(userdata))
                                return -ECANCELED;
                        w->run(w->userdata, i);
                }
                return 0;
        }
        work.group = f->numa.n_nodes > 1
                             ? numa_layout_choose(&f->numa, device_numa(builder, local_device))
                             : -1;
        work.caller_runs = work.group < 0;
        return fill_pool_run(f->pool, &work, cancelled, userdata);
}

void build_fill_failure_init(BuildFillFailure *f) {
        *f = (BuildFillFailure) { .r = 0, .error = FAMILY_ERROR_NULL };
        (void) pthread_mutex_init(&f->lock, NULL);
}

void build_fill_failure_set(BuildFillFailure *f, int r, FamilyError *e) {
        (void) pthread_mutex_lock(&f->lock);
        if (f->r >= 0) {
                f->r = r;
                f->error = *e;
                *e = FAMILY_ERROR_NULL;
        }
        (void) pthread_mutex_unlock(&f->lock);
        family_error_done(e);
        atomic_store(&f->failed, true);
}

int build_fill_failure_take(BuildFillFailure *f, int r, FamilyError *ret_error) {
        (void) pthread_mutex_destroy(&f->lock);
        if (f->r >= 0)
                return r;
        if (ret_error && family_error_is_set(&f->error)) {
                family_error_done(ret_error);
                *ret_error = f->error;
        } else
                family_error_done(&f->error);
        return f->r;
}
