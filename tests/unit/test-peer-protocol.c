/* test-peer-protocol.c: daemons' protocols wired through memory with a fake clock: joins, crashes, refusals. */

/* The nodes are real Protocols wired through memory by peer-net.h, with all-to-all heartbeats
 * (test-peer-swim.c: the same with --membership swim). */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer-net.h"

static void test_join_through_seed(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        /* c knew only a: a's table (c's digest asked for it) or b's own hello taught it b; a's
         * announce taught b of c, which knew less than half of a's table. */
        for (size_t i = 0; i < net.n_nodes; i++) {
                const Membership *m = protocol_membership(net.nodes[i].protocol);
                size_t connected;

                assert_int_equal(membership_count(m), 3);
                assert_int_equal(protocol_links(net.nodes[i].protocol, &connected), 2);
                assert_int_equal(connected, 2);
                assert_int_equal(membership_version(m),
                                 membership_version(protocol_membership(a->protocol)));
                assert_int_equal(net.nodes[i].published_version, membership_version(m));
        }
        assert_int_equal(state_of(b, c), NODE_UP);
        assert_int_equal(state_of(c, b), NODE_UP);
        assert_int_equal(a->refusing + b->refusing + c->refusing, 0);
        assert_int_equal(b->learned, 1);
        assert_true(c->learned <= 1);
        assert_true(net.table_asks >= 1);
}

/* Tables travel only where digests differ: none at rest, and a join costs one table (the
 * joiner asks its seed), not one per link. */
static void test_table_only_where_digests_differ(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        unsigned tables = net.tables, asks = net.table_asks;
        run(20);
        assert_int_equal(net.tables, tables);
        assert_int_equal(net.table_asks, asks);
        SimNode *d = add_node("node-d", 3, b->address);
        run(3);
        for (size_t i = 0; i < net.n_nodes; i++)
                assert_int_equal(membership_count(protocol_membership(net.nodes[i].protocol)), 4);
        assert_int_equal(net.table_asks, asks + 1);
        assert_int_equal(net.tables, tables + 1);
        assert_int_equal(state_of(d, c), NODE_UP);
        assert_int_equal(state_of(c, d), NODE_UP);
}

/* A member that joins knowing the table dials everyone itself: it is not announced. One that
 * knows less than half of it is. */
static void test_announce_only_for_newcomers(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);
        Delivery d = { .to = 1, .ep = NULL };
        MemberInfo w = { .name = "node-w", .node_rank = 7, .address = "127.0.0.1:7990",
                         .boot_id = 90, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };
        MemberInfo v = { .name = "node-v", .node_rank = 8, .address = "127.0.0.1:7991",
                         .boot_id = 91, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };

        run(3);
        (void) c;
        unsigned announces = net.announces;
        PeerMessage hello = { .body = PEER_HELLO, .version = 1, .sender = w, .has_table = true,
                              .table_members = 4 };
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &hello, net.now);
        assert_non_null(membership_find(protocol_membership(b->protocol), "node-w"));
        assert_int_equal(net.announces, announces);
        hello.sender = v;
        hello.table_members = 1;
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &hello, net.now);
        assert_int_equal(net.announces, announces + 2); /* to a and c */
        run(1);
}

/* Two members whose tables differ but are as large are asked for them once the difference
 * has lasted PROTOCOL_TABLE_ROUNDS heartbeats; then they agree. */
static void test_lasting_difference_asks_for_table(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        Delivery d = { .to = 0, .ep = NULL };
        MemberInfo z = { .name = "node-z", .node_rank = 7, .address = "127.0.0.1:7990",
                         .boot_id = 90, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };
        MemberInfo y = { .name = "node-y", .node_rank = 8, .address = "127.0.0.1:7991",
                         .boot_id = 91, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };

        run(3);
        unsigned asks = net.table_asks;
        /* a hears of z, b of y, and their announces are lost. */
        protocol_on_message(a->protocol, &(ProtocolOrigin) { .reply = &d },
                            &(PeerMessage) { .body = PEER_HELLO, .version = 1, .sender = z },
                            net.now);
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d },
                            &(PeerMessage) { .body = PEER_HELLO, .version = 1, .sender = y },
                            net.now);
        while (net.head < net.tail)
                peer_message_done(&net.queue[net.head++ % MAX_QUEUE].m);
        run(PROTOCOL_TABLE_ROUNDS - 1);
        assert_int_equal(net.table_asks, asks);
        assert_null(membership_find(protocol_membership(a->protocol), "node-y"));
        run(3);
        assert_true(net.table_asks > asks);
        assert_non_null(membership_find(protocol_membership(a->protocol), "node-y"));
        assert_non_null(membership_find(protocol_membership(b->protocol), "node-z"));
        assert_int_equal(membership_digest(protocol_membership(a->protocol)),
                         membership_digest(protocol_membership(b->protocol)));
}

