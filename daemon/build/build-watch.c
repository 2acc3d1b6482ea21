/* build-watch.c: the watcher thread: exits of processes holding builds, and grace periods. */

/*
 * DESIGN: one thread with its own sd-event loop (one loop per thread, as the shard socket and
 * the peer thread). Other threads hand it processes to watch (a pidfd each, listed under the
 * lock) and grace deadlines that changed, through an eventfd; the loop alone owns its event
 * sources. A pidfd turns readable when its process exits, however its connections ended: the
 * process's references go then (build-share.c). One timer, on CLOCK_REALTIME (grace deadlines
 * are Unix ms, as GetBuild shows them), fires at the earliest deadline of the build table.
 * A process stays watched until it exits, so a trainer idle for hours keeps its builds.
 * Where there are no pidfds (build-caller.c), a process is polled instead, once a second.
 */

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "build-holders-keep.h"
#include "build-private.h"
#include "common/log.h"

/* How often processes watched without a pidfd are checked. */
#define WATCH_POLL_USEC (1000u * 1000u)

typedef struct Watched {
        struct Watched *next;
        BuildWatch *w;
        BuildCaller caller;
        int pidfd;           /* -1: no pidfds here, polled */
        sd_event_source *io; /* NULL until the loop takes it up */
} Watched;

struct BuildWatch {
        const Builder *builder;
        pthread_mutex_t lock; /* list, n, stop */
        Watched *list;
        size_t n;
        bool stop;
        int event_fd;
        sd_event *event;
        sd_event_source *command;
        sd_event_source *timer;
        sd_event_source *poll; /* on while a process is watched without a pidfd */
        sd_event_source *released; /* on while freed shards are still held (build-released.c) */
        pthread_t thread;
        bool started;
};

static void watched_free(Watched *x) {
        sd_event_source_disable_unref(x->io);
        safe_close(x->pidfd);
        free(x);
}

/* Frees what is due and sets the timer to the next deadline. */
static void watch_rearm(BuildWatch *w) {
        int64_t next = build_sharing_expire(w->builder);
        int r = 0;

        if (next > 0)
                r = sd_event_source_set_time(w->timer, (uint64_t) next * 1000);
        if (r >= 0)
                r = sd_event_source_set_enabled(w->timer, next > 0 ? SD_EVENT_ONESHOT
                                                                   : SD_EVENT_OFF);
        if (r < 0)
                log_warning_errno(r, "Failed to arm the grace timer, ignoring: %m");
}

/* x's process exited: unlisted (the lock held), then its references go. */
static void watched_gone(BuildWatch *w, Watched *x) {
        build_sharing_process_gone(w->builder, &x->caller);
        watched_free(x);
}

static void watched_unlist(BuildWatch *w, Watched *x) {
        for (Watched **p = &w->list; *p; p = &(*p)->next)
                if (*p == x) {
                        *p = x->next;
                        w->n--;
                        return;
                }
}

static int on_exit_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        Watched *x = userdata;
        BuildWatch *w = x->w;

        (void) pthread_mutex_lock(&w->lock);
        watched_unlist(w, x);
        (void) pthread_mutex_unlock(&w->lock);
        watched_gone(w, x);
        watch_rearm(w);
        return 0;
}

/* The processes watched without a pidfd: those that exited go; the poll goes on while any is
 * left. */
static int on_poll(sd_event_source *source, uint64_t usec, void *userdata) {
        BuildWatch *w = userdata;
        Watched *gone = NULL;
        bool polled = false;

        (void) pthread_mutex_lock(&w->lock);
        for (Watched *x = w->list, *next; x; x = next) {
                next = x->next;
                if (x->pidfd >= 0)
                        continue;
                if (build_caller_alive(&x->caller)) {
                        polled = true;
                        continue;
                }
                watched_unlist(w, x);
                x->next = gone;
                gone = x;
        }
        (void) pthread_mutex_unlock(&w->lock);
        for (Watched *x = gone, *next; x; x = next) {
                next = x->next;
                watched_gone(w, x);
        }
        if (gone)
                watch_rearm(w);
        if (polled)
                (void) sd_event_source_set_time(source, usec + WATCH_POLL_USEC);
        return sd_event_source_set_enabled(source, polled ? SD_EVENT_ONESHOT : SD_EVENT_OFF);
}

/* Freed builds' shards: those nobody holds any more are let go; on while any is left. */
static int on_released(sd_event_source *source, uint64_t usec, void *userdata) {
        BuildWatch *w = userdata;
        BuildReleasedUse use;

        build_released_sweep(build_sharing_released(w->builder), &use);
        if (use.segments > 0)
                (void) sd_event_source_set_time(source, usec + WATCH_POLL_USEC);
        return sd_event_source_set_enabled(source,
                                           use.segments > 0 ? SD_EVENT_ONESHOT : SD_EVENT_OFF);
}

