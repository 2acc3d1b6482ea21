/* test-peer-swim.c: the membership protocol with --membership swim: probes, indirect probes, gossiped verdicts. */

/* Nodes are real Protocols wired through memory by peer-net.h, ticking every half heartbeat. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/verdict-sync.h"
#include "peer-net.h"

static int swim_setup(void **state) {
        setup(state);
        net.mode = PROTOCOL_SWIM;
        return 0;
}

/* a, and the others joining through it. */
static void start_cluster(size_t n) {
        static const char *const names[] = { "node-a", "node-b", "node-c", "node-d",
                                             "node-e", "node-f" };
        SimNode *a = add_node(names[0], 0, NULL);

        for (size_t i = 1; i < n; i++)
                (void) add_node(names[i], (int64_t) i, a->address);
}

static void assert_agreed(void) {
        const Membership *first = NULL;

        for (size_t i = 0; i < net.n_nodes; i++) {
                const Membership *m;
                if (net.nodes[i].crashed)
                        continue;
                m = protocol_membership(net.nodes[i].protocol);
                if (!first)
                        first = m;
                assert_int_equal(membership_count(m), membership_count(first));
                assert_int_equal(membership_digest(m), membership_digest(first));
                assert_int_equal(membership_version(m), membership_version(first));
        }
}

static unsigned sent_total(const SimNode *n) {
        unsigned sum = 0;

        for (size_t b = 0; b < _PEER_BODY_MAX; b++)
                sum += n->sent[b];
        return sum;
}

/* They agree; at rest each sends one ping and one ack per interval, not a heartbeat per
 * member, and no tables. */
static void test_swim_join_and_rest(void **state) {
        start_cluster(5);
        run(10);
        assert_agreed();
        for (size_t i = 0; i < net.n_nodes; i++)
                for (size_t j = 0; j < net.n_nodes; j++)
                        if (i != j)
                                assert_int_equal(state_of(&net.nodes[i], &net.nodes[j]), NODE_UP);
        for (size_t i = 0; i < net.n_nodes; i++)
                memset(net.nodes[i].sent, 0, sizeof net.nodes[i].sent);
        unsigned tables = net.tables;
        run(20);
        unsigned total = 0;
        for (size_t i = 0; i < net.n_nodes; i++) {
                SimNode *n = &net.nodes[i];
                assert_int_equal(n->sent[PEER_PING], 20);
                assert_int_equal(n->sent[PEER_HEARTBEAT], 0);
                assert_int_equal(n->sent[PEER_PING_REQ], 0);
                total += sent_total(n);
        }
        assert_int_equal(total, 2 * 20 * net.n_nodes); /* a ping and its ack */
        assert_int_equal(net.tables, tables);
        assert_agreed();
}

/* A crashed member: suspected by a prober within a few intervals, then down everywhere once
 * the suspicion has lasted membership_suspicion_ms() (7 intervals here). */
static void test_swim_crash_suspect_then_down(void **state) {
        start_cluster(5);
        run(10);
        SimNode *c = &net.nodes[2];
        crash(c);
        unsigned suspected_after = 0;
        for (unsigned k = 1; k <= 8 && !suspected_after; k++) {
                run(1);
                for (size_t i = 0; i < net.n_nodes; i++)
                        if (&net.nodes[i] != c && state_of(&net.nodes[i], c) != NODE_UP)
                                suspected_after = k;
        }
        assert_true(suspected_after > 0);
        run(7 + 8);
        for (size_t i = 0; i < net.n_nodes; i++) {
                if (&net.nodes[i] == c)
                        continue;
                assert_int_equal(state_of(&net.nodes[i], c), NODE_DOWN);
                for (size_t j = 0; j < net.n_nodes; j++)
                        if (j != i && &net.nodes[j] != c)
                                assert_int_equal(state_of(&net.nodes[i], &net.nodes[j]),
                                                 NODE_UP);
        }
        assert_agreed();
}

/* a cannot reach c, but the others can: a's probes of c go through them (ping_req), and c is
 * never suspected. */
