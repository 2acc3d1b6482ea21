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

#include <stdbool.h>
#include <stddef.h>
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

/* The deadline of each call in milliseconds (0: none); also bounds familyd_shard_fetch(). */
uint32_t familyd_client_get_timeout_ms(const FamilydClient *client);

/* Generic unary call, for methods without a typed wrapper below.
 * method is the full path, "/familyd.v1.FamilyService/Build". *ret_response is a message of
 * response_descriptor's type, to be freed with protobuf_c_message_free_unpacked(m, NULL). */
int familyd_client_call(
                FamilydClient *client,
                const char *method,
                const ProtobufCMessage *request,
                const ProtobufCMessageDescriptor *response_descriptor,
                ProtobufCMessage **ret_response,
                FamilydError *ret_error);

/*
 * Server-streaming calls ("watches": MeshService/WatchTopology).
 *
 * A FamilydWatch is one open stream. familyd_client_watch() sends the request and returns at
 * once; familyd_watch_next() blocks until the next message, the end of the stream or the
 * watch's deadline. Messages are bounded like unary answers (64 MiB); a larger one ends the
 * stream with RESOURCE_EXHAUSTED. The client's per-call timeout does not apply: a watch is
 * meant to stay open, so it has a deadline only when FamilydWatchParams gives one.
 *
 * familyd_watch_next() returns
 *
 *   0                     *ret_message is the next message, the caller's to free
 *   FAMILYD_WATCH_ENDED   the daemon ended the stream with OK: nothing more will come
 *   -ECANCELED            familyd_watch_cancel() ended it
 *   -EPROTO               it ended with another status, in *ret_error: UNAVAILABLE when the
 *                         daemon cannot be reached or went away, CANCELLED when it shut down,
 *                         DEADLINE_EXCEEDED at the watch's deadline, RESOURCE_EXHAUSTED when
 *                         the daemon's watch limit is reached or a message is too large
 *   -EBADMSG              a message that does not decode (the stream is cancelled)
 *   -ESHUTDOWN            the stream had already ended (an earlier call said how)
 *   -EINVAL, -ENOMEM, -EIO  as for unary calls
 *
 * familyd_watch_cancel() may be called from any thread, also while another thread waits in
 * familyd_watch_next() (which then returns -ECANCELED), but not from a signal handler and not
 * after familyd_watch_free(). familyd_watch_free() cancels a stream still open and waits for
 * nothing but gRPC's own bookkeeping. A watch belongs to its client: free it first.
 */
typedef struct FamilydWatch FamilydWatch;

/* Bits of FamilydWatchParams.field_mask, as for FamilydClientParams. */
enum {
        FAMILYD_WATCH_PARAM_FIELD_TIMEOUT_MS = 1u << 0,
};

/* params may be NULL: no deadline. */
typedef struct FamilydWatchParams {
        uint64_t field_mask;
        uint32_t timeout_ms;            /* deadline of the whole stream from its start; 0: none */
} FamilydWatchParams;

/* familyd_watch_next()'s and familyd_watch_topology()'s positive outcome. */
enum {
        FAMILYD_WATCH_ENDED = 1,
};

/* Generic server-streaming call, for methods without a typed wrapper: each message is of
 * message_descriptor's type (free it with protobuf_c_message_free_unpacked(m, NULL)). */
int familyd_client_watch(
                FamilydClient *client,
                const char *method,
                const ProtobufCMessage *request,
                const ProtobufCMessageDescriptor *message_descriptor,
                const FamilydWatchParams *params,
                FamilydWatch **ret_watch,
                FamilydError *ret_error);
int familyd_watch_next(FamilydWatch *watch, ProtobufCMessage **ret_message, FamilydError *ret_error);
void familyd_watch_cancel(FamilydWatch *watch);
/* Returns NULL. Accepts NULL. */
FamilydWatch *familyd_watch_free(FamilydWatch *watch);

/* MeshService/WatchTopology: the current Topology, then the whole Topology again after every
 * change (a node joins, turns suspect, down or up again, is forgotten). Each message of
 * familyd_watch_next() is a Familyd__V1__Topology: pass (ProtobufCMessage **) &topology and
 * free it with familyd__v1__topology__free_unpacked(topology, NULL). */
int familyd_watch_topology_start(FamilydClient *client, const FamilydWatchParams *params, FamilydWatch **ret_watch, FamilydError *ret_error);

/* Called with each Topology; it is the library's, valid until the handler returns. Return 0
 * for the next one, a positive value to stop (the stream is cancelled), or a negative errno to
 * stop with that error. */
