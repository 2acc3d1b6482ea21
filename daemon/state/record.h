/* record.h: the records that keep a build or a mesh across restarts: their format and codec. */
#pragma once

/*
 * DESIGN (docs/decisions.md, "Restart state records"): one record per live build and one per
 * mesh, each its own sealed memfd in the fd store or its own file under --state-dir, so a
 * change writes one small record and a damaged record costs one object, never all of them.
 * Builds and meshes never change after they are made, so a record is written once and only
 * ever removed.
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
 * restart). A section of an unknown tag is skipped (later additions that older readers may
 * ignore); one that a reader needs and cannot ignore comes with a new version, which older
 * readers refuse.
 *
 * Pure: no I/O, no logging. The decoder checks everything it reads (sizes, names, slices
 * within their rank's bytes), so a damaged record is an error, never a crash.
 */

#include <stddef.h>
#include <stdint.h>

#include "core/mesh.h"

struct BuildState; /* rpc/build-state.h */

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

typedef struct StateRecord {
        StateRecordKind kind;
        uint64_t created_ns;
        char *id;        /* the build's or the mesh's id */
        Mesh *mesh;      /* the mesh record's mesh, or the build's (NULL: none); checked as
                          * CreateMesh checks, its id derived anew; in no table */
        struct BuildState *build; /* BUILD: no segments yet; plan.mesh and counted_mesh NULL */
        uint64_t bytes;  /* BUILD: bytes of the ranks materialised on this node */
} StateRecord;

void state_record_done(StateRecord *r);

/* A record in a malloc'd buffer. b's ranks must have their tokens. */
int state_record_encode_build(const char *id, const struct BuildState *b, uint64_t created_ns,
                              uint8_t **ret, size_t *ret_size);
int state_record_encode_mesh(const Mesh *m, uint64_t created_ns, uint8_t **ret,
                             size_t *ret_size);

/*
 * 0 and *ret; -EBADMSG for a damaged record, -EPROTONOSUPPORT for one of another version or
 * kind, why (a sentence, why_size bytes) saying what is wrong; -ENOMEM.
 */
int state_record_decode(const uint8_t *data, size_t size, StateRecord *ret, char *why,
                        size_t why_size);
