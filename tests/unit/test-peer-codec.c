/* test-peer-codec.c: membership messages round-trip, and hostile bytes are refused whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/codec-peer.h"
#include "core/resource-limits.h"
#include "familyd-v1-peer.pb-c.h"

static Device devices[2] = {
        { .local_index = 0, .kind = "cuda", .name = "GPU 0", .uuid = "GPU-1", .pci_bus_id = "0000:01:00.0",
          .memory_bytes = 1u << 30, .numa_node = 0 },
        { .local_index = 1, .kind = "cuda", .name = "GPU 1", .uuid = "GPU-2", .pci_bus_id = "0000:02:00.0",
          .memory_bytes = 1u << 30, .numa_node = 1 },
};

#define DIGEST_A "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define DIGEST_B "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static MemberInfo member(const char *name) {
        return (MemberInfo) {
                .name = (char *) name,
                .node_rank = 3,
                .address = "10.0.0.1:7100",
                .boot_id = UINT64_C(0x1122334455667788),
                .started_unix_ms = 1700000000000,
                .devices = devices,
                .n_devices = 2,
                .registry_digest = DIGEST_A,
        };
}

static void test_round_trip(void **state) {
        PeerKnown known[2] = { { .info = member("b"), .age_ms = 5 }, { .info = member("c"), .age_ms = 9 } };
        PeerMessage m = { .body = PEER_HELLO, .sender = member("a"), .version = 42,
                          .members = known, .n_members = 2 };
        _cleanup_(peer_message_done) PeerMessage back = {};
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size;

        assert_int_equal(codec_peer_encode(&m, &buf, &size), 0);
        assert_int_equal(codec_peer_decode(buf, size, &back), 0);
        assert_int_equal(back.body, PEER_HELLO);
        assert_int_equal(back.version, 42);
        assert_string_equal(back.sender.name, "a");
        assert_int_equal(back.sender.node_rank, 3);
        assert_int_equal(back.sender.boot_id, UINT64_C(0x1122334455667788));
        assert_int_equal(back.sender.n_devices, 2);
        assert_string_equal(back.sender.devices[1].pci_bus_id, "0000:02:00.0");
        assert_int_equal(back.n_members, 2);
        assert_string_equal(back.members[1].info.name, "c");
        assert_int_equal(back.members[1].age_ms, 9);
        assert_string_equal(back.sender.registry_digest, DIGEST_A);
        assert_string_equal(back.members[0].info.registry_digest, DIGEST_A);
}

/* Heartbeats carry the digest too (a reload reaches the peers with the next one); an empty
 * digest (not known yet) passes as empty. */
static void test_digest_in_heartbeats(void **state) {
        PeerMessage hb = { .body = PEER_HEARTBEAT, .sender = member("a"), .version = 3 };
        _cleanup_(peer_message_done) PeerMessage back = {}, back2 = {};
        _cleanup_free_ uint8_t *b1 = NULL, *b2 = NULL;
        size_t s1, s2;

        hb.sender.partial = true;
        memcpy(hb.sender.registry_digest, DIGEST_B, sizeof hb.sender.registry_digest);
        assert_int_equal(codec_peer_encode(&hb, &b1, &s1), 0);
        assert_int_equal(codec_peer_decode(b1, s1, &back), 0);
        assert_true(back.sender.partial);
        assert_string_equal(back.sender.registry_digest, DIGEST_B);

        hb.sender.registry_digest[0] = 0;
        assert_int_equal(codec_peer_encode(&hb, &b2, &s2), 0);
        assert_int_equal(codec_peer_decode(b2, s2, &back2), 0);
        assert_string_equal(back2.sender.registry_digest, "");
}

static void test_partial_and_who(void **state) {
        PeerMessage hb = { .body = PEER_HEARTBEAT, .sender = member("a"), .version = 3 };
        PeerMessage who = { .body = PEER_WHO, .sender = member("a") };
        _cleanup_(peer_message_done) PeerMessage hb2 = {}, who2 = {};
        _cleanup_free_ uint8_t *b1 = NULL, *b2 = NULL;
        size_t s1, s2, full;

        assert_int_equal(codec_peer_encode(&hb, &b1, &full), 0);
        free(b1);
        b1 = NULL;
        hb.sender.partial = true;
        assert_int_equal(codec_peer_encode(&hb, &b1, &s1), 0);
        /* A partial sender leaves the devices out. */
        assert_true(s1 < full);
        assert_int_equal(codec_peer_decode(b1, s1, &hb2), 0);
        assert_true(hb2.sender.partial);
        assert_int_equal(hb2.sender.n_devices, 0);
        assert_int_equal(hb2.sender.boot_id, UINT64_C(0x1122334455667788));

        assert_int_equal(codec_peer_encode(&who, &b2, &s2), 0);
        assert_int_equal(codec_peer_decode(b2, s2, &who2), 0);
        assert_int_equal(who2.body, PEER_WHO);
        assert_false(who2.sender.partial);
        assert_int_equal(who2.sender.n_devices, 2);
}

