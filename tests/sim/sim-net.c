/* sim-net.c: the simulated network, its clock and the protocol's sink. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec-peer.h"
#include "peer/peer-frame.h"
#include "sim-net.h"

/* The Unix time of the simulation's start; a restart's started_unix_ms grows from it. */
#define SIM_UNIX_BASE_MS INT64_C(1800000000000)

typedef struct SimBuffer {
        size_t n_ref;
        size_t size;
        uint8_t data[];
} SimBuffer;

/* A simulated connection: node `from` dialed node `to` in its start `to_incarnation`. Held by
 * the dialer until it closes it or learns it failed, and by each event that names it. */
typedef struct SimEndpoint {
        uint32_t from, to;
        uint32_t from_incarnation, to_incarnation;
        uint32_t n_ref;
        bool open;
} SimEndpoint;

typedef enum SimEventKind {
        SIM_EVENT_DELIVER,
        SIM_EVENT_TICK,
        SIM_EVENT_FLUSH,
        SIM_EVENT_PUBLISH, /* a change held by the publish gap is due */
        SIM_EVENT_LINK_FAILED,
} SimEventKind;

typedef struct SimEvent {
        int64_t at_us;
        uint64_t seq;
        SimEventKind kind;
        uint32_t node, incarnation;
        bool is_reply; /* travels back on ep, to the node that dialed it */
        SimEndpoint *ep;
        SimBuffer *buffer;
} SimEvent;

/* The reply handle: the link a message came on, and which way. */
typedef struct SimOrigin {
        SimEndpoint *ep;
        bool is_reply;
} SimOrigin;

static Device *sim_devices;
static size_t sim_n_devices;

uint64_t sim_random(Sim *s) {
        /* xorshift64* */
        s->rng ^= s->rng >> 12;
        s->rng ^= s->rng << 25;
        s->rng ^= s->rng >> 27;
        return s->rng * UINT64_C(2685821657736338717);
}

static double sim_uniform(Sim *s) {
        return (double) (sim_random(s) >> 11) / (double) (UINT64_C(1) << 53);
}

static int64_t now_ms(const Sim *s) {
        return s->now_us / 1000;
}

static void buffer_unref(SimBuffer *b) {
        if (b && --b->n_ref == 0)
                free(b);
}

static void endpoint_unref(SimEndpoint *ep) {
        if (ep && --ep->n_ref == 0)
                free(ep);
}

/* The dialer lets go of an open endpoint: closed, or failed. */
static void endpoint_close(SimEndpoint *ep) {
        ep->open = false;
        endpoint_unref(ep);
}

/* --- the event heap, ordered by time then sequence --- */

static bool event_before(const SimEvent *a, const SimEvent *b) {
        return a->at_us < b->at_us || (a->at_us == b->at_us && a->seq < b->seq);
}

static void heap_push(Sim *s, SimEvent e) {
        if (s->n_heap == s->heap_allocated) {
                size_t n = s->heap_allocated ? s->heap_allocated * 2 : 1024;
                SimEvent *grown = reallocarray(s->heap, n, sizeof(SimEvent));
                if (!grown) {
                        fprintf(stderr, "familyd-sim: out of memory\n");
                        abort();
                }
                s->heap = grown;
                s->heap_allocated = n;
        }
        e.seq = s->seq++;
        if (e.ep)
                e.ep->n_ref++;
        size_t i = s->n_heap++;
        while (i > 0 && event_before(&e, &s->heap[(i - 1) / 2])) {
                s->heap[i] = s->heap[(i - 1) / 2];
                i = (i - 1) / 2;
        }
        s->heap[i] = e;
}

static SimEvent heap_pop(Sim *s) {
        SimEvent top = s->heap[0], last = s->heap[--s->n_heap];
        size_t i = 0;

        for (;;) {
                size_t c = 2 * i + 1;
                if (c >= s->n_heap)
                        break;
                if (c + 1 < s->n_heap && event_before(&s->heap[c + 1], &s->heap[c]))
                        c++;
                if (!event_before(&s->heap[c], &last))
                        break;
                s->heap[i] = s->heap[c];
                i = c;
        }
        if (s->n_heap > 0)
                s->heap[i] = last;
        return top;
}

/* --- the sink --- */

static Sim *the_sim;

