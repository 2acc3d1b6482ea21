/* peer-net.c: daemons' membership protocols wired through memory, with a clock the test moves. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer-net.h"

PeerNet net;

Device host_devices[1] = {
        { .local_index = 0, .kind = "host", .name = "host0", .uuid = "", .pci_bus_id = "",
          .numa_node = -1 },
};

static const MembershipTimeouts timeouts = { .suspect_ms = 300, .down_ms = 1000 };

static int node_at(const char *address) {
        for (size_t i = 0; i < net.n_nodes; i++)
                if (streq(net.nodes[i].address, address))
                        return (int) i;
        return -1;
}

int node_of(void *userdata) {
        return (int) ((SimNode *) userdata - net.nodes);
}

static void copy_message(const PeerMessage *from, PeerMessage *to) {
        *to = (PeerMessage) { .body = from->body, .version = from->version,
                              .n_members = from->n_members,
                              .forget_boot_id = from->forget_boot_id,
                              .want_table = from->want_table, .has_table = from->has_table,
                              .table_digest = from->table_digest,
                              .table_members = from->table_members,
                              .verdict_digest = from->verdict_digest };
        bool gossip = !net.no_gossip || from->body == PEER_VERDICTS;

        assert_int_equal(member_info_copy(&from->sender, &to->sender), 0);
        to->sender.partial = from->sender.partial;
        to->members = calloc(from->n_members + 1, sizeof(PeerKnown));
        assert_non_null(to->members);
        for (size_t i = 0; i < from->n_members; i++) {
                assert_int_equal(member_info_copy(&from->members[i].info, &to->members[i].info),
                                 0);
                to->members[i].age_ms = from->members[i].age_ms;
                to->members[i].state = from->members[i].state;
                to->members[i].incarnation = from->members[i].incarnation;
        }
        to->forget_name = from->forget_name ? strdup(from->forget_name) : NULL;
        to->reason = from->reason ? strdup(from->reason) : NULL;
        to->incarnation = from->incarnation;
        to->probe = from->probe;
        to->probe.name = from->probe.name ? strdup(from->probe.name) : NULL;
        to->n_updates = gossip ? from->n_updates : 0;
        assert_int_equal(peer_updates_copy(from->updates, to->n_updates, &to->updates), 0);
        if (from->n_want_verdicts > 0) {
                to->want_verdicts = calloc(from->n_want_verdicts, sizeof(uint64_t));
                assert_non_null(to->want_verdicts);
                memcpy(to->want_verdicts, from->want_verdicts,
                       from->n_want_verdicts * sizeof(uint64_t));
                to->n_want_verdicts = from->n_want_verdicts;
        }
}

static void enqueue(int to, Endpoint *ep, bool is_reply, const PeerMessage *m) {
        int from = is_reply ? ep->to : ep->from;

        net.nodes[from].sent[m->body]++;
        net.tables += m->body == PEER_HELLO && m->n_members > 0;
        net.table_asks += m->body == PEER_WHO && m->want_table;
        net.verdict_asks += m->body == PEER_WHO && m->n_want_verdicts > 0;
        net.announces += m->body == PEER_ANNOUNCE;
        assert_true(net.tail - net.head < MAX_QUEUE);
        Delivery *d = &net.queue[net.tail++ % MAX_QUEUE];
        *d = (Delivery) { .to = to, .ep = ep, .is_reply = is_reply };
        copy_message(m, &d->m);
}

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        SimNode *n = userdata;
        int to = node_at(address);

        n->dials++;
        if (to < 0 || net.nodes[to].crashed)
                return -ECONNREFUSED;
        assert_true(net.n_eps < 1024);
        Endpoint *ep = calloc(1, sizeof *ep);
        assert_non_null(ep);
        *ep = (Endpoint) { .from = node_of(n), .to = to, .open = true, .made = net.now,
                           .to_start = net.nodes[to].start };
        net.eps[net.n_eps++] = ep;
        *ret_endpoint = ep;
        return 0;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
        Endpoint *ep = endpoint;

        assert_true(ep->open);
        assert_int_equal(ep->from, node_of(userdata));
        enqueue(ep->to, ep, false, m);
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
        Delivery *d = reply;

        /* Back on the link the message came on, to its other end. */
        if (d->is_reply)
                enqueue(d->ep->to, d->ep, false, m);
        else
                enqueue(d->ep->from, d->ep, true, m);
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
        Endpoint *ep = endpoint;

        assert_true(ep->open);
        ep->open = false;
        ep->closes++;
}

static void sink_published(void *userdata, Topology *t) {
        SimNode *n = userdata;

        n->published_version = t->version;
        topology_unref(t);
}

static void sink_note(void *userdata, const ProtocolNote *note) {
        SimNode *n = userdata;

        switch (note->kind) {
        case PROTOCOL_NOTE_REFUSED_US:
                n->refused_us++;
                n->last_retry_s = note->number;
                break;
        case PROTOCOL_NOTE_ASKING_AGAIN:
                n->asked_again++;
                break;
        case PROTOCOL_NOTE_REFUSAL_IGNORED:
                n->refusals_ignored++;
                break;
        case PROTOCOL_NOTE_REFUSING:
                n->refusing++;
                break;
        case PROTOCOL_NOTE_LEARNED:
                n->learned++;
                break;
        default:
                break;
        }
}

