/* notify.c: sd_notify() messages: READY, STATUS, RELOADING, STOPPING, WATCHDOG. */

/*
 * DESIGN: the watchdog is pinged from the main loop, by a timerfd in its epoll set, not from a
 * thread of its own. The loop is what accepts every API connection and handles the signals;
 * if it hangs, familyd is useless even though gRPC's threads run, and a ping thread would hide
 * that from the service manager. A reload on SIGHUP runs on the loop too; it takes
 * milliseconds, far inside half an interval. The same timer keeps STATUS= current (builds come
 * and go without the loop's knowledge), sending it only when the text changed.
 *
 * The main thread and gRPC workers (the Reload RPC) both send; `lock` keeps the reload depth
 * and the last status consistent and the RELOADING/READY pairs in order. sd_notify() itself
 * opens a socket per call and is safe from any thread.
 */

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "common/log.h"
#include "notify.h"

#define NOTIFIER_STATUS_MAX 256

struct Notifier {
        Manager *manager;
        bool enabled;           /* NOTIFY_SOCKET is set */
        uint64_t watchdog_usec; /* 0: off */
        int timer_fd;
        pthread_mutex_t lock;
        unsigned reload_depth;
        bool reload_failed; /* the last reload failed: said in STATUS= until one succeeds */
        bool ready;
        char status[NOTIFIER_STATUS_MAX];
};

