/* build.h: the Build use-case: request to published tokens, release, re-adoption at start. */
#pragma once

/*
 * DESIGN: a Build is checked completely (plan, dtype, layout, ranks) before it reserves its
 * bytes and a slot in the build table (build_draft()); then its segments are made and filled,
 * and only a finished build is committed and its tokens published (build_draft_finish()). Any
 * failure returns the reservation and drops what was made: nothing is half-built.
 * build_free() withdraws the tokens first, so no new descriptor is handed out, then drops
 * the daemon's hold; mappings trainers already have stay valid (the kernel frees the memory
 * when the last one goes).
 *
 * Where builds outlive the daemon (daemon/state/: the fd store, or --state-dir), a Build
 * draws its id before materialising (its segments are named after it), reserves room in the
 * fd store with its bytes, and is saved (segments, then its record) before it is committed:
 * a build anyone can see is a build a restart brings back (build_restore()). build_free()
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
#include "handout/checkpoint-deposit.h"
#include "handout/shard-table.h"
#include "state/state.h"

typedef struct BuildSharing BuildSharing;
typedef struct BuildProgressTable BuildProgressTable;
typedef struct BuildFill BuildFill;

/* What the Build use-case works with; the shell sets it up, adapters pass it by pointer. */
typedef struct Builder {
        Manager *manager;   /* the registry, the topology, the mesh and build tables */
        ShardTable *shards; /* the tokens of materialised builds */
        Accel *accel;       /* shard memory by device; NULL: host devices only */
        State *state;       /* where builds and meshes are kept across restarts; NULL: nowhere */
        /* Shared builds, references and grace (build-share.c, build-watch.c); NULL: every
         * Build is its own and nothing watches processes (build_sharing_start()). */
        BuildSharing *sharing;
        /* Materialising builds and their progress (WatchBuild); NULL: not followed. */
        BuildProgressTable *progress;
        /* The fill threads (build_fill_start()); NULL: each fill starts threads of its own. */
        BuildFill *fill;
        /* Checkpoint files clients handed over on the shard socket; NULL: Builds from a
         * checkpoint find no token. */
        CheckpointDeposits *deposits;
} Builder;

/* ---- the fill threads (build-fill.c) ------------------------------------------------------ */

/*
 * Starts the pool that fills every Build's shards: n_threads threads (--fill-threads; 0: one
 * per online CPU), grouped by NUMA node and bound to its CPUs where the machine has several.
 * Does nothing when builder has one already (build_sharing_start() starts one with the default
 * size for a shell that did not). Logs its failure.
 */
int build_fill_start(Builder *builder, unsigned n_threads);
/* Stops the pool once no Build fills any more (after the Build threads); accepts none. */
void build_fill_stop(Builder *builder);

/* ---- callers (build-caller.c) ----------------------------------------------------------- */

/* The process a reference belongs to: pid, uid, and its start time (field 22 of
 * /proc/PID/stat), so that a reused pid is another process. */
typedef struct BuildCaller {
        int32_t pid;
        uint32_t uid;
        uint64_t start_time;
} BuildCaller;

/*
 * Names the client process (pid, uid from SO_PEERCRED; caller_pidfd from SO_PEERPIDFD or -1, taken):
 * a pidfd for it (*ret_pidfd, opened before its start time is read, so the start time is the
 * process's that the pidfd watches) and its start time. UNAVAILABLE CALLER_UNKNOWN when the
 * process cannot be named (pid 0: another pid namespace; gone already).
 */
int build_caller_identify(int32_t pid, uint32_t uid, int caller_pidfd, BuildCaller *ret,
                          int *ret_pidfd, FamilyError *ret_error);

/* Who asks, by the connection's credentials: whose uid a Build counts against, and who may pin,
 * unpin and release (docs/semantics.md, "Who may do what"). */
typedef struct BuildActor {
        uint32_t uid;
        bool admin; /* root, or a member of --admin-group: not held to the per-uid limits */
} BuildActor;

/* ---- shared builds (build-share.c) --------------------------------------------------------- */