static bool sink_verify(void *userdata, const MemberInfo *record) {
        return record->has_record_mac && record->record_mac[0] == 0xaa &&
               record->record_mac[1] == (uint8_t) record->boot_id;
}

/* Node n's protocol, its start number `start` (1: the first), joining through `seed`. */
static void start_node(SimNode *n, int64_t rank, unsigned start, const char *seed) {
        size_t i = (size_t) node_of(n);
        n->start = start;
        MemberInfo self = { .name = n->name, .node_rank = rank, .address = n->address,
                            .boot_id = 1000 * start + i, .started_unix_ms = 100 * start,
                            .devices = host_devices, .n_devices = 1 };
        ProtocolParams params = { .self = &self, .timeouts = timeouts, .max_nodes = 8,
                                  .heartbeat_ms = HEARTBEAT_MS, .mode = net.mode };
        ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                              .bind = sink_bind, .close = sink_close,
                              .published = sink_published, .note = sink_note,
                              .verify = net.macs ? sink_verify : NULL, .userdata = n };

        if (net.macs) {
                self.has_record_mac = true;
                self.record_mac[0] = 0xaa;
                self.record_mac[1] = (uint8_t) self.boot_id;
        }

        assert_int_equal(protocol_new(&params, &sink, net.now, &n->protocol), 0);
        if (seed)
                assert_int_equal(protocol_add_seed(n->protocol, seed, net.now), 0);
}

/* A node named `name` at 127.0.0.1:7000+i, joining through `seed` (may be NULL). */
SimNode *add_node(const char *name, int64_t rank, const char *seed) {
        SimNode *n = &net.nodes[net.n_nodes++];

        snprintf(n->name, sizeof n->name, "%s", name);
        snprintf(n->address, sizeof n->address, "127.0.0.1:%zu", 7000 + (size_t) node_of(n));
        start_node(n, rank, 1, seed);
        return n;
}

/* A crashed (or hung) node starts again at the same address: a new start, its old links
 * closed as the kernel closes a dead process's connections. */
void restart(SimNode *n, int64_t rank, unsigned start, const char *seed) {
        protocol_free(n->protocol);
        n->crashed = false;
        start_node(n, rank, start, seed);
}

/* Delivers everything queued (and what that sends), each receiver flushing after. */
void deliver(void) {
        while (net.head < net.tail) {
                Delivery *d = &net.queue[net.head++ % MAX_QUEUE];
                SimNode *n = &net.nodes[d->to];
                ProtocolOrigin o = { .reply = d, .dialed = d->is_reply ? d->ep : NULL };

                int from = d->is_reply ? d->ep->to : d->ep->from;

                if (net.lazy_failures && !d->is_reply && d->ep->open && !net.cut[from][d->to] &&
                    (n->crashed || d->ep->to_start != n->start)) {
                        /* The start it was meant for is gone: the dialer's link fails. */
                        d->ep->open = false;
                        protocol_on_link_failed(net.nodes[d->ep->from].protocol, d->ep, "reset",
                                                net.now);
                } else if (d->ep->open && !n->crashed && !net.cut[from][d->to]) {
                        protocol_on_message(n->protocol, &o, &d->m, net.now);
                        protocol_flush(n->protocol, net.now, 1000000 + net.now);
                }
                peer_message_done(&d->m);
        }
}

/* One heartbeat interval for every node that runs. */
void run(unsigned intervals) {
        unsigned ticks = net.mode == PROTOCOL_SWIM ? 2 : 1;

        for (unsigned k = 0; k < intervals * ticks; k++) {
                deliver();
                net.now += HEARTBEAT_MS / ticks;
                for (size_t i = 0; i < net.n_nodes; i++)
                        if (!net.nodes[i].crashed) {
                                protocol_tick(net.nodes[i].protocol, net.now);
                                protocol_flush(net.nodes[i].protocol, net.now, 1000000 + net.now);
                        }
                deliver();
        }
}

void drop_queued(void) {
        while (net.head < net.tail)
                peer_message_done(&net.queue[net.head++ % MAX_QUEUE].m);
}

/* A node crashes: it hears nothing, and the links to it fail as UCX says. */
void crash(SimNode *c) {
        int ci = node_of(c);

        c->crashed = true;
        for (size_t i = 0; i < net.n_eps; i++) {
                Endpoint *ep = net.eps[i];
                if (!ep->open || ep->to != ci)
                        continue;
                ep->open = false;
                protocol_on_link_failed(net.nodes[ep->from].protocol, ep, "reset", net.now);
        }
}

void crash_silently(SimNode *c) {
        c->crashed = true;
}

NodeState state_of(const SimNode *at, const SimNode *of) {
        const Member *m = membership_find(protocol_membership(at->protocol), of->name);

        assert_non_null(m);
        return m->state;
}

int setup(void **state) {
        memset(&net, 0, sizeof net);
        net.now = 1000;
        return 0;
}

int teardown(void **state) {
        deliver();
        for (size_t i = 0; i < net.n_nodes; i++)
                protocol_free(net.nodes[i].protocol);
        for (size_t i = 0; i < net.n_eps; i++)
                free(net.eps[i]);
        return 0;
}