static void test_crash_suspect_then_down(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        uint64_t before = membership_version(protocol_membership(a->protocol));
        crash(c);
        run(2);
        assert_int_equal(state_of(a, c), NODE_UP);
        run(2); /* past suspect_ms */
        assert_int_equal(state_of(a, c), NODE_SUSPECT);
        assert_int_equal(state_of(b, c), NODE_SUSPECT);
        run(7); /* past down_ms */
        assert_int_equal(state_of(a, c), NODE_DOWN);
        assert_int_equal(state_of(b, c), NODE_DOWN);
        assert_int_equal(state_of(a, b), NODE_UP);
        /* The survivors agree on the version, which moved with each change. */
        assert_true(membership_version(protocol_membership(a->protocol)) > before);
        assert_int_equal(membership_version(protocol_membership(a->protocol)),
                         membership_version(protocol_membership(b->protocol)));
        /* The link to c is dialed again with backoff, and fails while c is gone. */
        unsigned dials = b->dials;
        run(20);
        assert_true(b->dials > dials);
        assert_true(b->dials < dials + 20);
}

/* A node restarts at its address after its links failed: the links the others made to the
 * address since they last heard its previous start reach the new start already, and are kept
 * when the restart is believed (closing one cut the new start's own link under UCX, which pairs
 * the two directions between two workers: rogue-peer's node2 stayed down). */
static void test_restart_keeps_links_made_since(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        crash(c);
        run(1);
        int64_t restarted_at = net.now;
        restart(c, 2, 2, NULL); /* dials nobody: the others' links come back first */
        run(10);
        for (size_t i = 0; i < net.n_eps; i++) {
                const Endpoint *ep = net.eps[i];
                if (ep->to == node_of(c) && ep->made >= restarted_at) {
                        assert_int_equal(ep->closes, 0);
                        assert_true(ep->open);
                }
        }
        assert_int_equal(state_of(a, c), NODE_UP);
        assert_int_equal(state_of(b, c), NODE_UP);
        assert_int_equal(membership_find(protocol_membership(a->protocol), "node-c")->info->boot_id,
                         2002);
        assert_int_equal(state_of(c, a), NODE_UP);
        assert_int_equal(state_of(c, b), NODE_UP);
}

/* A node that hung (its links never failed) and came back as a new start: the link made while
 * the old start still spoke is made anew, once the restart is believed. */
/* c restarts where b cannot hear it: b learns the new start only from a's table, and believes
 * it only when the record carries c's own MAC (the cluster key's stand-in in peer-net). */
static void restart_heard_only_through_a(bool macs) {
        net.macs = macs;
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        crash(c);
        run(12); /* down at b */
        assert_int_equal(state_of(b, c), NODE_DOWN);
        net.cut[1][2] = net.cut[2][1] = true;
        restart(c, 2, 2, a->address);
        run(3 * PROTOCOL_TABLE_ROUNDS + 3);
        assert_int_equal(membership_find(protocol_membership(a->protocol), c->name)->info->boot_id,
                         2002);
        assert_int_equal(membership_find(protocol_membership(b->protocol), c->name)->info->boot_id,
                         macs ? 2002 : 1002);
}

static void test_restart_from_relayed_record_with_mac(void **state) {
        restart_heard_only_through_a(true);
}

static void test_restart_not_from_relayed_record_without_mac(void **state) {
        restart_heard_only_through_a(false);
}