static size_t node_index(const char *name_or_address) {
        return (size_t) strtoul(name_or_address + 1, NULL, 10);
}

static int64_t one_way_us(Sim *s) {
        int64_t j = s->config.jitter_us ? (int64_t) (sim_random(s) % s->config.jitter_us) : 0;
        return (int64_t) s->config.latency_us + j;
}

/* A flush, as the peer thread's before it sleeps: a change the publish gap holds gets an
 * event when due, as the peer thread arms a timer. */
static void node_flush(Sim *s, SimNode *n) {
        int64_t due;

        protocol_flush(n->protocol, now_ms(s), SIM_UNIX_BASE_MS + now_ms(s));
        due = protocol_publish_due_ms(n->protocol);
        if (due < 0 || n->publish_pending)
                return;
        n->publish_pending = true;
        heap_push(s, (SimEvent) { .at_us = due * 1000, .kind = SIM_EVENT_PUBLISH,
                                  .node = (uint32_t) (n - s->nodes),
                                  .incarnation = n->incarnation });
}

static void schedule_flush(Sim *s, SimNode *n) {
        if (n->flush_pending)
                return;
        n->flush_pending = true;
        heap_push(s, (SimEvent) { .at_us = s->now_us + s->config.flush_us,
                                  .kind = SIM_EVENT_FLUSH, .node = (uint32_t) (n - s->nodes),
                                  .incarnation = n->incarnation });
}

/* Encodes a message into a buffer, shared with the sender's previous one when identical. */
static SimBuffer *encode(Sim *s, SimNode *n, const PeerMessage *m) {
        _cleanup_free_ uint8_t *data = NULL;
        uint64_t hash = 14695981039346656037u;
        size_t size;

        if (codec_peer_encode(m, &data, &size) < 0) {
                fprintf(stderr, "familyd-sim: cannot encode a message\n");
                abort();
        }
        for (size_t i = 0; i < size; i++)
                hash = (hash ^ data[i]) * 1099511628211u;
        if (n->last_buffer && n->last_buffer_hash == hash && n->last_buffer->size == size &&
            memcmp(n->last_buffer->data, data, size) == 0) {
                n->last_buffer->n_ref++;
                return n->last_buffer;
        }
        SimBuffer *b = malloc(sizeof(SimBuffer) + size);
        if (!b)
                abort();
        b->n_ref = 2; /* the message, and last_buffer */
        b->size = size;
        memcpy(b->data, data, size);
        buffer_unref(n->last_buffer);
        n->last_buffer = b;
        n->last_buffer_hash = hash;
        return b;
}

/* Counts and schedules one message from `from` to node `to` on ep; lost or partitioned
 * messages are counted as sent and vanish. */
static void transmit(Sim *s, SimNode *from, size_t to, SimEndpoint *ep, bool is_reply,
                     const PeerMessage *m) {
        SimBuffer *b = encode(s, from, m);
        uint64_t bytes = b->size + PEER_FRAME_OVERHEAD;

        from->sent.messages++;
        from->sent.bytes += bytes;
        s->total.messages++;
        s->total.bytes += bytes;
        if (from->group != s->nodes[to].group ||
            (s->config.loss > 0 && sim_uniform(s) < s->config.loss)) {
                s->total.lost++;
                buffer_unref(b);
                return;
        }
        heap_push(s, (SimEvent) { .at_us = s->now_us + one_way_us(s),
                                  .kind = SIM_EVENT_DELIVER, .node = (uint32_t) to,
                                  .is_reply = is_reply, .ep = ep, .buffer = b });
}

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        SimNode *n = userdata;
        Sim *s = the_sim;
        size_t to = node_index(address);
        SimEndpoint *ep;

        if (to >= s->n_nodes || !s->nodes[to].up)
                return -ECONNREFUSED;
        ep = calloc(1, sizeof *ep);
        if (!ep)
                return -ENOMEM;
        *ep = (SimEndpoint) { .from = (uint32_t) (n - s->nodes), .to = (uint32_t) to,
                              .from_incarnation = n->incarnation,
                              .to_incarnation = s->nodes[to].incarnation, .open = true,
                              .n_ref = 1 };
        *ret_endpoint = ep;
        return 0;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
        SimEndpoint *ep = endpoint;

        (void) address;
        transmit(the_sim, userdata, ep->to, ep, false, m);
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
        SimOrigin *o = reply;

        if (o->is_reply)
                transmit(the_sim, userdata, o->ep->to, o->ep, false, m);
        else
                transmit(the_sim, userdata, o->ep->from, o->ep, true, m);
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        (void) userdata, (void) reply, (void) name, (void) boot_id;
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
        (void) userdata;
        endpoint_close(endpoint);
}

