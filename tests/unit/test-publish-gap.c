/* test-publish-gap.c: in a burst of changes a topology is published at most once per publish_gap_ms, the last change when due, and at once when asked. */

/* One real Protocol (all-to-all) with a sink that counts publications; members join by their
 * own hellos, as many a millisecond as a cold start brings. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/peer-protocol.h"

typedef struct Seen {
        unsigned published;
        size_t nodes; /* in the last one */
} Seen;

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        *ret_endpoint = strdup(address);
        return *ret_endpoint ? 0 : -ENOMEM;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
        free(endpoint);
}

static void sink_published(void *userdata, Topology *t) {
        Seen *s = userdata;

        s->published++;
        s->nodes = t->n_nodes;
        topology_unref(t);
}

static Protocol *new_protocol(unsigned gap_ms, Seen *seen) {
        static const MemberInfo self = { .name = "self", .node_rank = -1,
                                         .address = "10.0.0.1:7000", .boot_id = 1,
                                         .started_unix_ms = 100 };
        ProtocolParams params = { .self = &self, .mode = PROTOCOL_ALL_TO_ALL,
                                  .timeouts = { .suspect_ms = 3000, .down_ms = 10000 },
                                  .max_nodes = 4096, .heartbeat_ms = 1000,
                                  .publish_gap_ms = gap_ms };
        ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                              .bind = sink_bind, .close = sink_close,
                              .published = sink_published, .userdata = seen };
        Protocol *p = NULL;

        assert_int_equal(protocol_new(&params, &sink, 0, &p), 0);
        return p;
}

/* Member i says hello (a join) at now. */
static void join(Protocol *p, size_t i, int64_t now) {
        char name[32], address[48];
        int token;

        snprintf(name, sizeof name, "m%zu", i);
        snprintf(address, sizeof address, "10.1.%zu.%zu:7000", i / 250, i % 250);
        MemberInfo m = { .name = name, .node_rank = -1, .address = address, .boot_id = 100 + i,
                         .started_unix_ms = 100 };
        protocol_on_message(p, &(ProtocolOrigin) { .reply = &token },
                            &(PeerMessage) { .body = PEER_HELLO, .sender = m, .version = 1 },
                            now);
}

/* 1,000 joins over 100 ms, a flush after each: one publication per 20 ms, not 1,000; the
 * last joins, held back, are published once the gap has passed, and only then. */
static void test_burst_published_once_per_gap(void **state) {
        Seen seen = {};
        Protocol *p = new_protocol(20, &seen);
        int64_t now = 1000;

        for (size_t i = 0; i < 1000; i++) {
                now = 1000 + (int64_t) i / 10;
                join(p, i, now);
                protocol_flush(p, now, 1000000 + now);
        }
        assert_int_equal(membership_count(protocol_membership(p)), 1001);
        assert_in_range(seen.published, 5, 6); /* at 1000, 1020, ..., 1080 */
        int64_t due = protocol_publish_due_ms(p);
        assert_in_range(due, now + 1, now + 20);
        unsigned before = seen.published;
        protocol_flush(p, due - 1, 1000000 + due - 1);
        assert_int_equal(seen.published, before);
        protocol_flush(p, due, 1000000 + due);
        assert_int_equal(seen.published, before + 1);
        assert_int_equal(seen.nodes, 1001);
        assert_int_equal(protocol_publish_due_ms(p), -1);
        /* Nothing changed since: nothing to publish, nothing held. */
        protocol_flush(p, due + 100, 1000000 + due + 100);
        assert_int_equal(seen.published, before + 1);
        assert_int_equal(protocol_publish_due_ms(p), -1);
        protocol_free(p);
}

/* A change after a quiet spell is published at once; with no gap, every change is. */
static void test_quiet_change_published_at_once(void **state) {
        Seen seen = {};
        Protocol *p = new_protocol(20, &seen);

        join(p, 0, 1000);
        protocol_flush(p, 1000, 1001000);
        assert_int_equal(seen.published, 1);
        join(p, 1, 1500);
        protocol_flush(p, 1500, 1501000);
        assert_int_equal(seen.published, 2);
        assert_int_equal(protocol_publish_due_ms(p), -1);
        protocol_free(p);

        seen = (Seen) {};
        p = new_protocol(0, &seen);
        for (size_t i = 0; i < 100; i++) {
                join(p, i, 1000);
                protocol_flush(p, 1000, 1001000);
        }
        assert_int_equal(seen.published, 100);
        assert_int_equal(protocol_publish_due_ms(p), -1);
        protocol_free(p);
}

/* protocol_flush_now() publishes a held change whatever the gap (ForgetNode answers with the
 * topology next). */
static void test_flush_now_ignores_the_gap(void **state) {
        Seen seen = {};
        Protocol *p = new_protocol(20, &seen);

        join(p, 0, 1000);
        protocol_flush(p, 1000, 1001000);
        join(p, 1, 1001);
        protocol_flush(p, 1001, 1002000);
        assert_int_equal(seen.published, 1);
        assert_int_equal(protocol_publish_due_ms(p), 1020);
        protocol_flush_now(p, 1002, 1002000);
        assert_int_equal(seen.published, 2);
        assert_int_equal(seen.nodes, 3);
        assert_int_equal(protocol_publish_due_ms(p), -1);
        protocol_free(p);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_burst_published_once_per_gap),
                cmocka_unit_test(test_quiet_change_published_at_once),
                cmocka_unit_test(test_flush_now_ignores_the_gap),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
