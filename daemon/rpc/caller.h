/* caller.h: each API connection: who is at the other end, its refusal, its queued replies. */
#pragma once

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The credentials of a connection's peer (SO_PEERCRED and SO_PEERGROUPS at accept). */
typedef struct RpcCaller {
        int32_t pid; /* 0: outside familyd's pid namespace */
        uint32_t uid;
        uint32_t gid;
        bool admin; /* root, or a member of --admin-group (primary or supplementary) */
} RpcCaller;

/* Why the listener took a connection over a cap: its first call is answered with it. */
typedef enum RpcRefusalKind {
        RPC_REFUSAL_NONE,
        RPC_REFUSAL_CONNECTIONS, /* --max-connections */
        RPC_REFUSAL_PEER,        /* --max-connections-per-process */
        RPC_REFUSAL_UID,         /* --max-connections-per-uid */
        _RPC_REFUSAL_KIND_MAX,
        _RPC_REFUSAL_KIND_INVALID = -EINVAL,
} RpcRefusalKind;

typedef struct RpcRefusal {
        RpcRefusalKind kind;
        unsigned limit; /* the cap that was reached */
} RpcRefusal;

/* Bytes of replies handed to gRPC and not yet taken by the client: the bounds. */
typedef struct CallerQueueLimits {
        uint64_t per_connection; /* --max-queued-bytes-per-connection */
        uint64_t total;          /* --max-queued-bytes */
} CallerQueueLimits;

/* caller_table_queue()'s outcomes besides 0. */
typedef enum CallerQueueFull {
        CALLER_QUEUE_CONNECTION_FULL = 1, /* this connection's bound */
        CALLER_QUEUE_TOTAL_FULL,          /* the bound over all connections */
} CallerQueueFull;

typedef struct CallerTable CallerTable;
/* One accepted connection; lives while the table or a call holds it (reference-counted). */
typedef struct RpcConnection RpcConnection;

/* admin_gid: --admin-group's gid, or (gid_t) -1 for none (only root is an admin then). */
int caller_table_new(gid_t admin_gid, const CallerQueueLimits *limits, CallerTable **ret);
/* Reference-counted: queued replies hold the table until gRPC lets go of their bytes, which
 * may be after the server is gone. */
CallerTable *caller_table_ref(CallerTable *t);
CallerTable *caller_table_unref(CallerTable *t);

/* At accept, before gRPC has the socket: reads the client's credentials and files them under
 * the descriptor's number, replacing whatever a closed connection left there. refusal: NULL,
 * or why the connection is over a cap. */
int caller_table_add(CallerTable *t, int fd, const RpcRefusal *refusal);

/* The credentials filed for the connection now at fd (the same socket: its inode is checked);
 * -ENOTCONN when none were. */
int caller_table_find(CallerTable *t, int fd, RpcCaller *ret);

/* The connection now at fd, with a reference for the caller; NULL when none was filed. */
RpcConnection *caller_table_connection(CallerTable *t, int fd);
RpcConnection *rpc_connection_ref(RpcConnection *c);
RpcConnection *rpc_connection_unref(RpcConnection *c);
const RpcCaller *rpc_connection_caller(const RpcConnection *c);
const RpcRefusal *rpc_connection_refusal(const RpcConnection *c);
/* Whether fd is still this connection's socket (gRPC keeps it open while a call lives). */
bool rpc_connection_is_fd(const RpcConnection *c, int fd);

/*
 * Counts size bytes of a reply handed to gRPC for connection c (NULL: unknown, only the total
 * counts): 0, or CALLER_QUEUE_*_FULL with nothing counted and *ret_queued, *ret_limit the
 * bytes already waiting and the bound they would pass.
 */
int caller_table_queue(CallerTable *t, RpcConnection *c, size_t size, uint64_t *ret_queued,
                       uint64_t *ret_limit);
/* The reply's bytes are freed (sent, or dropped with the call or the connection). */
void caller_table_unqueue(CallerTable *t, RpcConnection *c, size_t size);

/* At the server's shutdown: shuts down both ways every filed connection still open at its
 * number (the same socket), so that gRPC closes it even while a write to a client that never
 * reads is in progress (its close waits for that write). Returns how many. */
unsigned caller_table_shutdown_all(CallerTable *t);
