/* codec-peer.c: membership messages between daemons, decoded with every field bounded. */
#include <stdlib.h>
#include <string.h>

#include "codec-peer.h"
#include "codec-text.h"
#include "codec-wire.h"
#include "codec.h"
#include "familyd-v1-peer.pb-c.h"
#include "core/resource-limits.h"

/* Strings from peers go into logs and topology replies: codec_text_ok() (codec-text.h). */

static int device_decode(const Familyd__V1__Device *pb, Device *ret) {
        Device d = {
                .local_index = pb->local_index,
                .memory_bytes = pb->memory_bytes,
                .numa_node = pb->numa_node,
        };

        if (pb->local_index < 0 || pb->numa_node < -1 ||
            !codec_text_ok(pb->kind, 16, false) || !codec_text_ok(pb->name, 256, true) ||
            !codec_text_ok(pb->uuid, 128, true) || !codec_text_ok(pb->pci_bus_id, 64, true))
                return -EBADMSG;
        return device_copy(&(Device) {
                                   .local_index = d.local_index,
                                   .memory_bytes = d.memory_bytes,
                                   .numa_node = d.numa_node,
                                   .kind = pb->kind,
                                   .name = pb->name,
                                   .uuid = pb->uuid,
                                   .pci_bus_id = pb->pci_bus_id,
                           },
                           ret);
}

static int member_decode(const Familyd__V1__PeerMember *pb, MemberInfo *ret) {
        _cleanup_(member_info_done) MemberInfo m = {};
        int r;

        if (!pb || !codec_text_ok(pb->name, FAMILYD_MAX_NAME_LENGTH, false) ||
            !codec_text_ok(pb->address, FAMILYD_MAX_NAME_LENGTH, false) || pb->node_rank < -1 ||
            pb->n_devices > FAMILYD_MAX_NODE_DEVICES ||
            !node_registry_digest_valid(strempty(pb->registry_digest)))
                return -EBADMSG;
        /* Devices are numbered 0..n-1 in order: ranks are counted from them. */
        for (size_t i = 0; i < pb->n_devices; i++)
                if (!pb->devices[i] || pb->devices[i]->local_index != (int32_t) i)
                        return -EBADMSG;

        m.name = strdup(pb->name);
        m.address = strdup(pb->address);
        if (!m.name || !m.address)
                return -ENOMEM;
        m.node_rank = pb->node_rank;
        m.partial = pb->partial;
        strcpy(m.registry_digest, strempty(pb->registry_digest)); /* length checked above */
        m.boot_id = pb->boot_id;
        m.started_unix_ms = pb->started_unix_ms;
        if (pb->record_mac.len != 0 && pb->record_mac.len != MEMBER_RECORD_MAC_BYTES)
                return -EBADMSG;
        if (pb->record_mac.len == MEMBER_RECORD_MAC_BYTES) {
                memcpy(m.record_mac, pb->record_mac.data, MEMBER_RECORD_MAC_BYTES);
                m.has_record_mac = true;
        }
        if (pb->n_devices > 0) {
                m.devices = calloc(pb->n_devices, sizeof(Device));
                if (!m.devices)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < pb->n_devices; i++) {
                r = device_decode(pb->devices[i], &m.devices[i]);
                if (r < 0)
                        return r;
                m.n_devices++;
        }
        *ret = m;
        m = (MemberInfo) {};
        return 0;
}

static int known_decode(Familyd__V1__PeerKnown **pb, size_t n, PeerMessage *m) {
        if (n > FAMILYD_MAX_PEER_MEMBERS)
                return -EBADMSG;
        if (n == 0)
                return 0;
        m->members = calloc(n, sizeof(PeerKnown));
        if (!m->members)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                if (!pb[i])
                        return -EBADMSG;
                int r = member_decode(pb[i]->member, &m->members[i].info);
                if (r < 0)
                        return r;
                m->members[i].age_ms = pb[i]->age_ms;
                m->n_members++;
                if ((unsigned) pb[i]->state > FAMILYD__V1__PEER_STATE__PEER_STATE_DOWN ||
                    pb[i]->incarnation > FAMILYD_MAX_TOPOLOGY_VERSION)
                        return -EBADMSG;
                m->members[i].state = (NodeState) pb[i]->state;
                m->members[i].incarnation = pb[i]->incarnation;
        }
        return 0;
}

