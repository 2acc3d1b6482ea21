/* familyd.h: libfamilyd, the C client of the familyd node daemon (familyd.v1 over gRPC). */
#pragma once

/*
 * DESIGN
 *
 * One opaque handle, FamilydClient, owns a gRPC channel to the daemon's Unix socket. Each call
 * runs on its own private completion queue and blocks until the answer or the deadline, so one
 * client may be shared by several threads. Do not fork() after familyd_client_new(): gRPC
 * starts threads of its own.
 *
 * Requests and results are the protobuf-c messages of the familyd.v1 protos (the generated
 * headers below are installed next to this one). A result handed back through a ret_*
 * parameter belongs to the caller, who frees it with the generated free function of its type,
 * for example familyd__v1__family__free_unpacked(family, NULL).
 *
 * Every function that can fail returns 0 or a negative errno:
 *
 *   -EINVAL     a NULL or malformed argument (nothing was sent)
 *   -ENOMEM     out of memory
 *   -EPROTO     the call ended with a gRPC status other than OK; *ret_error says which. This
 *               covers answers of the daemon (NOT_FOUND, INVALID_ARGUMENT, ...), a daemon that
 *               cannot be reached (UNAVAILABLE) and an expired deadline (DEADLINE_EXCEEDED).
 *   -EBADMSG    the daemon answered OK with a message that does not decode as the expected type
 *   -EIO        gRPC refused to start the call
 *
 * On failure ret_* results are left untouched; ret_error (may be NULL) is filled on -EPROTO and
 * reset to FAMILYD_ERROR_NULL on every other outcome, so a FamilydError can be reused across
 * calls. Release its contents with familyd_error_clear().
 */

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "familyd-v1-admin.pb-c.h"
#include "familyd-v1-family.pb-c.h"
#include "familyd-v1-mesh.pb-c.h"
#include "familyd-v1-values.pb-c.h"
#include "google-rpc-status.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FamilydClient FamilydClient;

/* Bits of FamilydClientParams.field_mask: a field is read only when its bit is set, so fields
 * can be appended to the struct without breaking callers compiled against an older header. */
enum {
        FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH = 1u << 0,
        FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS  = 1u << 1,
};

/* Without SOCKET_PATH: $FAMILYD_SOCKET when set and non-empty, else /run/familyd/familyd.sock.
 * Without TIMEOUT_MS: FAMILYD_CLIENT_DEFAULT_TIMEOUT_MS. A timeout of 0 means no deadline. */
#define FAMILYD_CLIENT_DEFAULT_TIMEOUT_MS 30000u

typedef struct FamilydClientParams {
        uint64_t field_mask;
        const char *socket_path;        /* a filesystem path, not a gRPC target */
        uint32_t timeout_ms;            /* deadline of each call */
} FamilydClientParams;

/* A failed call, as the daemon (or gRPC) described it. code is a grpc_status_code number
 * (0 = no failure); message is the status message (may be multi-line); reason and info come
 * from the google.rpc.ErrorInfo in the grpc-status-details-bin trailer, NULL when it had none
 * (info holds the domain and the metadata naming the field or axis). All owned by the struct. */
typedef struct FamilydError {
        int code;
        char *message;
        char *reason;
        Google__Rpc__ErrorInfo *info;
} FamilydError;

#define FAMILYD_ERROR_NULL ((FamilydError) { .code = 0 })

/* Frees the contents and resets *error to FAMILYD_ERROR_NULL. Accepts NULL. */
void familyd_error_clear(FamilydError *error);

/* "NOT_FOUND" for 5 and so on; "UNKNOWN_STATUS" for numbers outside gRPC's list. */
const char *familyd_status_name(int code);

/* params may be NULL (all defaults). Connecting is lazy: a missing daemon shows as
 * UNAVAILABLE on the first call, not here. */
int familyd_client_new(const FamilydClientParams *params, FamilydClient **ret_client);

/* Returns NULL. Accepts NULL. Waits for nothing: no call may be in flight. */
FamilydClient *familyd_client_free(FamilydClient *client);

/* The socket path the client talks to. */
const char *familyd_client_get_socket_path(const FamilydClient *client);

/* Generic unary call, for methods without a typed wrapper below (Build, Validate, ...).
 * method is the full path, "/familyd.v1.FamilyService/Build". *ret_response is a message of
 * response_descriptor's type, to be freed with protobuf_c_message_free_unpacked(m, NULL). */
int familyd_client_call(
                FamilydClient *client,
                const char *method,
                const ProtobufCMessage *request,
                const ProtobufCMessageDescriptor *response_descriptor,
                ProtobufCMessage **ret_response,
                FamilydError *ret_error);

/* familyd.v1.FamilyService */
int familyd_list_families(FamilydClient *client, Familyd__V1__ListFamiliesResponse **ret_response, FamilydError *ret_error);
int familyd_get_family(FamilydClient *client, const char *family, Familyd__V1__Family **ret_family, FamilydError *ret_error);
int familyd_resolve(FamilydClient *client, const Familyd__V1__ResolveRequest *request, Familyd__V1__ResolveResponse **ret_response, FamilydError *ret_error);

/* familyd.v1.MeshService. create_mesh returns the mesh as stored, with its mesh_id and ranks. */
int familyd_create_mesh(FamilydClient *client, const Familyd__V1__Mesh *mesh, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error);
int familyd_get_mesh(FamilydClient *client, const char *mesh_id, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error);
int familyd_list_meshes(FamilydClient *client, Familyd__V1__ListMeshesResponse **ret_response, FamilydError *ret_error);
int familyd_delete_mesh(FamilydClient *client, const char *mesh_id, FamilydError *ret_error);
int familyd_get_topology(FamilydClient *client, Familyd__V1__Topology **ret_topology, FamilydError *ret_error);

/* familyd.v1.AdminService */
int familyd_get_status(FamilydClient *client, Familyd__V1__GetStatusResponse **ret_status, FamilydError *ret_error);
int familyd_reload(FamilydClient *client, Familyd__V1__ReloadResponse **ret_response, FamilydError *ret_error);

/* proto3 JSON of any protobuf-c message: lowerCamelCase names, 64-bit integers as strings,
 * maps as objects, bytes as base64, default values omitted (fields with presence, such as
 * oneof members and proto3 optional, are written when set). One line, or indented by two
 * spaces with FAMILYD_JSON_PRETTY. *ret_json is a NUL-terminated string to free(). */
enum {
        FAMILYD_JSON_PRETTY = 1u << 0,
};

int familyd_json_encode(const ProtobufCMessage *message, unsigned flags, char **ret_json);

#ifdef __cplusplus
}
#endif
