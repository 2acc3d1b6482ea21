/* build-private.h: what the files of build/ share: placement and what is kept across restarts. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>

#include "build.h"

/* ---- build-place.c: where ranks live, what memory they take ---------------------------- */

/* materialize.dtype, float32 by default, then BuildRequest.parameter_dtypes
 * (build_plan_check_dtypes()): INVALID_ARGUMENT DTYPE otherwise. */
int build_dtype_of(const BuildPlan *plan, Dtype *ret, FamilyError *ret_error);
int build_compute_layout(BuildState *b, FamilyError *ret_error);
/* Where each rank lives, and which ranks this Build materialises here. */
int build_place_ranks(BuildState *b, const Topology *t, Accel *accel, FamilyError *ret_error);
/* Every GPU this Build materialises on can hold shards; then their bytes, all at once. */
int build_reserve_devices(BuildState *b, Accel *accel, FamilyError *ret_error);
/*
 * Replicas: among b's ranks materialised in host memory, each whose bytes equal an earlier
 * one's (build_ranks_same_bytes()) becomes a replica of the first such rank, its primary: one
 * segment, filled once, for the whole group. None in a writable build (its bytes are shared
 * by every process mapping them: a replica's writes would show in another rank's shard), none
 * in GPU memory (an allocation belongs to one GPU).
 */
int build_group_replicas(BuildState *b);
/* Layout ranks i and j hold the same bytes: the same segment size and, slice by slice, the
 * same parameter, global offset, local shape, byte offset and byte length (values are a
 * function of the parameter, the logical index, the seed and the dtype, all equal within a
 * build). */
bool build_ranks_same_bytes(const Layout *l, size_t i, size_t j);
/* Replica rank i's segment: its own descriptor (a dup) of its primary's memory, its own
 * device index, no mapping; the primary's segment must be there. */
int build_replica_segment(BuildState *b, size_t i);
/* Host bytes, the ones --shm-budget counts: each segment once, replicas share theirs (GPU
 * ranks count in their GPU's budget). */
uint64_t build_host_bytes(const BuildState *b);
uint64_t build_gpu_bytes(const BuildState *b);
/* RESOURCE_EXHAUSTED SHARD_LIMIT when the shard table cannot take b's tokens. */
int build_check_shard_room(const BuildState *b, ShardTable *shards, FamilyError *ret_error);

/* ---- build-keep.c: builds and meshes kept across restarts (daemon/state/) --------------- */

/* s may be NULL (nothing is kept) in all of them. */
int build_keep_reserve(State *s, const BuildState *b, FamilyError *ret_error);
void build_keep_unreserve(State *s, const BuildState *b);
/* A mapped, zeroed host segment of size bytes for rank of the build: a memfd, or a file in the
 * state dir (-ENOSPC: the state dir is full). */
int build_keep_segment_new(State *s, const char *id, int64_t rank, uint64_t size, int device,
                           ShardSegment **ret);
/* RESOURCE_EXHAUSTED STATE_DIR_FULL when the record does not fit; UNAVAILABLE FDSTORE when
 * the manager cannot be told. On failure nothing of it is kept (the segments stay the
 * caller's to discard). */
int build_keep_save(State *s, const char *id, const BuildState *b, FamilyError *ret_error);
/* Before the save: the segments' files go. */
void build_keep_discard(State *s, const char *id, const BuildState *b);
void build_keep_forget(State *s, const char *id, const BuildState *b);
/* The text of a Build that failed with -ENOSPC in the state dir. */
int build_keep_dir_full_error(State *s, uint64_t bytes, FamilyError *ret_error);

/* Keeps a mesh record (CreateMesh, or a build's mesh found without its own record). */
int mesh_keep_save(State *s, const Mesh *m, FamilyError *ret_error);
/* From now on the mesh table's new meshes are kept and its removed ones forgotten. */
void mesh_keep_install(State *s, MeshTable *meshes);

/* CLOCK_REALTIME ns: the order records keep across a restart. */
uint64_t build_keep_now_ns(void);

/* ---- build-share-key.c: the sharing key ------------------------------------------------- */

