/* topology-watch.c: familyctl topology --watch: the topology, then each new one as it comes. */

/*
 * DESIGN
 *
 * `topology --watch` waits in familyd_watch_next() on the main thread. What must end that
 * wait from outside (SIGINT, SIGTERM, the reader of stdout going away) is watched by one
 * helper thread: SIGINT and SIGTERM are blocked before the client exists, so every thread gRPC
 * starts inherits the mask, and arrive on a signalfd; stdout is polled for POLLERR/POLLHUP (a
 * pipe whose reader closed). The helper records why and calls familyd_watch_cancel(), which
 * gRPC allows from any thread; the main thread sees -ECANCELED and exits 0. An eventfd tells
 * the helper to leave when the watch ends on its own; it is joined before the watch is freed.
 * SIGPIPE is ignored, so a write to a closed pipe fails with EPIPE instead of killing us.
 */

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "familyctl.h"
#include "common/macro.h"

/* What ends a watch from outside the main thread (see DESIGN). */
typedef struct WatchGuard {
        FamilydWatch *watch;
        int signal_fd;
        int stop_fd;
        pthread_t thread;
        bool running;
        atomic_int why;         /* 0, a signal number, or -EPIPE for a closed stdout */
} WatchGuard;

static void *guard_thread(void *userdata) {
        WatchGuard *g = userdata;
        struct pollfd p[3] = {
                { .fd = g->signal_fd, .events = POLLIN },
                { .fd = g->stop_fd, .events = POLLIN },
                { .fd = STDOUT_FILENO, .events = 0 },  /* POLLERR/POLLHUP are always reported */
        };

        for (;;) {
                if (poll(p, ELEMENTSOF(p), -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return NULL;
                }
                if (p[1].revents)
                        return NULL;
                if (p[0].revents & POLLIN) {
                        struct signalfd_siginfo si;

                        if (read(g->signal_fd, &si, sizeof(si)) != (ssize_t) sizeof(si))
                                continue;
                        atomic_store(&g->why, (int) si.ssi_signo);
                        break;
                }
                if (p[2].revents & (POLLERR | POLLHUP)) {
                        atomic_store(&g->why, -EPIPE);
                        break;
                }
                if (p[2].revents & POLLNVAL)
                        p[2].fd = -1;   /* no stdout at all: nothing to watch there */
        }
        familyd_watch_cancel(g->watch);
        return NULL;
}

static void guard_stop(WatchGuard *g) {
        if (g->running) {
                uint64_t one = 1;

                (void) !write(g->stop_fd, &one, sizeof(one));
                (void) pthread_join(g->thread, NULL);
                g->running = false;
        }
        g->signal_fd = safe_close(g->signal_fd);
        g->stop_fd = safe_close(g->stop_fd);
}

/* "2026-11-30T06:12:34.567+0000": local time, to the millisecond, with its offset. */
static void print_timestamp(void) {
        struct timespec ts;
        struct tm tm;
        char date[32], zone[8];

        (void) clock_gettime(CLOCK_REALTIME, &ts);
        (void) localtime_r(&ts.tv_sec, &tm);
        (void) strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
        (void) strftime(zone, sizeof(zone), "%z", &tm);
        printf("%s.%03ld%s", date, ts.tv_nsec / 1000000, zone);
}

/* Prints one topology of the stream and flushes; -EPIPE when the reader is gone, another
 * negative errno when stdout fails otherwise, else an exit code. */
static int watch_print(Context *ctx, const Familyd__V1__Topology *topo, bool devices) {
        int r;

        if (ctx->json) {
                _cleanup_free_ char *json = NULL;

                r = familyd_json_encode(&topo->base, 0, &json);
                if (r < 0)
                        return ctl_fail("encode JSON", r, NULL);
                puts(json);
        } else {
                /* The blank line ends the block now, so that a reader need not wait for the
                 * next topology to know this one is whole. */
                print_timestamp();
                printf("  topology version %" PRIu64 "\n", topo->version);
                r = print_topology(&ctx->table, topo, devices);
                if (r != EXIT_OK)
                        return r;
                putchar('\n');
        }
        if (fflush(stdout) != 0 || ferror(stdout))
                return errno > 0 ? -errno : -EIO;
        return EXIT_OK;
}

/* The stream ended without our asking: say why. The daemon never ends a watch by itself, so
 * even an OK end means it went away. */
static int watch_ended(int r, const FamilydError *error, uint64_t seen) {
        if (r == FAMILYD_WATCH_ENDED) {
                fputs("familyctl: familyd ended the topology watch\n", stderr);
                return EXIT_UNREACHABLE;
        }
        if (r == -EPROTO && seen > 0 && error &&
            (error->code == 14 /* UNAVAILABLE */ || error->code == 1 /* CANCELLED */)) {
                fprintf(stderr, "familyctl: familyd went away, the topology watch ended: %s: %s\n",
                        familyd_status_name(error->code), strempty(error->message));
                return EXIT_UNREACHABLE;
        }
        return ctl_fail("watch topology", r, error);
}

int topology_watch(Context *ctx, bool devices, uint64_t count) {
        _cleanup_(guard_stop) WatchGuard g = { .signal_fd = -1, .stop_fd = -1 };
        FamilydWatchParams params = {};
        FamilydError error = FAMILYD_ERROR_NULL;
        FamilydWatch *watch = NULL;
        uint64_t seen = 0;
        sigset_t mask;
        int r;

        /* Before the client exists, so that gRPC's threads inherit the mask (see DESIGN). */
        (void) sigemptyset(&mask);
        (void) sigaddset(&mask, SIGINT);
        (void) sigaddset(&mask, SIGTERM);
        r = -pthread_sigmask(SIG_BLOCK, &mask, NULL);
        if (r < 0)
                return ctl_fail("block signals", r, NULL);
        (void) signal(SIGPIPE, SIG_IGN);

        g.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
        g.stop_fd = eventfd(0, EFD_CLOEXEC);
        if (g.signal_fd < 0 || g.stop_fd < 0)
                return ctl_fail("watch signals", -errno, NULL);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;

        /* --timeout bounds the whole watch only when given: the client's default would end
         * every watch after 30 s. */
        if (ctx->timeout_set) {
                params.field_mask |= FAMILYD_WATCH_PARAM_FIELD_TIMEOUT_MS;
                params.timeout_ms = ctx->timeout_ms;
        }
        r = familyd_watch_topology_start(ctx->client, &params, &watch, &error);
        if (r < 0) {
                r = ctl_fail("watch topology", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        g.watch = watch;
        r = -pthread_create(&g.thread, NULL, guard_thread, &g);
        if (r < 0) {
                familyd_watch_free(watch);
                return ctl_fail("start a thread", r, NULL);
        }
        g.running = true;

        for (;;) {
                Familyd__V1__Topology *topo = NULL;

                r = familyd_watch_next(watch, (ProtobufCMessage **) &topo, &error);
                if (r != 0) {
                        int why = atomic_load(&g.why);

                        /* Ours: a signal or a closed stdout; the daemon's end otherwise. */
                        r = r == -ECANCELED && why != 0 ? EXIT_OK : watch_ended(r, &error, seen);
                        break;
                }
                r = watch_print(ctx, topo, devices);
                familyd__v1__topology__free_unpacked(topo, NULL);
                if (r == -EPIPE)
                        r = EXIT_OK;    /* the reader is gone: nothing left to do */
                else if (r < 0)
                        r = ctl_fail("write to stdout", r, NULL);
                if (r != EXIT_OK || ++seen == count)
                        break;
        }

        familyd_error_clear(&error);
        guard_stop(&g);
        familyd_watch_free(watch);
        return r;
}