static void test_forget_and_refuse(void **state) {
        PeerMessage f = { .body = PEER_FORGET, .sender = member("a"), .forget_name = "d",
                          .forget_boot_id = 7 };
        PeerMessage r = { .body = PEER_REFUSE, .sender = member("a"), .reason = "no" };
        _cleanup_(peer_message_done) PeerMessage f2 = {}, r2 = {};
        _cleanup_free_ uint8_t *b1 = NULL, *b2 = NULL;
        size_t s1, s2;

        assert_int_equal(codec_peer_encode(&f, &b1, &s1), 0);
        assert_int_equal(codec_peer_decode(b1, s1, &f2), 0);
        assert_string_equal(f2.forget_name, "d");
        assert_int_equal(f2.forget_boot_id, 7);
        assert_int_equal(codec_peer_encode(&r, &b2, &s2), 0);
        assert_int_equal(codec_peer_decode(b2, s2, &r2), 0);
        assert_string_equal(r2.reason, "no");
}

/* Encodes a hand-made protobuf message and expects the decoder to refuse it. */
static void expect_refused(Familyd__V1__PeerMessage *pb) {
        size_t size = familyd__v1__peer_message__get_packed_size(pb);
        uint8_t *buf = malloc(size + 1);
        PeerMessage m = {};

        assert_non_null(buf);
        familyd__v1__peer_message__pack(pb, buf);
        assert_int_equal(codec_peer_decode(buf, size, &m), -EBADMSG);
        assert_null(m.sender.name);
        free(buf);
}

static void expect_accepted(Familyd__V1__PeerMessage *pb) {
        size_t size = familyd__v1__peer_message__get_packed_size(pb);
        _cleanup_free_ uint8_t *buf = malloc(size + 1);
        _cleanup_(peer_message_done) PeerMessage m = {};

        assert_non_null(buf);
        familyd__v1__peer_message__pack(pb, buf);
        assert_int_equal(codec_peer_decode(buf, size, &m), 0);
}

static void test_hostile(void **state) {
        Familyd__V1__PeerMember sender = FAMILYD__V1__PEER_MEMBER__INIT;
        Familyd__V1__PeerHeartbeat hb = FAMILYD__V1__PEER_HEARTBEAT__INIT;
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        Familyd__V1__Device dev = FAMILYD__V1__DEVICE__INIT;
        Familyd__V1__Device *devs[1] = { &dev };

        sender.name = "a";
        sender.address = "h:1";
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
        pb.heartbeat = &hb;

        /* No sender. */
        expect_refused(&pb);
        pb.sender = &sender;

        /* Control characters in a name that ends up in logs. */
        sender.name = "a\nb";
        expect_refused(&pb);
        sender.name = "";
        expect_refused(&pb);
        sender.name = "a";
        sender.node_rank = -2;
        expect_refused(&pb);
        sender.node_rank = -1;

        /* Devices must be numbered 0..n-1 and have a kind. */
        dev.kind = "host";
        dev.local_index = 5;
        sender.devices = devs;
        sender.n_devices = 1;
        expect_refused(&pb);
        dev.local_index = 0;
        dev.kind = "";
        expect_refused(&pb);
        dev.kind = "host";

        /* A registry digest is 64 lower-case hex digits or nothing. */
        static const char *const bad_digests[] = {
                DIGEST_A "0",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
                "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                "0123456789abcdeg0123456789abcdef0123456789abcdef0123456789abcdef",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd\n",
                "unknown",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad_digests); i++) {
                sender.registry_digest = (char *) bad_digests[i];
                expect_refused(&pb);
        }
        /* Also in a member another daemon reports. */
        {
                Familyd__V1__PeerMember other = sender;
                Familyd__V1__PeerKnown known = FAMILYD__V1__PEER_KNOWN__INIT;
                Familyd__V1__PeerKnown *list[1] = { &known };
                Familyd__V1__PeerHello hello = FAMILYD__V1__PEER_HELLO__INIT;

                sender.registry_digest = DIGEST_A;
                other.name = "b";
                other.registry_digest = "ABC";
                known.member = &other;
                hello.members = list;
                hello.n_members = 1;
                pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HELLO;
                pb.hello = &hello;
                expect_refused(&pb);
                pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
                pb.heartbeat = &hb;
        }
        sender.registry_digest = DIGEST_B;

        /* A version no daemon can reach (2^64-1 wrapped the version: fuzz-peer). */
        pb.sender = &sender;
        pb.version = UINT64_MAX;
        expect_refused(&pb);
        pb.version = 7;

        /* No body. */
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY__NOT_SET;
        expect_refused(&pb);
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;

        /* Now it is fine. */
        size_t size = familyd__v1__peer_message__get_packed_size(&pb);
        _cleanup_free_ uint8_t *buf = malloc(size);
        _cleanup_(peer_message_done) PeerMessage m = {};
        familyd__v1__peer_message__pack(&pb, buf);
        assert_int_equal(codec_peer_decode(buf, size, &m), 0);
        assert_int_equal(m.body, PEER_HEARTBEAT);
        assert_string_equal(m.sender.registry_digest, DIGEST_B);
}

