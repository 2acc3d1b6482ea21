/* metrics-server.h: the /metrics HTTP endpoint (libmicrohttpd), on its own thread. */
#pragma once

#include "common/macro.h"
#include "metrics-snapshot.h"

/* What a scraper controls, each bounded (docs/security.md, "Metrics port"). */
/* Open connections in all; one more is accepted and closed at once. */
#define METRICS_MAX_CONNECTIONS 16u
/* Open connections from one IP address. */
#define METRICS_MAX_CONNECTIONS_PER_IP 8u
/* A connection with no traffic for this long is closed. */
#define METRICS_CONNECTION_TIMEOUT_S 5u
/* A request whose line and headers are not complete this long after accept (or after the
 * previous request on the connection) is closed, however its bytes trickle in. */
#define METRICS_REQUEST_DEADLINE_S 3u
/* A connection's buffer for its request line and headers: a longer request is answered 431
 * (or 414 for its line) and closed. */
#define METRICS_CONNECTION_MEMORY_BYTES 16384u
/* Connections waiting in the kernel to be accepted. */
#define METRICS_LISTEN_BACKLOG 16u
/* The longest --metrics-listen value. */
#define METRICS_MAX_ADDRESS_LENGTH 255u

typedef struct MetricsServer MetricsServer;

/*
 * Binds address ("127.0.0.1:9464", "[::1]:9464", "localhost:9464"; that address only) and
 * starts the HTTP thread, which answers GET /metrics from src (manager and builder must
 * outlive the server) and GET / with a link to it; anything else is 404 or 405. -EINVAL for
 * an address that is not HOST:PORT or does not resolve, the bind's errno otherwise; logged.
 */
int metrics_server_new(const char *address, const MetricsSources *src, MetricsServer **ret);
/* Stops and joins the thread, closing every connection and the socket. NULL is fine. */
MetricsServer *metrics_server_free(MetricsServer *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(MetricsServer *, metrics_server_free);