static int on_command(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        BuildWatch *w = userdata;
        uint64_t n;
        bool stop;

        (void) read(w->event_fd, &n, sizeof n);
        (void) pthread_mutex_lock(&w->lock);
        stop = w->stop;
        for (Watched *x = w->list; x && !stop; x = x->next) {
                if (x->pidfd < 0 && !sd_event_source_get_enabled(w->poll, NULL)) {
                        uint64_t now = 0;
                        (void) sd_event_now(w->event, CLOCK_MONOTONIC, &now);
                        (void) sd_event_source_set_time(w->poll, now + WATCH_POLL_USEC);
                        (void) sd_event_source_set_enabled(w->poll, SD_EVENT_ONESHOT);
                }
                if (x->io || x->pidfd < 0)
                        continue;
                int r = sd_event_add_io(w->event, &x->io, x->pidfd, EPOLLIN, on_exit_io, x);
                if (r < 0)
                        log_warning_errno(r, "Failed to watch process %d, its references stay "
                                             "until released, ignoring: %m",
                                          (int) x->caller.pid);
        }
        (void) pthread_mutex_unlock(&w->lock);
        if (stop)
                return sd_event_exit(w->event, 0);
        watch_rearm(w);
        if (!sd_event_source_get_enabled(w->released, NULL)) {
                uint64_t now = 0;
                (void) sd_event_now(w->event, CLOCK_MONOTONIC, &now);
                (void) on_released(w->released, now, w);
        }
        return 0;
}

static int on_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        watch_rearm(userdata);
        return 0;
}

static void *watch_thread(void *userdata) {
        BuildWatch *w = userdata;
        int r = sd_event_loop(w->event);
        if (r < 0)
                log_error_errno(r, "Build watcher: the event loop failed, references of exited "
                                   "processes and grace periods stop being followed: %m");
        return NULL;
}

static void watch_wake(BuildWatch *w) {
        uint64_t one = 1;
        (void) write(w->event_fd, &one, sizeof one);
}

int build_watch_new(const Builder *builder, BuildWatch **ret) {
        BuildWatch *w = calloc(1, sizeof *w);
        int r;

        if (!w)
                return -ENOMEM;
        w->builder = builder;
        (void) pthread_mutex_init(&w->lock, NULL);
        w->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        r = w->event_fd < 0 ? -errno : 0;
        if (r >= 0)
                r = sd_event_new(&w->event);
        if (r >= 0)
                r = sd_event_add_io(w->event, &w->command, w->event_fd, EPOLLIN, on_command, w);
        if (r >= 0)
                r = sd_event_add_time(w->event, &w->timer, CLOCK_REALTIME, 0, 1000, on_timer, w);
        if (r >= 0)
                r = sd_event_source_set_enabled(w->timer, SD_EVENT_OFF);
        if (r >= 0)
                r = sd_event_add_time(w->event, &w->poll, CLOCK_MONOTONIC, 0, 0, on_poll, w);
        if (r >= 0)
                r = sd_event_source_set_enabled(w->poll, SD_EVENT_OFF);
        if (r >= 0)
                r = sd_event_add_time(w->event, &w->released, CLOCK_MONOTONIC, 0, 0, on_released,
                                      w);
        if (r >= 0)
                r = sd_event_source_set_enabled(w->released, SD_EVENT_OFF);
        if (r >= 0)
                r = -pthread_create(&w->thread, NULL, watch_thread, w);
        if (r < 0) {
                build_watch_free(w);
                return r;
        }
        w->started = true;
        *ret = w;
        return 0;
}

BuildWatch *build_watch_free(BuildWatch *w) {
        if (!w)
                return NULL;
        if (w->started) {
                (void) pthread_mutex_lock(&w->lock);
                w->stop = true;
                (void) pthread_mutex_unlock(&w->lock);
                watch_wake(w);
                (void) pthread_join(w->thread, NULL);
        }
        while (w->list) {
                Watched *x = w->list;
                w->list = x->next;
                watched_free(x);
        }
        sd_event_source_disable_unref(w->command);
        sd_event_source_disable_unref(w->timer);
        sd_event_source_disable_unref(w->poll);
        sd_event_source_disable_unref(w->released);
        sd_event_unref(w->event);
        safe_close(w->event_fd);
        (void) pthread_mutex_destroy(&w->lock);
        return mfree(w);
}

int build_watch_add(BuildWatch *w, const BuildCaller *caller, int pidfd) {
        _cleanup_close_ int fd = pidfd;
        Watched *x;
        int r = 0;

        (void) pthread_mutex_lock(&w->lock);
        for (x = w->list; x; x = x->next)
                if (x->caller.pid == caller->pid && x->caller.start_time == caller->start_time)
                        break;
        if (!x) {
                if (w->n >= BUILD_TABLE_MAX_HOLDERS)
                        r = -E2BIG;
                else if (!(x = calloc(1, sizeof *x)))
                        r = -ENOMEM;
                else {
                        *x = (Watched) { .next = w->list, .w = w, .caller = *caller,
                                         .pidfd = TAKE_FD(fd) };
                        w->list = x;
                        w->n++;
                }
        }
        (void) pthread_mutex_unlock(&w->lock);
        if (r >= 0 && fd < 0)
                watch_wake(w);
        return r;
}

void build_watch_kick(BuildWatch *w) {
        if (w)
                watch_wake(w);
}
