/* coordinator-status.h: whether this daemon's coordinator (etcd) answers, for GetStatus and health. */
#pragma once

/*
 * DESIGN: one daemon per process, one coordinator per daemon: the shell's etcd membership
 * (daemon/cluster/) writes this status from whichever thread saw an outage's edge, and the
 * adapters (GetStatus, the health service's `familyd.cluster`) read a copy of it. A mutex
 * guards the copy; nothing waits on it for longer than a memcpy. Without a coordinator (the
 * embedded membership) nothing is configured and the cluster is served.
 */

#include <stdbool.h>

#define COORDINATOR_STATUS_MAX_TEXT 512u

typedef struct CoordinatorStatus {
        bool configured; /* --coordinator was given */
        bool reachable;
        char endpoints[COORDINATOR_STATUS_MAX_TEXT]; /* "HOST:PORT[,HOST:PORT...]" */
        char cluster[COORDINATOR_STATUS_MAX_TEXT];   /* --cluster */
        char last_error[COORDINATOR_STATUS_MAX_TEXT]; /* of the last outage; "": none yet */
} CoordinatorStatus;

/* At start, before anything reads it: etcd mode with these endpoints, reachable. */
void coordinator_status_configure(const char *endpoints, const char *cluster);
/* An outage's edge: why (NULL: keep the last error) says what failed at its start. */
void coordinator_status_set_reachable(bool reachable, const char *why);
/* Back to the embedded membership (the daemon stopped its coordinator). */
void coordinator_status_clear(void);
void coordinator_status_get(CoordinatorStatus *ret);

/*
 * Calls changed(userdata) after each edge of reachable (the health service's watches push
 * then), on the thread that saw it; NULL: nobody. Setting waits for a call in progress, so
 * after coordinator_status_on_change(NULL, NULL) returns no call into the old hook runs. The
 * hook is called with no lock of the status held, so it may read the status.
 */
void coordinator_status_on_change(void (*changed)(void *userdata), void *userdata);
