/* metrics-server.c: GET /metrics over libmicrohttpd, on the library's own polling thread. */

/*
 * DESIGN: libmicrohttpd runs one internal thread (epoll) that accepts, reads, renders and
 * writes: a scrape never runs on a gRPC worker or the main loop, and what it reads is what
 * GetStatus reads (metrics-gather.c), so a scrape never holds a lock an RPC waits on for
 * longer than GetStatus would. A scraper is bounded by the library's own limits (connection
 * count in all and per IP, an idle timeout, the per-connection memory that caps the request
 * line and headers) and by a deadline for a request's headers that the library lacks
 * (metrics-deadline.c: its idle timeout counts a dripped byte as traffic); the socket is
 * ours, bound to the one address given, close-on-exec.
 */

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "core/manager.h"
#include "metrics-deadline.h"
#include "metrics-server.h"

struct MetricsServer {
        struct MHD_Daemon *mhd;
        MetricsDeadline *deadline; /* closes connections whose request headers are late */
        MetricsSources src;
};

static const char index_page[] =
        "<html><head><title>familyd</title></head><body>"
        "<h1>familyd</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

static enum MHD_Result reply_static(struct MHD_Connection *connection, unsigned code,
                                    const char *content_type, const char *body) {
        struct MHD_Response *response;
        enum MHD_Result ret;

        response = MHD_create_response_from_buffer(strlen(body), (void *) body,
                                                   MHD_RESPMEM_PERSISTENT);
        if (!response)
                return MHD_NO;
        (void) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
                (void) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET");
        ret = MHD_queue_response(connection, code, response);
        MHD_destroy_response(response);
        return ret;
}

/* The scraper asks for OpenMetrics by its Accept header, as Prometheus does. */
static bool wants_openmetrics(struct MHD_Connection *connection) {
        const char *accept = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_ACCEPT);
        return accept && strstr(accept, "application/openmetrics-text");
}

static enum MHD_Result reply_metrics(MetricsServer *s, struct MHD_Connection *connection) {
        _cleanup_free_ MetricsSnapshot *snapshot = NULL;
        struct MHD_Response *response;
        enum MHD_Result ret;
        bool openmetrics = wants_openmetrics(connection);
        char *text = NULL;
        size_t size = 0;
        int r;

        snapshot = malloc(sizeof *snapshot);
        if (!snapshot)
                return reply_static(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                                    "out of memory\n");
        r = metrics_snapshot_gather(&s->src, snapshot);
        if (r >= 0)
                r = metrics_render(snapshot, openmetrics, &text, &size);
        if (r < 0) {
                log_warning_errno(r, "Failed to render /metrics, answering 500: %m");
                return reply_static(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                                    "metrics unavailable\n");
        }
        response = MHD_create_response_from_buffer(size, text, MHD_RESPMEM_MUST_FREE);
        if (!response) {
                free(text);
                return MHD_NO;
        }
        (void) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                                       openmetrics ? METRICS_CONTENT_TYPE_OPENMETRICS
                                                   : METRICS_CONTENT_TYPE_TEXT);
        ret = MHD_queue_response(connection, MHD_HTTP_OK, response);
        MHD_destroy_response(response);
        return ret;
}

/* Answers on the first call, before any body: a request with one is refused anyway. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
        MetricsServer *s = cls;
        bool known = streq(url, "/metrics") || streq(url, "/");

        metrics_deadline_on_headers(s->deadline, connection);

        if (!known)
                return reply_static(connection, MHD_HTTP_NOT_FOUND, "text/plain",
                                    "not found: familyd serves /metrics\n");
        if (!streq(method, MHD_HTTP_METHOD_GET))
                return reply_static(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                                    "method not allowed: only GET\n");
        if (streq(url, "/"))
                return reply_static(connection, MHD_HTTP_OK, "text/html; charset=utf-8",
                                    index_page);
        return reply_metrics(s, connection);
}

/* The library's complaints are about scrapers (limits hit, bad requests): debug only. */
_printf_(2, 0) static void on_log(void *cls, const char *fmt, va_list ap) {
        char line[256];

        (void) vsnprintf(line, sizeof line, fmt, ap);
        line[strcspn(line, "\n")] = 0;
        log_debug("metrics: %s", line);
}

