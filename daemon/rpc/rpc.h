/* rpc.h: what a service file declares: its methods, their kinds and handlers. */
#pragma once

#include "codec/codec-message.h"
#include <stdint.h>

#include "core/arena.h"
#include "core/error.h"
#include "core/manager.h"
#include "caller.h"

typedef enum RpcKind {
        RPC_UNARY,       /* one request, one reply or an error */
        RPC_WATCH,       /* one request, a first reply, then held open until the client leaves */
        RPC_BIDI_BYTES,  /* a stream of requests, each answered by one reply (reflection) */
        _RPC_KIND_MAX,
        _RPC_KIND_INVALID = -EINVAL,
} RpcKind;

struct Builder;
struct ShardTable;
struct Executor;

/* What the daemon around the server plugs in: whom to tell of what happens (the service
 * manager, through sd/), without the rpc layer knowing who listens, and the use-cases it set
 * up. Called on gRPC worker threads; NULL: nobody. */
typedef struct RpcHooks {
        /* Around the Reload RPC: before the registry is read, and after (result < 0: failed). */
        void (*reload_begin)(void *userdata);
        void (*reload_end)(void *userdata, int result);
        void *userdata;
        /* The Build use-case with the state store and the accelerators (daemon/build/build.h;
         * must outlive the server). NULL: builds in host memory, kept nowhere. */
        const struct Builder *builder;
} RpcHooks;

typedef struct RpcContext {
        Manager *manager;
        const RpcHooks *hooks;     /* NULL, or members NULL: nobody listens */
        struct Executor *executor; /* long work (materialising) off the gRPC workers */
        struct ShardTable *shards; /* tokens of materialised builds */
        const char *shard_socket;  /* where trainers fetch descriptors */
        void *userdata; /* the service's own state, from RpcService.userdata */
} RpcContext;

/* Unary and watch: a decoded request in, a reply built in the call's arena (released with the
 * call) or a FamilyError out. A negative errno without ret_error set is answered INTERNAL. */
typedef int (*RpcHandler)(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                          ProtobufCMessage **ret_reply, FamilyError *ret_error);
/* Bidi: raw request bytes in, raw reply bytes out (malloc'd); -EBADMSG: undecodable. */
typedef int (*RpcBytesHandler)(RpcContext *ctx, const uint8_t *request, size_t size,
                               uint8_t **ret_reply, size_t *ret_size);

typedef struct RpcMethod {
        const char *path; /* "/familyd.v1.FamilyService/Resolve" */
        RpcKind kind;
        const ProtobufCMessageDescriptor *request_type; /* unary and watch */
        RpcHandler handler;
        RpcBytesHandler bytes_handler;
        /* Watch: the handler's reply is sent again on each server_notify_watches(). */
        bool pushes_changes;
        /* ... unless it is byte for byte the reply this watch sent last (health: a message
         * per change of status, never the same status twice). */
        bool skips_repeats;
        /* It changes state: logged with the caller's pid and uid (CALLER_PID=, CALLER_UID=). */
        bool audited;
} RpcMethod;

typedef struct RpcService {
        const char *name; /* "familyd.v1.FamilyService" */
        const RpcMethod *methods;
        size_t n_methods;
        void *userdata;
} RpcService;

/* The services, each in its own service-*.c / health.c / reflection glue. */
extern const RpcService service_family;
extern const RpcService service_build;
extern const RpcService service_validate;
extern const RpcService service_mesh;
extern const RpcService service_admin;
extern const RpcService service_health;
extern const RpcService service_reflection_v1;
extern const RpcService service_reflection_v1alpha;

/*
 * A unary handler that would hold its worker long (a Build that materialises) answers later:
 * it calls rpc_call_defer() and returns RPC_PENDING; another thread then builds the reply in
 * rpc_pending_arena() and calls rpc_pending_finish() exactly once. Until then the call stays
 * alive (the server's shutdown waits for it).
 */
#define RPC_PENDING 1

/* A watch handler's last reply: sent, then the stream ends with OK (WatchBuild's final
 * state); no push reaches it any more. */
#define RPC_WATCH_LAST 2

/* The watches server_notify_watches_of() names for a build's progress. */
#define RPC_WATCH_BUILD_PATH "/familyd.v1.FamilyService/WatchBuild"
/* ... and for the health service's serving status (the coordinator's reachability). */
#define RPC_WATCH_HEALTH_PATH "/grpc.health.v1.Health/Watch"

typedef struct RpcPending RpcPending;

RpcPending *rpc_call_defer(void);
Arena *rpc_pending_arena(RpcPending *p);
/* Whether the call's deadline has passed, or its client cancelled or went away. */
bool rpc_pending_expired(RpcPending *p);
/* reply (from the pending arena) or error; takes over the error's contents. */
void rpc_pending_finish(RpcPending *p, ProtobufCMessage *reply, FamilyError *error);

/* On a worker inside a handler: the credentials of the call's connection, taken when it was
 * accepted (rpc/caller.c). -ENOTCONN: the client cannot be told. */
int rpc_call_caller(RpcCaller *ret);

/*
 * On a worker inside a handler: the process at the other end of the call's connection, pid and
 * uid as rpc_call_caller() has them, and a pidfd for it (SO_PEERPIDFD: the process that
 * connected, even if its pid was reused since; -1 where the kernel has none). -ENOTCONN: the
 * client cannot be told, or is outside familyd's pid namespace.
 */
int rpc_call_peer(int32_t *ret_pid, uint32_t *ret_uid, int *ret_pidfd);

/* On a worker inside a handler: whether the call's deadline has passed (the client has given
 * up on the answer). Long handlers check it before keeping what they made. */
bool rpc_call_expired(void);

/* On a worker inside a handler: 0 when the caller is an admin (root, or a member of
 * --admin-group), else PERMISSION_DENIED NOT_ADMIN naming what (the method or its option). */
int rpc_require_admin(const char *what, FamilyError *ret_error);

