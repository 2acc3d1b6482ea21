/* fuzz-peer.c: UCX membership messages, from the wire through the decoder into the membership. */

/*
 * An input is what a peer could send: one PeerMessage's bytes. It is decoded as the peer
 * thread decodes it (daemon/rpc/codec-peer.c) and, when valid, applied as on_message() applies
 * it (daemon/peer/peer.c): membership_heard() for the sender, membership_learn() for every
 * member of a hello or announce, membership_forget() for a forget; then a tick and the
 * topology every daemon computes. The membership starts with two known members, and the
 * clock moves with the input, so joins, restarts, refusals, states and forgetting all happen.
 * The rules of issue 16 hold as on_message() applies them: the membership is capped at 8
 * nodes (--max-nodes), a hello that would pass it is refused whole, and versions come only
 * from members. Checks besides "no crash": the version never goes down, never reaches half the
 * limit (no input can freeze the topology), the table never passes --max-nodes, the topology
 * numbers its ranks without gaps, and every node in it is a member.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/membership.h"
#include "codec/codec-peer.h"
#include "core/resource-limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static Device devices[1] = {
        { .local_index = 0, .kind = "host", .name = "host0", .uuid = "", .pci_bus_id = "",
          .numa_node = 0 },
};

static Membership *membership_seeded(void) {
        static const MembershipTimeouts t = { .suspect_ms = 300, .down_ms = 1000,
                                              .forget_after_ms = 2000 };
        MemberInfo self = { .name = "self", .node_rank = 0, .address = "127.0.0.1:7000",
                            .boot_id = 1, .started_unix_ms = 10, .devices = devices,
                            .n_devices = 1 };
        MemberInfo b = { .name = "node-b", .node_rank = -1, .address = "127.0.0.1:7001",
                         .boot_id = 2, .started_unix_ms = 10, .devices = devices, .n_devices = 1 };
        MemberInfo c = { .name = "node-c", .node_rank = 5, .address = "127.0.0.1:7002",
                         .boot_id = 3, .started_unix_ms = 10, .devices = devices, .n_devices = 1 };
        Membership *m = NULL;
        MemberVerdict v;

        if (membership_new(&self, &t, 0, &m) < 0)
                abort();
        membership_set_max_nodes(m, 8);
        (void) membership_heard(m, &b, 1, 0, &v, NULL);
        (void) membership_learn(m, &c, 500, 0, &v);
        return m;
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(peer_message_done) PeerMessage msg = {};
        _cleanup_(membership_freep) Membership *m = membership_seeded();
        _cleanup_free_ char *refusal = NULL;
        int64_t now = 100 + (size > 0 ? data[0] * 20 : 0);
        MemberVerdict v;

        if (codec_peer_decode(data, size, &msg) < 0)
                return 0;

        uint64_t before = membership_version(m);
        bool version_refused;
        if (membership_heard_from(m, &msg.sender, msg.version, msg.n_members, now, &v,
                                  &version_refused, &refusal) < 0)
                return 0;
        if (v != MEMBER_KNOWN && v != MEMBER_JOINED && v != MEMBER_RESTARTED &&
            membership_version(m) != before)
                abort(); /* a version taken from a non-member */
        if ((v == MEMBER_REFUSED) != (refusal != NULL) && v == MEMBER_REFUSED)
                abort(); /* a refusal always says why */

        if (v == MEMBER_KNOWN || v == MEMBER_JOINED || v == MEMBER_RESTARTED) {
                switch (msg.body) {
                case PEER_HELLO:
                case PEER_ANNOUNCE: {
                        _cleanup_free_ const MemberInfo **list =
                                calloc(msg.n_members + 1, sizeof(MemberInfo *));
                        if (!list)
                                return 0;
                        for (size_t i = 0; i < msg.n_members; i++)
                                list[i] = &msg.members[i].info;
                        if (!membership_can_take(m, list, msg.n_members))
                                break;
                        for (size_t i = 0; i < msg.n_members; i++)
                                (void) membership_learn(m, &msg.members[i].info,
                                                        msg.members[i].age_ms, now, &v);
                        break;
                }
                case PEER_FORGET:
                        (void) membership_forget(m, msg.forget_name, msg.forget_boot_id, true, now,
                                                 NULL);
                        break;
                default:
                        break;
                }
        }
        if (membership_version(m) < before ||
            membership_version(m) >= FAMILYD_MAX_TOPOLOGY_VERSION / 2 ||
            membership_count(m) > membership_max_nodes(m))
                abort();
        check_topology(m, now);
        (void) membership_tick(m, now + 1500);
        check_topology(m, now + 1500);
        (void) membership_tick(m, now + 5000);
        check_topology(m, now + 5000);

        /* What a daemon sends back out must decode again. */
        uint8_t *out = NULL;
        size_t out_size = 0;
        if (codec_peer_encode(&msg, &out, &out_size) == 0) {
                PeerMessage again = {};
                if (codec_peer_decode(out, out_size, &again) != 0)
                        abort();
                peer_message_done(&again);
                free(out);
        }
        return 0;
}