/* Starts sharing on builder: references, grace periods (grace_ms; 0: freed at once) and the
 * watcher thread; builds already in the table (restored) start their grace period now. */
int build_sharing_start(Builder *builder, uint64_t grace_ms);
/* Stops the watcher and frees the sharing state; accepts a builder without one. */
void build_sharing_stop(Builder *builder);

/* The counters GetStatus shows (0 without sharing). */
typedef struct BuildCounters {
        uint64_t fills_started;
        uint64_t bytes_filled;
        unsigned builds_in_grace;
        uint64_t checkpoint_ranks;      /* ranks filled from a checkpoint */
        uint64_t checkpoint_bytes_read; /* bytes read from checkpoints' files for them */
        uint64_t checkpoint_reads;      /* the read calls that read those bytes */
} BuildCounters;
void build_counters(const Builder *builder, BuildCounters *ret);

/* Host shards of freed builds that clients still map or hold (build-released.c): bytes the
 * node's memory still holds that --shm-budget no longer counts. Reading it lets go of those
 * nobody holds any more. */
typedef struct BuildReleasedUse {
        uint64_t bytes;
        unsigned segments;
} BuildReleasedUse;
void build_released_use(const Builder *builder, BuildReleasedUse *ret);

/* One caller waiting for a materialising Build's answer (the adapter's pending call). */
typedef struct BuildWaiter {
        BuildCaller caller;
        int pidfd; /* taken by build_draft_share(), on failure too */
        /* BuildRequest.share "group": the shard socket hands the build to every uid of its
         * group, not only the owner's (part of the sharing key). */
        bool share_group;
        /* An admin: a new build is not held to --max-builds-per-uid, --shm-budget-per-uid. */
        bool admin;
        /* The caller gave up (deadline, cancel, gone): it gets no reference. */
        bool (*expired)(void *userdata);
        /* Called exactly once, on any thread: rec (borrowed for the call) and shared, or the
         * error (rec NULL). */
        void (*done)(void *userdata, BuildRecord *rec, bool shared, FamilyError *error);
        void *userdata;
} BuildWaiter;

/* A Build checked and holding its reservations, not yet materialised. */
typedef struct BuildDraft BuildDraft;

/*
 * Builds steps 1-5 (plan, dtype, layout, ranks on devices) and reserves what the build takes:
 * its mesh's count, GPU memory, fd store room, its bytes and slot in the build table. The
 * Build reply (naming shard_socket) must fit FAMILYD_MAX_REPLY_BYTES. On failure nothing is
 * held and ret_error says why (or a bare negative errno: INTERNAL).
 */
int build_draft(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                const BuildActor *actor, BuildDraft **ret, FamilyError *ret_error);
/*
 * A materialising Build with a waiter: as build_draft(), but first the live builds and the
 * Builds in flight are searched by the request's sharing key (unless private). Returns
 * BUILD_SHARE_NEW with *ret a draft that the caller finishes with build_draft_run() (which
 * answers the waiter and everyone who joined), BUILD_SHARE_ANSWERED when the waiter was already
 * answered (a live build, now held by the waiter), BUILD_SHARE_JOINED when it waits for a Build
 * in flight; or an error (the waiter not answered).
 */
enum {
        BUILD_SHARE_NEW = 0,
        BUILD_SHARE_ANSWERED = 1,
        BUILD_SHARE_JOINED = 2,
};
int build_draft_share(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                      BuildWaiter *w, BuildDraft **ret, FamilyError *ret_error);
/* Materialises a draft of build_draft_share() (taken) and answers every waiter; it stops,
 * keeping nothing, once stopping(userdata) or every waiter gave up. */
void build_draft_run(BuildDraft *d, bool (*stopping)(void *userdata), void *userdata);
/* A copy of an error (a flight's failure, for each waiter); -EINVAL, or -ENOMEM. */
int build_error_copy(const FamilyError *from, FamilyError *to);
/* Gives a draft of build_draft_share() up (taken) and answers every waiter with error. */
void build_draft_fail(BuildDraft *d, const FamilyError *error);

