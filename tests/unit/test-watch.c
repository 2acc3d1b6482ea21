/* test-watch.c: the watch API and familyd_forget_node without a daemon: bad arguments, and a
 * stream to a socket nobody listens on (the integration suite covers a real daemon). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "familyd.h"

#define CHECK(cond)                                                                     \
        do {                                                                            \
                if (!(cond)) {                                                          \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
                        exit(EXIT_FAILURE);                                             \
                }                                                                       \
        } while (0)

static int never(const Familyd__V1__Topology *t, void *userdata) {
        (*(int *) userdata)++;
        return 1;
}

static FamilydClient *client_at(const char *path) {
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH | FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS,
                .socket_path = path,
                .timeout_ms = 5000,
        };
        FamilydClient *c = NULL;

        CHECK(familyd_client_new(&params, &c) == 0);
        return c;
}

static void test_bad_arguments(FamilydClient *c) {
        Familyd__V1__WatchTopologyRequest req = FAMILYD__V1__WATCH_TOPOLOGY_REQUEST__INIT;
        Familyd__V1__ForgetNodeResponse *resp = NULL;
        FamilydError e = { .code = 5, .message = strdup("stale") };
        ProtobufCMessage *m = NULL;
        FamilydWatch *w = NULL;
        int calls = 0;

        /* Every refusal resets a stale error, as the unary calls do. */
        CHECK(familyd_forget_node(c, NULL, &resp, &e) == -EINVAL);
        CHECK(e.code == 0 && !e.message && !resp);
        CHECK(familyd_watch_next(NULL, &m, &e) == -EINVAL);
        CHECK(familyd_watch_topology(c, NULL, NULL, &calls, &e) == -EINVAL);
        CHECK(familyd_watch_topology(NULL, NULL, never, &calls, &e) == -EINVAL);
        CHECK(familyd_watch_topology_start(c, NULL, NULL, &e) == -EINVAL);
        CHECK(familyd_client_watch(c, "no-slash", &req.base, &familyd__v1__topology__descriptor, NULL, &w, &e) == -EINVAL);
        CHECK(familyd_client_watch(c, "/x/Y", NULL, &familyd__v1__topology__descriptor, NULL, &w, &e) == -EINVAL);
        CHECK(!w && calls == 0);
        CHECK(familyd_watch_free(NULL) == NULL);
        familyd_watch_cancel(NULL);
}

/* Nobody at the socket: UNAVAILABLE on the first next(), then the end is final. */
static void test_unreachable(FamilydClient *c) {
        FamilydError e = FAMILYD_ERROR_NULL;
        FamilydWatch *w = NULL;
        ProtobufCMessage *m = NULL;
        int calls = 0;

        CHECK(familyd_watch_topology_start(c, NULL, &w, &e) == 0);
        CHECK(w);
        CHECK(familyd_watch_next(w, &m, &e) == -EPROTO);
        CHECK(e.code == 14 /* UNAVAILABLE */ && e.message);
        CHECK(!m);
        CHECK(familyd_watch_next(w, &m, &e) == -ESHUTDOWN);
        CHECK(e.code == 0 && !e.message);
        familyd_watch_cancel(w);   /* after the end: harmless */
        w = familyd_watch_free(w);

        CHECK(familyd_watch_topology(c, NULL, never, &calls, &e) == -EPROTO);
        CHECK(e.code == 14 && calls == 0);
        familyd_error_clear(&e);
}

/* Cancelled before the first next(): -ECANCELED, not the daemon's status; freeing an unread
 * watch needs no next() at all. */
static void test_cancel_before_next(FamilydClient *c) {
        FamilydError e = FAMILYD_ERROR_NULL;
        FamilydWatch *w = NULL;
        ProtobufCMessage *m = NULL;

        CHECK(familyd_watch_topology_start(c, NULL, &w, &e) == 0);
        familyd_watch_cancel(w);
        CHECK(familyd_watch_next(w, &m, &e) == -ECANCELED);
        CHECK(e.code == 0 && !m);
        familyd_watch_free(w);

        CHECK(familyd_watch_topology_start(c, NULL, &w, &e) == 0);
        familyd_watch_free(w);
}

int main(void) {
        char path[] = "/tmp/familyd-test-watch-XXXXXX";
        char sock[sizeof(path) + 16];
        FamilydClient *c;

        CHECK(mkdtemp(path));
        (void) snprintf(sock, sizeof(sock), "%s/none.sock", path);
        c = client_at(sock);

        test_bad_arguments(c);
        test_unreachable(c);
        test_cancel_before_next(c);

        familyd_client_free(c);
        (void) rmdir(path);
        return 0;
}
