/* caller.h: who is at the other end of each API connection, taken when it was accepted. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The credentials of a connection's peer (SO_PEERCRED and SO_PEERGROUPS at accept). */
typedef struct RpcCaller {
        int32_t pid; /* 0: outside familyd's pid namespace */
        uint32_t uid;
        uint32_t gid;
        bool admin; /* root, or a member of --admin-group (primary or supplementary) */
} RpcCaller;

typedef struct CallerTable CallerTable;

/* admin_gid: --admin-group's gid, or (gid_t) -1 for none (only root is an admin then). */
int caller_table_new(gid_t admin_gid, CallerTable **ret);
CallerTable *caller_table_free(CallerTable *t);

/* At accept, before gRPC has the socket: reads the peer's credentials and files them under
 * the descriptor's number, replacing whatever a closed connection left there. */
int caller_table_add(CallerTable *t, int fd);

/* The credentials filed for the connection now at fd (the same socket: its inode is checked);
 * -ENOTCONN when none were. */
int caller_table_find(CallerTable *t, int fd, RpcCaller *ret);
