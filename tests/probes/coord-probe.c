/* coord-probe.c: drives daemon/coord against a real etcd, for tests/integration/test_etcd_client.py. */

/*
 * coord-probe put-member ENDPOINTS PREFIX NAME RANK   create PREFIX/members/NAME if absent:
 *                                                     "created REV" (0) or "exists" (3)
 * coord-probe get-member ENDPOINTS PREFIX NAME        "member NAME rank=R devices=N ucx=B"
 *                                                     (0), "absent" (2) or "refused" (4)
 * coord-probe hold ENDPOINTS KEY TTL_MS               put KEY under a kept-alive lease,
 *                                                     print "held LEASE TTL_S", run until killed
 * coord-probe watch ENDPOINTS PREFIX                  print "reset REV", "put KEY REV",
 *                                                     "delete KEY REV" per event; keys under
 *                                                     PREFIX/members/ are decoded as members
 *                                                     ("member NAME" or one refusal log line);
 *                                                     "etcd up"/"etcd down" on reachability
 * TLS: COORD_PROBE_CA (the CA's PEM), COORD_PROBE_CERT and COORD_PROBE_KEY (the client's pair).
 * Output is line-buffered on stdout; logs go to stderr (debug too with COORD_PROBE_DEBUG set).
 * Exit 1 on a failed call.
 */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "coord/coord-client.h"
#include "coord/coord-member.h"
#include "common/log.h"

static int client_open(const char *endpoints, const char *watch_prefix, uint64_t ttl_ms,
                       CoordEventFn on_event, CoordReachableFn on_reachable, void *userdata,
                       CoordClient **ret) {
        CoordOptions o = {
                .endpoints = endpoints,
                .timeout_ms = 10000, /* generous: CI machines are loaded */
                .watch_prefix = watch_prefix,
                .on_event = on_event,
                .on_reachable = on_reachable,
                .userdata = userdata,
                .lease_ttl_ms = ttl_ms,
                .tls_ca_path = getenv("COORD_PROBE_CA"),
                .tls_cert_path = getenv("COORD_PROBE_CERT"),
                .tls_key_path = getenv("COORD_PROBE_KEY"),
        };
        int r = coord_client_new(&o, ret);

        if (r < 0)
                return log_error_errno(r, "Failed to make the etcd client for %s: %m", endpoints);
        return 0;
}

static int put_member(const char *endpoints, const char *prefix, const char *name, const char *rank) {
        _cleanup_(coord_client_freep) CoordClient *c = NULL;
        _cleanup_free_ uint8_t *value = NULL;
        _cleanup_free_ char *key = NULL;
        uint8_t ucx[32];
        Device dev = { .local_index = 0, .kind = (char *) "host", .name = (char *) "host0",
                       .numa_node = -1, .memory_bytes = 1u << 30 };
        CoordMember m = { .name = (char *) name, .node_rank = atoll(rank), .boot_id = 0x1234,
                          .started_unix_ms = 1000, .ucx_address = ucx,
                          .ucx_address_size = sizeof(ucx), .devices = &dev, .n_devices = 1 };
        size_t size;
        int64_t rev = 0;
        int r;

        memset(ucx, 0xab, sizeof(ucx));
        if (asprintf(&key, "%smembers/%s", prefix, name) < 0)
                return -ENOMEM;
        r = client_open(endpoints, NULL, 0, NULL, NULL, NULL, &c);
        if (r < 0)
                return r;
        r = codec_coord_member_encode(&m, &value, &size);
        if (r < 0)
                return log_error_errno(r, "Failed to encode the member: %m");
        r = coord_client_create(c, key, value, size, &rev);
        if (r < 0)
                return log_error_errno(r, "Failed to create %s: %m", key);
        if (r == COORD_EXISTS) {
                printf("exists\n");
                return 3;
        }
        printf("created %lld\n", (long long) rev);
        return 0;
}

static int get_member(const char *endpoints, const char *prefix, const char *name) {
        _cleanup_(coord_client_freep) CoordClient *c = NULL;
        _cleanup_(coord_member_done) CoordMember m = {};
        _cleanup_(etcd_kv_done) EtcdKv kv = {};
        _cleanup_free_ char *key = NULL, *members = NULL;
        int r;

        if (asprintf(&key, "%smembers/%s", prefix, name) < 0 || asprintf(&members, "%smembers/", prefix) < 0)
                return -ENOMEM;
        r = client_open(endpoints, NULL, 0, NULL, NULL, NULL, &c);
        if (r < 0)
                return r;
        r = coord_client_get(c, key, &kv);
        if (r == -ENOENT) {
                printf("absent\n");
                return 2;
        }
        if (r < 0)
                return log_error_errno(r, "Failed to read %s: %m", key);
        r = coord_member_from_event(&(CoordEvent) { .type = COORD_EVENT_PUT, .key = kv.key,
                                                    .value = kv.value, .value_size = kv.value_size },
                                    members, &m);
        if (r < 0) {
                printf("refused\n");
                return 4;
        }
        printf("member %s rank=%lld devices=%zu ucx=%zu mod_revision=%lld\n", m.name,
               (long long) m.node_rank, m.n_devices, m.ucx_address_size, (long long) kv.mod_revision);
        return 0;
}

