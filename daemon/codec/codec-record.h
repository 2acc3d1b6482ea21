/* codec-record.h: the records that keep a build or a mesh across restarts: format and codec. */
#pragma once

/*
 * DESIGN (docs/decisions.md, "Restart state records"): one record per live build and one per
 * mesh, each its own sealed memfd in the fd store or its own file under --state-dir, so a
 * change writes one small record and a damaged record costs one object, never all of them.
 * Builds and meshes never change after they are made, so a record is written once and only
 * ever removed. daemon/state/ keeps the bytes without reading them; daemon/build/ makes and
 * re-adopts what they say.
 *
 * A record is a 32-byte header, then sections, all little-endian:
 *
 *   0   8  magic "FAMILYDS"
 *   8   4  version (STATE_RECORD_VERSION)
 *   12  4  kind (StateRecordKind)
 *   16  8  body length (the sections), at most STATE_RECORD_MAX_BYTES
 *   24  4  CRC-32C of the header's first 24 bytes followed by the body
 *   28  4  zero
 *   32  ... sections: u32 tag, u32 length, that many bytes
 *
 * Sections: BUILD, the build as GetBuild answers it (a serialized familyd.v1.Build: provenance,
 * layout, every rank's node, device, size, slices and token); MESH, its mesh (familyd.v1.Mesh,
 * ranks filled in; for a mesh record, the mesh itself); GROUP, the shard table's group name;
 * DTYPE; SEED; CREATED (CLOCK_REALTIME ns, the order ListBuilds and ListMeshes keep across a
 * restart); REPLICAS, the ranks whose bytes are another rank's (docs/sharing.md, "Replicas"):
 * pairs of u32 (the replica's index in the layout's rank order, its primary's index), by
 * increasing replica, each primary an earlier rank with a segment of its own. A replica's
 * segment is its primary's, kept once under the primary's name; a build without replicas has
 * no such section, and records written before replicas existed, where every materialised rank
 * has its own segment, read as before. (An older familyd skips the section, looks for a
 * replica's own segment, does not find it and drops the build: nothing wrong is served.)
 * A section of an unknown tag is skipped (later additions that older readers may
 * ignore); one that a reader needs and cannot ignore comes with a new version, which older
 * readers refuse.
 *
 * Pure: no I/O, no logging. The decoder checks everything it reads (sizes, names, slices
 * within their rank's bytes), so a damaged record is an error, never a crash. A decoded build
 * is plain data (RecordBuild): daemon/build/ turns it into a live build when it re-adopts it.
 */

#include <stddef.h>
#include <stdint.h>

#include "codec-build.h"
#include "core/build-plan.h"
#include "core/fill.h"
#include "core/layout.h"
#include "core/mesh.h"
#include "core/topology.h"

#define STATE_RECORD_VERSION 1u
#define STATE_RECORD_HEADER_SIZE 32u
/* Build replies stop at 4 MiB (FAMILYD_MAX_REPLY_BYTES); a record is that plus its mesh. */
#define STATE_RECORD_MAX_BYTES (32u * 1024u * 1024u)

typedef enum StateRecordKind {
        STATE_RECORD_BUILD = 1,
        STATE_RECORD_MESH = 2,
        _STATE_RECORD_KIND_MAX,
        _STATE_RECORD_KIND_INVALID = -EINVAL,
} StateRecordKind;

/* A rank of a kept build, in the layout's rank order. */
typedef struct RecordBuildRank {
        char *node;
        int32_t local_device;
        const char *device_kind; /* CODEC_DEVICE_KIND_HOST | _CUDA (static) */
        uint64_t size_bytes;     /* materialised on this node: its shard's size; else 0 */
        char token[CODEC_TOKEN_LENGTH + 1]; /* materialised on this node: its token; else "" */
        bool replica;   /* its segment is rank primary's (an earlier index), kept once */
        size_t primary;
} RecordBuildRank;

/* A replica as a record lists it: indices in the layout's rank order. */
typedef struct RecordReplica {
        uint32_t rank;
        uint32_t primary;
} RecordReplica;

/* A kept build as its record says it: plain data, owned. */
typedef struct RecordBuild {
        BuildPlan plan; /* provenance: request, resolved family, config, origin; no mesh, no
                         * materialize options */
        Layout layout;  /* checked against the record's mesh */
        Dtype dtype;
        uint64_t seed;
        char group[CODEC_TOKEN_LENGTH + 1]; /* the shard table's name of its tokens */
        RecordBuildRank *ranks;
        size_t n_ranks;
        uint64_t bytes; /* of the segments kept on this node: each once, replicas share */
        bool writable;  /* handed out writable */
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* "" in older records */
} RecordBuild;

typedef struct StateRecord {
        StateRecordKind kind;
        uint64_t created_ns;
        char *id;           /* the build's or the mesh's id */
        Mesh *mesh;         /* the mesh record's mesh, or the build's (NULL: none); checked as
                             * CreateMesh checks, its id derived anew; in no table */
        RecordBuild *build; /* BUILD only */
} StateRecord;

void codec_record_done(StateRecord *r);
void codec_record_build_free(RecordBuild *b);
DEFINE_TRIVIAL_CLEANUP_FUNC(RecordBuild *, codec_record_build_free);

/* A record in a malloc'd buffer. b's materialised ranks must have their tokens, and b its seed
 * and group; replicas (n_replicas of them, by increasing rank, each primary earlier; may be
 * NULL when none) list the ranks that share another's segment (-EINVAL otherwise). */
int codec_record_encode_build(const char *id, const CodecBuild *b, const RecordReplica *replicas,
                              size_t n_replicas, uint64_t created_ns, uint8_t **ret,
                              size_t *ret_size);
int codec_record_encode_mesh(const Mesh *m, uint64_t created_ns, uint8_t **ret,
                             size_t *ret_size);

/*
 * 0 and *ret; -EBADMSG for a damaged record, -EPROTONOSUPPORT for one of another version or
 * kind, why (a sentence, why_size bytes) saying what is wrong; -ENOMEM.
 */
int codec_record_decode(const uint8_t *data, size_t size, StateRecord *ret, char *why,
                        size_t why_size);