typedef int (*FamilydTopologyHandler)(const Familyd__V1__Topology *topology, void *userdata);

/* Runs a topology watch on the calling thread until the handler stops it (returns 0), the
 * handler fails (returns its negative value), or the stream ends: FAMILYD_WATCH_ENDED, or the
 * errors of familyd_watch_next() (-EPROTO with *ret_error, ...). */
int familyd_watch_topology(FamilydClient *client, const FamilydWatchParams *params, FamilydTopologyHandler handler, void *userdata, FamilydError *ret_error);

/* familyd.v1.FamilyService */
int familyd_list_families(FamilydClient *client, Familyd__V1__ListFamiliesResponse **ret_response, FamilydError *ret_error);
int familyd_get_family(FamilydClient *client, const char *family, Familyd__V1__Family **ret_family, FamilydError *ret_error);
int familyd_resolve(FamilydClient *client, const Familyd__V1__ResolveRequest *request, Familyd__V1__ResolveResponse **ret_response, FamilydError *ret_error);

/* Build, GetBuild, ListBuilds, ReleaseBuild. familyd_build takes a prepared request (family,
 * arguments, config or module, context, mesh_id, materialize, checkpoint), like
 * familyd_resolve; the caller keeps ownership of it. A Build's shards hold the tokens to pass
 * to familyd_shard_fetch() together with Build.shard_socket. To fill the parameters from a
 * checkpoint, deposit it first (familyd_checkpoint_deposit() below) and name its token in
 * request->checkpoint, a Familyd__V1__CheckpointRef {token, prefix}, with materialize set. */
int familyd_build(FamilydClient *client, const Familyd__V1__BuildRequest *request, Familyd__V1__BuildResponse **ret_response, FamilydError *ret_error);
int familyd_get_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error);
int familyd_list_builds(FamilydClient *client, Familyd__V1__ListBuildsResponse **ret_response, FamilydError *ret_error);
/* ReleaseBuild drops this process's reference to the build (FAILED_PRECONDITION NOT_HELD when
 * it holds none); the daemon frees a build that nothing holds after its grace period.
 * familyd_release_build_full(): with force, the build is freed at once whatever holds it;
 * *ret_freed (may be NULL) says whether this call freed it. */
int familyd_release_build(FamilydClient *client, const char *build_id, FamilydError *ret_error);
int familyd_release_build_full(FamilydClient *client, const char *build_id, bool force, bool *ret_freed, FamilydError *ret_error);
/* PinBuild / UnpinBuild: a pinned build outlives every process holding it. *ret_build (may be
 * NULL: not returned) is the build after the call; free it with familyd__v1__build__free_unpacked. */
int familyd_pin_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error);
int familyd_unpin_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error);
/* PublishBuild: a writable build of a member with init: module parameters, filled by its
 * caller and no longer mapped writable, sealed read-only and shared by the node's read-only
 * Builds of the same request from now on (docs/registry.md, "init: module"). */
int familyd_publish_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error);

/* Validate: the trainer's model (its boundaries: every fqn of one built instance, the build id,
 * optionally the layout applied afterwards) against the job context. A model with violations
 * is a successful call: the answer's ok is false and violations lists them all (fqns, reason
 * code such as AXIS_SIZE_MISMATCH, message). The caller keeps ownership of the request. */
int familyd_validate(FamilydClient *client, const Familyd__V1__ValidateRequest *request, Familyd__V1__ValidateResponse **ret_response, FamilydError *ret_error);

/*
 * The shard socket (not gRPC; proto/familyd/v1/shard.proto, docs/operating.md "Build and the shard
 * socket"): trades RankShard tokens for file descriptors of the shards' shared memory.
 *
 * familyd_shard_fetch() connects to shard_socket_path (NULL or "": shard.sock in the directory
 * of the client's API socket), sends one ShardFdRequest{tokens, writable} and reads the
 * ShardFdReply with its SCM_RIGHTS descriptors. n is 1..FAMILYD_SHARD_MAX_TOKENS. The client
 * only lends its timeout (the whole exchange must finish within it; 0: no limit); client may
 * be NULL (socket path then required, no timeout).
 *
 * On success ret_fds[i] is a new descriptor (O_CLOEXEC) of tokens[i]'s memory, owned by the
 * caller, who close()s it; ret_sizes[i] (ret_sizes may be NULL) its size in bytes. Host
 * shards are memfds sealed against resizing, read-only unless writable was asked for; GPU
 * shards (familyd_shard_fetch_info() says which) are CUDA descriptors, see below.
 * On any failure no descriptor is left open and ret_fds/ret_sizes are untouched:
 *
 *   -EPROTO     the daemon answered a status other than OK (unknown token, bad request...):
 *               *ret_error holds its code and message (reason/info stay NULL)
 *   -EBADMSG    a reply that does not decode, or whose descriptors/sizes do not match tokens
 *   -ETIMEDOUT  no complete reply within the client's timeout
 *   -EINVAL     bad arguments; -ENOMEM; any other -errno of socket/connect/sendmsg/recvmsg
 *               (-ENOENT, -ECONNREFUSED: no shard socket there)
 */