static void test_swim_indirect_probe(void **state) {
        start_cluster(5);
        run(10);
        SimNode *a = &net.nodes[0], *c = &net.nodes[2];
        net.cut[0][2] = net.cut[2][0] = true;
        for (unsigned k = 0; k < 40; k++) {
                run(1);
                for (size_t i = 0; i < net.n_nodes; i++)
                        if (&net.nodes[i] != c)
                                assert_int_equal(state_of(&net.nodes[i], c), NODE_UP);
        }
        assert_true(a->sent[PEER_PING_REQ] > 0);
}

/* c is cut off long enough to be suspected, then heard again before the suspicion runs out: it
 * raises its incarnation, which lifts the suspicion everywhere; nobody saw it down. */
static void test_swim_refutes_suspicion(void **state) {
        start_cluster(5);
        run(10);
        SimNode *c = &net.nodes[2];
        bool suspected = false;
        for (size_t i = 0; i < net.n_nodes; i++)
                net.cut[i][2] = net.cut[2][i] = true;
        for (unsigned k = 0; k < 6 && !suspected; k++) {
                run(1);
                for (size_t i = 0; i < net.n_nodes; i++)
                        suspected = suspected ||
                                    (&net.nodes[i] != c && state_of(&net.nodes[i], c) != NODE_UP);
        }
        assert_true(suspected);
        memset(net.cut, 0, sizeof net.cut);
        for (unsigned k = 0; k < 12; k++) {
                run(1);
                for (size_t i = 0; i < net.n_nodes; i++)
                        if (&net.nodes[i] != c)
                                assert_int_not_equal(state_of(&net.nodes[i], c), NODE_DOWN);
        }
        for (size_t i = 0; i < net.n_nodes; i++) {
                if (&net.nodes[i] == c)
                        continue;
                assert_int_equal(state_of(&net.nodes[i], c), NODE_UP);
                assert_true(membership_find(protocol_membership(net.nodes[i].protocol), c->name)
                                    ->incarnation > 0);
        }
        assert_agreed();
}

/* Two halves cut apart for longer than the down verdicts are gossiped: each holds the other
 * down. Healed, the probes of down members carry that verdict to them (a ping names the state
 * the prober holds), they refute it, and all are up again. */
static void test_swim_partition_heals(void **state) {
        start_cluster(6);
        run(10);
        for (size_t i = 0; i < 3; i++)
                for (size_t j = 3; j < 6; j++)
                        net.cut[i][j] = net.cut[j][i] = true;
        run(60);
        assert_int_equal(state_of(&net.nodes[0], &net.nodes[4]), NODE_DOWN);
        assert_int_equal(state_of(&net.nodes[4], &net.nodes[0]), NODE_DOWN);
        memset(net.cut, 0, sizeof net.cut);
        run(40);
        for (size_t i = 0; i < net.n_nodes; i++)
                for (size_t j = 0; j < net.n_nodes; j++)
                        if (i != j)
                                assert_int_equal(state_of(&net.nodes[i], &net.nodes[j]), NODE_UP);
        assert_agreed();
}

/* Every other node holds start `boot` of c, up; and they agree. */
static void assert_everyone_holds(const SimNode *c, uint64_t boot) {
        for (size_t i = 0; i < net.n_nodes; i++) {
                const SimNode *at = &net.nodes[i];
                if (at == c)
                        continue;
                assert_int_equal(membership_find(protocol_membership(at->protocol), c->name)
                                         ->info->boot_id,
                                 boot);
                assert_int_equal(state_of(at, c), NODE_UP);
        }
        assert_agreed();
}

/* A restart after the old start is down everywhere: believed at once from its greeting. */
static void test_swim_restart_after_down(void **state) {
        start_cluster(5);
        run(10);
        SimNode *a = &net.nodes[0], *c = &net.nodes[2];
        crash(c);
        run(25);
        assert_int_equal(state_of(a, c), NODE_DOWN);
        restart(c, 2, 2, a->address);
        run(3);
        assert_everyone_holds(c, 2002);
}

/* A restart before anyone noticed the crash: the members that hold the old start up probe it
 * at once, suspect it, and then believe the new start. */
static void test_swim_restart_before_detection(void **state) {
        start_cluster(5);
        run(10);
        SimNode *a = &net.nodes[0], *c = &net.nodes[2];
        crash(c);
        restart(c, 2, 2, a->address);
        run(6);
        assert_everyone_holds(c, 2002);
}

