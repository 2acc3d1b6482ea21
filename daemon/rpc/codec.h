/* codec.h: protobuf-c messages of familyd.v1 to core structs and back; pure, no gRPC. */
#pragma once

/*
 * Decoders check what the transport cannot: client-controlled sizes against resource-limits.h,
 * answering INVALID_ARGUMENT. Encoders build messages whose every part is heap-allocated, so the
 * caller releases a reply with protobuf_c_message_free_unpacked(msg, NULL) however far an
 * encoder got before failing (they return -ENOMEM and free what they built).
 */

#include "familyd-v1-admin.pb-c.h"
#include "familyd-v1-family.pb-c.h"
#include "familyd-v1-mesh.pb-c.h"
#include "familyd-v1-values.pb-c.h"

#include "error.h"
#include "mesh.h"
#include "registry.h"
#include "resolve.h"
#include "topology.h"
#include "value.h"

/* Every map<string, Value> entry message has this layout (key = 1, value = 2). */
typedef struct CodecValueEntry {
        ProtobufCMessage base;
        char *key;
        Familyd__V1__Value *value;
} CodecValueEntry;

int codec_value_decode(const Familyd__V1__Value *pb, Value *ret, FamilyError *ret_error);
int codec_value_encode(const Value *v, Familyd__V1__Value **ret);
/* entries: an array of any map<string, Value> entry type; a key sent twice: the last wins. */
int codec_value_map_decode(void *const *entries, size_t n, const char *what, ValueMap *ret,
                           FamilyError *ret_error);
/* Allocates entries of the given entry descriptor. */
int codec_value_map_encode(const ValueMap *m, const ProtobufCMessageDescriptor *entry_desc,
                           void ***ret_entries, size_t *ret_n);

char *codec_strdup(const char *s); /* NULL or "" -> "" owned copy; NULL on OOM */

int codec_job_context_decode(const Familyd__V1__JobContext *pb, JobContext *ret,
                             FamilyError *ret_error);
int codec_resolve_request_decode(const Familyd__V1__ResolveRequest *pb, ResolveRequest *ret,
                                 FamilyError *ret_error);
int codec_resolved_family_encode(const ResolvedFamily *r, Familyd__V1__ResolvedFamily **ret);
int codec_family_encode(const Family *f, Familyd__V1__Family **ret);

int codec_mesh_spec_decode(const Familyd__V1__Mesh *pb, MeshSpec *ret, FamilyError *ret_error);
int codec_mesh_encode(const Mesh *m, Familyd__V1__Mesh **ret);
int codec_topology_encode(const Topology *t, Familyd__V1__Topology **ret);

/* Allocates and initialises one message; NULL on OOM. */
#define MSG_NEW(type, init_fn)                          \
        ({                                              \
                type *_m = malloc(sizeof(type));        \
                if (_m)                                 \
                        init_fn(_m);                    \
                _m;                                     \
        })

/* Encoders attach each child to its parent as soon as it exists and count arrays up as they
 * fill, so one free_unpacked of the root releases everything on any failure. */
#define ARRAY_NEW(ptr, n) (((n) == 0) || ((ptr) = calloc((n), sizeof(*(ptr)))) != NULL)
