/* listener.h: the API socket: lock, bind, accept, and a cap on concurrent connections. */
#pragma once

#include "macro.h"

typedef struct Listener Listener;

/*
 * Takes PATH.lock (flock) so a second daemon refuses to start instead of stealing the socket,
 * then binds PATH (replacing a stale socket), mode 0660. -EBUSY: another daemon holds the lock.
 */
int listener_new(const char *path, unsigned max_connections, Listener **ret);
/* Adopts an already listening socket (systemd socket activation); no lock, no unlink at exit. */
int listener_adopt(int fd, unsigned max_connections, Listener **ret);
Listener *listener_free(Listener *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(Listener *, listener_free);

int listener_fd(const Listener *l);
/* Accepts one connection: 0 and *ret_fd, -EAGAIN when none is waiting, -EDQUOT when the cap is
 * reached (the connection was closed and logged), or another negative errno. */
int listener_accept(Listener *l, int *ret_fd);