/* Splits "HOST:PORT" / "[HOST]:PORT" and binds a listening socket to exactly that address. */
static int metrics_bind(const char *address, int *ret_fd) {
        char host[METRICS_MAX_ADDRESS_LENGTH + 1];
        const char *colon = strrchr(address, ':'), *h = address;
        size_t n;
        int fd, r;

        if (!colon || !colon[1] || strlen(address) > METRICS_MAX_ADDRESS_LENGTH)
                return log_error_errno(-EINVAL, "--metrics-listen %s: not ADDR:PORT", address);
        n = (size_t) (colon - address);
        if (n >= 2 && address[0] == '[' && address[n - 1] == ']') {
                h++;
                n -= 2;
        }
        memcpy(host, h, n);
        host[n] = 0;

        struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
        struct addrinfo *ai = NULL;
        r = getaddrinfo(n > 0 ? host : NULL, colon + 1, &hints, &ai);
        if (r != 0)
                return log_error_errno(-EINVAL, "--metrics-listen %s: %s", address,
                                       gai_strerror(r));

        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
                r = -errno;
                freeaddrinfo(ai);
                return log_error_errno(r, "Failed to create the metrics socket: %m");
        }
        (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &(int) { 1 }, sizeof(int));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
            listen(fd, (int) METRICS_LISTEN_BACKLOG) < 0) {
                r = -errno;
                freeaddrinfo(ai);
                (void) close(fd);
                return log_error_errno(r, "Failed to bind the metrics address %s: %m", address);
        }
        freeaddrinfo(ai);
        *ret_fd = fd;
        return 0;
}

int metrics_server_new(const char *address, const MetricsSources *src, MetricsServer **ret) {
        _cleanup_(metrics_server_freep) MetricsServer *s = NULL;
        struct timespec now;
        int fd, r;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->src = *src;
        (void) clock_gettime(CLOCK_REALTIME, &now);
        s->src.start_time_seconds = (double) now.tv_sec + (double) now.tv_nsec / 1e9 -
                                    (double) manager_uptime_ms(src->manager) / 1e3;
        metrics_mark_start();

        r = metrics_deadline_new(METRICS_REQUEST_DEADLINE_S * 1000ull, &s->deadline);
        if (r < 0)
                return log_error_errno(r, "Failed to start the metrics request deadline: %m");
        r = metrics_bind(address, &fd);
        if (r < 0)
                return r;
        s->mhd = MHD_start_daemon(
                MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL,
                NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
                (unsigned) METRICS_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                (unsigned) METRICS_MAX_CONNECTIONS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT,
                (unsigned) METRICS_CONNECTION_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                (size_t) METRICS_CONNECTION_MEMORY_BYTES, MHD_OPTION_NOTIFY_CONNECTION,
                metrics_deadline_on_connection, s->deadline, MHD_OPTION_NOTIFY_COMPLETED,
                metrics_deadline_on_completed, s->deadline, MHD_OPTION_EXTERNAL_LOGGER, on_log,
                NULL, MHD_OPTION_END);
        if (!s->mhd) {
                (void) close(fd);
                return log_error_errno(-EIO, "Failed to start the metrics server on %s",
                                       address);
        }
        log_info("Serving metrics on http://%s/metrics.", address);
        *ret = TAKE_PTR(s);
        return 0;
}

MetricsServer *metrics_server_free(MetricsServer *s) {
        if (!s)
                return NULL;
        /* Joins the thread and closes the connections and the listening socket. */
        if (s->mhd)
                MHD_stop_daemon(s->mhd);
        metrics_deadline_free(s->deadline);
        return mfree(s);
}