/* What the table shows after a change: new suspicions of live members, the watched member.
 * Read from the table, not from a topology (no copy of N records per change; the sim's node
 * index is the member's node rank). */
static void sink_changed(void *userdata, const Membership *m) {
        SimNode *n = userdata;
        Sim *s = the_sim;
        size_t observer = (size_t) (n - s->nodes);

        for (size_t i = 1; i < membership_count(m); i++) {
                const Member *e = membership_get(m, i);
                size_t j = (size_t) e->info->node_rank;
                uint8_t seen = e->state == NODE_UP ? 0 : e->state == NODE_SUSPECT ? 1 : 2;

                if (j >= s->config.max_nodes)
                        continue;
                if (seen != n->suspected[j]) {
                        bool live = s->count_suspicions && s->nodes[j].up &&
                                    s->nodes[j].group == n->group;
                        s->false_suspicions += seen == 1 && live;
                        s->false_downs += seen == 2 && live;
                        n->suspected[j] = seen;
                }
                if ((int64_t) j != s->watch.node)
                        continue;
                if (seen != 0 && s->watch.first_suspect_us < 0)
                        s->watch.first_suspect_us = s->now_us;
                if (seen == 2 && !s->watch.seen_down[observer]) {
                        s->watch.seen_down[observer] = 1;
                        s->watch.down_seen++;
                        if (s->watch.down_seen == s->watch.expected)
                                s->watch.all_down_us = s->now_us;
                }
        }
}

static const ProtocolSink sim_sink = {
        .dial = sink_dial, .send = sink_send, .reply = sink_reply, .bind = sink_bind,
        .close = sink_close, .changed = sink_changed,
};

/* --- events --- */

static void deliver(Sim *s, SimEvent *e) {
        _cleanup_(peer_message_done) PeerMessage m = {};
        SimEndpoint *ep = e->ep;
        SimNode *n = &s->nodes[e->node];
        uint32_t incarnation = e->is_reply ? ep->from_incarnation : ep->to_incarnation;
        SimOrigin origin = { .ep = ep, .is_reply = e->is_reply };

        if (!n->up || n->incarnation != incarnation) {
                /* The start it was meant for is gone: the dialer's link fails (a reset). */
                if (!e->is_reply && ep->open)
                        heap_push(s, (SimEvent) { .at_us = s->now_us + one_way_us(s),
                                                  .kind = SIM_EVENT_LINK_FAILED,
                                                  .node = ep->from,
                                                  .incarnation = ep->from_incarnation,
                                                  .ep = ep });
                return;
        }
        if (!ep->open)
                return;
        if (codec_peer_decode(e->buffer->data, e->buffer->size, &m) < 0) {
                fprintf(stderr, "familyd-sim: a message did not decode\n");
                abort();
        }
        s->total.delivered++;
        ProtocolOrigin o = { .reply = &origin, .dialed = e->is_reply ? ep : NULL };
        protocol_on_message(n->protocol, &o, &m, now_ms(s));
        schedule_flush(s, n);
}

static void run_event(Sim *s, SimEvent *e) {
        SimNode *n = &s->nodes[e->node];
        bool current = n->up && n->incarnation == e->incarnation;

        switch (e->kind) {
        case SIM_EVENT_DELIVER:
                deliver(s, e);
                break;
        case SIM_EVENT_TICK:
                if (!current)
                        break;
                protocol_tick(n->protocol, now_ms(s));
                node_flush(s, n);
                heap_push(s, (SimEvent) { .at_us = s->now_us +
                                                   protocol_tick_interval_ms(n->protocol) * 1000,
                                          .kind = SIM_EVENT_TICK, .node = e->node,
                                          .incarnation = e->incarnation });
                break;
        case SIM_EVENT_FLUSH:
                if (!current)
                        break;
                n->flush_pending = false;
                node_flush(s, n);
                break;
        case SIM_EVENT_PUBLISH:
                if (!current)
                        break;
                n->publish_pending = false;
                node_flush(s, n);
                break;
        case SIM_EVENT_LINK_FAILED:
                if (current && e->ep->open) {
                        /* The transport closes it itself: the protocol does not. */
                        protocol_on_link_failed(n->protocol, e->ep, "reset", now_ms(s));
                        endpoint_close(e->ep);
                        schedule_flush(s, n);
                }
                break;
        }
        buffer_unref(e->buffer);
        endpoint_unref(e->ep);
}