/* swim: probes with gossiped verdicts (a forgotten start among them) round-trip. */
static void test_probe_round_trip(void **state) {
        PeerUpdate updates[2] = {
                { .name = "c", .boot_id = 9, .incarnation = 4, .state = NODE_SUSPECT },
                { .name = "d", .boot_id = 10, .forgotten = true },
        };
        PeerMessage m = { .body = PEER_PING_REQ, .sender = member("a"), .version = 3,
                          .incarnation = 2, .updates = updates, .n_updates = 2,
                          .probe = { .name = "b", .boot_id = 77, .seq = 5, .state = NODE_DOWN,
                                     .incarnation = 6 } };
        _cleanup_(peer_message_done) PeerMessage back = {};
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size;

        m.sender.partial = true;
        assert_int_equal(codec_peer_encode(&m, &buf, &size), 0);
        assert_int_equal(codec_peer_decode(buf, size, &back), 0);
        assert_int_equal(back.body, PEER_PING_REQ);
        assert_int_equal(back.incarnation, 2);
        assert_string_equal(back.probe.name, "b");
        assert_int_equal(back.probe.boot_id, 77);
        assert_int_equal(back.probe.seq, 5);
        assert_int_equal(back.probe.state, NODE_DOWN);
        assert_int_equal(back.probe.incarnation, 6);
        assert_int_equal(back.n_updates, 2);
        assert_string_equal(back.updates[0].name, "c");
        assert_int_equal(back.updates[0].state, NODE_SUSPECT);
        assert_int_equal(back.updates[0].incarnation, 4);
        assert_false(back.updates[0].forgotten);
        assert_true(back.updates[1].forgotten);
        assert_int_equal(back.updates[1].boot_id, 10);
}

/* swim fields refused whole: a state past DOWN, FORGOTTEN in a probe, verdicts on a body that
 * is not a probe, more than PEER_MAX_GOSSIP of them, a bad name, an incarnation past 2^53. */
