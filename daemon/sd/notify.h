/* notify.h: telling the service manager how familyd is doing: readiness, reload, stop, watchdog. */
#pragma once

#include <systemd/sd-event.h>

#include "common/macro.h"
#include "core/manager.h"

typedef struct Notifier Notifier;

/*
 * Without NOTIFY_SOCKET in the environment every call is a no-op and notifier_attach() adds
 * nothing. With it, and with the watchdog on (WATCHDOG_USEC, WATCHDOG_PID this process or
 * unset), the main loop gets a timer firing at half the watchdog interval; with the watchdog
 * off it fires every NOTIFIER_STATUS_REFRESH_USEC to keep STATUS= current. m must outlive n.
 */
#define NOTIFIER_STATUS_REFRESH_USEC (10ull * 1000000ull)

int notifier_new(Manager *m, Notifier **ret);
Notifier *notifier_free(Notifier *n);
DEFINE_TRIVIAL_CLEANUP_FUNC(Notifier *, notifier_free);

/* Adds the timer to the main loop's event loop (the thread that runs it pings); n owns the
 * source and must be freed before event. */
int notifier_attach(Notifier *n, sd_event *event);
/* What the timer does: WATCHDOG=1 when the watchdog is on, and STATUS= when it changed. */
void notifier_dispatch(Notifier *n);

/* READY=1 with the first STATUS=: the registry is loaded and both sockets accept. */
void notifier_ready(Notifier *n);
/*
 * RELOADING=1 (with MONOTONIC_USEC=) before a registry reload, READY=1 and STATUS= after it,
 * whatever its result (result < 0: the old registry stays, and STATUS= says the reload
 * failed). Safe from any thread; reloads that overlap (SIGHUP and the Reload RPC) nest, so
 * the manager sees one RELOADING=1 ... READY=1 pair around them.
 */
void notifier_reload_begin(Notifier *n);
void notifier_reload_end(Notifier *n, int result);
/* STOPPING=1: shutdown has begun. */
void notifier_stopping(Notifier *n);

/* Start failed (no Notifier yet): STATUS= and ERRNO= so `systemctl status` shows why. */
void notifier_start_failed(int error);

/*
 * The fd store (FDSTORE=1): the service manager keeps a copy of each descriptor under name
 * (FDNAME=; printable ASCII without ':', at most 255 bytes) and passes it back through
 * LISTEN_FDS when familyd starts again (sd/listen.h). A descriptor the store already holds is
 * ignored by the manager, under whatever name. 1: sent; 0: no service manager (NOTIFY_SOCKET
 * unset), nothing stored; negative errno: not sent (-EINVAL: a bad name). Any thread.
 */
int notify_fdstore_add(const char *name, const int *fds, size_t n_fds);
/* FDSTOREREMOVE=1: the manager closes and forgets every descriptor stored under name. */
int notify_fdstore_remove(const char *name);