/*
 * The sharing key of b (build-share.c's DESIGN) for a Build (writable: BuildRequest.writable)
 * by a caller of uid, handed to its group's uids too with share_group: the Build message b
 * would be, without tokens, sizes or its group name (codec_build_key()), then, each ending in
 * a NUL: "mesh=ID", "seed=N", "dtype=D", "ranks=" a 0 or 1 per rank (materialised here),
 * "writable=0|1", "uid=N[ share=group]", "module=FQN", "registry=DIGEST", with a checkpoint
 * "checkpoint=ID prefix=P names=parameters|registry", and with init fields
 * "init_fields=NAME=VALUE;..." (ints in decimal, floats exactly, %a). *ret is the caller's.
 */
int build_share_key(const BuildState *b, bool writable, uint32_t uid, bool share_group,
                    uint8_t **ret, size_t *ret_size);

/* ---- build-share.c: shared builds, references, grace ------------------------------------- */

typedef struct BuildFlight BuildFlight;
typedef struct BuildWatch BuildWatch;

/* CLOCK_REALTIME ms: what references and grace deadlines show. */
int64_t build_now_ms(void);
/* A fill of bytes starts (GetStatus's counters); builder->sharing may be NULL. */
void build_count_fill(const Builder *builder, uint64_t bytes);
/* Ranks read from a checkpoint (0: a band pass, whose bytes are several ranks'): the bytes
 * read from its files and the read calls. */
void build_count_checkpoint_read(const Builder *builder, unsigned ranks, uint64_t bytes,
                                 uint64_t calls);
/* Takes the build out of the table as mode allows, withdraws its tokens, forgets it where it
 * was kept and lets its memory go. -EBUSY when mode refuses; NOT_FOUND as build_table_get(). */
int build_free(const Builder *builder, const char *id, BuildTakeMode mode, int64_t now_ms,
               const char *why, FamilyError *ret_error);
/* Frees the build whose grace period ends first among those match (NULL: any) accepts (a
 * BuildState); -ENOENT when none is in grace. */
int build_evict_one(const Builder *builder, bool (*match)(const void *payload));
/* ---- build-released.c: freed builds' host shards that clients still hold ---------------- */

typedef struct BuildReleased BuildReleased;
int build_released_new(BuildReleased **ret);
BuildReleased *build_released_free(BuildReleased *r);
/* Follows b's own host segments (a read-only build's) from its free on; before b's segments
 * are let go. r may be NULL. */
void build_released_add(BuildReleased *r, const BuildState *b);
/* Lets go of the segments nobody else holds any more; *ret (may be NULL): those left. */
void build_released_sweep(BuildReleased *r, BuildReleasedUse *ret);
/* build-share.c: the list (NULL without sharing). */
BuildReleased *build_sharing_released(const Builder *builder);

/* The same among the builds counted against uid. */
int build_evict_one_of_uid(const Builder *builder, uint32_t uid);
/* Grace deadlines changed: frees what is due (grace 0) and re-arms the watcher's timer. */
void build_sharing_grace_changed(const Builder *builder);
uint64_t build_sharing_grace_ms(const Builder *builder);

/* build.c, in two steps for build_draft_share(): steps 1-5 and the reply check (b complete,
 * nothing reserved), then the reservations (b taken into *ret on success only; builds in their
 * grace period give way to SHM_BUDGET, BUILD_LIMIT and FDSTORE_LIMIT). */
int build_draft_prepare(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                        int64_t uid, BuildState **ret, FamilyError *ret_error);
int build_draft_reserve(const Builder *builder, BuildState *b, BuildDraft **ret,
                        FamilyError *ret_error);

/* The flight a shared draft leads (build.c keeps it, build-share.c lands it). */
struct BuildDraftShare {
        BuildFlight *flight;
};
void build_draft_set_flight(BuildDraft *d, BuildFlight *f);
BuildFlight *build_draft_flight(const BuildDraft *d);
const Builder *build_draft_builder(const BuildDraft *d);
/* After the commit of rec (flight's draft), under the sharing lock: the record gets its key and
 * flags, the flight leaves the list, and each waiter still there gets its reference; then every
 * waiter is answered (error: rec NULL). Frees the flight. */
void build_flight_land(const Builder *builder, BuildFlight *f, BuildRecord *rec,
                       const FamilyError *error);
/* Whether every waiter of f gave up. */
bool build_flight_abandoned(const Builder *builder, BuildFlight *f);

/* ---- build-watch.c: the watcher thread -------------------------------------------------- */