static void test_probe_hostile(void **state) {
        Familyd__V1__PeerMember sender = FAMILYD__V1__PEER_MEMBER__INIT;
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        Familyd__V1__PeerProbe probe = FAMILYD__V1__PEER_PROBE__INIT;
        Familyd__V1__PeerHeartbeat hb = FAMILYD__V1__PEER_HEARTBEAT__INIT;
        Familyd__V1__PeerUpdate update = FAMILYD__V1__PEER_UPDATE__INIT;
        Familyd__V1__PeerUpdate *many[PEER_MAX_GOSSIP + 1];

        sender.name = "a";
        sender.address = "h:1";
        sender.partial = true;
        pb.sender = &sender;
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_PING;
        pb.ping = &probe;
        probe.name = "b";
        update.name = "c";
        for (size_t i = 0; i < ELEMENTSOF(many); i++)
                many[i] = &update;

        probe.state = 4;
        expect_refused(&pb);
        probe.state = FAMILYD__V1__PEER_STATE__PEER_STATE_FORGOTTEN;
        expect_refused(&pb);
        probe.state = FAMILYD__V1__PEER_STATE__PEER_STATE_SUSPECT;
        probe.name = "b\x01";
        expect_refused(&pb);
        probe.name = "b";
        probe.incarnation = UINT64_MAX;
        expect_refused(&pb);
        probe.incarnation = 1;
        pb.incarnation = UINT64_MAX;
        expect_refused(&pb);
        pb.incarnation = 1;
        pb.updates = many;
        pb.n_updates = PEER_MAX_GOSSIP + 1;
        expect_refused(&pb);
        pb.n_updates = 1;
        update.state = 9;
        expect_refused(&pb);
        update.state = FAMILYD__V1__PEER_STATE__PEER_STATE_FORGOTTEN; /* fine in an update */
        update.name = "";
        expect_refused(&pb);
        update.name = "c";
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
        pb.heartbeat = &hb;
        expect_refused(&pb); /* verdicts ride on probes only */
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_PING;
        pb.ping = &probe;

        size_t size = familyd__v1__peer_message__get_packed_size(&pb);
        _cleanup_free_ uint8_t *buf = malloc(size);
        _cleanup_(peer_message_done) PeerMessage m = {};
        familyd__v1__peer_message__pack(&pb, buf);
        assert_int_equal(codec_peer_decode(buf, size, &m), 0);
        assert_int_equal(m.body, PEER_PING);
        assert_int_equal(m.n_updates, 1);
        assert_true(m.updates[0].forgotten);
        assert_int_equal(m.probe.state, NODE_SUSPECT);
}

/* swim's pull: a who with verdict buckets, the answer with its verdicts, and the verdict
 * digest round-trip. */
static void test_verdicts_round_trip(void **state) {
        uint64_t buckets[4] = { 1, 2, UINT64_MAX, 0 };
        PeerUpdate updates[2] = {
                { .name = "c", .boot_id = 9, .incarnation = 4, .state = NODE_DOWN },
                { .name = "d", .boot_id = 10, .incarnation = 1, .state = NODE_UP },
        };
        PeerMessage who = { .body = PEER_WHO, .sender = member("a"), .version = 3,
                            .has_table = true, .table_digest = 5, .table_members = 3,
                            .verdict_digest = UINT64_C(0xfeedface12345678),
                            .want_verdicts = buckets, .n_want_verdicts = 4 };
        PeerMessage answer = { .body = PEER_VERDICTS, .sender = member("b"), .version = 3,
                               .updates = updates, .n_updates = 2 };
        _cleanup_(peer_message_done) PeerMessage back = {}, back2 = {};
        _cleanup_free_ uint8_t *buf = NULL, *buf2 = NULL;
        size_t size, size2;

        who.sender.partial = answer.sender.partial = true;
        assert_int_equal(codec_peer_encode(&who, &buf, &size), 0);
        assert_int_equal(codec_peer_decode(buf, size, &back), 0);
        assert_int_equal(back.body, PEER_WHO);
        assert_int_equal(back.verdict_digest, UINT64_C(0xfeedface12345678));
        assert_int_equal(back.n_want_verdicts, 4);
        assert_memory_equal(back.want_verdicts, buckets, sizeof buckets);
        assert_false(back.want_table);

        assert_int_equal(codec_peer_encode(&answer, &buf2, &size2), 0);
        assert_int_equal(codec_peer_decode(buf2, size2, &back2), 0);
        assert_int_equal(back2.body, PEER_VERDICTS);
        assert_int_equal(back2.n_updates, 2);
        assert_string_equal(back2.updates[0].name, "c");
        assert_int_equal(back2.updates[0].state, NODE_DOWN);
        assert_int_equal(back2.updates[0].incarnation, 4);
        assert_int_equal(back2.updates[1].boot_id, 10);
        assert_int_equal(back2.verdict_digest, 0); /* none sent */
}

/* Refused whole: buckets not a power of two or more than PEER_MAX_VERDICT_BUCKETS, and more
 * than PEER_MAX_VERDICTS verdicts in an answer (which may carry more than a probe's 256). */