/* States on the wire are numbered as NodeState; FORGOTTEN only where `forgotten` may be set. */
static int state_decode(Familyd__V1__PeerState pb, bool forgotten_ok, NodeState *ret,
                        bool *ret_forgotten) {
        if (pb == FAMILYD__V1__PEER_STATE__PEER_STATE_FORGOTTEN && forgotten_ok) {
                *ret = NODE_DOWN;
                *ret_forgotten = true;
                return 0;
        }
        if ((unsigned) pb > FAMILYD__V1__PEER_STATE__PEER_STATE_DOWN)
                return -EBADMSG;
        *ret = (NodeState) pb;
        return 0;
}

static int probe_decode(const Familyd__V1__PeerProbe *pb, PeerProbe *ret) {
        bool unused;

        if (!codec_text_ok(pb->name, FAMILYD_MAX_NAME_LENGTH, false) ||
            pb->incarnation > FAMILYD_MAX_TOPOLOGY_VERSION ||
            state_decode(pb->state, false, &ret->state, &unused) < 0)
                return -EBADMSG;
        ret->boot_id = pb->boot_id;
        ret->seq = pb->seq;
        ret->incarnation = pb->incarnation;
        ret->name = strdup(pb->name);
        return ret->name ? 0 : -ENOMEM;
}

/* Verdicts about members: gossip on probes, or an answer to a who with buckets. The names
 * are checked where protobuf-c left them, in a, and copied once, all together. */
static int gossip_decode(Arena *a, const Familyd__V1__PeerMessage *pb, PeerMessage *m) {
        size_t max = pb->body_case == FAMILYD__V1__PEER_MESSAGE__BODY_VERDICTS ? PEER_MAX_VERDICTS
                                                                             : PEER_MAX_GOSSIP;
        PeerUpdate *list;
        int r;

        if (pb->n_updates > max)
                return -EBADMSG;
        if (pb->n_updates == 0)
                return 0;
        list = arena_alloc_array(a, pb->n_updates, sizeof(PeerUpdate));
        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < pb->n_updates; i++) {
                const Familyd__V1__PeerUpdate *u = pb->updates[i];
                PeerUpdate *d = &list[i];

                if (!u || !codec_text_ok(u->name, FAMILYD_MAX_NAME_LENGTH, false) ||
                    u->incarnation > FAMILYD_MAX_TOPOLOGY_VERSION ||
                    state_decode(u->state, true, &d->state, &d->forgotten) < 0)
                        return -EBADMSG;
                d->boot_id = u->boot_id;
                d->incarnation = u->incarnation;
                d->name = u->name; /* borrowed from the unpacked message until copied */
        }
        r = peer_updates_copy(list, pb->n_updates, &m->updates);
        if (r < 0)
                return r;
        m->n_updates = pb->n_updates;
        return 0;
}

/* A who's buckets: a power of two of them, at most PEER_MAX_VERDICT_BUCKETS. */
static int buckets_decode(const Familyd__V1__PeerWho *pb, PeerMessage *m) {
        size_t n = pb->n_verdicts;

        if (n == 0)
                return 0;
        if (n > PEER_MAX_VERDICT_BUCKETS || (n & (n - 1)) != 0)
                return -EBADMSG;
        m->want_verdicts = malloc(n * sizeof(uint64_t));
        if (!m->want_verdicts)
                return -ENOMEM;
        memcpy(m->want_verdicts, pb->verdicts, n * sizeof(uint64_t));
        m->n_want_verdicts = n;
        return 0;
}

