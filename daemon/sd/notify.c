/* notify.c: sd_notify() messages: READY, STATUS, RELOADING, STOPPING, WATCHDOG. */

/*
 * DESIGN: the watchdog is pinged from the main loop, by a time source on its sd-event loop,
 * not from a thread of its own. The loop is what accepts every API connection and handles the signals;
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
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>

#include "common/log.h"
#include "notify.h"

#define NOTIFIER_STATUS_MAX 256
#define NOTIFIER_TIMER_ACCURACY_USEC 1000u

struct Notifier {
        Manager *manager;
        bool enabled;           /* NOTIFY_SOCKET is set */
        uint64_t watchdog_usec; /* 0: off */
        uint64_t period_usec;   /* of the timer: half the watchdog's, or the status refresh */
        sd_event_source *timer;
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

        n->period_usec = n->watchdog_usec > 0 ? n->watchdog_usec / 2
                                              : NOTIFIER_STATUS_REFRESH_USEC;
        if (n->period_usec == 0)
                n->period_usec = 1;
        if (n->watchdog_usec > 0)
                log_debug("Watchdog on: %" PRIu64 " us, pinging every %" PRIu64 " us.",
                          n->watchdog_usec, n->period_usec);

        *ret = TAKE_PTR(n);
        return 0;
}

Notifier *notifier_free(Notifier *n) {
        if (!n)
                return NULL;
        sd_event_source_disable_unref(n->timer);
        (void) pthread_mutex_destroy(&n->lock);
        return mfree(n);
}

void notifier_dispatch(Notifier *n) {
        char status[NOTIFIER_STATUS_MAX], text[NOTIFIER_STATUS_MAX + 32];

        if (!n || !n->enabled)
                return;
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

/* The next expiry keeps the cadence of the first; after a stall (the loop was busy for
 * longer than a period) it counts from now, one ping for all the missed ones. */
static int notifier_on_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        Notifier *n = userdata;
        uint64_t now = 0, next = usec + n->period_usec;

        notifier_dispatch(n);
        (void) sd_event_now(sd_event_source_get_event(source), CLOCK_MONOTONIC, &now);
        if (next <= now)
                next = now + n->period_usec;
        return sd_event_source_set_time(source, next);
}

int notifier_attach(Notifier *n, sd_event *event) {
        uint64_t now = 0;
        int r;

        if (!n || !n->enabled)
                return 0;
        r = sd_event_now(event, CLOCK_MONOTONIC, &now);
        if (r < 0)
                return r;
        /* An accuracy of 1 ms: sd-event would otherwise move the expiry by up to 250 ms to
         * batch wakeups, which a 200 ms half-interval cannot afford. */
        r = sd_event_add_time(event, &n->timer, CLOCK_MONOTONIC, now + n->period_usec,
                              NOTIFIER_TIMER_ACCURACY_USEC, notifier_on_timer, n);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(n->timer, SD_EVENT_ON);
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