void sim_run_until(Sim *s, int64_t until_us) {
        while (s->n_heap > 0 && s->heap[0].at_us <= until_us) {
                SimEvent e = heap_pop(s);
                s->now_us = e.at_us;
                run_event(s, &e);
        }
        s->now_us = until_us;
}

/* --- agreement --- */

static uint64_t table_hash(const Membership *m) {
        uint64_t sum = 0;

        for (size_t i = 0; i < membership_count(m); i++) {
                const Member *e = membership_get(m, i);
                uint64_t h = 14695981039346656037u;
                for (const char *c = e->info->name; *c; c++)
                        h = (h ^ (unsigned char) *c) * 1099511628211u;
                h = (h ^ e->info->boot_id) * 1099511628211u;
                h = (h ^ (uint64_t) (e->local ? NODE_UP : e->state)) * 1099511628211u;
                sum += h * 0x9E3779B97F4A7C15u;
        }
        return sum;
}

/* Counts and versions first (cheap, and where tables differ while they converge), then the
 * tables' hashes (O(N) each). */
bool sim_agreed(const Sim *s) {
        const Membership *first = NULL;
        uint64_t hash = 0;

        for (size_t i = 0; i < s->n_nodes; i++) {
                if (!s->nodes[i].up)
                        continue;
                const Membership *m = protocol_membership(s->nodes[i].protocol);
                if (!first)
                        first = m;
                else if (membership_count(m) != membership_count(first) ||
                         membership_version(m) != membership_version(first))
                        return false;
        }
        if (first)
                hash = table_hash(first);
        for (size_t i = 0; i < s->n_nodes; i++) {
                const Membership *m = s->nodes[i].up ? protocol_membership(s->nodes[i].protocol)
                                                     : NULL;
                if (m && m != first && table_hash(m) != hash)
                        return false;
        }
        return true;
}

int64_t sim_run_to_agreement(Sim *s, int64_t until_us, int64_t check_us) {
        while (s->now_us < until_us) {
                sim_run_until(s, MIN(s->now_us + check_us, until_us));
                if (sim_agreed(s))
                        return s->now_us;
        }
        return -1;
}

/* --- nodes --- */

int sim_start(Sim *s, size_t i, int64_t seed) {
        SimNode *n = &s->nodes[i];
        int r;

        if (i >= s->config.max_nodes)
                return -ERANGE;
        n->incarnation++;
        snprintf(n->name, sizeof n->name, "n%zu", i);
        snprintf(n->address, sizeof n->address, "n%zu:7000", i);
        MemberInfo self = { .name = n->name, .node_rank = (int64_t) i, .address = n->address,
                            .boot_id = ((uint64_t) n->incarnation << 32) | (i + 1),
                            .started_unix_ms = SIM_UNIX_BASE_MS + now_ms(s),
                            .devices = sim_devices, .n_devices = sim_n_devices };
        ProtocolParams params = {
                .self = &self,
                .timeouts = { .suspect_ms = s->config.suspect_ms, .down_ms = s->config.down_ms },
                .max_nodes = s->config.max_nodes,
                .heartbeat_ms = s->config.heartbeat_ms,
                .mode = s->config.mode,
                .records = s->records,
                .reserve = s->config.max_nodes,
                .publish_gap_ms = PROTOCOL_PUBLISH_GAP_MS, /* the daemon's */
        };
        ProtocolSink sink = sim_sink;

        sink.userdata = n;
        n->up = true;
        n->flush_pending = false;
        n->publish_pending = false;
        memset(n->suspected, 0, s->config.max_nodes);
        s->n_nodes = MAX(s->n_nodes, i + 1);
        r = protocol_new(&params, &sink, now_ms(s), &n->protocol);
        if (r < 0)
                return r;
        if (seed >= 0 && (size_t) seed != i) {
                char address[32];
                snprintf(address, sizeof address, "n%" PRId64 ":7000", seed);
                r = protocol_add_seed(n->protocol, address, now_ms(s));
                if (r < 0)
                        return r;
        }
        node_flush(s, n);
        /* Ticks at a random phase, as daemons started apart tick apart. */
        heap_push(s, (SimEvent) { .at_us = s->now_us + (int64_t) (sim_random(s) %
                                                    ((uint64_t) s->config.heartbeat_ms * 1000)),
                                  .kind = SIM_EVENT_TICK, .node = (uint32_t) i,
                                  .incarnation = n->incarnation });
        return 0;
}