/* ForgetNode at one daemon reaches every other by gossip. */
static void test_swim_forget_gossiped(void **state) {
        start_cluster(5);
        run(10);
        SimNode *a = &net.nodes[0], *c = &net.nodes[2];
        FamilyError error = {};
        crash(c);
        run(25);
        assert_int_equal(protocol_forget(a->protocol, c->name, net.now, &error), 1);
        family_error_done(&error);
        run(10);
        for (size_t i = 0; i < net.n_nodes; i++)
                if (&net.nodes[i] != c)
                        assert_null(membership_find(protocol_membership(net.nodes[i].protocol),
                                                    c->name));
        assert_agreed();
}

/* A ping from a start we do not know is answered (an ack, so its prober does not suspect us)
 * and asked for its record (a who). */
static void test_swim_unknown_pinger_answered(void **state) {
        start_cluster(3);
        run(10);
        SimNode *b = &net.nodes[1];
        MemberInfo w = { .name = "node-w", .node_rank = 7, .address = "127.0.0.1:7990",
                         .boot_id = 90, .started_unix_ms = 100, .partial = true };
        Delivery d = { .to = 1 };
        PeerMessage ping = { .body = PEER_PING, .version = 1, .sender = w,
                             .probe = { .name = b->name, .boot_id = 1001, .seq = 7 } };
        unsigned acks = b->sent[PEER_ACK], whos = b->sent[PEER_WHO];

        for (size_t i = 0; i < net.n_eps && !d.ep; i++)
                if (net.eps[i]->to == 1 && net.eps[i]->open)
                        d.ep = net.eps[i]; /* an answer on it is b's */
        assert_non_null(d.ep);

        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &ping, net.now);
        assert_int_equal(b->sent[PEER_WHO], whos + 1);
        assert_int_equal(b->sent[PEER_ACK], acks + 1);
        drop_queued();
}

/* A member we hold down speaks to us (it never heard): our answer tells it, so it refutes. */
static void test_swim_answer_tells_held_state(void **state) {
        start_cluster(4);
        run(10);
        SimNode *a = &net.nodes[0], *c = &net.nodes[2];
        crash(c);
        run(30); /* down at a, and the news of it told out */
        assert_int_equal(state_of(a, c), NODE_DOWN);
        MemberInfo self = { .name = c->name, .node_rank = 2, .address = c->address,
                            .boot_id = 1002, .started_unix_ms = 100, .partial = true };
        Delivery d = { .to = 0 };
        PeerMessage ping = { .body = PEER_PING, .version = 1, .sender = self,
                             .probe = { .name = a->name, .boot_id = 1000, .seq = 3 } };
        bool told = false;

        for (size_t i = 0; i < net.n_eps && !d.ep; i++)
                if (net.eps[i]->to == 0)
                        d.ep = net.eps[i];
        assert_non_null(d.ep);
        d.ep->open = true;
        size_t tail = net.tail;
        protocol_on_message(a->protocol, &(ProtocolOrigin) { .reply = &d }, &ping, net.now);
        for (size_t q = tail; q < net.tail; q++) {
                const PeerMessage *m = &net.queue[q % MAX_QUEUE].m;
                if (m->body != PEER_ACK)
                        continue;
                for (size_t u = 0; u < m->n_updates; u++)
                        told = told || (streq(m->updates[u].name, c->name) &&
                                        m->updates[u].state == NODE_DOWN);
        }
        assert_true(told);
        drop_queued();
}

/* The incarnation in b's ack to a ping from a, whose probe says b is down at `incarnation`. */
static uint64_t ack_incarnation_after_down_at(uint64_t incarnation) {
        SimNode *a = &net.nodes[0], *b = &net.nodes[1];
        MemberInfo sender = { .name = a->name, .node_rank = 0, .address = a->address,
                              .boot_id = 1000, .started_unix_ms = 100, .partial = true };
        Delivery d = { .to = 1 };
        PeerMessage ping = { .body = PEER_PING, .version = 1, .sender = sender,
                             .probe = { .name = b->name, .boot_id = 1001, .seq = 5,
                                        .state = NODE_DOWN, .incarnation = incarnation } };
        uint64_t answered = UINT64_MAX;

        for (size_t i = 0; i < net.n_eps && !d.ep; i++)
                if (net.eps[i]->to == 1 && net.eps[i]->from == 0 && net.eps[i]->open)
                        d.ep = net.eps[i];
        assert_non_null(d.ep);
        size_t tail = net.tail;
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &ping, net.now);
        for (size_t q = tail; q < net.tail; q++)
                if (net.queue[q % MAX_QUEUE].m.body == PEER_ACK)
                        answered = net.queue[q % MAX_QUEUE].m.probe.incarnation;
        drop_queued();
        return answered;
}