static void test_verdicts_hostile(void **state) {
        static Familyd__V1__PeerUpdate *many[PEER_MAX_VERDICTS + 1];
        static uint64_t buckets[PEER_MAX_VERDICT_BUCKETS * 2];
        Familyd__V1__PeerMember sender = FAMILYD__V1__PEER_MEMBER__INIT;
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        Familyd__V1__PeerWho who = FAMILYD__V1__PEER_WHO__INIT;
        Familyd__V1__PeerVerdicts verdicts = FAMILYD__V1__PEER_VERDICTS__INIT;
        Familyd__V1__PeerUpdate update = FAMILYD__V1__PEER_UPDATE__INIT;

        sender.name = "a";
        sender.address = "h:1";
        sender.partial = true;
        pb.sender = &sender;
        update.name = "c";
        for (size_t i = 0; i < ELEMENTSOF(many); i++)
                many[i] = &update;

        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_WHO;
        pb.who = &who;
        who.verdicts = buckets;
        who.n_verdicts = 3;
        expect_refused(&pb);
        who.n_verdicts = PEER_MAX_VERDICT_BUCKETS * 2;
        expect_refused(&pb);
        who.n_verdicts = PEER_MAX_VERDICT_BUCKETS;
        expect_accepted(&pb);

        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_VERDICTS;
        pb.verdicts = &verdicts;
        pb.updates = many;
        pb.n_updates = PEER_MAX_VERDICTS + 1;
        expect_refused(&pb);
        pb.n_updates = PEER_MAX_VERDICTS;
        expect_accepted(&pb);
        update.incarnation = UINT64_MAX;
        expect_refused(&pb);
}

/* Devices per node are bounded: a hello naming one member with more is refused whole, with
 * the sender and every other member (an attack: 630 members of 256 devices took 3.5 GB). */
static void test_device_bound(void **state) {
        enum { N = FAMILYD_MAX_NODE_DEVICES + 1 };
        Familyd__V1__PeerMember sender = FAMILYD__V1__PEER_MEMBER__INIT, good = sender, big = sender;
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        Familyd__V1__PeerHello hello = FAMILYD__V1__PEER_HELLO__INIT;
        Familyd__V1__PeerKnown k0 = FAMILYD__V1__PEER_KNOWN__INIT, k1 = k0;
        Familyd__V1__PeerKnown *list[2] = { &k0, &k1 };
        static Familyd__V1__Device dev[N];
        static Familyd__V1__Device *devs[N];

        for (size_t i = 0; i < N; i++) {
                dev[i] = (Familyd__V1__Device) FAMILYD__V1__DEVICE__INIT;
                dev[i].kind = "cuda";
                dev[i].local_index = (int32_t) i;
                devs[i] = &dev[i];
        }
        sender.name = "a";
        sender.address = "h:1";
        good.name = "b";
        good.address = "h:2";
        good.devices = devs;
        good.n_devices = 1;
        big.name = "c";
        big.address = "h:3";
        big.devices = devs;
        big.n_devices = FAMILYD_MAX_NODE_DEVICES;
        k0.member = &good;
        k1.member = &big;
        hello.members = list;
        hello.n_members = 2;
        pb.sender = &sender;
        pb.version = 1;
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HELLO;
        pb.hello = &hello;

        size_t size = familyd__v1__peer_message__get_packed_size(&pb);
        _cleanup_free_ uint8_t *buf = malloc(size);
        _cleanup_(peer_message_done) PeerMessage m = {};
        familyd__v1__peer_message__pack(&pb, buf);
        assert_int_equal(codec_peer_decode(buf, size, &m), 0);
        assert_int_equal(m.n_members, 2);
        assert_int_equal(m.members[1].info.n_devices, FAMILYD_MAX_NODE_DEVICES);

        big.n_devices = N;
        expect_refused(&pb);
        /* And in the sender itself. */
        big.n_devices = 1;
        sender.devices = devs;
        sender.n_devices = N;
        expect_refused(&pb);
}

static void test_garbage(void **state) {
        uint8_t junk[512];
        PeerMessage m = {};

        for (unsigned seed = 0; seed < 2000; seed++) {
                srand(seed);
                size_t n = (size_t) rand() % sizeof junk;
                for (size_t i = 0; i < n; i++)
                        junk[i] = (uint8_t) rand();
                if (codec_peer_decode(junk, n, &m) == 0)
                        peer_message_done(&m);
        }
        /* Oversized. */
        assert_int_equal(codec_peer_decode(junk, (size_t) 64 << 20, &m), -EBADMSG);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_forget_and_refuse),
                cmocka_unit_test(test_partial_and_who),
                cmocka_unit_test(test_digest_in_heartbeats),
                cmocka_unit_test(test_hostile),
                cmocka_unit_test(test_device_bound),
                cmocka_unit_test(test_garbage),
                cmocka_unit_test(test_probe_round_trip),
                cmocka_unit_test(test_probe_hostile),
                cmocka_unit_test(test_verdicts_round_trip),
                cmocka_unit_test(test_verdicts_hostile),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