static void test_restart_remakes_older_links(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *c = add_node("node-c", 1, a->address);

        run(3);
        Endpoint *old = NULL;
        for (size_t i = 0; i < net.n_eps; i++)
                if (net.eps[i]->from == node_of(a) && net.eps[i]->to == node_of(c))
                        old = net.eps[i];
        assert_non_null(old);
        c->crashed = true; /* silent, its connections open */
        run(5);            /* past suspect_ms: a restart is believed */
        assert_int_equal(state_of(a, c), NODE_SUSPECT);
        unsigned dials = a->dials;
        restart(c, 1, 2, a->address);
        run(3);
        assert_int_equal(old->closes, 1);
        assert_true(a->dials > dials);
        assert_int_equal(state_of(a, c), NODE_UP);
        assert_int_equal(state_of(c, a), NODE_UP);
}

static void test_refusal_and_backoff(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *x = add_node("node-x", 0, a->address); /* a's node rank: refused */

        run(1);
        assert_int_equal(a->refusing, 1);
        assert_int_equal(x->refused_us, 1);
        assert_int_equal(x->last_retry_s, 1);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 1);
        size_t connected;
        assert_int_equal(protocol_links(x->protocol, &connected), 1);
        assert_int_equal(connected, 0);
        /* Asked again after 1 s, not before; refused again, then after 2 s. */
        unsigned dials = x->dials;
        run(8);
        assert_int_equal(x->dials, dials);
        assert_int_equal(x->asked_again, 0);
        run(3);
        assert_int_equal(x->asked_again, 1);
        assert_int_equal(x->dials, dials + 1);
        assert_int_equal(x->refused_us, 2);
        assert_int_equal(x->last_retry_s, 2);
        run(15);
        assert_int_equal(x->asked_again, 1);
        run(6);
        assert_int_equal(x->asked_again, 2);
        assert_int_equal(x->last_retry_s, 4);
}

/* A refusal that does not come back on a link this node dialed changes nothing. */
static void test_refusal_on_foreign_link_ignored(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        MemberInfo liar = { .name = a->name, .node_rank = 0, .address = a->address,
                            .boot_id = 1000, .started_unix_ms = 100, .devices = host_devices,
                            .n_devices = 1 };
        PeerMessage refuse = { .body = PEER_REFUSE, .sender = liar, .reason = "no" };
        Delivery d = { .to = 1, .ep = net.eps[0], .is_reply = false };

        run(2);
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &refuse, net.now);
        assert_int_equal(b->refusals_ignored, 1);
        assert_int_equal(b->refused_us, 0);
        size_t connected;
        assert_int_equal(protocol_links(b->protocol, &connected), 1);
        assert_int_equal(connected, 1);
}

/* A keyed link bound to one node drops a message in another's name. */
static void test_bound_link_drops_other_names(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        MemberInfo other = { .name = "node-z", .node_rank = 5, .address = "127.0.0.1:7999",
                             .boot_id = 77, .started_unix_ms = 100, .devices = host_devices,
                             .n_devices = 1 };
        PeerMessage hello = { .body = PEER_HELLO, .sender = other };
        ProtocolOrigin o = { .bound_name = "node-b", .bound_boot_id = 1001 };

        protocol_on_message(a->protocol, &o, &hello, net.now);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 1);
        o.bound_name = NULL;
        protocol_on_message(a->protocol, &o, &hello, net.now);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 2);
        run(1);
}

/* An operator's forget reaches the other members. */
static void test_forget_told_to_peers(void **state) {
        FamilyError error = {};
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        SimNode *c = add_node("node-c", 2, a->address);

        run(3);
        assert_true(protocol_forget(a->protocol, "node-c", net.now, &error) < 0);
        family_error_done(&error);
        crash(c);
        run(12);
        assert_int_equal(protocol_forget(a->protocol, "node-c", net.now, &error), 1);
        run(1);
        assert_null(membership_find(protocol_membership(a->protocol), "node-c"));
        assert_null(membership_find(protocol_membership(b->protocol), "node-c"));
        assert_int_equal(protocol_links(a->protocol, NULL), 1);
}

/* A heartbeat from a start this node does not know is answered with a who, back on the
 * sender's link; the sender's hello follows and the node joins. */
static void test_who_asks_for_a_hello(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);

        /* b's first hello is lost. */
        while (net.head < net.tail)
                peer_message_done(&net.queue[net.head++ % MAX_QUEUE].m);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 1);
        run(1); /* b's heartbeat, a's who, b's hello */
        assert_non_null(membership_find(protocol_membership(a->protocol), "node-b"));
        assert_non_null(membership_find(protocol_membership(b->protocol), "node-a"));
}