#define FAMILYD_SHARD_MAX_TOKENS 253

int familyd_shard_fetch(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                uint64_t *ret_sizes,
                FamilydError *ret_error);

/*
 * Checkpoint deposits (docs/checkpoints.md): a Build reads a safetensors checkpoint only
 * through descriptors its caller opened, so that the daemon never reads a file for a process
 * that could not read it itself.
 *
 * familyd_checkpoint_deposit() opens the checkpoint at path with this process's rights
 * (O_RDONLY | O_CLOEXEC, following symbolic links):
 *
 *   a regular file         just it;
 *   a directory            its index (the one *.index.json in it, if any) and every regular
 *                          *.safetensors file in it, sorted by name; no JSON is read here,
 *                          the daemon checks the index against the files.
 *
 * and sends them, in that order, to the shard socket (shard_socket_path, NULL or "": beside
 * the client's API socket; client and timeout as for familyd_shard_fetch()) as one
 * ShardFdRequest{checkpoint_files: base names} with the descriptors as SCM_RIGHTS. On success
 * ret_token holds the deposit's token, FAMILYD_CHECKPOINT_TOKEN_LEN hex digits and a NUL: name
 * it in BuildRequest.checkpoint.token (a Build of this uid, within 120 s of the deposit or of
 * the last Build that named it). The descriptors are closed before returning either way.
 *
 * A checkpoint refused here (nothing is sent) returns the reason's errno and fills *ret_error
 * (may be NULL) with a code and a message that names the file:
 *
 *   -ENOENT     path, or a file in it, does not exist (code NOT_FOUND)
 *   -EACCES     this process may not read it (PERMISSION_DENIED); any other errno of open()
 *               or readdir() the same way (-EPERM: PERMISSION_DENIED; others INVALID_ARGUMENT)
 *   -EINVAL     path is neither a regular file nor a directory, or a NULL/empty argument
 *               (no message for those)
 *   -ENODATA    a directory without a regular *.safetensors file (INVALID_ARGUMENT)
 *   -ENOTUNIQ   a directory with more than one *.index.json (INVALID_ARGUMENT)
 *   -E2BIG      more than FAMILYD_CHECKPOINT_MAX_FILES files, or names past the shard
 *               socket's frame (INVALID_ARGUMENT)
 *
 * The daemon's refusal is -EPROTO with *ret_error's code and message: INVALID_ARGUMENT (a
 * descriptor that is not a regular file open for reading, a bad name), RESOURCE_EXHAUSTED (the
 * deposits a uid, or the daemon, may hold: docs/checkpoints.md, "Limits"). Trouble with the
 * shard socket itself leaves ret_error's code 0 and returns as familyd_shard_fetch() does:
 * -ENOENT or -ECONNREFUSED (no shard socket), -ETIMEDOUT, -EBADMSG (a reply without a
 * well-formed token).
 */
#define FAMILYD_CHECKPOINT_MAX_FILES 253
#define FAMILYD_CHECKPOINT_TOKEN_LEN 32

int familyd_checkpoint_deposit(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *path,
                char ret_token[FAMILYD_CHECKPOINT_TOKEN_LEN + 1],
                FamilydError *ret_error);

