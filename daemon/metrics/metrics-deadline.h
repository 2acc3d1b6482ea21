/* metrics-deadline.h: a metrics connection whose request headers are late is closed. */
#pragma once

#include <microhttpd.h>
#include <stdint.h>

#include "common/macro.h"

typedef struct MetricsDeadline MetricsDeadline;

/* deadline_ms: how long a request's line and headers may take, from accept or from the end of
 * the previous request on the connection. Starts the watcher thread. */
int metrics_deadline_new(uint64_t deadline_ms, MetricsDeadline **ret);
/* Stops and joins the thread; after MHD_stop_daemon (every connection is closed by then). */
MetricsDeadline *metrics_deadline_free(MetricsDeadline *d);
DEFINE_TRIVIAL_CLEANUP_FUNC(MetricsDeadline *, metrics_deadline_free);

/* libmicrohttpd's callbacks, on its thread: MHD_OPTION_NOTIFY_CONNECTION and
 * MHD_OPTION_NOTIFY_COMPLETED with d as their closure, and the request handler's first call
 * (the headers are complete). */
void metrics_deadline_on_connection(void *d, struct MHD_Connection *connection,
                                    void **socket_context,
                                    enum MHD_ConnectionNotificationCode code);
void metrics_deadline_on_completed(void *d, struct MHD_Connection *connection, void **con_cls,
                                   enum MHD_RequestTerminationCode code);
void metrics_deadline_on_headers(MetricsDeadline *d, struct MHD_Connection *connection);
