/* daemon.h: the running daemon: its manager, servers and the main event loop. */
#pragma once

#include "config.h"

typedef struct Daemon Daemon;

/* Loads the registry and binds the sockets; a load error or a held socket is -EINVAL/-EBUSY,
 * already logged. */
int daemon_new(const Config *config, Daemon **ret);
Daemon *daemon_free(Daemon *d);
DEFINE_TRIVIAL_CLEANUP_FUNC(Daemon *, daemon_free);

/* Runs until SIGTERM or SIGINT; 0 on a clean stop. */
int daemon_run(Daemon *d);