/* b refutes a verdict at its incarnation, not one further ahead than a member can have seen:
 * a lie that would take it past what the others believe (MEMBERSHIP_INCARNATION_SLACK). */
static void test_swim_refutes_only_plausible_verdicts(void **state) {
        start_cluster(3);
        run(10);
        assert_int_equal(ack_incarnation_after_down_at(MEMBERSHIP_INCARNATION_SLACK + 1), 0);
        assert_int_equal(ack_incarnation_after_down_at(0), 1);
}

/* Gossip is lost on the way and d cannot reach b: d's suspicion of b (as if from a probe of its
 * own) reaches the others and b only in answers to pulls (d's verdict digest differs from
 * theirs); b refutes it, and the refutation reaches d the same way. Without pulls d would hold b
 * suspect, then down, for good: its probes of b go through members that hold b up at the very
 * incarnation d suspects. */
static void test_swim_pull_heals_without_gossip(void **state) {
        start_cluster(4);
        run(10);
        SimNode *b = &net.nodes[1], *d = &net.nodes[3];
        Membership *at_d = (Membership *) protocol_membership(d->protocol);

        assert_agreed();
        net.verdict_asks = 0;
        run(20);
        assert_int_equal(net.verdict_asks, 0); /* at rest, digests agree: no pulls */
        net.cut[1][3] = net.cut[3][1] = true;
        net.no_gossip = true;
        assert_int_equal(membership_verdict(at_d, b->name, 1001, 0, NODE_SUSPECT, net.now), 1);
        run(40);
        for (size_t i = 0; i < net.n_nodes; i++) {
                if (&net.nodes[i] == b)
                        continue;
                assert_int_equal(state_of(&net.nodes[i], b), NODE_UP);
                assert_true(membership_find(protocol_membership(net.nodes[i].protocol), b->name)
                                    ->incarnation > 0);
        }
        assert_true(net.verdict_asks > 0);
        unsigned answered = 0;
        for (size_t i = 0; i < net.n_nodes; i++)
                answered += net.nodes[i].sent[PEER_VERDICTS];
        assert_true(answered > 0);
        assert_agreed();
}

/* c crashes and no transport says so (a link fails only when used, as over RDMA without
 * keepalives), and starts again. d never heard c's first start directly (c's messages to d are
 * lost), so when it last heard of it says nothing about when d's link to c was made: on the
 * restart d makes that link anew, as it does every link the new start has not answered on,
 * instead of keeping one to the old start whose first probe would be lost. */
static Endpoint *open_endpoint(int from, int to) {
        for (size_t i = 0; i < net.n_eps; i++)
                if (net.eps[i]->from == from && net.eps[i]->to == to && net.eps[i]->open)
                        return net.eps[i];
        return NULL;
}

static void test_swim_restart_remakes_unanswered_links(void **state) {
        SimNode *a, *c, *d;
        Endpoint *ep;

        net.lazy_failures = true;
        net.cut[2][3] = true; /* c -> d */
        start_cluster(4);
        a = &net.nodes[0], c = &net.nodes[2], d = &net.nodes[3];
        run(10);
        /* At rest (no tables go round), d's link to c fails and is made again when d next
         * probes c: after the last time d heard of c. */
        ep = open_endpoint(3, 2);
        assert_non_null(ep);
        ep->open = false;
        protocol_on_link_failed(d->protocol, ep, "reset", net.now);
        for (unsigned k = 0; k < 100 && !open_endpoint(3, 2); k++)
                run(1);
        assert_non_null(open_endpoint(3, 2));
        crash_silently(c);
        net.cut[3][2] = true; /* d's probes of c are lost, so its link never fails */
        run(30);
        assert_int_equal(state_of(d, c), NODE_DOWN);
        memset(net.cut, 0, sizeof net.cut);
        restart(c, 2, 2, a->address);
        deliver(); /* c's greeting reaches d: the restart is believed, no tick yet */
        assert_int_equal(membership_find(protocol_membership(d->protocol), c->name)->info->boot_id,
                         2002);
        assert_int_equal(state_of(d, c), NODE_UP);
        unsigned open = 0;
        for (size_t i = 0; i < net.n_eps; i++) {
                const Endpoint *e = net.eps[i];
                if (e->from != 3 || e->to != 2 || !e->open)
                        continue;
                assert_int_equal(e->to_start, 2);
                open++;
        }
        assert_int_equal(open, 1); /* made anew */
        run(20);
        assert_everyone_holds(c, 2002);
}

