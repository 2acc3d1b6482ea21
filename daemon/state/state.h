/* state.h: builds and meshes kept across a daemon restart: systemd's fd store, or --state-dir. */
#pragma once

/*
 * DESIGN: one adapter, three modes, chosen once at start.
 *
 *   fdstore  under a service manager (NOTIFY_SOCKET set): each shard segment (a sealed memfd)
 *            goes into the manager's fd store as "shard-<build id>-<rank>", each build's and
 *            each mesh's record (record.h) as a sealed memfd "meta-<id>". At most
 *            --fdstore-max of ours are stored (the unit's FileDescriptorStoreMax must match):
 *            a Build or CreateMesh that would need more is refused (FDSTORE_LIMIT) rather
 *            than left unprotected, since the manager drops what is over its limit silently.
 *   dir      without one, with --state-dir on a tmpfs or ramfs: segments are files there
 *            (unsealable, so handed out read-only), records are files beside them written
 *            as a temporary file and renamed.
 *   none     nothing persists.
 *
 * What is written first is segments, then the record; what is removed first is the record,
 * then the segments. So a crash leaves at worst segments without a record, which the next
 * start deletes (or drops from the store), never a record whose bytes are missing. A record
 * that cannot be read, or whose segments are missing or of the wrong size, is logged and
 * dropped with its segments; the daemon starts anyway. Nothing ever truncates or rewrites a
 * kept segment, so a trainer's mapping survives every crash and restart.
 *
 * GPU shards (a build with a rank materialised in GPU memory) are never kept, in any mode:
 * the driver documents that an exported descriptor keeps its allocation alive while it is
 * open, but not that the allocation survives the process that made it (its context goes with
 * the process), nor that another process may re-export it; a descriptor re-adopted after a
 * restart could not be told from a live one until a trainer's import failed. So such a build
 * reserves no fd store room, writes no record and no segment (logged once, when it would have
 * been saved), and a record that names a GPU shard anyway is dropped at start (record.c):
 * re-adoption never takes a descriptor for a memfd it is not.
 *
 * Thread safety: state_build_* are called from the build threads and gRPC workers at once;
 * the mesh hooks under the mesh table's lock. Only the fd count is shared (own mutex); each
 * record or segment has its own name. The restore runs once, before any call is served.
 */

#include <stddef.h>
#include <stdint.h>

#include "rpc/build-state.h"
#include "core/error.h"
#include "sd/listen.h"
#include "core/manager.h"
#include "shm/segment.h"
#include "shm/shard-table.h"

#define STATE_FDSTORE_MAX_DEFAULT 4096u
/* The fd store's own rule (sd_notify(3), fdname_is_valid()): at most 255 characters. */
#define STATE_FDNAME_MAX 255u

typedef enum StateMode {
        STATE_MODE_NONE,
        STATE_MODE_DIR,
        STATE_MODE_FDSTORE,
        _STATE_MODE_MAX,
        _STATE_MODE_INVALID = -EINVAL,
} StateMode;

const char *state_mode_to_string(StateMode m); /* "none" | "state-dir" | "fd-store" */

typedef struct StateParams {
        const char *state_dir;  /* --state-dir, or NULL */
        unsigned fdstore_max;   /* --fdstore-max; 0: STATE_FDSTORE_MAX_DEFAULT */
        bool under_manager;     /* NOTIFY_SOCKET is set: the fd store mode */
        /* The fd store's descriptors given back at this start (listen_fds_take() of "meta"
         * and "shard-"): taken over by state_new(), on failure too. */
        ListenFd *metas;
        size_t n_metas;
        ListenFd *shards;
        size_t n_shards;
} StateParams;

typedef struct State State;

/* Chooses the mode and logs it; a --state-dir that is not a tmpfs or ramfs is said clearly
 * and means mode none. Fails (logged) when the state dir cannot be made or is locked by
 * another familyd. */
int state_new(const StateParams *params, State **ret);
State *state_free(State *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(State *, state_free);

StateMode state_mode(const State *s);

/*
 * Re-adopts what the previous run kept, before anything is served: meshes into m->meshes,
 * builds into m->builds (same ids, bytes counted in the budget), their tokens into shards;
 * then installs the mesh table hooks so new meshes are kept too. Logs what it adopts and
 * what it drops. Only -ENOMEM and the like fail it.
 */
int state_restore(State *s, Manager *m, ShardTable *shards);

/*
 * A Build's way through: reserve room for its materialised ranks (fd store: one descriptor
 * each plus its record; RESOURCE_EXHAUSTED FDSTORE_LIMIT past --fdstore-max), make each
 * segment, save once filled and published (the reservation becomes use), or, on any failure
 * before that, discard (its files go) and unreserve. ReleaseBuild forgets it. s may be NULL
 * (mode none) in all of them.
 */
int state_build_reserve(State *s, const BuildState *b, FamilyError *ret_error);
void state_build_unreserve(State *s, const BuildState *b);
/* A mapped, zeroed segment of size bytes for rank of the build: a memfd, or a file in the
 * state dir (-ENOSPC: the state dir is full). */
int state_segment_new(State *s, const char *build_id, int64_t rank, uint64_t size, int device,
                      ShardSegment **ret);
/* RESOURCE_EXHAUSTED STATE_DIR_FULL when the record does not fit; UNAVAILABLE FDSTORE when
 * the manager cannot be told. On failure nothing of it is kept (the segments stay the
 * caller's to discard). */
int state_build_save(State *s, const char *build_id, const BuildState *b,
                     FamilyError *ret_error);
void state_build_discard(State *s, const char *build_id, const BuildState *b);
void state_build_forget(State *s, const char *build_id, const BuildState *b);

/* The text of a Build that failed with -ENOSPC in the state dir. */
int state_dir_full_error(State *s, uint64_t bytes, FamilyError *ret_error);