/*
 * How a trainer maps a shard (docs/operating.md, "Mapping modes"):
 *
 *   FAMILYD_MAP_READ_ONLY  MAP_SHARED, PROT_READ: the daemon's bytes, zero-copy; writes fault.
 *   FAMILYD_MAP_PRIVATE    MAP_PRIVATE, PROT_READ | PROT_WRITE of a read-only descriptor:
 *                          zero-copy until the first write to a page, which copies that page
 *                          into this process (copy-on-write); the daemon's bytes and every
 *                          other process's view never change. For training on a shared build.
 *                          On hugetlb pages with none left to reserve for copies, mapped
 *                          without the reservation (MAP_NORESERVE): reads work, a write that
 *                          finds no free huge page is SIGBUS.
 *   FAMILYD_MAP_SHARED     MAP_SHARED, PROT_READ | PROT_WRITE of a writable descriptor: writes
 *                          reach every process mapping the shard. Only for builds made writable
 *                          (BuildRequest.writable); fetching a writable descriptor of any other
 *                          build is refused (PERMISSION_DENIED).
 *
 * familyd_map_mode_from_string() takes the names "read-only", "private", "shared" (-EINVAL
 * otherwise); familyd_map_mode_to_string() gives them back (NULL for no mode).
 * familyd_map_mode_fetch_writable(): whether the mode needs a writable descriptor (shared). */
typedef enum FamilydMapMode {
        FAMILYD_MAP_READ_ONLY,
        FAMILYD_MAP_PRIVATE,
        FAMILYD_MAP_SHARED,
} FamilydMapMode;

int familyd_map_mode_from_string(const char *s, FamilydMapMode *ret_mode);
const char *familyd_map_mode_to_string(FamilydMapMode mode);
bool familyd_map_mode_fetch_writable(FamilydMapMode mode);

/*
 * mmap()s size bytes of a shard descriptor in mode (above) and populates the mapping (below)
 * unless flags has FAMILYD_MAP_LAZY. size is the shard socket's (FamilydShardInfo.size, the
 * descriptor's: a shard on huge pages is a whole number of them, and only whole ones can be
 * unmapped). *ret_ptr belongs to the caller: familyd_shard_unmap(ptr, size) or munmap(). The
 * mapping stays valid after close(fd), and after ReleaseBuild (the memory lives while any
 * descriptor or mapping holds it). -EACCES: FAMILYD_MAP_SHARED of a read-only descriptor;
 * -EINVAL: an unknown flag; a failed populate's error (nothing stays mapped then).
 *
 * Populated is the default because a trainer reads every byte of its parameters at once (the
 * first forward pass, a checkpoint, a copy to the GPU): the page tables are filled up front
 * on up to FAMILYD_POPULATE_MAX_THREADS threads, and the first read runs at memory speed
 * instead of faulting page by page. FAMILYD_MAP_LAZY maps without touching anything, for
 * callers that read a little of a large shard (a header, a probe, a debugger).
 */
#define FAMILYD_MAP_LAZY (1u << 0)
int familyd_shard_map_flags(int fd, uint64_t size, FamilydMapMode mode, unsigned flags,
                            void **ret_ptr);
/* familyd_shard_map_flags() with flags 0: populated. */
int familyd_shard_map_mode(int fd, uint64_t size, FamilydMapMode mode, void **ret_ptr);
/* familyd_shard_map_mode() with FAMILYD_MAP_SHARED when writable, else FAMILYD_MAP_READ_ONLY. */
int familyd_shard_map(int fd, uint64_t size, bool writable, void **ret_ptr);
/*
 * Makes size bytes of a mapping at ptr (made in mode) resident in this process's page tables:
 * MADV_POPULATE_READ (MADV_POPULATE_WRITE for FAMILYD_MAP_SHARED: a private mapping is never
 * written, which would copy it), split over up to FAMILYD_POPULATE_MAX_THREADS threads of at
 * least FAMILYD_POPULATE_BYTES_PER_THREAD each, no more than the online CPUs; a kernel without
 * those advices (before Linux 5.14) gets one byte per page read instead. 0, or a negative
 * errno of madvise() (-EFAULT: a range not mapped).
 */
#define FAMILYD_POPULATE_MAX_THREADS 4
#define FAMILYD_POPULATE_BYTES_PER_THREAD (64u << 20)
int familyd_shard_populate(void *ptr, uint64_t size, FamilydMapMode mode);
int familyd_shard_unmap(void *ptr, uint64_t size);

/* What the shard socket says of each descriptor (ShardFdReply). */
typedef struct FamilydShardInfo {
        uint64_t size;        /* the descriptor's size; for cuda, the GPU allocation's (a
                               * multiple of its granularity: map all of it) */
        int32_t device;       /* the local device index; for cuda, the CUDA ordinal */
        char device_kind[16]; /* "host": a sealed memfd, familyd_shard_map() it;
                               * "cuda": a CUDA POSIX file descriptor, familyd_cuda_shard_import() it */
} FamilydShardInfo;

/* familyd_shard_fetch(), with each descriptor's size, device kind and device in ret_info[i]
 * (written on success only). The same errors. */
