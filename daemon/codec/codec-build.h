/* codec-build.h: a build as GetBuild and the state records describe it: plain data. */
#pragma once

/*
 * What the Build messages carry of a live build, borrowed from whoever holds it (daemon/build/
 * keeps the build itself, with its memory): the plan (provenance), the layout (each parameter
 * with its own dtype), the build's default dtype (materialize.dtype) and,
 * per rank of the layout, where the rank lives and, when this node materialised it, its token.
 * Nothing here is owned: the pointers live as long as the build they describe.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "core/build-plan.h"
#include "core/fill.h"
#include "core/layout.h"

/* A shard token as the messages carry it: 32 lowercase hex characters. */
#define CODEC_TOKEN_LENGTH 32u
#define CODEC_DEVICE_KIND_HOST "host"
#define CODEC_DEVICE_KIND_CUDA "cuda"

typedef struct CodecBuildRank {
        const char *node;          /* the node holding the rank */
        int32_t local_device;      /* on that node */
        const char *device_kind;   /* "host" | "cuda"; NULL: "host" */
        uint64_t allocation_bytes; /* materialised: the memory it takes (0: its size) */
        const char *token;         /* materialised on this node: its token; else NULL */
} CodecBuildRank;

typedef struct CodecBuild {
        const BuildPlan *plan;
        const Layout *layout;
        Dtype dtype; /* the build's default; each parameter's own is in the layout */
        uint64_t seed;               /* records only */
        const char *group;           /* records only: the name its tokens are filed under */
        const CodecBuildRank *ranks; /* one per rank of the layout, in its order */
        size_t n_ranks;
        bool writable;               /* made writable (BuildRequest.writable) */
        const char *registry_digest; /* of the registry it was made from; NULL or "": unknown */
} CodecBuild;

/* The packed size of the Build message codec_build_encode() makes of b. */
int codec_build_packed_size(const char *build_id, const CodecBuild *b, const char *shard_socket,
                            size_t *ret);

/* True when s is a shard token (CODEC_TOKEN_LENGTH lowercase hex characters). */
bool codec_token_is_valid(const char *s);

/* Where a materialising build stands (BuildProgress.state). */
typedef enum CodecBuildProgressState {
        CODEC_BUILD_PROGRESS_FILLING,
        CODEC_BUILD_PROGRESS_DONE,
        CODEC_BUILD_PROGRESS_FAILED,
        _CODEC_BUILD_PROGRESS_MAX,
        _CODEC_BUILD_PROGRESS_INVALID = -EINVAL,
} CodecBuildProgressState;

/* A materialising build's progress, as WatchBuild, GetStatus and ListBuilds carry it; the
 * strings are borrowed (NULL: empty). */
typedef struct CodecBuildProgress {
        const char *build_id;
        const char *progress_tag;
        const char *family;
        const char *error; /* FAILED: the Build's error message */
        CodecBuildProgressState state;
        uint64_t bytes_filled;
        uint64_t bytes_total;
        uint64_t bytes_per_second;
        uint64_t elapsed_ms;
        int64_t started_unix_ms;
        uint64_t bytes_read;    /* a Build from a checkpoint: read from its files so far */
        uint64_t bytes_to_read; /* and in all; 0 for a seeded fill */
} CodecBuildProgress;
