/* build-state.h: what the daemon keeps for one live build (a BuildRecord's payload). */
#pragma once

#include <stdatomic.h>

#include "core/arena.h"
#include "core/build-plan.h"
#include "core/build-table.h"
#include "core/fill.h"
#include "core/layout.h"
#include "core/topology.h"
#include "codec/codec-build.h"
#include "build-checkpoint.h"
#include "shm/accel.h"
#include "shm/segment.h"
#include "handout/token.h"

/* Per rank of the layout, in the layout's rank order. */
typedef struct BuildRankState {
        char *node;           /* the node holding the rank */
        int32_t local_device; /* on that node */
        const char *device_kind; /* that device's: "host" | "cuda" (static) */
        bool materialized;    /* here, holding bytes: then token and segment are set */
        uint64_t allocation_bytes; /* materialised: the segment's size (granularity-rounded) */
        ShardToken token;
        ShardSegment *segment;
        /* A replica (build-place.c, build_group_replicas()): its bytes are those of rank
         * primary (an index into BuildState.ranks, an earlier rank with a segment of its
         * own), whose memory its segment shares; nothing of its own is filled or kept. */
        bool replica;
        size_t primary;
} BuildRankState;

typedef struct BuildState {
        BuildPlan plan;
        Layout layout;
        Dtype dtype;
        /* BuildRequest.writable: its segments are handed out writable. Atomic: PublishBuild
         * turns it off on a committed build that other threads read (build-publish.c). */
        atomic_bool writable;
        /* Restored writable with its seals open: an init: module build not yet published,
         * whose plan came back without the parameters' inits (build-restore.c). */
        bool module_init_pending;
        /* A training handout (private_build and writable): the process that made it, from
         * the draft on, so that no token leaks before its record has its holding. */
        BuildBinding binding;
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* of the registry it was made from */
        uint64_t seed;
        BuildRankState *ranks;
        size_t n_ranks;
        ShardToken group; /* the shard table groups this build's tokens under this name */
        Mesh *counted_mesh; /* the mesh whose n_builds this build holds, or NULL */
        AccelReservation *device_memory; /* GPU bytes reserved for its shards, or NULL */
        BuildCharge charge; /* whose slot and bytes it takes (--max-builds-per-uid) */
        /* A Build from a checkpoint (build-from-checkpoint.c): the files, open until the fill
         * is done; the request's prefix; what names the files for sharing; the bytes the
         * node's shards read from them. */
        BuildCheckpoint *checkpoint;
        char *checkpoint_prefix;
        bool checkpoint_by_parameter; /* tensors named as the parameters (CheckpointRef.names) */
        char checkpoint_identity[BUILD_CHECKPOINT_ID_HEX + 1];
        uint64_t checkpoint_bytes;
} BuildState;

void build_state_free(void *state);
DEFINE_TRIVIAL_CLEANUP_FUNC(BuildState *, build_state_free);

/* What the Build messages and the build's record say of b (codec/codec-build.h), borrowing
 * b's data; its rank list is allocated in a. */
int build_state_describe(const BuildState *b, Arena *a, CodecBuild *ret);

/* How many ranks b materialised here (each a token and a descriptor the daemon holds). */
size_t build_state_segments(const BuildState *b);
/* How many of them have memory of their own (not replicas): what is filled, counted in the
 * budget and kept across restarts. */
size_t build_state_own_segments(const BuildState *b);
size_t build_state_replicas(const BuildState *b);
/* A rank materialised in GPU memory. */
bool build_rank_on_gpu(const BuildRankState *rs);
bool build_state_has_gpu_shards(const BuildState *b);

/* One build's fill in a BuildProgressTable (build.h), from its start to its end. */
typedef struct BuildProgress BuildProgress;
struct BuildProgressTable;

/* The fill of build id starts: total_bytes to fill. tag and family are copied. */
int build_progress_start(struct BuildProgressTable *t, const char *id, const char *tag,
                         const char *family, uint64_t total_bytes, BuildProgress **ret);
/* The counter fill_run() adds to (FillContext.progress); NULL for NULL. */
FillProgress *build_progress_fill(BuildProgress *p);
/* At least done bytes are filled (a segment finished). */
void build_progress_advance(BuildProgress *p, uint64_t done);
/* A Build from a checkpoint: total bytes are to be read from its files; then bytes more were
 * read (any thread). NULL: nothing. */
void build_progress_reading(BuildProgress *p, uint64_t total);
void build_progress_add_read(BuildProgress *p, uint64_t bytes);
/* The fill ended: DONE (r >= 0) or FAILED with error's message (else strerror(-r)). p belongs
 * to the table from now on. Accepts NULL. */
void build_progress_end(BuildProgress *p, int r, const FamilyError *error);
