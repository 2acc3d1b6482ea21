/* build.h: the Build use-case: request to published tokens, release, re-adoption at start. */
#pragma once

/*
 * DESIGN: a Build is checked completely (plan, dtype, layout, ranks) before it reserves its
 * bytes and a slot in the build table (build_draft()); then its segments are made and filled,
 * and only a finished build is committed and its tokens published (build_draft_finish()). Any
 * failure returns the reservation and drops what was made: nothing is half-built.
 * build_release() withdraws the tokens first, so no new descriptor is handed out, then drops
 * the daemon's hold; mappings trainers already have stay valid (the kernel frees the memory
 * when the last one goes).
 *
 * Where builds outlive the daemon (daemon/state/: the fd store, or --state-dir), a Build
 * draws its id before materialising (its segments are named after it), reserves room in the
 * fd store with its bytes, and is saved (segments, then its record) before it is committed:
 * a build anyone can see is a build a restart brings back (build_restore()). build_release()
 * forgets it there. Builds with shards in GPU memory are the exception: they are never kept
 * (build-keep.c says why).
 *
 * Devices: a rank goes to the device the topology assigns to it (its node, its local device
 * index), and its kind ("host" or "cuda") is that device's. Ranks materialised on this node
 * get their memory from the device's backend (shm/accel.h): host ranks a memfd (or a
 * --state-dir file) counted in --shm-budget, GPU ranks an allocation on that GPU counted in
 * the GPU's own budget, reserved (all GPUs at once) before anything is allocated, and given
 * back when the build goes. A GPU that cannot hold shards fails the Build before anything is
 * reserved.
 *
 * Thread safety: the functions here are called from gRPC workers and the build threads at
 * once; each works on its own draft or record, and the tables lock for themselves.
 */

#include <stdbool.h>
#include <stdint.h>

#include "build-state.h"
#include "core/build-plan.h"
#include "core/build-table.h"
#include "core/error.h"
#include "core/manager.h"
#include "shm/accel.h"
#include "shm/shard-table.h"
#include "state/state.h"

/* What the Build use-case works with; the shell sets it up, adapters pass it by pointer. */
typedef struct Builder {
        Manager *manager;   /* the registry, the topology, the mesh and build tables */
        ShardTable *shards; /* the tokens of materialised builds */
        Accel *accel;       /* shard memory by device; NULL: host devices only */
        State *state;       /* where builds and meshes are kept across restarts; NULL: nowhere */
} Builder;

/* A Build checked and holding its reservations, not yet materialised. */
typedef struct BuildDraft BuildDraft;

/*
 * Builds steps 1-5 (plan, dtype, layout, ranks on devices) and reserves what the build takes:
 * its mesh's count, GPU memory, fd store room, its bytes and slot in the build table. The
 * Build reply (naming shard_socket) must fit FAMILYD_MAX_REPLY_BYTES. On failure nothing is
 * held and ret_error says why (or a bare negative errno: INTERNAL).
 */
int build_draft(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                BuildDraft **ret, FamilyError *ret_error);
/* True when the draft has shards to fill here: the slow part, which adapters may run off their
 * own threads. */
bool build_draft_fills(const BuildDraft *d);
/* Gives back everything the draft holds and frees it. */
void build_draft_abandon(BuildDraft *d);

/*
 * Materialises, publishes the tokens, saves and commits the draft (taken, on failure too);
 * *ret is a new reference to the committed build. expired(userdata) says the caller has given
 * up (a deadline, or the daemon stopping): nobody would learn the build's id, so it stops and
 * keeps nothing (DEADLINE_EXCEEDED).
 */
int build_draft_finish(BuildDraft *d, bool (*expired)(void *userdata), void *userdata,
                       BuildRecord **ret, FamilyError *ret_error);

/* ReleaseBuild: tokens withdrawn, the build forgotten where it was kept, its bytes back in the
 * budget. NOT_FOUND as build_table_get(). */
int build_release(const Builder *builder, const char *id, FamilyError *ret_error);

/*
 * Re-adopts what the previous run kept (builder->state), before anything is served: meshes
 * into the mesh table, builds into the build table (same ids, bytes counted in the budget),
 * their tokens into the shard table; then keeps new meshes too (the mesh table's hooks). Logs
 * what it adopts and what it drops. Only -ENOMEM and the like fail it.
 */
int build_restore(const Builder *builder);