static int peer_decode(Arena *a, const Familyd__V1__PeerMessage *pb, PeerMessage *m) {
        int r;

        r = member_decode(pb->sender, &m->sender);
        if (r < 0)
                return r;
        if (pb->version > FAMILYD_MAX_TOPOLOGY_VERSION)
                return -EBADMSG;
        m->version = pb->version;
        if (pb->incarnation > FAMILYD_MAX_TOPOLOGY_VERSION)
                return -EBADMSG;
        m->incarnation = pb->incarnation;
        if (pb->n_updates > 0 &&
            pb->body_case != FAMILYD__V1__PEER_MESSAGE__BODY_PING &&
            pb->body_case != FAMILYD__V1__PEER_MESSAGE__BODY_ACK &&
            pb->body_case != FAMILYD__V1__PEER_MESSAGE__BODY_PING_REQ &&
            pb->body_case != FAMILYD__V1__PEER_MESSAGE__BODY_VERDICTS)
                return -EBADMSG;
        if (pb->table) {
                if (pb->table->members == 0 || pb->table->members > MEMBERSHIP_MAX_NODES_CEILING)
                        return -EBADMSG;
                m->has_table = true;
                m->table_digest = pb->table->digest;
                m->table_members = pb->table->members;
                m->verdict_digest = pb->table->verdicts;
        }

        switch (pb->body_case) {
        case FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT:
                m->body = PEER_HEARTBEAT;
                return 0;
        case FAMILYD__V1__PEER_MESSAGE__BODY_HELLO:
                m->body = PEER_HELLO;
                return known_decode(pb->hello->members, pb->hello->n_members, m);
        case FAMILYD__V1__PEER_MESSAGE__BODY_ANNOUNCE:
                m->body = PEER_ANNOUNCE;
                return known_decode(pb->announce->members, pb->announce->n_members, m);
        case FAMILYD__V1__PEER_MESSAGE__BODY_FORGET:
                m->body = PEER_FORGET;
                if (!codec_text_ok(pb->forget->name, FAMILYD_MAX_NAME_LENGTH, false))
                        return -EBADMSG;
                m->forget_name = strdup(pb->forget->name);
                m->forget_boot_id = pb->forget->boot_id;
                return m->forget_name ? 0 : -ENOMEM;
        case FAMILYD__V1__PEER_MESSAGE__BODY_WHO:
                m->body = PEER_WHO;
                m->want_table = pb->who->table;
                return buckets_decode(pb->who, m);
        case FAMILYD__V1__PEER_MESSAGE__BODY_REFUSE:
                m->body = PEER_REFUSE;
                if (!codec_text_ok(pb->refuse->reason, FAMILYD_MAX_STATUS_MESSAGE, true))
                        return -EBADMSG;
                m->reason = strdup(strempty(pb->refuse->reason));
                return m->reason ? 0 : -ENOMEM;
        case FAMILYD__V1__PEER_MESSAGE__BODY_PING:
        case FAMILYD__V1__PEER_MESSAGE__BODY_ACK:
        case FAMILYD__V1__PEER_MESSAGE__BODY_PING_REQ: {
                const Familyd__V1__PeerProbe *probe =
                        pb->body_case == FAMILYD__V1__PEER_MESSAGE__BODY_PING ? pb->ping :
                        pb->body_case == FAMILYD__V1__PEER_MESSAGE__BODY_ACK  ? pb->ack :
                                                                                pb->ping_req;
                m->body = pb->body_case == FAMILYD__V1__PEER_MESSAGE__BODY_PING ? PEER_PING :
                          pb->body_case == FAMILYD__V1__PEER_MESSAGE__BODY_ACK  ? PEER_ACK :
                                                                                  PEER_PING_REQ;
                r = probe_decode(probe, &m->probe);
                return r < 0 ? r : gossip_decode(a, pb, m);
        }
        case FAMILYD__V1__PEER_MESSAGE__BODY_VERDICTS:
                m->body = PEER_VERDICTS;
                return gossip_decode(a, pb, m);
        default:
                return -EBADMSG;
        }
}

int codec_peer_decode(const uint8_t *data, size_t size, PeerMessage *ret) {
        _cleanup_(peer_message_done) PeerMessage m = { .body = _PEER_BODY_INVALID };
        _cleanup_(arena_done) Arena a;
        Familyd__V1__PeerMessage *pb;
        ProtobufCAllocator allocator;
        int r;

        arena_init(&a);
        allocator = codec_wire_arena_allocator(&a);

        if (size > FAMILYD_MAX_PEER_MESSAGE_BYTES)
                return -EBADMSG;
        r = codec_wire_check(&familyd__v1__peer_message__descriptor, data, size,
                             FAMILYD_MAX_REQUEST_DEPTH, FAMILYD_MAX_REQUEST_MESSAGES);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return -EBADMSG;
        /* One arena for protobuf-c's thousands of small allocations of a pull's answer. */
        pb = familyd__v1__peer_message__unpack(&allocator, size, data);
        if (!pb)
                return -EBADMSG;
        r = peer_decode(&a, pb, &m);
        if (r < 0)
                return r;
        *ret = m;
        m = (PeerMessage) {};
        return 0;
}