/* Its own sd-event loop: pidfds of processes holding builds, and the grace timer. */
int build_watch_new(const Builder *builder, BuildWatch **ret);
BuildWatch *build_watch_free(BuildWatch *w);
/* Watches caller's process (pidfd taken; a process already watched keeps its first pidfd).
 * -E2BIG past BUILD_TABLE_MAX_HOLDERS processes. */
int build_watch_add(BuildWatch *w, const BuildCaller *caller, int pidfd);
/* Re-arms the grace timer from the table (any thread). */
void build_watch_kick(BuildWatch *w);
/* On the watcher's thread: a watched process exited. */
void build_sharing_process_gone(const Builder *builder, const BuildCaller *caller);
/* On the watcher's thread: frees builds whose grace ended; the next deadline (0: none). */
int64_t build_sharing_expire(const Builder *builder);

/* The shard socket hands rec's tokens to whom its holding says: its owner's processes and
 * admins, or, shared with the group, everyone; a training handout's (binding bound) to its one
 * process only (build-share.c). Nothing without an owner or a binding. */
void build_set_shard_access(const Builder *builder, const BuildRecord *rec, bool has_owner,
                            uint32_t owner_uid, bool share_group, const BuildBinding *binding);

/* Runs w's chunks on the fill threads near local_device's memory (on the calling thread
 * without a pool), as fill_pool_run(). */
int build_fill_run(const Builder *builder, int32_t local_device, const FillPoolWork *w,
                   bool (*cancelled)(void *userdata), void *userdata);
/* Binds the calling thread's next fills (fill_context_bind()) to the builder's pool, on the
 * threads of the NUMA node of this node's device local_device, reporting to progress and
 * stopping once cancelled(userdata) (the Build's callers gone, the daemon stopping). */
void build_fill_bind(const Builder *builder, int32_t local_device, FillProgress *progress,
                     bool (*cancelled)(void *userdata), void *userdata);

/* The first failure of work spread over the fill threads: a chunk that fails sets it (the
 * first one's error is kept; e is taken), the others see `failed` and stop early; the caller
 * then takes it (build_fill_failure_take(): the failure's r with its error in *ret_error, else
 * r), which also ends it. */
typedef struct BuildFillFailure {
        pthread_mutex_t lock;
        atomic_bool failed;
        int r;
        FamilyError error;
} BuildFillFailure;
void build_fill_failure_init(BuildFillFailure *f);
void build_fill_failure_set(BuildFillFailure *f, int r, FamilyError *e);
int build_fill_failure_take(BuildFillFailure *f, int r, FamilyError *ret_error);

/* ---- build-publish.c: builds whose values a client's module init writes ------------------ */

/* The first parameter of b whose init is `module` (NULL: none, or values from a checkpoint). */
const PlanParameter *build_module_init_parameter(const BuildState *b);
/* A draft of b may be made: FAILED_PRECONDITION MODULE_INIT_PENDING for a read-only build that
 * materialises a member with init: module (its published build is found by key, not made). */
int build_module_init_check(const BuildState *b, FamilyError *ret_error);

/* ---- build-from-checkpoint.c: a Build's values from a deposited checkpoint --------------- */

/*
 * With req->checkpoint (uid: the caller's; -1: none known): opens the deposit and plans every
 * slice this node fills, before anything is reserved, so a missing tensor, a wrong shape or
 * dtype is refused first; b gets the open checkpoint, its identity and the bytes to read.
 * Nothing without it.
 */
int build_checkpoint_prepare(const Builder *builder, BuildState *b, const BuildRequest *req,
                             int64_t uid, FamilyError *ret_error);
/* Fills rank i's segment (made, mapped for host memory) from b->checkpoint on the fill
 * threads; -ECANCELED once expired(userdata). */
int build_checkpoint_fill_rank(const Builder *builder, BuildState *b, size_t i,
                               BuildProgress *progress, bool (*expired)(void *userdata),
                               void *userdata, FamilyError *ret_error);
/* After every rank's build_checkpoint_fill_rank(), with their segments still mapped: the
 * banded tensors (build-checkpoint-bands.c), read once in bands and scattered to every rank;
 * then each rank's segment is unmapped (build_checkpoint_unmap). 0 when there are none. */
int build_checkpoint_fill_bands(const Builder *builder, BuildState *b, BuildProgress *progress,
                                bool (*expired)(void *userdata), void *userdata,
                                FamilyError *ret_error);
/* Unmaps the host segments a checkpoint's fill left mapped for its bands. */
void build_checkpoint_unmap(BuildState *b);
