/* test-peer-record.c: a node's MAC over its own member record, its bytes, and its checks. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/codec-peer.h"
#include "familyd-v1-peer.pb-c.h"
#include "peer/peer-record.h"

static Device devices[1] = {
        { .local_index = 0, .kind = "cuda", .name = "GPU 0", .uuid = "GPU-1",
          .pci_bus_id = "0000:01:00.0", .memory_bytes = 1u << 30, .numa_node = 0 },
};

static MemberInfo record(void) {
        return (MemberInfo) { .name = "node-c", .node_rank = 2, .address = "10.0.0.3:7100",
                              .boot_id = 77, .started_unix_ms = 1700000000000,
                              .devices = devices, .n_devices = 1 };
}

static PeerKeys keys(uint8_t first, uint8_t second, unsigned n) {
        PeerKeys k = { .n = n };

        memset(k.keys[0], first, PEER_KEY_BYTES);
        memset(k.keys[1], second, PEER_KEY_BYTES);
        return k;
}

/* The bytes name the identity (and its devices), not the registry digest or the MAC itself. */
static void test_record_bytes(void **state) {
        MemberInfo a = record(), b = record();
        _cleanup_free_ uint8_t *x = NULL, *y = NULL, *z = NULL;
        size_t nx, ny, nz;

        strcpy(b.registry_digest, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
        b.has_record_mac = true;
        b.record_mac[0] = 9;
        b.partial = true;
        assert_int_equal(codec_peer_record_bytes(&a, &x, &nx), 0);
        assert_int_equal(codec_peer_record_bytes(&b, &y, &ny), 0);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx);
        assert_memory_equal(x, "familyd record v1", 18);
        b = record();
        b.boot_id = 78;
        assert_int_equal(codec_peer_record_bytes(&b, &z, &nz), 0);
        assert_true(nz != nx || memcmp(x, z, nx) != 0);
}

/* Signed with the first key, checked under either; another key, another record or a changed
 * MAC fails; no key makes none. */
static void test_sign_and_verify(void **state) {
        PeerKeys one = keys(1, 0, 1), rotated = keys(2, 1, 2), other = keys(3, 0, 1);
        PeerKeys none = { .n = 0 };
        MemberInfo c = record(), forged;

        assert_int_equal(peer_record_sign(&none, &c), 0);
        assert_false(c.has_record_mac);
        assert_false(peer_record_verify(&one, &c));
        assert_int_equal(peer_record_sign(&one, &c), 0);
        assert_true(c.has_record_mac);
        assert_true(peer_record_verify(&one, &c));
        assert_true(peer_record_verify(&rotated, &c)); /* the old key is still the second */
        assert_false(peer_record_verify(&other, &c));
        assert_false(peer_record_verify(&none, &c));
        /* A relaying node changes the record (a later start, its own address): the MAC fails. */
        forged = c;
        forged.boot_id = 78;
        assert_false(peer_record_verify(&one, &forged));
        forged = c;
        forged.address = "10.0.0.9:7100";
        assert_false(peer_record_verify(&one, &forged));
        forged = c;
        forged.record_mac[5] ^= 1;
        assert_false(peer_record_verify(&one, &forged));
        /* The registry digest moves with reloads and is not covered. */
        forged = c;
        strcpy(forged.registry_digest, "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210");
        assert_true(peer_record_verify(&one, &forged));
}

/* The MAC travels in a hello's records and comes back whole; a MAC of another length is
 * refused with the message. */
static void test_mac_on_the_wire(void **state) {
        PeerKeys one = keys(1, 0, 1);
        MemberInfo c = record();
        PeerKnown known = { .info = c };
        PeerMessage m = { .body = PEER_HELLO, .sender = record(), .version = 1,
                          .members = &known, .n_members = 1 };
        _cleanup_(peer_message_done) PeerMessage back = {};
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size;

        m.sender.name = "node-a";
        assert_int_equal(peer_record_sign(&one, &known.info), 0);
        assert_int_equal(codec_peer_encode(&m, &buf, &size), 0);
        assert_int_equal(codec_peer_decode(buf, size, &back), 0);
        assert_false(back.sender.has_record_mac);
        assert_true(back.members[0].info.has_record_mac);
        assert_memory_equal(back.members[0].info.record_mac, known.info.record_mac,
                            MEMBER_RECORD_MAC_BYTES);
        assert_true(peer_record_verify(&one, &back.members[0].info));

        /* A MAC of another length than 32 bytes: the whole message is refused. */
        static const size_t lengths[] = { 1, 31, 32, 33 };
        static uint8_t mac[33];
        for (size_t i = 0; i < ELEMENTSOF(lengths); i++) {
                size_t len = lengths[i];
                Familyd__V1__PeerMember sender = FAMILYD__V1__PEER_MEMBER__INIT;
                Familyd__V1__PeerHeartbeat hb = FAMILYD__V1__PEER_HEARTBEAT__INIT;
                Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
                PeerMessage bad = {};
                size_t n;

                sender.name = "node-a";
                sender.address = "h:1";
                sender.record_mac = (ProtobufCBinaryData) { .len = len, .data = mac };
                pb.sender = &sender;
                pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
                pb.heartbeat = &hb;
                n = familyd__v1__peer_message__get_packed_size(&pb);
                _cleanup_free_ uint8_t *raw = malloc(n);
                assert_non_null(raw);
                familyd__v1__peer_message__pack(&pb, raw);
                assert_int_equal(codec_peer_decode(raw, n, &bad), len == 32 ? 0 : -EBADMSG);
                assert_true(len != 32 || bad.sender.has_record_mac);
                peer_message_done(&bad);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_record_bytes),
                cmocka_unit_test(test_sign_and_verify),
                cmocka_unit_test(test_mac_on_the_wire),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
