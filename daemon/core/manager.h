/* manager.h: the daemon's state: the current registry snapshot, the mesh table, the topology. */
#pragma once

/*
 * DESIGN: RPC worker threads call every manager_* function concurrently. The registry and the
 * topology are immutable reference-counted snapshots; `lock` guards only the pointer swap, so a
 * Resolve holds it for a reference increment and never waits on a reload, which builds its new
 * snapshot outside the lock (reload_lock serialises reloads among themselves). The mesh table
 * has its own lock.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "build-table.h"
#include "error.h"
#include "mesh.h"
#include "registry.h"
#include "resolve.h"
#include "topology.h"

typedef struct ManagerParams {
        const char *registry_path;
        const char *node_name;
        int64_t node_rank; /* -1: not configured */
        const char *address;
        unsigned host_devices; /* without devices: this many host devices (0: one) */
        const Device *devices; /* this node's devices as the inventory found them */
        size_t n_devices;
        uint64_t shm_budget_bytes;
        unsigned max_builds;
        uint32_t boot_tag; /* random per start: build ids differ across restarts */
} ManagerParams;

/* What the adapters plug in: the server pushes topology changes to watchers; the peer thread
 * forgets nodes cluster-wide. Set once, before the server starts. */
typedef struct ManagerHooks {
        void (*topology_changed)(void *userdata);
        void *topology_userdata;
        /* 1: forgotten; a negative errno with ret_error set otherwise. */
        int (*forget_node)(void *userdata, const char *node, FamilyError *ret_error);
        void *forget_userdata;
} ManagerHooks;

typedef struct Manager {
        pthread_mutex_t lock;
        pthread_mutex_t reload_lock;
        pthread_mutex_t hooks_lock; /* held while a hook runs, so clearing waits for it */
        Registry *registry;
        Topology *topology;
        MeshTable *meshes;
        BuildTable *builds;
        char *registry_path;
        char *node_name;
        uint64_t shm_budget_bytes;
        unsigned max_builds;
        uint64_t started_usec; /* CLOCK_MONOTONIC */
        ManagerHooks hooks;
        atomic_uint_fast64_t peer_messages_sent; /* counted by the peer thread */
        atomic_uint_fast64_t peer_bytes_sent;
} Manager;

/* Loads the registry; on a load error returns -EINVAL with *ret_diag filled. */
int manager_new(const ManagerParams *params, Manager **ret, LoadDiagnostics *ret_diag);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);

/* New references to the current snapshots. */
Registry *manager_registry(Manager *m);
Topology *manager_topology(Manager *m);

/* Installs (or, with NULL, removes) the adapters' hooks; waits for a running hook. */
void manager_set_hooks(Manager *m, const ManagerHooks *hooks);
/* Replaces the topology (takes a new reference to t) and tells the watchers. */
void manager_set_topology(Manager *m, Topology *t);
/* Forgets a down node (ForgetNode); without peers only this node is known. */
int manager_forget_node(Manager *m, const char *node, FamilyError *ret_error);

/* Loads the registry anew and swaps it in; on failure the old one stays and *ret_diag says why.
 * *ret_registry (may be NULL) gets a reference to the registry now in force. */
int manager_reload(Manager *m, Registry **ret_registry, LoadDiagnostics *ret_diag);

int manager_resolve(Manager *m, const ResolveRequest *req, ResolvedFamily *ret,
                    FamilyError *ret_error);
/* GetFamily: the target errors of Resolve step 1; *ret_registry keeps *ret alive. */
int manager_get_family(Manager *m, const char *target, Registry **ret_registry,
                       const Family **ret, FamilyError *ret_error);

int manager_create_mesh(Manager *m, const MeshSpec *spec, Mesh **ret, FamilyError *ret_error);

uint64_t manager_uptime_ms(const Manager *m);

uint64_t manager_registry_generation(Manager *m);