static uint64_t now_usec(clockid_t clock) {
        struct timespec ts;
        (void) clock_gettime(clock, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static void notifier_send(const char *text) {
        int r = sd_notify(/* unset_environment= */ false, text);
        if (r < 0)
                log_debug_errno(r, "Failed to notify the service manager, ignoring: %m");
}

/* The STATUS= text for now, into buf. Called with the lock held. */
static void notifier_format_status(Notifier *n, char *buf, size_t size) {
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(n->manager);
        unsigned builds = build_table_count(n->manager->builds);
        size_t meshes = mesh_table_size(n->manager->meshes);

        (void) snprintf(buf, size,
                        "Serving: registry generation %" PRIu64 ", %zu famil%s, %u build%s, "
                        "%zu mesh%s%s",
                        reg->generation, reg->n_families, reg->n_families == 1 ? "y" : "ies",
                        builds, builds == 1 ? "" : "s", meshes, meshes == 1 ? "" : "es",
                        n->reload_failed ? "; the last reload failed, see the log" : "");
}

int notifier_new(Manager *m, Notifier **ret) {
        _cleanup_(notifier_freep) Notifier *n = NULL;
        uint64_t usec = 0;
        int r;

        n = calloc(1, sizeof *n);
        if (!n)
                return -ENOMEM;
        n->manager = m;
        n->timer_fd = -1;
        (void) pthread_mutex_init(&n->lock, NULL);
        n->enabled = !isempty(getenv("NOTIFY_SOCKET"));
        if (!n->enabled) {
                *ret = TAKE_PTR(n);
                return 0;
        }

        r = sd_watchdog_enabled(/* unset_environment= */ false, &usec);
        if (r < 0)
                log_warning_errno(r, "Invalid WATCHDOG_USEC or WATCHDOG_PID, running without "
                                     "the watchdog: %m");
        n->watchdog_usec = r > 0 ? usec : 0;

        uint64_t period = n->watchdog_usec > 0 ? n->watchdog_usec / 2
                                                : NOTIFIER_STATUS_REFRESH_USEC;
        if (period == 0)
                period = 1;
        n->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
        if (n->timer_fd < 0)
                return log_error_errno(-errno, "Failed to create the watchdog timer: %m");
        struct itimerspec its = {
                .it_interval = { .tv_sec = (time_t) (period / 1000000u),
                                 .tv_nsec = (long) (period % 1000000u) * 1000 },
        };
        its.it_value = its.it_interval;
        if (timerfd_settime(n->timer_fd, 0, &its, NULL) < 0)
                return log_error_errno(-errno, "Failed to arm the watchdog timer: %m");
        if (n->watchdog_usec > 0)
                log_debug("Watchdog on: %" PRIu64 " us, pinging every %" PRIu64 " us.",
                          n->watchdog_usec, period);

        *ret = TAKE_PTR(n);
        return 0;
}

Notifier *notifier_free(Notifier *n) {
        if (!n)
                return NULL;
        safe_close(n->timer_fd);
        (void) pthread_mutex_destroy(&n->lock);
        return mfree(n);
}

int notifier_fd(const Notifier *n) {
        return n ? n->timer_fd : -1;
}

void notifier_dispatch(Notifier *n) {
        char status[NOTIFIER_STATUS_MAX], text[NOTIFIER_STATUS_MAX + 32];
        uint64_t expirations;

        if (!n || n->timer_fd < 0)
                return;
        /* Several expirations missed (the loop was busy) still make one ping; a failed read
         * (EAGAIN: woken for nothing) pings anyway, which is harmless. */
        ssize_t k = read(n->timer_fd, &expirations, sizeof expirations);
        (void) k;

        (void) pthread_mutex_lock(&n->lock);
        bool status_changed = false;
        if (n->ready && n->reload_depth == 0) {
                notifier_format_status(n, status, sizeof status);
                status_changed = !streq(status, n->status);
                if (status_changed)
                        memcpy(n->status, status, sizeof status);
        }
        if (n->watchdog_usec > 0 || status_changed) {
                (void) snprintf(text, sizeof text, "%s%s%s",
                                n->watchdog_usec > 0 ? "WATCHDOG=1\n" : "",
                                status_changed ? "STATUS=" : "", status_changed ? status : "");
                notifier_send(text);
        }
        (void) pthread_mutex_unlock(&n->lock);
}

/* READY=1 and the current STATUS=, with the lock held. */
static void notifier_send_ready(Notifier *n) {
        char text[NOTIFIER_STATUS_MAX + 32];

        notifier_format_status(n, n->status, sizeof n->status);
        (void) snprintf(text, sizeof text, "READY=1\nSTATUS=%s", n->status);
        notifier_send(text);
}

void notifier_ready(Notifier *n) {
        if (!n || !n->enabled)
                return;
        (void) pthread_mutex_lock(&n->lock);
        n->ready = true;
        notifier_send_ready(n);
        (void) pthread_mutex_unlock(&n->lock);
}

void notifier_reload_begin(Notifier *n) {
        char text[128];

        if (!n || !n->enabled)
                return;
        (void) pthread_mutex_lock(&n->lock);
        /* Before READY=1 (a Reload RPC can arrive while familyd starts) the manager is still
         * waiting for readiness: nothing to say. */
        if (n->reload_depth++ == 0 && n->ready) {
                /* MONOTONIC_USEC is what Type=notify-reload (systemd 253+) matches a reload
                 * with; older managers ignore it. */
                (void) snprintf(text, sizeof text,
                                "RELOADING=1\nSTATUS=Reloading the registry\n"
                                "MONOTONIC_USEC=%" PRIu64,
                                now_usec(CLOCK_MONOTONIC));
                notifier_send(text);
        }
        (void) pthread_mutex_unlock(&n->lock);
}

void notifier_reload_end(Notifier *n, int result) {
        if (!n || !n->enabled)
                return;
        (void) pthread_mutex_lock(&n->lock);
        n->reload_failed = result < 0;
        if (n->reload_depth > 0 && --n->reload_depth == 0 && n->ready)
                notifier_send_ready(n);
        (void) pthread_mutex_unlock(&n->lock);
}

void notifier_stopping(Notifier *n) {
        if (!n || !n->enabled)
                return;
        (void) pthread_mutex_lock(&n->lock);
        n->ready = false;
        notifier_send("STOPPING=1\nSTATUS=Stopping");
        (void) pthread_mutex_unlock(&n->lock);
}

void notifier_start_failed(int error) {
        char text[128];
        int e = error < 0 ? -error : error;

        if (isempty(getenv("NOTIFY_SOCKET")))
                return;
        (void) snprintf(text, sizeof text, "STATUS=Failed to start: %s\nERRNO=%d",
                        strerror(e), e);
        notifier_send(text);
}

/* What systemd accepts as FDNAME= (fdname_is_valid()). */
static bool fdname_valid(const char *name) {
        size_t n = 0;

        if (isempty(name))
                return false;
        for (const char *p = name; *p; p++, n++)
                if (*p < ' ' || *p > '~' || *p == ':')
                        return false;
        return n <= 255;
}

int notify_fdstore_add(const char *name, const int *fds, size_t n_fds) {
        char text[300];

        if (!fdname_valid(name) || n_fds == 0 || n_fds > 253)
                return -EINVAL;
        (void) snprintf(text, sizeof text, "FDSTORE=1\nFDNAME=%s", name);
        int r = sd_pid_notify_with_fds(0, /* unset_environment= */ false, text, fds,
                                       (unsigned) n_fds);
        return r < 0 ? r : r > 0;
}

int notify_fdstore_remove(const char *name) {
        char text[300];

        if (!fdname_valid(name))
                return -EINVAL;
        (void) snprintf(text, sizeof text, "FDSTOREREMOVE=1\nFDNAME=%s", name);
        int r = sd_notify(/* unset_environment= */ false, text);
        return r < 0 ? r : r > 0;
}
