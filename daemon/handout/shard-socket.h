/* shard-socket.h: the shard socket: tokens in, shard descriptors out over SCM_RIGHTS. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "common/macro.h"
#include "checkpoint-deposit.h"
#include "shard-table.h"

/* Client-controlled resources of the shard socket (proto/familyd/v1/shard.proto). */
/* A frame's body; a longer declared length closes the connection. */
#define SHARD_SOCKET_MAX_FRAME_BYTES 65536u
/* Tokens in one request: SCM_MAX_FD, the most descriptors one sendmsg carries. */
#define SHARD_SOCKET_MAX_TOKENS 253u
/* Concurrent connections; one over it is closed as soon as it is accepted, with a log line. */
#define SHARD_SOCKET_MAX_CONNECTIONS 128u
/* Concurrent connections of one peer uid (SO_PEERCRED at accept; uid 0 counts like any other),
 * the same way. With the one-unread-reply rule this bounds the descriptors one uid can keep in
 * flight, charged to the daemon's user, at this times SHARD_SOCKET_MAX_TOKENS. */
#define SHARD_SOCKET_MAX_CONNECTIONS_PER_UID 16u
/* A connection that completes no request frame (and takes no reply) for this long is closed;
 * not while a reply with descriptors is unread, though: the unread timeout applies then. */
#define SHARD_SOCKET_IDLE_TIMEOUT_MS 5000u
/* A connection whose descriptor-carrying reply stays unread this long is shut down (the client
 * reads what was sent, then EOF); its slot is held until the client reads it or closes. */
#define SHARD_SOCKET_UNREAD_TIMEOUT_MS 60000u

typedef struct ShardServer ShardServer;

/* What the socket has done since it started (/metrics); each number is read on its own. */
typedef struct ShardServerCounters {
        unsigned connections;       /* open now */
        uint64_t connections_total; /* accepted and served (past both caps) */
        uint64_t refused_total;     /* closed at accept for a connection cap */
        uint64_t handouts_total;    /* replies whose descriptors the kernel took */
        uint64_t descriptors_total; /* descriptors those replies carried */
} ShardServerCounters;

/*
 * Binds path (replacing a stale socket: the API socket's lock already makes this daemon the
 * only one), mode 0660, and starts the socket's own thread, which serves lookups in table (it
 * takes a reference). Host descriptors of read-only requests are read-only;
 * GPU ones carry no access mode (segment.h).
 */
int shard_server_new(const char *path, ShardTable *table, ShardServer **ret);
/* The same on an inherited listening socket (socket activation), non-blocking already; takes
 * fd, even on failure, and never removes the socket file. */
int shard_server_adopt(int fd, ShardTable *table, ShardServer **ret);
/* Stops and joins the thread, closes every connection, removes the socket. */
ShardServer *shard_server_free(ShardServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(ShardServer *, shard_server_free);

/* For tests and configuration; a change applies to deadlines set from then on. 0: default. */
void shard_server_set_idle_timeout(ShardServer *s, unsigned msec);
void shard_server_set_max_connections(ShardServer *s, unsigned n);
void shard_server_set_max_connections_per_uid(ShardServer *s, unsigned n);
void shard_server_set_unread_timeout(ShardServer *s, unsigned msec);
/* Members of gid (--admin-group) map any build's shards, as root does; (gid_t) -1: none. */
void shard_server_set_admin_gid(ShardServer *s, gid_t gid);
/* Checkpoint deposits (ShardFdRequest.checkpoint_files) go to deposits, which must outlive s;
 * NULL (the default): refused. */
void shard_server_set_checkpoint_deposits(ShardServer *s, CheckpointDeposits *deposits);
/* Any thread, while s lives: relaxed reads of the counters the socket's thread bumps. */
void shard_server_counters(ShardServer *s, ShardServerCounters *ret);
