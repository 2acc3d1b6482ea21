/* codec-build.h: a build as GetBuild and the state records describe it: plain data. */
#pragma once

/*
 * What the Build messages carry of a live build, borrowed from whoever holds it (daemon/build/
 * keeps the build itself, with its memory): the plan (provenance), the layout (each parameter
 * with its own dtype), the build's default dtype (materialize.dtype) and,
 * per rank of the layout, where the rank lives and, when this node materialised it, its token.
 * Nothing here is owned: the pointers live as long as the build they describe.
 */

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