int familyd_shard_fetch_info(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                FamilydShardInfo *ret_info,
                FamilydError *ret_error);

/*
 * CUDA shards (device_kind "cuda": the shard lives in GPU memory). libfamilyd does not link
 * CUDA: the driver is loaded at run time on first use ($FAMILYD_CUDA_DRIVER, else
 * libcuda.so.1). These fill ret_error (may be NULL) on every failure with a gRPC-style code
 * and a sentence, and return:
 *
 *   -ENOENT     this client cannot map device memory: no CUDA driver, or one that cannot
 *               initialise (code FAILED_PRECONDITION; the message says which)
 *   -ENODEV     this process has no CUDA device of that ordinal
 *   -EIO        a driver call failed (code UNAVAILABLE; the message names the call and its
 *               CUresult)
 *   -EINVAL, -ENOMEM
 *
 * familyd_cuda_available(): 0 when this process can import CUDA shards.
 *
 * familyd_cuda_shard_import(): imports fd (a "cuda" descriptor of familyd_shard_fetch_info();
 * it stays the caller's, who may close it at once) of size bytes (its info's size) on CUDA
 * device `device` (its info's device): retains that device's primary context and makes it
 * current on the calling thread, then cuMemImportFromShareableHandle, cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess. The mapping is read-only unless writable; a driver that has no
 * read-only device mappings gets read-write (familyd_cuda_shard_writable() says which).
 * GPU shards cannot be sealed and their descriptors carry no access mode: read-only is
 * advisory, a promise of this process, not a protection. The mapping stays valid after
 * ReleaseBuild and after the daemon exits, until familyd_cuda_shard_free().
 *
 * familyd_cuda_shard_pointer(): the mapping's address (a CUdeviceptr, valid in the device's
 * primary context, e.g. torch's); the RankShard's slices start at their byte_offset from it.
 * familyd_cuda_shard_read(): copies n bytes at offset to host memory (cuMemcpyDtoH).
 * familyd_cuda_shard_free(): unmaps, frees the reservation, releases the handle and the
 * context; accepts NULL, returns NULL.
 */
typedef struct FamilydCudaShard FamilydCudaShard;

int familyd_cuda_available(FamilydError *ret_error);
int familyd_cuda_shard_import(int fd, uint64_t size, int device, bool writable,
                              FamilydCudaShard **ret_shard, FamilydError *ret_error);
/*
 * The `private` mapping mode of a CUDA shard: GPU memory has no copy-on-write, so the shard is
 * imported read-only, copied (through host memory) into an allocation of this process's own
 * on the same device, and let go; the copy is read-write and its writes stay in this process.
 * The same arguments and errors as familyd_cuda_shard_import(); familyd_cuda_shard_free() it.
 */
int familyd_cuda_shard_import_private(int fd, uint64_t size, int device,
                                      FamilydCudaShard **ret_shard, FamilydError *ret_error);
uint64_t familyd_cuda_shard_pointer(const FamilydCudaShard *shard);
uint64_t familyd_cuda_shard_size(const FamilydCudaShard *shard);
int familyd_cuda_shard_device(const FamilydCudaShard *shard);
bool familyd_cuda_shard_writable(const FamilydCudaShard *shard);
int familyd_cuda_shard_read(const FamilydCudaShard *shard, uint64_t offset, void *dst, size_t n,
                            FamilydError *ret_error);
FamilydCudaShard *familyd_cuda_shard_free(FamilydCudaShard *shard);

/* familyd.v1.MeshService. create_mesh returns the mesh as stored, with its mesh_id and ranks. */
int familyd_create_mesh(FamilydClient *client, const Familyd__V1__Mesh *mesh, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error);
int familyd_get_mesh(FamilydClient *client, const char *mesh_id, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error);
int familyd_list_meshes(FamilydClient *client, Familyd__V1__ListMeshesResponse **ret_response, FamilydError *ret_error);
int familyd_delete_mesh(FamilydClient *client, const char *mesh_id, FamilydError *ret_error);
int familyd_get_topology(FamilydClient *client, Familyd__V1__Topology **ret_topology, FamilydError *ret_error);
/* Drops a down node and its ranks from the topology, on every daemon; the answer holds the new
 * topology. NOT_FOUND for a node not in the topology, FAILED_PRECONDITION for a node that is
 * up or suspect, or this daemon's own node. */
int familyd_forget_node(FamilydClient *client, const char *node, Familyd__V1__ForgetNodeResponse **ret_response, FamilydError *ret_error);

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
