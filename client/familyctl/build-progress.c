/* build-progress.c: familyctl build's progress bar: WatchBuild by a tag, drawn on stderr. */

/*
 * DESIGN: a Build's id is known only from its answer, so familyctl picks a progress_tag for
 * the request and a thread of its own follows it with WatchBuild on a second client (its own
 * connection) while the main thread waits in the Build call. The daemon knows the tag only
 * once the fill starts: until then WatchBuild answers NOT_FOUND and the thread asks again
 * every BAR_RETRY_MS. The bar is drawn only when stderr is a terminal and --json is not given;
 * it is cleared before the main thread prints the answer. Cancelling the watch (gRPC allows it
 * from any thread) ends the thread's wait at once; the watch pointer is shared under a lock.
 */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "familyctl.h"
#include "common/macro.h"

#define BAR_WIDTH 30
#define BAR_RETRY_MS 50
#define BAR_WATCH_PATH "/familyd.v1.FamilyService/WatchBuild"
#define BAR_GRPC_NOT_FOUND 5

struct ProgressBar {
        FamilydClient *client;
        char tag[64];
        pthread_t thread;
        pthread_mutex_t lock; /* watch, stopping */
        FamilydWatch *watch;
        bool stopping;
        bool drawn; /* a bar is on the line (the thread's until joined) */
};

static void bar_human_bytes(uint64_t n, char *buf, size_t size) {
        static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
        double v = (double) n;
        size_t u = 0;

        while (v >= 1024.0 && u + 1 < ELEMENTSOF(units)) {
                v /= 1024.0;
                u++;
        }
        (void) snprintf(buf, size, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* A seeded fill: bytes filled of the shards' total. A Build from a checkpoint: bytes read
 * from its files of the bytes to read, at the rate since the fill started. */
static void bar_draw(ProgressBar *b, const Familyd__V1__BuildProgress *p) {
        char filled[32], total[32], rate[32], bar[BAR_WIDTH + 1];
        bool reading = p->bytes_to_read > 0;
        uint64_t done = reading ? p->bytes_read : p->bytes_filled;
        uint64_t all = reading ? p->bytes_to_read : p->bytes_total;
        uint64_t per_second = !reading ? p->bytes_per_second
                            : p->elapsed_ms > 0 ? (uint64_t) ((double) p->bytes_read * 1000.0 /
                                                              (double) p->elapsed_ms)
                                                : 0;
        unsigned percent = all > 0 ? (unsigned) (100.0 * (double) done / (double) all) : 0;
        size_t marks = (size_t) MIN(percent, 100u) * BAR_WIDTH / 100;

        for (size_t i = 0; i < BAR_WIDTH; i++)
                bar[i] = i < marks ? '#' : '-';
        bar[BAR_WIDTH] = 0;
        bar_human_bytes(done, filled, sizeof filled);
        bar_human_bytes(all, total, sizeof total);
        bar_human_bytes(per_second, rate, sizeof rate);
        fprintf(stderr, "\r\033[K%s [%s] %3u%%  %s of %s  %s/s", reading ? "reading" : "filling",
                bar, percent, filled, total, rate);
        fflush(stderr);
        b->drawn = true;
}

static bool bar_stopping(ProgressBar *b) {
        (void) pthread_mutex_lock(&b->lock);
        bool s = b->stopping;
        (void) pthread_mutex_unlock(&b->lock);
        return s;
}

/* One WatchBuild stream: 1 when it ended (or the bar stops), 0 to ask again (not known yet). */
static int bar_watch_once(ProgressBar *b) {
        Familyd__V1__WatchBuildRequest req = FAMILYD__V1__WATCH_BUILD_REQUEST__INIT;
        FamilydError error = {};
        FamilydWatch *w = NULL;
        int r;

        req.progress_tag = b->tag;
        r = familyd_client_watch(b->client, BAR_WATCH_PATH, &req.base,
                                 &familyd__v1__build_progress__descriptor, NULL, &w, &error);
        familyd_error_clear(&error);
        if (r < 0)
                return 1;
        (void) pthread_mutex_lock(&b->lock);
        if (b->stopping)
                familyd_watch_cancel(w);
        b->watch = w;
        (void) pthread_mutex_unlock(&b->lock);

        for (;;) {
                Familyd__V1__BuildProgress *p = NULL;
                r = familyd_watch_next(w, (ProtobufCMessage **) &p, &error);
                if (r != 0)
                        break;
                bar_draw(b, p);
                familyd__v1__build_progress__free_unpacked(p, NULL);
        }
        bool again = r == -EPROTO && error.code == BAR_GRPC_NOT_FOUND;
        familyd_error_clear(&error);

        (void) pthread_mutex_lock(&b->lock);
        b->watch = NULL;
        (void) pthread_mutex_unlock(&b->lock);
        familyd_watch_free(w);
        return again ? 0 : 1;
}

static void *bar_thread(void *userdata) {
        ProgressBar *b = userdata;

        while (!bar_stopping(b) && bar_watch_once(b) == 0) {
                struct timespec ts = { .tv_nsec = BAR_RETRY_MS * 1000000L };
                (void) nanosleep(&ts, NULL);
        }
        return NULL;
}

int progress_bar_start(const Context *ctx, ProgressBar **ret) {
        FamilydClientParams params = {};
        uint8_t random[8];
        ProgressBar *b;
        int r;

        *ret = NULL;
        if (ctx->json || !isatty(STDERR_FILENO))
                return 0;
        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        if (getrandom(random, sizeof random, GRND_NONBLOCK) != (ssize_t) sizeof random)
                memset(random, 0, sizeof random);
        (void) snprintf(b->tag, sizeof b->tag, "familyctl-%d-%02x%02x%02x%02x%02x%02x%02x%02x",
                        (int) getpid(), random[0], random[1], random[2], random[3], random[4],
                        random[5], random[6], random[7]);
        if (ctx->socket_path) {
                params.field_mask |= FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH;
                params.socket_path = ctx->socket_path;
        }
        r = familyd_client_new(&params, &b->client);
        if (r < 0) {
                free(b);
                return r;
        }
        (void) pthread_mutex_init(&b->lock, NULL);
        r = -pthread_create(&b->thread, NULL, bar_thread, b);
        if (r < 0) {
                familyd_client_free(b->client);
                (void) pthread_mutex_destroy(&b->lock);
                free(b);
                return r;
        }
        *ret = b;
        return 0;
}

const char *progress_bar_tag(const ProgressBar *b) {
        return b ? b->tag : NULL;
}

ProgressBar *progress_bar_stop(ProgressBar *b) {
        if (!b)
                return NULL;
        (void) pthread_mutex_lock(&b->lock);
        b->stopping = true;
        if (b->watch)
                familyd_watch_cancel(b->watch);
        (void) pthread_mutex_unlock(&b->lock);
        (void) pthread_join(b->thread, NULL);
        if (b->drawn) {
                fputs("\r\033[K", stderr);
                fflush(stderr);
        }
        familyd_client_free(b->client);
        (void) pthread_mutex_destroy(&b->lock);
        free(b);
        return NULL;
}
