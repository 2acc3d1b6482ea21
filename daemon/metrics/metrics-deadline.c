/* metrics-deadline.c: a metrics connection whose request headers are late is closed. */

/*
 * DESIGN: libmicrohttpd's connection timeout counts any byte as traffic, so a scraper that
 * drips its headers a byte at a time holds its connection for as long as it likes, and 16 of
 * them (the connection limit) kept every other scraper out (an adversarial run found it). The library has no
 * deadline for a request's headers, so this file keeps one: each connection, from its
 * NOTIFY_CONNECTION start to its close, has an entry (its socket context) with the time its
 * request's headers are due, from accept and again from the end of each request on a
 * kept-alive connection; the request handler's first call (headers complete) clears it. A
 * watcher thread sleeps until the earliest due time (with no timeout while nothing is due)
 * and shuts down (never closes: the descriptor stays the library's) the socket of a connection
 * past its due time; the library then reads its end and closes the connection. The list and
 * the shutdown share one lock with the CLOSED notification, which the library sends before it
 * closes the descriptor, so a shut-down descriptor is always the connection's own.
 */

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/log.h"
#include "common/macro.h"
#include "metrics-deadline.h"

/* The watcher wakes this much after the earliest due time, so that it finds it past. */
#define METRICS_DEADLINE_SLACK_NS (10ull * 1000000ull)

typedef struct DeadlineEntry DeadlineEntry;
struct DeadlineEntry {
        DeadlineEntry *prev, *next;
        int fd;
        uint64_t due_ns; /* 0: headers complete, a request is being answered */
        bool shut;
};

struct MetricsDeadline {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        pthread_t thread;
        bool started;
        bool stopping;
        uint64_t deadline_ns;
        DeadlineEntry *entries;
};

static uint64_t now_ns(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static void *metrics_deadline_thread(void *userdata) {
        MetricsDeadline *d = userdata;

        (void) pthread_mutex_lock(&d->lock);
        while (!d->stopping) {
                uint64_t now = now_ns(), next = UINT64_MAX;

                for (DeadlineEntry *e = d->entries; e; e = e->next) {
                        if (e->due_ns == 0 || e->shut)
                                continue;
                        if (now < e->due_ns) {
                                next = MIN(next, e->due_ns);
                                continue;
                        }
                        /* The library sees its end and closes the connection. */
                        (void) shutdown(e->fd, SHUT_RDWR);
                        e->shut = true;
                        log_debug("metrics: a request's headers were not complete within "
                                  "%llu ms, connection closed",
                                  (unsigned long long) (d->deadline_ns / 1000000ull));
                }
                if (next == UINT64_MAX) {
                        /* Nothing is due: sleep until a connection comes or a request ends. */
                        (void) pthread_cond_wait(&d->cond, &d->lock);
                        continue;
                }
                next += METRICS_DEADLINE_SLACK_NS;
                struct timespec until = { .tv_sec = (time_t) (next / 1000000000ull),
                                          .tv_nsec = (long) (next % 1000000000ull) };
                (void) pthread_cond_timedwait(&d->cond, &d->lock, &until);
        }
        (void) pthread_mutex_unlock(&d->lock);
        return NULL;
}

int metrics_deadline_new(uint64_t deadline_ms, MetricsDeadline **ret) {
        _cleanup_(metrics_deadline_freep) MetricsDeadline *d = NULL;
        pthread_condattr_t attr;
        int r;

        d = calloc(1, sizeof *d);
        if (!d)
                return -ENOMEM;
        d->deadline_ns = deadline_ms * 1000000ull;
        (void) pthread_mutex_init(&d->lock, NULL);
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&d->cond, &attr);
        (void) pthread_condattr_destroy(&attr);
        r = -pthread_create(&d->thread, NULL, metrics_deadline_thread, d);
        if (r < 0)
                return r;
        d->started = true;
        *ret = TAKE_PTR(d);
        return 0;
}

MetricsDeadline *metrics_deadline_free(MetricsDeadline *d) {
        if (!d)
                return NULL;
        if (d->started) {
                (void) pthread_mutex_lock(&d->lock);
                d->stopping = true;
                (void) pthread_cond_signal(&d->cond);
                (void) pthread_mutex_unlock(&d->lock);
                (void) pthread_join(d->thread, NULL);
        }
        /* The library's CLOSED notifications have freed every entry by now. */
        (void) pthread_cond_destroy(&d->cond);
        (void) pthread_mutex_destroy(&d->lock);
        return mfree(d);
}

void metrics_deadline_on_connection(void *cls, struct MHD_Connection *connection,
                                    void **socket_context,
                                    enum MHD_ConnectionNotificationCode code) {
        MetricsDeadline *d = cls;
        DeadlineEntry *e;

        if (code == MHD_CONNECTION_NOTIFY_STARTED) {
                const union MHD_ConnectionInfo *info =
                        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);

                e = calloc(1, sizeof *e);
                if (!e || !info) {
                        /* Served without a deadline: the idle timeout still applies. */
                        free(e);
                        log_debug("metrics: no deadline for a connection (out of memory)");
                        return;
                }
                e->fd = info->connect_fd;
                (void) pthread_mutex_lock(&d->lock);
                e->due_ns = now_ns() + d->deadline_ns;
                e->next = d->entries;
                if (d->entries)
                        d->entries->prev = e;
                d->entries = e;
                (void) pthread_cond_signal(&d->cond);
                (void) pthread_mutex_unlock(&d->lock);
                *socket_context = e;
                return;
        }

        e = *socket_context;
        if (code != MHD_CONNECTION_NOTIFY_CLOSED || !e)
                return;
        (void) pthread_mutex_lock(&d->lock);
        if (e->prev)
                e->prev->next = e->next;
        else
                d->entries = e->next;
        if (e->next)
                e->next->prev = e->prev;
        (void) pthread_mutex_unlock(&d->lock);
        *socket_context = NULL;
        free(e);
}

static DeadlineEntry *entry_of(struct MHD_Connection *connection) {
        const union MHD_ConnectionInfo *info =
                MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        return info ? info->socket_context : NULL;
}

void metrics_deadline_on_headers(MetricsDeadline *d, struct MHD_Connection *connection) {
        DeadlineEntry *e = entry_of(connection);

        if (!e)
                return;
        (void) pthread_mutex_lock(&d->lock);
        e->due_ns = 0;
        (void) pthread_mutex_unlock(&d->lock);
}

void metrics_deadline_on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                                   enum MHD_RequestTerminationCode code) {
        MetricsDeadline *d = cls;
        DeadlineEntry *e = entry_of(connection);

        if (!e)
                return;
        /* The next request on a kept-alive connection has its own deadline. */
        (void) pthread_mutex_lock(&d->lock);
        e->due_ns = now_ns() + d->deadline_ns;
        (void) pthread_cond_signal(&d->cond);
        (void) pthread_mutex_unlock(&d->lock);
}