static int member_encode(Arena *a, const MemberInfo *m, Familyd__V1__PeerMember **ret) {
        Familyd__V1__PeerMember *pb =
                MSG_NEW(a, Familyd__V1__PeerMember, familyd__v1__peer_member__init);

        if (!pb)
                return -ENOMEM;
        pb->name = arena_strdup(a, m->name);
        pb->address = arena_strdup(a, m->address);
        pb->registry_digest = arena_strdup(a, m->registry_digest);
        if (!pb->name || !pb->address || !pb->registry_digest)
                return -ENOMEM;
        pb->node_rank = m->node_rank;
        pb->boot_id = m->boot_id;
        pb->started_unix_ms = m->started_unix_ms;
        pb->partial = m->partial;
        if (m->has_record_mac && !m->partial) {
                pb->record_mac.data = (uint8_t *) m->record_mac; /* read only by the packer */
                pb->record_mac.len = MEMBER_RECORD_MAC_BYTES;
        }
        size_t n_devices = m->partial ? 0 : m->n_devices;
        if (!ARRAY_NEW(a, pb->devices, n_devices))
                return -ENOMEM;
        for (size_t i = 0; i < n_devices; i++) {
                int r = codec_device_encode(a, &m->devices[i], &pb->devices[i]);
                if (r < 0)
                        return r;
        }
        pb->n_devices = n_devices;
        *ret = pb;
        return 0;
}

static int known_encode(Arena *a, const PeerMessage *m, Familyd__V1__PeerKnown ***ret,
                        size_t *ret_n) {
        Familyd__V1__PeerKnown **list = NULL;

        if (!ARRAY_NEW(a, list, m->n_members))
                return -ENOMEM;
        for (size_t i = 0; i < m->n_members; i++) {
                list[i] = MSG_NEW(a, Familyd__V1__PeerKnown, familyd__v1__peer_known__init);
                if (!list[i])
                        return -ENOMEM;
                int r = member_encode(a, &m->members[i].info, &list[i]->member);
                if (r < 0)
                        return r;
                list[i]->age_ms = m->members[i].age_ms;
                list[i]->state = (Familyd__V1__PeerState) m->members[i].state;
                list[i]->incarnation = m->members[i].incarnation;
        }
        *ret = list;
        *ret_n = m->n_members;
        return 0;
}

static int updates_encode(Arena *a, const PeerMessage *m, Familyd__V1__PeerMessage *pb) {
        if (!ARRAY_NEW(a, pb->updates, m->n_updates))
                return -ENOMEM;
        for (size_t i = 0; i < m->n_updates; i++) {
                const PeerUpdate *u = &m->updates[i];
                Familyd__V1__PeerUpdate *e =
                        MSG_NEW(a, Familyd__V1__PeerUpdate, familyd__v1__peer_update__init);
                if (!e || !(e->name = arena_strdup(a, u->name)))
                        return -ENOMEM;
                e->boot_id = u->boot_id;
                e->incarnation = u->incarnation;
                e->state = u->forgotten ? FAMILYD__V1__PEER_STATE__PEER_STATE_FORGOTTEN :
                                          (Familyd__V1__PeerState) u->state;
                pb->updates[i] = e;
        }
        pb->n_updates = m->n_updates;
        return 0;
}

static int probe_encode(Arena *a, const PeerMessage *m, Familyd__V1__PeerMessage *pb,
                        Familyd__V1__PeerProbe **ret) {
        Familyd__V1__PeerProbe *probe =
                MSG_NEW(a, Familyd__V1__PeerProbe, familyd__v1__peer_probe__init);

        if (!probe || !(probe->name = arena_strdup(a, m->probe.name)))
                return -ENOMEM;
        probe->boot_id = m->probe.boot_id;
        probe->seq = m->probe.seq;
        probe->state = (Familyd__V1__PeerState) m->probe.state;
        probe->incarnation = m->probe.incarnation;
        *ret = probe;
        return updates_encode(a, m, pb);
}