/* SIGTERM and SIGINT are blocked in every thread (main blocks them before the gRPC threads start,
 * and threads inherit the mask), so a signal meant to stop us cannot land in a gRPC thread and be
 * lost: the main thread takes it here. */
static sigset_t stop_signals;

static void wait_for_stop(void) {
        int sig;

        (void) sigwait(&stop_signals, &sig);
}

static int hold(const char *endpoints, const char *key, const char *ttl_ms) {
        _cleanup_(coord_client_freep) CoordClient *c = NULL;
        int r;

        r = client_open(endpoints, NULL, strtoull(ttl_ms, NULL, 10), NULL, NULL, NULL, &c);
        if (r < 0)
                return r;
        r = coord_client_start(c);
        if (r < 0)
                return log_error_errno(r, "Failed to start the etcd client: %m");
        r = coord_client_put_leased(c, key, (const uint8_t *) "1", 1);
        if (r < 0)
                return log_error_errno(r, "Failed to put %s: %m", key);
        printf("held %lld %lld\n", (long long) coord_client_lease_id(c),
               (long long) coord_client_lease_ttl_s(c));
        wait_for_stop();
        return 0;
}

static const char *watch_members; /* "<prefix>members/" */

static void watch_on_event(const CoordEvent *e, void *userdata) {
        _cleanup_(coord_member_done) CoordMember m = {};

        switch (e->type) {
        case COORD_EVENT_RESET:
                printf("reset %lld\n", (long long) e->mod_revision);
                return;
        case COORD_EVENT_PUT:
                printf("put %s %lld\n", e->key, (long long) e->mod_revision);
                if (strncmp(e->key, watch_members, strlen(watch_members)) == 0 &&
                    coord_member_from_event(e, watch_members, &m) >= 0)
                        printf("member %s rank=%lld\n", m.name, (long long) m.node_rank);
                return;
        case COORD_EVENT_DELETE:
                printf("delete %s %lld\n", e->key, (long long) e->mod_revision);
                return;
        default:
                return;
        }
}

static void watch_on_reachable(bool reachable, const char *why, void *userdata) {
        printf("etcd %s\n", reachable ? "up" : "down");
}

static int watch(const char *endpoints, const char *prefix) {
        /* Freed after the client: its callbacks read it until coord_client_free() returns. */
        _cleanup_free_ char *members = NULL;
        _cleanup_(coord_client_freep) CoordClient *c = NULL;
        int r;

        if (asprintf(&members, "%smembers/", prefix) < 0)
                return -ENOMEM;
        watch_members = members;
        r = client_open(endpoints, prefix, 0, watch_on_event, watch_on_reachable, NULL, &c);
        if (r < 0)
                return r;
        r = coord_client_start(c);
        if (r < 0)
                return log_error_errno(r, "Failed to start the etcd client: %m");
        wait_for_stop();
        return 0;
}

int main(int argc, char **argv) {
        int r = -EINVAL;

        setvbuf(stdout, NULL, _IOLBF, 0);
        setvbuf(stderr, NULL, _IOLBF, 0);
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGTERM);
        sigaddset(&stop_signals, SIGINT);
        (void) pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
        if (getenv("COORD_PROBE_DEBUG"))
                log_set_max_level(LOG_DEBUG);
        if (argc == 6 && streq(argv[1], "put-member"))
                r = put_member(argv[2], argv[3], argv[4], argv[5]);
        else if (argc == 5 && streq(argv[1], "get-member"))
                r = get_member(argv[2], argv[3], argv[4]);
        else if (argc == 5 && streq(argv[1], "hold"))
                r = hold(argv[2], argv[3], argv[4]);
        else if (argc == 4 && streq(argv[1], "watch"))
                r = watch(argv[2], argv[3]);
        else
                fprintf(stderr, "usage: coord-probe put-member|get-member|hold|watch ...\n");
        return r < 0 ? 1 : r;
}
