/* test-swim-links.c: swim's links on demand: past PROTOCOL_SWIM_LINKS, idle ones are closed. */

/* One real Protocol with a sink that counts: a seed's table of N members makes it greet every
 * member (a link each), and the clock runs on with nothing heard. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/peer-protocol.h"

typedef struct Counts {
        unsigned dials, closes, open;
        unsigned closed_live; /* closes before the protocol was freed */
} Counts;

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        Counts *c = userdata;

        *ret_endpoint = strdup(address);
        assert_non_null(*ret_endpoint);
        c->dials++;
        c->open++;
        return 0;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
        assert_string_equal(endpoint, address);
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
        Counts *c = userdata;

        free(endpoint);
        c->closes++;
        c->open--;
}

static void sink_published(void *userdata, Topology *t) {
        topology_unref(t);
}

/* A node that learns n members from its seed's hello, then runs `intervals` heartbeats hearing
 * nothing; the links it holds then. */
static size_t links_after(size_t n, unsigned intervals, Counts *c) {
        MemberInfo self = { .name = "self", .node_rank = -1, .address = "10.0.0.1:7000",
                            .boot_id = 1, .started_unix_ms = 100 };
        MemberInfo seed = { .name = "seed", .node_rank = -1, .address = "10.0.0.2:7000",
                            .boot_id = 2, .started_unix_ms = 100 };
        ProtocolParams params = { .self = &self, .mode = PROTOCOL_SWIM,
                                  .timeouts = { .suspect_ms = 3000, .down_ms = 10000 },
                                  .max_nodes = n + 2, .heartbeat_ms = 1000 };
        ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                              .bind = sink_bind, .close = sink_close,
                              .published = sink_published, .userdata = c };
        PeerKnown *known = calloc(n, sizeof(PeerKnown));
        char (*names)[24] = calloc(n, 24), (*addresses)[48] = calloc(n, 48);
        int64_t now = 1000;
        Protocol *p = NULL;
        size_t links;
        int token;

        assert_non_null(known);
        assert_non_null(names);
        assert_non_null(addresses);
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], sizeof names[i], "m%zu", i);
                snprintf(addresses[i], sizeof addresses[i], "10.1.%zu.%zu:7000", i / 250, i % 250);
                known[i].info = (MemberInfo) { .name = names[i], .node_rank = -1,
                                               .address = addresses[i], .boot_id = 100 + i,
                                               .started_unix_ms = 100 };
        }
        assert_int_equal(protocol_new(&params, &sink, now, &p), 0);
        assert_int_equal(protocol_add_seed(p, seed.address, now), 0);
        PeerMessage hello = { .body = PEER_HELLO, .sender = seed, .version = 2,
                              .members = known, .n_members = n };
        protocol_on_message(p, &(ProtocolOrigin) { .reply = &token }, &hello, now);
        protocol_flush(p, now, 1000000 + now);
        assert_int_equal(membership_count(protocol_membership(p)), n + 2);
        assert_true(protocol_links(p, NULL) >= n); /* greeted every member */
        for (unsigned k = 0; k < intervals * 2; k++) {
                now += protocol_tick_interval_ms(p);
                protocol_tick(p, now);
                protocol_flush(p, now, 1000000 + now);
        }
        links = protocol_links(p, NULL);
        assert_int_equal(links, c->open);
        c->closed_live = c->closes;
        protocol_free(p);
        assert_int_equal(c->open, 0);
        free(known);
        free(names);
        free(addresses);
        return links;
}

/* Past PROTOCOL_SWIM_LINKS, links idle for PROTOCOL_SWIM_LINK_IDLE_PERIODS intervals are
 * closed down to the bound; before that long, none. */
static void test_idle_links_closed_past_the_bound(void **state) {
        Counts c = {};
        size_t n = PROTOCOL_SWIM_LINKS + 60;

        assert_true(links_after(n, PROTOCOL_SWIM_LINK_IDLE_PERIODS - 2, &c) >= n);
        assert_int_equal(c.closed_live, 0);
        c = (Counts) {};
        size_t links = links_after(n, PROTOCOL_SWIM_LINK_IDLE_PERIODS + 2, &c);
        assert_true(links <= PROTOCOL_SWIM_LINKS + 1); /* the seed's stays */
        assert_true(links >= PROTOCOL_SWIM_LINKS - 2);
        assert_true(c.closed_live >= n - PROTOCOL_SWIM_LINKS - 1);
}

/* Below the bound no live link is closed, however idle: closing one may cut the other side's
 * link to us that UCX pairs with it. */
static void test_no_link_closed_below_the_bound(void **state) {
        Counts c = {};
        size_t n = PROTOCOL_SWIM_LINKS - 20;

        assert_true(links_after(n, 3 * PROTOCOL_SWIM_LINK_IDLE_PERIODS, &c) >= n);
        assert_int_equal(c.closed_live, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_idle_links_closed_past_the_bound),
                cmocka_unit_test(test_no_link_closed_below_the_bound),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
