/* build-state.h: what the daemon keeps for one live build (a BuildRecord's payload). */
#pragma once

#include "shm/accel.h"
#include "core/build-plan.h"
#include "core/fill.h"
#include "core/layout.h"
#include "shm/segment.h"
#include "shm/token.h"

/* Per rank of the layout, in the layout's rank order. */
typedef struct BuildRankState {
        char *node;           /* the node holding the rank */
        int32_t local_device; /* on that node */
        const char *device_kind; /* that device's: "host" | "cuda" (static) */
        bool materialized;    /* here, holding bytes: then token and segment are set */
        uint64_t allocation_bytes; /* materialised: the segment's size (granularity-rounded) */
        ShardToken token;
        ShardSegment *segment;
} BuildRankState;

typedef struct BuildState {
        BuildPlan plan;
        Layout layout;
        Dtype dtype;
        uint64_t seed;
        BuildRankState *ranks;
        size_t n_ranks;
        ShardToken group; /* the shard table groups this build's tokens under this name */
        Mesh *counted_mesh; /* the mesh whose n_builds this build holds, or NULL */
        AccelReservation *device_memory; /* GPU bytes reserved for its shards, or NULL */
} BuildState;

void build_state_free(void *state);