/* A hello whose list would take the table past --max-nodes is refused whole. */
static void test_hello_past_max_nodes_refused(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        PeerKnown known[8];
        char names[8][16], addresses[8][32];

        for (size_t i = 0; i < 8; i++) {
                snprintf(names[i], sizeof names[i], "node-%zu", i);
                snprintf(addresses[i], sizeof addresses[i], "127.0.0.1:%zu", 8000 + i);
                known[i] = (PeerKnown) { .info = { .name = names[i], .node_rank = -1,
                                                   .address = addresses[i], .boot_id = 50 + i,
                                                   .started_unix_ms = 100,
                                                   .devices = host_devices, .n_devices = 1 } };
        }
        SimNode *b = add_node("node-b", 1, a->address);
        Delivery d = { .to = 0, .ep = net.eps[0] };
        PeerMessage hello = { .body = PEER_HELLO, .version = 1, .members = known,
                              .n_members = 8,
                              .sender = { .name = b->name, .node_rank = 1, .address = b->address,
                                          .boot_id = 1001, .started_unix_ms = 100,
                                          .devices = host_devices, .n_devices = 1 } };

        protocol_on_message(a->protocol, &(ProtocolOrigin) { .reply = &d }, &hello, net.now);
        assert_int_equal(a->refusing, 1);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 1);
        hello.n_members = 6; /* with its sender and a: 8 */
        protocol_on_message(a->protocol, &(ProtocolOrigin) { .reply = &d }, &hello, net.now);
        assert_int_equal(a->refusing, 1);
        assert_int_equal(membership_count(protocol_membership(a->protocol)), 8);
        run(1);
        assert_int_equal(b->refused_us, 1); /* the refusal came back on b's link */
}

/* Tables that can never agree (each side refuses the other's member: one node rank, two
 * nodes) are asked for less and less often, not every few heartbeats forever. */
static void test_fruitless_asks_back_off(void **state) {
        SimNode *a = add_node("node-a", 0, NULL);
        SimNode *b = add_node("node-b", 1, a->address);
        Delivery d = { .to = 0, .ep = NULL };
        MemberInfo z = { .name = "node-z", .node_rank = 7, .address = "127.0.0.1:7990",
                         .boot_id = 90, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };
        MemberInfo y = { .name = "node-y", .node_rank = 7, .address = "127.0.0.1:7991",
                         .boot_id = 91, .started_unix_ms = 100, .devices = host_devices,
                         .n_devices = 1 };

        run(3);
        protocol_on_message(a->protocol, &(ProtocolOrigin) { .reply = &d },
                            &(PeerMessage) { .body = PEER_HELLO, .version = 1, .sender = z },
                            net.now);
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d },
                            &(PeerMessage) { .body = PEER_HELLO, .version = 1, .sender = y },
                            net.now);
        while (net.head < net.tail)
                peer_message_done(&net.queue[net.head++ % MAX_QUEUE].m);
        unsigned asks = net.table_asks;
        run(60);
        /* Every PROTOCOL_TABLE_ROUNDS heartbeats would be 20 each; doubling waits, about 7. */
        assert_true(net.table_asks > asks);
        assert_true(net.table_asks - asks <= 2 * 8);
        assert_null(membership_find(protocol_membership(a->protocol), "node-y"));
        assert_null(membership_find(protocol_membership(b->protocol), "node-z"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_join_through_seed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_table_only_where_digests_differ, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_announce_only_for_newcomers, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_lasting_difference_asks_for_table, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_fruitless_asks_back_off, setup, teardown),
                cmocka_unit_test_setup_teardown(test_crash_suspect_then_down, setup, teardown),
                cmocka_unit_test_setup_teardown(test_restart_keeps_links_made_since, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_restart_from_relayed_record_with_mac, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_restart_not_from_relayed_record_without_mac,
                                                setup, teardown),
                cmocka_unit_test_setup_teardown(test_restart_remakes_older_links, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_refusal_and_backoff, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refusal_on_foreign_link_ignored, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_bound_link_drops_other_names, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_forget_told_to_peers, setup, teardown),
                cmocka_unit_test_setup_teardown(test_who_asks_for_a_hello, setup, teardown),
                cmocka_unit_test_setup_teardown(test_hello_past_max_nodes_refused, setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
