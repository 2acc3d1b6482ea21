/* listener.h: the API socket: lock, bind, accept, and caps on concurrent connections. */
#pragma once

#include "common/macro.h"
#include "caller.h"

/* Connections over a cap open at once that wait to answer their first call with the refusal;
 * past this many, one over a cap is closed bare. */
#define LISTENER_MAX_REFUSING 32u

typedef struct Listener Listener;

typedef struct ListenerLimits {
        unsigned max_connections; /* live connections in all (--max-connections) */
        unsigned max_per_peer;    /* from one client process (--max-connections-per-process) */
        unsigned max_per_uid;     /* from one uid (--max-connections-per-uid); 0: half of
                                   * max_connections */
} ListenerLimits;

/*
 * Takes PATH.lock (flock) so a second daemon refuses to start instead of stealing the socket,
 * then binds PATH (replacing a stale socket), mode 0660. -EBUSY: another daemon holds the lock.
 */
int listener_new(const char *path, const ListenerLimits *limits, Listener **ret);
/*
 * Adopts an already listening, non-blocking socket (socket activation) and takes fd, even on
 * failure. Takes PATH.lock too when the socket is bound to a path (-EBUSY: another daemon holds
 * it; a lock file that cannot be created is only a warning). Never removes the socket file.
 */
int listener_adopt(int fd, const ListenerLimits *limits, Listener **ret);
Listener *listener_free(Listener *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(Listener *, listener_free);

int listener_fd(const Listener *l);
/*
 * Accepts one connection: 0 and *ret_fd, with *ret_refusal saying whether it is over a cap
 * (kind RPC_REFUSAL_NONE: served; else hand it to the server marked, so that its first call
 * gets the reason); -EAGAIN when none is waiting; -EDQUOT when one was taken off the queue and
 * closed (over a cap with LISTENER_MAX_REFUSING refusals pending, or shed while the process is
 * out of file descriptors), already logged; or another negative errno, after which the caller
 * should stop accepting for a while (-EMFILE/-ENFILE: out of descriptors, already logged).
 */
int listener_accept(Listener *l, int *ret_fd, RpcRefusal *ret_refusal);