static int peer_encode(Arena *a, const PeerMessage *m, Familyd__V1__PeerMessage *pb) {
        int r;

        r = member_encode(a, &m->sender, &pb->sender);
        if (r < 0)
                return r;
        pb->version = m->version;
        pb->incarnation = m->incarnation;
        if (m->has_table) {
                pb->table = MSG_NEW(a, Familyd__V1__PeerTableDigest,
                                    familyd__v1__peer_table_digest__init);
                if (!pb->table)
                        return -ENOMEM;
                pb->table->digest = m->table_digest;
                pb->table->members = m->table_members;
                pb->table->verdicts = m->verdict_digest;
        }

        switch (m->body) {
        case PEER_HEARTBEAT:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
                pb->heartbeat = MSG_NEW(a, Familyd__V1__PeerHeartbeat,
                                        familyd__v1__peer_heartbeat__init);
                return pb->heartbeat ? 0 : -ENOMEM;
        case PEER_HELLO:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HELLO;
                pb->hello = MSG_NEW(a, Familyd__V1__PeerHello, familyd__v1__peer_hello__init);
                if (!pb->hello)
                        return -ENOMEM;
                return known_encode(a, m, &pb->hello->members, &pb->hello->n_members);
        case PEER_ANNOUNCE:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_ANNOUNCE;
                pb->announce = MSG_NEW(a, Familyd__V1__PeerAnnounce,
                                       familyd__v1__peer_announce__init);
                if (!pb->announce)
                        return -ENOMEM;
                return known_encode(a, m, &pb->announce->members, &pb->announce->n_members);
        case PEER_FORGET:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_FORGET;
                pb->forget = MSG_NEW(a, Familyd__V1__PeerForget, familyd__v1__peer_forget__init);
                if (!pb->forget)
                        return -ENOMEM;
                pb->forget->name = arena_strdup(a, m->forget_name);
                pb->forget->boot_id = m->forget_boot_id;
                return pb->forget->name ? 0 : -ENOMEM;
        case PEER_WHO:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_WHO;
                pb->who = MSG_NEW(a, Familyd__V1__PeerWho, familyd__v1__peer_who__init);
                if (!pb->who)
                        return -ENOMEM;
                pb->who->table = m->want_table;
                pb->who->verdicts = m->want_verdicts;
                pb->who->n_verdicts = m->n_want_verdicts;
                return 0;
        case PEER_REFUSE:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_REFUSE;
                pb->refuse = MSG_NEW(a, Familyd__V1__PeerRefuse, familyd__v1__peer_refuse__init);
                if (!pb->refuse)
                        return -ENOMEM;
                pb->refuse->reason = arena_strdup(a, m->reason);
                return pb->refuse->reason ? 0 : -ENOMEM;
        case PEER_PING:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_PING;
                return probe_encode(a, m, pb, &pb->ping);
        case PEER_ACK:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_ACK;
                return probe_encode(a, m, pb, &pb->ack);
        case PEER_PING_REQ:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_PING_REQ;
                return probe_encode(a, m, pb, &pb->ping_req);
        case PEER_VERDICTS:
                pb->body_case = FAMILYD__V1__PEER_MESSAGE__BODY_VERDICTS;
                pb->verdicts = MSG_NEW(a, Familyd__V1__PeerVerdicts,
                                       familyd__v1__peer_verdicts__init);
                return pb->verdicts ? updates_encode(a, m, pb) : -ENOMEM;
        default:
                return -EINVAL;
        }
}

int codec_peer_record_bytes(const MemberInfo *m, uint8_t **ret, size_t *ret_size) {
        static const char label[] = "familyd record v1";
        MemberInfo bare = *m;
        Familyd__V1__PeerMember *pb;
        _cleanup_(arena_done) Arena arena;
        uint8_t *buf;
        size_t size;
        int r;

        arena_init(&arena);
        bare.partial = false;
        bare.has_record_mac = false;
        bare.registry_digest[0] = 0;
        r = member_encode(&arena, &bare, &pb);
        if (r < 0)
                return r;
        size = familyd__v1__peer_member__get_packed_size(pb);
        buf = malloc(sizeof label + size);
        if (!buf)
                return -ENOMEM;
        memcpy(buf, label, sizeof label); /* with its NUL: the label ends there */
        (void) familyd__v1__peer_member__pack(pb, buf + sizeof label);
        *ret = buf;
        *ret_size = sizeof label + size;
        return 0;
}

int codec_peer_encode(const PeerMessage *m, uint8_t **ret, size_t *ret_size) {
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        _cleanup_(arena_done) Arena arena;
        uint8_t *buf;
        size_t size;
        int r;

        arena_init(&arena);
        r = peer_encode(&arena, m, &pb);
        if (r < 0)
                return r;
        size = familyd__v1__peer_message__get_packed_size(&pb);
        buf = malloc(size ? size : 1);
        if (!buf)
                return -ENOMEM;
        (void) familyd__v1__peer_message__pack(&pb, buf);
        *ret = buf;
        *ret_size = size;
        return 0;
}
