/* listen.h: descriptors inherited from the service manager (LISTEN_FDS), by name. */
#pragma once

#include <stddef.h>

#include "common/macro.h"

/*
 * Names familyd understands (LISTEN_FDNAMES, FileDescriptorName= in the socket units):
 *   api, shard   listening AF_UNIX stream sockets, served instead of binding --socket and
 *                --shard-socket;
 *   shard-*, meta*
 *                descriptors familyd put in the fd store itself (FDSTORE=1 with FDNAME=), given
 *                back on a restart: kept open, untouched, until taken with listen_fds_take().
 * Any other name, or none (LISTEN_FDNAMES unset), is a startup error.
 */
#define LISTEN_NAME_API "api"
#define LISTEN_NAME_SHARD "shard"
#define LISTEN_PREFIX_FDSTORE_SHARD "shard-"
#define LISTEN_PREFIX_FDSTORE_META "meta"

typedef struct ListenFd {
        char *name;
        int fd;
} ListenFd;

typedef struct ListenFds ListenFds;

/*
 * Takes the descriptors passed for this process (sd_listen_fds_with_names; the LISTEN_*
 * variables are unset) and checks them: -EINVAL, already logged, for an unknown or missing
 * name, a duplicate api or shard, or an api or shard descriptor that is not a listening
 * AF_UNIX stream socket. None passed is fine: an empty set.
 */
int listen_fds_new(ListenFds **ret);
/* Closes every descriptor not taken; accepts NULL. */
ListenFds *listen_fds_free(ListenFds *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(ListenFds *, listen_fds_free);

/* How many descriptors are left (not taken). */
size_t listen_fds_count(const ListenFds *l);

/*
 * The descriptor named exactly name (api, shard), now the caller's: non-blocking and
 * close-on-exec. -ENOENT when none was passed (the caller binds its own socket).
 */
int listen_fds_take_socket(ListenFds *l, const char *name, int *ret_fd);

/*
 * Every descriptor whose name starts with prefix, in the order they were passed, now the
 * caller's (names and descriptors; free with listen_fd_array_free). 0 with *ret_n 0 when there
 * is none. For the fd store: listen_fds_take(l, LISTEN_PREFIX_FDSTORE_SHARD, &a, &n).
 */
int listen_fds_take(ListenFds *l, const char *prefix, ListenFd **ret, size_t *ret_n);
void listen_fd_array_free(ListenFd *a, size_t n);

/* The path an AF_UNIX socket is bound to, for logs and replies; -ENODATA when unnamed or
 * abstract. */
int socket_unix_path(int fd, char **ret_path);
