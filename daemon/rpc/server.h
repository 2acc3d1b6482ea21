/* server.h: the gRPC server: method registration, worker threads, connections handed in. */
#pragma once

/*
 * DESIGN: one completion queue, polled by `threads` worker threads that own no domain state:
 * each completion runs its call's next step (decode, call into the Manager, encode, send), so
 * the Manager is the only shared state and it locks for itself. The daemon's main loop accepts
 * connections and hands them in with server_add_connection(); gRPC never binds a socket.
 */

#include <sys/types.h>

#include "core/manager.h"
#include "rpc.h"

typedef struct Server Server;

struct ShardTable;
struct Executor;

typedef struct ServerParams {
        Manager *manager;
        struct Executor *executor;
        struct ShardTable *shards;
        const char *shard_socket;
        unsigned threads;
        unsigned max_request_bytes;
        unsigned connection_idle_ms;
        unsigned max_watches;
        unsigned max_watches_per_process; /* 0: max_watches */
        CallerQueueLimits queue_limits;   /* members 0: unbounded */
        gid_t admin_gid; /* --admin-group, or (gid_t) -1: only root is an admin */
        RpcHooks hooks; /* copied; userdata must outlive the server */
} ServerParams;

int server_new(const ServerParams *params, Server **ret);
/* Takes ownership of fd, a connected stream socket. refusal: NULL, or the cap it is over: its
 * first call is answered RESOURCE_EXHAUSTED with the reason, then the connection is closed. */
void server_add_connection(Server *s, int fd, const RpcRefusal *refusal);
/* From any thread: open watches that push changes (WatchTopology) send anew. */
void server_notify_watches(Server *s);
/* From any thread: only the open watches of the method path (RPC_WATCH_BUILD_PATH) send anew. */
void server_notify_watches_of(Server *s, const char *path);
/* Cancels every call, stops the threads and frees; accepts NULL. */
Server *server_free(Server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Server *, server_free);
