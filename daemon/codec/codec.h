/* codec.h: protobuf-c messages of familyd.v1 to core structs and back; pure, no gRPC. */
#pragma once

/*
 * Decoders check what the transport cannot: client-controlled sizes against resource-limits.h,
 * answering INVALID_ARGUMENT; they build core structs the caller owns. Encoders build a reply
 * tree in the call's Arena: nothing to free piecewise, and a failing encoder (-ENOMEM) leaves
 * only arena memory behind, released with the call.
 */

#include "familyd-v1-admin.pb-c.h"
#include "familyd-v1-family.pb-c.h"
#include "familyd-v1-mesh.pb-c.h"
#include "familyd-v1-values.pb-c.h"

#include "core/arena.h"
#include "core/error.h"
#include "core/mesh.h"
#include "core/registry.h"
#include "core/resolve.h"
#include "core/topology.h"
#include "core/value.h"

#include "codec-build.h"

/* Every map<string, Value> entry message has this layout (key = 1, value = 2). */
typedef struct CodecValueEntry {
        ProtobufCMessage base;
        char *key;
        Familyd__V1__Value *value;
} CodecValueEntry;

int codec_value_decode(const Familyd__V1__Value *pb, Value *ret, FamilyError *ret_error);
int codec_value_encode(Arena *a, const Value *v, Familyd__V1__Value **ret);
/* entries: an array of any map<string, Value> entry type; a key sent twice: the last wins. */
int codec_value_map_decode(void *const *entries, size_t n, const char *what, ValueMap *ret,
                           FamilyError *ret_error);
/* Allocates entries of the given entry descriptor. */
int codec_value_map_encode(Arena *a, const ValueMap *m,
                           const ProtobufCMessageDescriptor *entry_desc, void ***ret_entries,
                           size_t *ret_n);

/* A client-given name or id longer than max bytes: INVALID_ARGUMENT naming field. */
int codec_check_length(const char *s, size_t max, const char *field, FamilyError *ret_error);

int codec_job_context_decode(const Familyd__V1__JobContext *pb, JobContext *ret,
                             FamilyError *ret_error);
int codec_resolve_request_decode(const Familyd__V1__ResolveRequest *pb, ResolveRequest *ret,
                                 FamilyError *ret_error);
int codec_resolved_family_encode(Arena *a, const ResolvedFamily *r,
                                 Familyd__V1__ResolvedFamily **ret);
int codec_family_encode(Arena *a, const Family *f, Familyd__V1__Family **ret);
int codec_activation_layout_encode(Arena *a, const ActivationLayout *l, Familyd__V1__ActivationLayout **ret);
/* Borrows pb's strings, arrays in a; bounds every count (16) and string (256 bytes): INVALID_ARGUMENT
 * LIMIT, field applied_layout. The result is not freed: it lives as long as a and pb. */
int codec_activation_layout_decode(Arena *a, const Familyd__V1__ActivationLayout *pb, ActivationLayout *ret,
                                   FamilyError *ret_error);

struct BuildRequest;
int codec_build_request_decode(const Familyd__V1__BuildRequest *pb, struct BuildRequest *ret,
                               FamilyError *ret_error);

struct ModelBoundary;
/* Validate's boundaries, borrowing the request's strings (they live in the call's arena). */
int codec_model_decode(Arena *a, Familyd__V1__ModelBoundary *const *pb, size_t n,
                       struct ModelBoundary **ret, size_t *ret_n, FamilyError *ret_error);
struct SharedParameter;
/* Validate's shared parameters, borrowing the request's strings, checked by
 * validate_shared_check() (INVALID_ARGUMENT for a malformed list). */
int codec_shared_parameters_decode(Arena *a, Familyd__V1__SharedParameter *const *pb, size_t n,
                                   struct SharedParameter **ret, size_t *ret_n,
                                   FamilyError *ret_error);

/* A Build reply (GetBuild's, a Build record's) of b; shard_socket is where tokens are
 * redeemed. */
int codec_build_encode(Arena *a, const char *build_id, const CodecBuild *b,
                       const char *shard_socket, Familyd__V1__Build **ret);
/* A BuildProgress message of p, in a. */
int codec_build_progress_encode(Arena *a, const CodecBuildProgress *p,
                                Familyd__V1__BuildProgress **ret);
/* n of them, as a repeated field's array (NULL when n is 0). */
int codec_build_progress_list_encode(Arena *a, const CodecBuildProgress *list, size_t n,
                                     Familyd__V1__BuildProgress ***ret);
int codec_job_context_encode(Arena *a, const JobContext *c, Familyd__V1__JobContext **ret);

int codec_mesh_spec_decode(const Familyd__V1__Mesh *pb, MeshSpec *ret, FamilyError *ret_error);
int codec_mesh_encode(Arena *a, const Mesh *m, Familyd__V1__Mesh **ret);
int codec_topology_encode(Arena *a, const Topology *t, Familyd__V1__Topology **ret);
int codec_device_encode(Arena *a, const Device *d, Familyd__V1__Device **ret);

/* One message in the arena, initialised; NULL on OOM. */
#define MSG_NEW(arena, type, init_fn)                                   \
        ({                                                              \
                type *_m = arena_alloc((arena), sizeof(type));          \
                if (_m)                                                 \
                        init_fn(_m);                                    \
                _m;                                                     \
        })

/* A zeroed array of n pointers (or elements) in the arena; true on success, n may be 0. */
#define ARRAY_NEW(arena, ptr, n) \
        (((n) == 0) || ((ptr) = arena_alloc_array((arena), (n), sizeof(*(ptr)))) != NULL)
