/* watch-probe.c: drives libfamilyd's watch API against a real daemon for the integration tests
 * (tests/integration/test_familyctl_topology.py). Not installed.
 *
 *   watch-probe SOCKET stop N        familyd_watch_topology(); the handler stops after N
 *   watch-probe SOCKET stop-again N  the same, then a second watch on the same client
 *   watch-probe SOCKET fail          the handler fails with -ENOTRECOVERABLE at once
 *   watch-probe SOCKET deadline MS   a watch with a deadline of MS ms, read to its end
 *   watch-probe SOCKET cancel MS     familyd_watch_next() on the main thread, cancelled by
 *                                    another thread after MS ms
 *   watch-probe SOCKET follow        read to the end of the stream
 *
 * Each topology prints as "topology VERSION NODE=STATE,..." and the outcome as
 * "result R (ERRNO_NAME) STATUS_NAME: message" plus "elapsed MS"; stdout is flushed per line.
 * Exit 0 when the calls ran (the test judges the lines), 1 on a local failure.
 */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "familyd.h"

typedef struct Probe {
        unsigned seen;
        unsigned stop_after;
        int stop_with;
} Probe;

static uint64_t now_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static void print_topology(const Familyd__V1__Topology *t) {
        printf("topology %" PRIu64 " ", t->version);
        for (size_t i = 0; i < t->n_nodes; i++)
                printf("%s%s=%s", i > 0 ? "," : "", t->nodes[i]->name, t->nodes[i]->state);
        putchar('\n');
        fflush(stdout);
}

static const char *errno_name(int r) {
        switch (r) {
        case 0:                 return "0";
        case FAMILYD_WATCH_ENDED: return "FAMILYD_WATCH_ENDED";
        case -ECANCELED:        return "ECANCELED";
        case -EPROTO:           return "EPROTO";
        case -EBADMSG:          return "EBADMSG";
        case -ESHUTDOWN:        return "ESHUTDOWN";
        case -ENOTRECOVERABLE:  return "ENOTRECOVERABLE";
        case -EINVAL:           return "EINVAL";
        default:                return "other";
        }
}

static void print_result(int r, const FamilydError *e, uint64_t t0) {
        printf("result %d (%s)", r, errno_name(r));
        if (r == -EPROTO)
                printf(" %s: %s", familyd_status_name(e->code), e->message ? e->message : "");
        printf("\nelapsed %" PRIu64 "\n", now_ms() - t0);
        fflush(stdout);
}

static int on_topology(const Familyd__V1__Topology *t, void *userdata) {
        Probe *p = userdata;

        print_topology(t);
        if (p->stop_with < 0)
                return p->stop_with;
        return ++p->seen >= p->stop_after ? 1 : 0;
}

typedef struct Canceller {
        FamilydWatch *watch;
        unsigned ms;
} Canceller;

static void *cancel_later(void *userdata) {
        Canceller *c = userdata;

        (void) usleep(c->ms * 1000);
        familyd_watch_cancel(c->watch);
        return NULL;
}

/* Reads the stream with the handle API until it ends; returns familyd_watch_next()'s end. */
static int drain(FamilydWatch *w, FamilydError *e) {
        for (;;) {
                Familyd__V1__Topology *t = NULL;
                int r = familyd_watch_next(w, (ProtobufCMessage **) &t, e);

                if (r != 0)
                        return r;
                print_topology(t);
                familyd__v1__topology__free_unpacked(t, NULL);
        }
}

int main(int argc, char **argv) {
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH,
        };
        FamilydError e = FAMILYD_ERROR_NULL;
        FamilydClient *client = NULL;
        const char *mode;
        unsigned arg;
        uint64_t t0;
        int r;

        if (argc < 3) {
                fprintf(stderr, "usage: watch-probe SOCKET MODE [N]\n");
                return 1;
        }
        params.socket_path = argv[1];
        mode = argv[2];
        arg = argc > 3 ? (unsigned) strtoul(argv[3], NULL, 10) : 0;

        r = familyd_client_new(&params, &client);
        if (r < 0) {
                fprintf(stderr, "familyd_client_new: %s\n", strerror(-r));
                return 1;
        }

        t0 = now_ms();
        if (strcmp(mode, "stop") == 0 || strcmp(mode, "stop-again") == 0 || strcmp(mode, "fail") == 0) {
                Probe p = { .stop_after = arg, .stop_with = strcmp(mode, "fail") == 0 ? -ENOTRECOVERABLE : 0 };

                r = familyd_watch_topology(client, NULL, on_topology, &p, &e);
                print_result(r, &e, t0);
                printf("handler calls %u\n", p.seen);
                if (strcmp(mode, "stop-again") == 0) {
                        /* The first stream must be gone on the daemon's side too: against a
                         * daemon with --max-watches 1 this second watch needs its slot. */
                        unsigned retries = 0;

                        t0 = now_ms();
                        for (;;) {
                                p = (Probe) { .stop_after = arg };
                                familyd_error_clear(&e);
                                r = familyd_watch_topology(client, NULL, on_topology, &p, &e);
                                /* The daemon frees the slot when it sees the cancel, which may
                                 * be just after it sees this call: allow it a moment. */
                                if (r != -EPROTO || e.code != 8 /* RESOURCE_EXHAUSTED */ || ++retries > 40)
                                        break;
                                (void) usleep(50 * 1000);
                        }
                        print_result(r, &e, t0);
                        printf("handler calls %u\nretries %u\n", p.seen, retries);
                }
        } else if (strcmp(mode, "deadline") == 0 || strcmp(mode, "follow") == 0) {
                FamilydWatchParams wp = {
                        .field_mask = FAMILYD_WATCH_PARAM_FIELD_TIMEOUT_MS,
                        .timeout_ms = strcmp(mode, "deadline") == 0 ? arg : 0,
                };
                FamilydWatch *w = NULL;

                r = familyd_watch_topology_start(client, &wp, &w, &e);
                if (r >= 0) {
                        r = drain(w, &e);
                        print_result(r, &e, t0);
                        /* The end is final. */
                        familyd_error_clear(&e);
                        Familyd__V1__Topology *t = NULL;
                        r = familyd_watch_next(w, (ProtobufCMessage **) &t, &e);
                        printf("again %d (%s)\n", r, errno_name(r));
                } else
                        print_result(r, &e, t0);
                familyd_watch_free(w);
        } else if (strcmp(mode, "cancel") == 0) {
                Canceller c = { .ms = arg };
                pthread_t thread;

                r = familyd_watch_topology_start(client, NULL, &c.watch, &e);
                if (r >= 0) {
                        if (pthread_create(&thread, NULL, cancel_later, &c) != 0) {
                                fprintf(stderr, "pthread_create failed\n");
                                return 1;
                        }
                        r = drain(c.watch, &e);
                        print_result(r, &e, t0);
                        (void) pthread_join(thread, NULL);
                } else
                        print_result(r, &e, t0);
                familyd_watch_free(c.watch);
        } else {
                fprintf(stderr, "unknown mode '%s'\n", mode);
                familyd_client_free(client);
                return 1;
        }

        familyd_error_clear(&e);
        familyd_client_free(client);
        return 0;
}
