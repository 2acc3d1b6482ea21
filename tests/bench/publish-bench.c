/* publish-bench: a cold start's burst of joins at one daemon, its topologies published on every change against once per publish gap. */

/*
 * DESIGN
 *
 * One real Protocol (membership/peer-protocol.h, swim or all-to-all, 1 device a member) with a
 * sink that builds every topology it is given, as the daemon's does (membership_topology(): a
 * copy of every record), and drops it. --members members say hello, --per-ms of them a millisecond of
 * a fake clock (a cold start's burst as one daemon sees it), with a flush after each hello:
 * the worst case, one event-loop wakeup a message. The burst runs twice, with publish gap 0
 * (every change published: the baseline) and with --gap-ms (PROTOCOL_PUBLISH_GAP_MS by
 * default), then the held change is flushed when due. Printed per run: the publications and
 * the CPU seconds of the whole burst (joins included, so the ratio is of the daemon's work,
 * not of the copies alone); then the ratio baseline / gap.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/macro.h"

#include "membership/peer-protocol.h"

typedef struct Run {
        unsigned long published;
        double cpu_s;
} Run;

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        static char endpoint;

        *ret_endpoint = &endpoint;
        return 0;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
}

static void sink_published(void *userdata, Topology *t) {
        Run *r = userdata;

        r->published++;
        topology_unref(t);
}

static double cpu_seconds(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static int burst(ProtocolMode mode, size_t members, unsigned per_ms, unsigned gap_ms, Run *ret) {
        static Device device = { .local_index = 0, .kind = (char *) "cuda", .name = (char *) "gpu",
                                 .uuid = (char *) "GPU-0", .numa_node = 0,
                                 .pci_bus_id = (char *) "0000:00:00.0" };
        MemberInfo self = { .name = (char *) "self", .node_rank = 0,
                            .address = (char *) "10.0.0.1:7000", .boot_id = 1,
                            .started_unix_ms = 100, .devices = &device, .n_devices = 1 };
        ProtocolParams params = { .self = &self, .mode = mode,
                                  .timeouts = { .suspect_ms = 3000, .down_ms = 10000 },
                                  .max_nodes = members + 1, .heartbeat_ms = 1000,
                                  .publish_gap_ms = gap_ms };
        ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                              .bind = sink_bind, .close = sink_close,
                              .published = sink_published, .userdata = ret };
        Protocol *p = NULL;
        int64_t now = 1000;
        double start;
        int token, r;

        *ret = (Run) {};
        r = protocol_new(&params, &sink, now, &p);
        if (r < 0)
                return r;
        start = cpu_seconds();
        for (size_t i = 0; i < members; i++) {
                char name[32], address[48];

                now = 1000 + (int64_t) (i / per_ms);
                snprintf(name, sizeof name, "node-%05zu", i);
                snprintf(address, sizeof address, "10.%zu.%zu.%zu:7000", i / 65536,
                         i / 256 % 256, i % 256);
                MemberInfo m = { .name = name, .node_rank = (int64_t) i + 1, .address = address,
                                 .boot_id = 100 + i, .started_unix_ms = 100,
                                 .devices = &device, .n_devices = 1 };
                protocol_on_message(p, &(ProtocolOrigin) { .reply = &token },
                                    &(PeerMessage) { .body = PEER_HELLO, .sender = m,
                                                     .version = 1 },
                                    now);
                protocol_flush(p, now, 1000000 + now);
        }
        if (protocol_publish_due_ms(p) >= 0) {
                now = protocol_publish_due_ms(p);
                protocol_flush(p, now, 1000000 + now);
        }
        ret->cpu_s = cpu_seconds() - start;
        r = membership_count(protocol_membership(p)) == members + 1 ? 0 : -EPROTO;
        protocol_free(p);
        return r;
}

int main(int argc, char **argv) {
        static const struct option longopts[] = {
                { "members", required_argument, NULL, 'm' },
                { "per-ms", required_argument, NULL, 'p' },
                { "gap-ms", required_argument, NULL, 'g' },
                { "membership", required_argument, NULL, 'M' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        size_t members = 10000;
        unsigned per_ms = 10, gap_ms = PROTOCOL_PUBLISH_GAP_MS;
        ProtocolMode mode = PROTOCOL_SWIM;
        Run baseline, gapped;
        int c;

        while ((c = getopt_long(argc, argv, "", longopts, NULL)) >= 0)
                switch (c) {
                case 'm': members = strtoul(optarg, NULL, 10); break;
                case 'p': per_ms = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'g': gap_ms = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'M':
                        mode = streq(optarg, "all-to-all") ? PROTOCOL_ALL_TO_ALL :
                               streq(optarg, "swim")       ? PROTOCOL_SWIM :
                                                             _PROTOCOL_MODE_INVALID;
                        if (mode < 0) {
                                fprintf(stderr, "publish-bench: --membership all-to-all|swim\n");
                                return 2;
                        }
                        break;
                case 'h':
                        printf("publish-bench [--members N] [--per-ms K] [--gap-ms G]\n"
                               "              [--membership swim|all-to-all]\n"
                               "A burst of N joins, K a millisecond, at one daemon's protocol\n"
                               "(swim by default): topologies published on every change, then\n"
                               "once per G ms.\n");
                        return 0;
                default: return 2;
                }
        if (members == 0 || per_ms == 0 || gap_ms == 0 || members > 1000000) {
                fprintf(stderr, "publish-bench: --members 1..1000000, --per-ms and --gap-ms "
                                "above 0\n");
                return 2;
        }
        if (burst(mode, members, per_ms, 0, &baseline) < 0 ||
            burst(mode, members, per_ms, gap_ms, &gapped) < 0) {
                fprintf(stderr, "publish-bench: a burst did not end with every member joined\n");
                return 1;
        }
        printf("%zu joins, %u a ms (%.0f ms of burst), 1 device a member, %s\n", members, per_ms,
               (double) members / per_ms, protocol_mode_to_string(mode));
        printf("%-24s %12s %10s\n", "publish", "publications", "cpu s");
        printf("%-24s %12lu %10.3f\n", "on every change", baseline.published, baseline.cpu_s);
        printf("gap %-3u ms               %12lu %10.3f\n", gap_ms, gapped.published,
               gapped.cpu_s);
        printf("ratio: cpu every change / gap %u ms = %.2f\n", gap_ms,
               gapped.cpu_s > 0 ? baseline.cpu_s / gapped.cpu_s : 0.0);
        return 0;
}