/* BuildRequest.progress_tag (copied; NULL or "": none): the draft's fill is followed under it
 * as well as under its id. -ENOMEM. */
int build_draft_set_progress_tag(BuildDraft *d, const char *tag);

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

/*
 * ReleaseBuild with references: force frees the build whatever holds it (the adapter checks
 * that actor is an admin); else the caller's reference goes (FAILED_PRECONDITION NOT_HELD when
 * it holds none) and a build left unheld starts its grace period (0: freed now). A build
 * without references (layout only) is freed at once (build_free()), by its owner's uid or an
 * admin only (PERMISSION_DENIED RELEASE_NOT_ALLOWED; anyone for a build of no known owner).
 * *ret_freed: this call freed it.
 */
int build_release_held(const Builder *builder, const char *id, const BuildCaller *caller,
                       const BuildActor *actor, bool force, bool *ret_freed,
                       FamilyError *ret_error);
/* PinBuild / UnpinBuild as actor (build_table_pin_as() has the rules); *ret a new reference to
 * the build. NOT_FOUND as build_table_get(). */
int build_pin(const Builder *builder, const char *id, const BuildActor *actor, bool pin,
              BuildRecord **ret, FamilyError *ret_error);

/*
 * PublishBuild as actor (build-publish.c): a writable build of a member with init: module,
 * filled by its caller, becomes the node's read-only build of its request: its segments sealed
 * against writes (FAILED_PRECONDITION MAPPED_WRITABLE while a process maps one writable), found
 * by the read-only Builds of the same request from then on. The build's owner or an admin only
 * (PERMISSION_DENIED PUBLISH_NOT_ALLOWED); FAILED_PRECONDITION NOT_PUBLISHABLE for a build
 * without init: module or a training handout. Publishing a published build changes nothing.
 * *ret a new reference. NOT_FOUND as build_table_get().
 */
int build_publish(const Builder *builder, const char *id, const BuildActor *actor,
                  BuildRecord **ret, FamilyError *ret_error);

/* ---- progress of materialising builds (build-state.c) ------------------------------------ */

/* A watcher is told again at most this often while a build fills. */
#define BUILD_PROGRESS_TICK_MS 100u
/* An ended build stays known this long (a watcher that comes late learns how it ended), and
 * at most this many ended builds are kept. */
#define BUILD_PROGRESS_KEEP_MS 60000u
#define BUILD_PROGRESS_KEEP_ENDED 64u

/*
 * The builds whose shards build_draft_finish() fills, from the start of the fill until a while
 * after it ends (DONE or FAILED). changed(userdata) is called when one starts or ends, and at
 * most every BUILD_PROGRESS_TICK_MS while one fills, on the thread that made the change (a
 * build thread, or a fill helper), never under the table's lock.
 */
int build_progress_table_new(void (*changed)(void *userdata), void *userdata,
                             BuildProgressTable **ret);
BuildProgressTable *build_progress_table_free(BuildProgressTable *t);
/* Replaces the hook (NULL: none) once the calls of the old one under way have returned. */
void build_progress_table_set_changed(BuildProgressTable *t, void (*changed)(void *userdata),
                                      void *userdata);

/* A build's progress (by id, else by tag: the latest with it), copied into a; -ENOENT when the
 * table knows none. */
int build_progress_find(BuildProgressTable *t, const char *id, const char *tag, Arena *a,
                        CodecBuildProgress *ret);
/* The builds filling now, oldest first, copied into a. */
int build_progress_list(BuildProgressTable *t, Arena *a, CodecBuildProgress **ret,
                        size_t *ret_n);

/*
 * Re-adopts what the previous run kept (builder->state), before anything is served: meshes
 * into the mesh table, builds into the build table (same ids, bytes counted in the budget),
 * their tokens into the shard table; then keeps new meshes too (the mesh table's hooks). Logs
 * what it adopts and what it drops. Only -ENOMEM and the like fail it.
 */
int build_restore(const Builder *builder);
