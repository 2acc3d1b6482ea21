/* manager.h: the daemon's state: the current registry snapshot, the mesh table, the topology. */
#pragma once

/*
 * DESIGN: RPC worker threads call every manager_* function concurrently. The registry and the
 * topology are immutable reference-counted snapshots; `lock` guards only the pointer swap, so a
 * Resolve holds it for a reference increment and never waits on a reload, which builds its new
 * snapshot outside the lock (reload_lock serialises reloads among themselves). The mesh table
 * has its own lock. The registry's digest is computed with each load, outside the lock, and
 * swapped in with its registry; the topology's local node always shows the digest in force
 * (manager_set_topology() stamps a copy when the peer thread's is behind a reload).
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
        BuildUidLimits uid_limits; /* --max-builds-per-uid, --max-pins-per-uid, ... */
        uint32_t boot_tag; /* random per start: build ids differ across restarts */
        /* The registry's digest into ret (REGISTRY_DIGEST_LENGTH + 1 bytes): 0 or -ENOMEM. The
         * shell sets codec_registry_digest (core does not include codec/); NULL: "" (unknown). */
        int (*registry_digest)(const Registry *r, char *ret);
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
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* of registry; under lock */
        int (*digest_fn)(const Registry *r, char *ret);
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

/* The digest of the registry in force (REGISTRY_DIGEST_LENGTH + 1 bytes; "" without a digest
 * function). */
void manager_registry_digest(Manager *m, char ret[REGISTRY_DIGEST_LENGTH + 1]);
/* The digest of reg, a snapshot this manager served (computed anew if a reload replaced it). */
int manager_registry_digest_of(Manager *m, const Registry *reg,
                               char ret[REGISTRY_DIGEST_LENGTH + 1]);

/*
 * Build's check that the nodes holding ranks of mesh in topology t loaded the same registry as
 * reg, the snapshot the Build uses here: a node whose digest differs, or is not known yet,
 * fails it with FAILED_PRECONDITION REGISTRY_MISMATCH naming this node and the nodes that
 * differ with their digests.
 */
int manager_check_registry_agreement(Manager *m, const Registry *reg, const Topology *t,
                                     const Mesh *mesh, FamilyError *ret_error);