/* A who with buckets from member `from` to b, answered now; the verdicts b sent in answer. */
static size_t pull_from_b(int from, const uint64_t *buckets, size_t n_buckets,
                          unsigned *ret_answers) {
        SimNode *b = &net.nodes[1], *f = &net.nodes[from];
        MemberInfo sender = { .name = f->name, .node_rank = from, .address = f->address,
                              .boot_id = 1000 + (uint64_t) from, .started_unix_ms = 100,
                              .partial = true };
        Delivery d = { .to = 1 };
        PeerMessage who = { .body = PEER_WHO, .version = 1, .sender = sender,
                            .want_verdicts = (uint64_t *) buckets, .n_want_verdicts = n_buckets };
        size_t tail = net.tail, listed = 0;

        for (size_t i = 0; i < net.n_eps && !d.ep; i++)
                if (net.eps[i]->to == 1 && net.eps[i]->open)
                        d.ep = net.eps[i];
        assert_non_null(d.ep);
        protocol_on_message(b->protocol, &(ProtocolOrigin) { .reply = &d }, &who, net.now);
        *ret_answers = 0;
        for (size_t q = tail; q < net.tail; q++) {
                const PeerMessage *m = &net.queue[q % MAX_QUEUE].m;
                if (m->body != PEER_VERDICTS)
                        continue;
                (*ret_answers)++;
                listed += m->n_updates;
        }
        drop_queued();
        return listed;
}

/* b answers a pull with its verdicts about the members of the buckets that differ only, leaving
 * out those up at incarnation 0 (they win nothing), and at most VERDICT_SYNC_ANSWERS pulls a
 * heartbeat. */
static void test_swim_pull_answers(void **state) {
        start_cluster(4);
        run(10);
        Membership *at_b = (Membership *) protocol_membership(net.nodes[1].protocol);
        uint64_t same[2], other[2];
        unsigned answers;

        /* All four up at incarnation 0: every bucket differs, and still nothing to send. */
        membership_verdict_buckets(at_b, 2, same);
        other[0] = same[0] + 1;
        other[1] = same[1] + 1;
        assert_int_equal(pull_from_b(0, other, 2, &answers), 0);
        assert_int_equal(answers, 0);
        /* node-c suspect, node-d up at incarnation 1 (as if from gossip): those two. */
        assert_int_equal(membership_verdict(at_b, "node-c", 1002, 0, NODE_SUSPECT, net.now), 1);
        assert_int_equal(membership_verdict(at_b, "node-d", 1003, 1, NODE_UP, net.now), 2);
        membership_verdict_buckets(at_b, 2, same);
        other[0] = same[0] + 1;
        other[1] = same[1] + 1;
        assert_int_equal(pull_from_b(0, other, 2, &answers), 2);
        assert_int_equal(answers, 1);
        /* Only the bucket of node-c differs: the members in it worth sending. */
        unsigned c_bucket = membership_verdict_bucket(membership_find(at_b, "node-c"), 2);
        size_t in_bucket = 1 + (membership_verdict_bucket(membership_find(at_b, "node-d"), 2) ==
                                c_bucket);
        memcpy(other, same, sizeof same);
        other[c_bucket]++;
        assert_int_equal(pull_from_b(0, other, 2, &answers), in_bucket);
        /* Equal buckets: nothing to send. */
        assert_int_equal(pull_from_b(0, same, 2, &answers), 0);
        assert_int_equal(answers, 0);
        /* The rest of this heartbeat's answers, then none until the next. */
        other[0] = same[0] + 1;
        other[1] = same[1] + 1;
        for (unsigned k = 4; k < VERDICT_SYNC_ANSWERS; k++)
                assert_int_equal(pull_from_b(2, other, 2, &answers), 2);
        assert_int_equal(pull_from_b(2, other, 2, &answers), 0);
        net.now += HEARTBEAT_MS;
        assert_int_equal(pull_from_b(2, other, 2, &answers), 2);
}