void sim_crash(Sim *s, size_t i) {
        SimNode *n = &s->nodes[i];

        if (!n->up)
                return;
        n->up = false;
        n->protocol = protocol_free(n->protocol);
        buffer_unref(n->last_buffer);
        n->last_buffer = NULL;
}

void sim_watch(Sim *s, int64_t i) {
        s->watch.node = i;
        s->watch.first_suspect_us = -1;
        s->watch.down_seen = 0;
        s->watch.all_down_us = -1;
        s->watch.expected = sim_live(s) - (i >= 0 && s->nodes[i].up);
        memset(s->watch.seen_down, 0, s->config.max_nodes);
}

size_t sim_live(const Sim *s) {
        size_t n = 0;

        for (size_t i = 0; i < s->n_nodes; i++)
                n += s->nodes[i].up;
        return n;
}

/* --- the object --- */

static int devices_make(unsigned n) {
        sim_devices = calloc(n ? n : 1, sizeof(Device));
        if (!sim_devices)
                return -ENOMEM;
        for (unsigned d = 0; d < n; d++) {
                char name[64], uuid[64], bus[32];
                snprintf(name, sizeof name, "NVIDIA H100 80GB HBM3");
                snprintf(uuid, sizeof uuid, "GPU-6f1c9e0a-3b2d-4c1e-9a7f-%012u", d);
                snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x18 + d * 0x10);
                int r = device_copy(&(Device) { .local_index = (int32_t) d, .kind = "cuda",
                                                .name = name, .uuid = uuid,
                                                .memory_bytes = UINT64_C(85899345920),
                                                .numa_node = (int32_t) (d / 4),
                                                .pci_bus_id = bus },
                                    &sim_devices[d]);
                if (r < 0)
                        return r;
                sim_n_devices++;
        }
        return 0;
}

int sim_new(const SimConfig *config, Sim **ret) {
        Sim *s = calloc(1, sizeof(Sim));

        if (!s)
                return -ENOMEM;
        s->config = *config;
        s->rng = config->seed ? config->seed : 1;
        s->nodes = calloc(config->max_nodes, sizeof(SimNode));
        s->watch.seen_down = calloc(config->max_nodes, 1);
        s->watch.node = -1;
        if (!s->nodes || !s->watch.seen_down) {
                sim_free(s);
                return -ENOMEM;
        }
        for (size_t i = 0; i < config->max_nodes; i++) {
                s->nodes[i].suspected = calloc(config->max_nodes, 1);
                if (!s->nodes[i].suspected) {
                        sim_free(s);
                        return -ENOMEM;
                }
        }
        if ((!sim_devices && devices_make(config->devices) < 0) ||
            (!config->own_records && member_records_new(&s->records) < 0)) {
                sim_free(s);
                return -ENOMEM;
        }
        the_sim = s;
        *ret = s;
        return 0;
}

Sim *sim_free(Sim *s) {
        if (!s)
                return NULL;
        for (size_t i = 0; i < s->config.max_nodes && s->nodes; i++) {
                sim_crash(s, i);
                free(s->nodes[i].suspected);
        }
        while (s->n_heap > 0) {
                SimEvent e = heap_pop(s);
                buffer_unref(e.buffer);
                endpoint_unref(e.ep);
        }
        for (size_t d = 0; d < sim_n_devices; d++)
                device_done(&sim_devices[d]);
        sim_devices = mfree(sim_devices);
        sim_n_devices = 0;
        member_records_free(s->records); /* after every node's table */
        free(s->heap);
        free(s->watch.seen_down);
        free(s->nodes);
        the_sim = NULL;
        return mfree(s);
}
