/* fuzz-peer.c: UCX membership messages, from the wire through the decoder into the protocol. */

/*
 * An input is what a peer could send: one PeerMessage's bytes. It is decoded as the peer
 * thread decodes it (codec_peer_decode()) and, when valid, handed to the very protocol the
 * daemon runs (membership/peer-protocol.h) through a sink in memory; the fuzz build has no MAC to
 * check. The input's first byte says where it came from: the link this daemon dialed to
 * node-b (so a refusal counts), a keyed link bound to node-b's start, or a link another
 * daemon dialed. Then ticks and the topology every daemon computes. The protocol starts with
 * two known members, and the clock moves with the input, so joins, restarts, refusals, states
 * and forgetting all happen. The peer protocol's rules (docs/security.md) hold as the protocol applies them: the
 * membership is capped at 8 nodes (--max-nodes), a hello that would pass it is refused whole,
 * and versions come only from members. Checks besides "no crash": the version never goes
 * down, never reaches half the limit (no input can freeze the topology), the table never
 * passes --max-nodes, the topology numbers its ranks without gaps, every node in it is a
 * member, and every message the protocol sends decodes again.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "membership/peer-protocol.h"
#include "codec/codec-peer.h"
#include "core/resource-limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static Device devices[1] = {
        { .local_index = 0, .kind = "host", .name = "host0", .uuid = "", .pci_bus_id = "",
          .numa_node = 0 },
};

/* The endpoint of the link this daemon dialed to node-b. */
static void *dialed_b;

/* What the protocol sends must decode again. */
static void check_encodes(const PeerMessage *m) {
        uint8_t *out = NULL;
        size_t out_size = 0;

        if (codec_peer_encode(m, &out, &out_size) < 0)
                return; /* out of memory only */
        PeerMessage again = {};
        if (codec_peer_decode(out, out_size, &again) != 0)
                abort();
        peer_message_done(&again);
        free(out);
}

/* The sink: an endpoint is a copy of its address. */
static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        *ret_endpoint = strdup(address);
        if (*ret_endpoint && streq(address, "127.0.0.1:7001"))
                dialed_b = *ret_endpoint;
        return *ret_endpoint ? 0 : -ENOMEM;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
        check_encodes(m);
}

static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
        check_encodes(m);
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        return 0;
}

static void sink_close(void *userdata, void *endpoint) {
        if (endpoint == dialed_b)
                dialed_b = NULL;
        free(endpoint);
}

static void sink_published(void *userdata, Topology *t) {
        topology_unref(t);
}

static const ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                                   .bind = sink_bind, .close = sink_close,
                                   .published = sink_published };

/* mode: --membership swim for a probe, and for every input of odd length. */
static Protocol *protocol_seeded(ProtocolMode mode) {
        MemberInfo self = { .name = "self", .node_rank = 0, .address = "127.0.0.1:7000",
                            .boot_id = 1, .started_unix_ms = 10, .devices = devices,
                            .n_devices = 1 };
        MemberInfo b = { .name = "node-b", .node_rank = -1, .address = "127.0.0.1:7001",
                         .boot_id = 2, .started_unix_ms = 10, .devices = devices, .n_devices = 1 };
        MemberInfo c = { .name = "node-c", .node_rank = 5, .address = "127.0.0.1:7002",
                         .boot_id = 3, .started_unix_ms = 10, .devices = devices, .n_devices = 1 };
        ProtocolParams params = { .self = &self, .mode = mode, .max_nodes = 8, .heartbeat_ms = 100,
                                  .timeouts = { .suspect_ms = 300, .down_ms = 1000,
                                                .forget_after_ms = 2000 } };
        PeerKnown known = { .info = c, .age_ms = 500 };
        PeerMessage hello = { .body = PEER_HELLO, .sender = b, .version = 1, .members = &known,
                              .n_members = 1 };
        Protocol *p = NULL;

        if (protocol_new(&params, &sink, 0, &p) < 0)
                abort();
        protocol_on_message(p, &(ProtocolOrigin) {}, &hello, 0);
        /* swim dials no one back: links are made when a message is to go out. */
        if (membership_count(protocol_membership(p)) != 3 ||
            (mode == PROTOCOL_ALL_TO_ALL && !dialed_b))
                abort();
        return p;
}

static void check_topology(const Membership *m, int64_t now) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        int64_t rank = 0;

        if (membership_topology(m, now, 1000000 + now, &t) < 0)
                return; /* out of memory only */
        if (t->n_nodes != membership_count(m) || t->version != membership_version(m))
                abort();
        for (size_t i = 0; i < t->n_nodes; i++) {
                if (t->nodes[i].first_rank != rank || !membership_find(m, t->nodes[i].name))
                        abort();
                rank += (int64_t) t->nodes[i].n_devices;
        }
        if (rank != t->world_size || !topology_local_node(t))
                abort();
}

/* Where the input came from: its first byte's low bits. */
static ProtocolOrigin origin_of(const uint8_t *data, size_t size) {
        ProtocolOrigin o = {};
        unsigned how = size > 0 ? data[0] & 3 : 0;

        if (how == 1)
                o.dialed = dialed_b;
        else if (how == 2) {
                o.bound_name = "node-b";
                o.bound_boot_id = 2;
        }
        return o;
}

static void check_table(const Membership *m, uint64_t before) {
        if (membership_version(m) < before ||
            membership_version(m) >= FAMILYD_MAX_TOPOLOGY_VERSION / 2 ||
            membership_count(m) > membership_max_nodes(m))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(peer_message_done) PeerMessage msg = {};
        _cleanup_(protocol_freep) Protocol *p = NULL;
        int64_t now = 100 + (size > 0 ? data[0] * 20 : 0);

        if (codec_peer_decode(data, size, &msg) < 0)
                return 0;
        p = protocol_seeded(msg.body == PEER_PING || msg.body == PEER_ACK ||
                                            msg.body == PEER_PING_REQ ||
                                            msg.body == PEER_VERDICTS ||
                                            msg.n_want_verdicts > 0 || (size & 1) ?
                                    PROTOCOL_SWIM :
                                    PROTOCOL_ALL_TO_ALL);
        const Membership *m = protocol_membership(p);
        ProtocolOrigin o = origin_of(data, size);
        uint64_t before = membership_version(m);

        protocol_on_message(p, &o, &msg, now);
        check_table(m, before);
        protocol_flush(p, now, 1000000 + now);
        check_topology(m, now);
        protocol_tick(p, now + 1500);
        check_table(m, before);
        check_topology(m, now + 1500);
        protocol_tick(p, now + 5000);
        check_topology(m, now + 5000);
        check_encodes(&msg);
        return 0;
}