/* Answers of n verdicts from node-a, about members nobody knows, as if d had asked. */
static void answer_d(size_t n) {
        SimNode *a = &net.nodes[0], *d = &net.nodes[3];
        MemberInfo sender = { .name = a->name, .node_rank = 0, .address = a->address,
                              .boot_id = 1000, .started_unix_ms = 100, .partial = true };
        PeerUpdate *list = calloc(n, sizeof(PeerUpdate));
        char (*names)[32] = calloc(n, sizeof *names);
        Delivery back = { .to = 0 };

        assert_non_null(list);
        assert_non_null(names);
        for (size_t i = 0; i < net.n_eps && !back.ep; i++)
                if (net.eps[i]->from == 3 && net.eps[i]->to == 0 && net.eps[i]->open)
                        back.ep = net.eps[i];
        assert_non_null(back.ep);
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], sizeof names[i], "ghost-%zu", i);
                list[i] = (PeerUpdate) { .name = names[i], .boot_id = 7, .state = NODE_UP,
                                         .incarnation = 1 };
        }
        protocol_on_message(d->protocol, &(ProtocolOrigin) { .reply = &back },
                            &(PeerMessage) { .body = PEER_VERDICTS, .version = 1,
                                             .sender = sender, .updates = list,
                                             .n_updates = n },
                            net.now);
        free(names);
        free(list);
}

/* A pull answered with many verdicts paces the next: answers of 8 x PEER_MAX_VERDICTS
 * (16 heartbeats' worth at VERDICT_SYNC_PACE) keep d from asking again for 16 heartbeats
 * after its pull while its verdicts still differ; then it asks, and heals. */
static void test_swim_pull_paced_by_answers(void **state) {
        start_cluster(4);
        run(10);
        SimNode *b = &net.nodes[1], *d = &net.nodes[3];
        Membership *at_d = (Membership *) protocol_membership(d->protocol);
        unsigned asked, waited = 0;

        assert_agreed();
        net.cut[1][3] = net.cut[3][1] = true;
        net.no_gossip = true;
        assert_int_equal(membership_verdict(at_d, b->name, 1001, 0, NODE_SUSPECT, net.now), 1);
        run(40);
        assert_int_equal(state_of(d, b), NODE_UP); /* healed by pulls, as above */
        uint64_t incarnation = membership_find(at_d, b->name)->incarnation;
        assert_int_equal(
                membership_verdict(at_d, b->name, 1001, incarnation, NODE_SUSPECT, net.now), 1);
        for (asked = d->sent[PEER_WHO]; d->sent[PEER_WHO] == asked && waited < 40; waited++)
                run(1);
        assert_true(d->sent[PEER_WHO] > asked); /* it pulled (b not refuted yet: no news) */
        for (unsigned k = 0; k < 8; k++)
                answer_d(PEER_MAX_VERDICTS);
        asked = d->sent[PEER_WHO];
        run(14);
        assert_int_equal(d->sent[PEER_WHO], asked);
        assert_int_not_equal(state_of(d, b), NODE_UP); /* suspect, down by now */
        run(30);
        assert_true(d->sent[PEER_WHO] > asked);
        assert_int_equal(state_of(d, b), NODE_UP);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_swim_join_and_rest, swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_crash_suspect_then_down, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_indirect_probe, swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_refutes_suspicion, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_partition_heals, swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_restart_after_down, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_restart_before_detection, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_forget_gossiped, swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_pull_heals_without_gossip, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_pull_answers, swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_pull_paced_by_answers, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_restart_remakes_unanswered_links,
                                                swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_refutes_only_plausible_verdicts,
                                                swim_setup, teardown),
                cmocka_unit_test_setup_teardown(test_swim_answer_tells_held_state, swim_setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_swim_unknown_pinger_answered, swim_setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
