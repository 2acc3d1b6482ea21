/* test-peer-digest.c: the table digest and the who's want_table on the wire, bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/codec-peer.h"
#include "familyd-v1-peer.pb-c.h"

static MemberInfo sender(void) {
        return (MemberInfo) { .name = "node-a", .node_rank = 0, .address = "10.0.0.1:7100",
                              .boot_id = 7, .started_unix_ms = 1700000000000, .partial = true };
}

static void test_round_trip(void **state) {
        PeerMessage m = { .body = PEER_WHO, .sender = sender(), .version = 3, .want_table = true,
                          .has_table = true, .table_digest = UINT64_C(0xfedcba9876543210),
                          .table_members = 4096 };
        _cleanup_(peer_message_done) PeerMessage back = {};
        _cleanup_free_ uint8_t *bytes = NULL;
        size_t size;

        assert_int_equal(codec_peer_encode(&m, &bytes, &size), 0);
        assert_int_equal(codec_peer_decode(bytes, size, &back), 0);
        assert_int_equal(back.body, PEER_WHO);
        assert_true(back.want_table);
        assert_true(back.has_table);
        assert_int_equal(back.table_digest, UINT64_C(0xfedcba9876543210));
        assert_int_equal(back.table_members, 4096);
}

/* A message without the digest (a daemon before it) decodes with has_table false. */
static void test_absent(void **state) {
        PeerMessage m = { .body = PEER_HEARTBEAT, .sender = sender(), .version = 3 };
        _cleanup_(peer_message_done) PeerMessage back = {};
        _cleanup_free_ uint8_t *bytes = NULL;
        size_t size;

        assert_int_equal(codec_peer_encode(&m, &bytes, &size), 0);
        assert_int_equal(codec_peer_decode(bytes, size, &back), 0);
        assert_false(back.has_table);
        assert_false(back.want_table);
}

static int decode_with_members(uint32_t members) {
        Familyd__V1__PeerMessage pb = FAMILYD__V1__PEER_MESSAGE__INIT;
        Familyd__V1__PeerMember s = FAMILYD__V1__PEER_MEMBER__INIT;
        Familyd__V1__PeerHeartbeat hb = FAMILYD__V1__PEER_HEARTBEAT__INIT;
        Familyd__V1__PeerTableDigest table = FAMILYD__V1__PEER_TABLE_DIGEST__INIT;
        _cleanup_(peer_message_done) PeerMessage m = {};
        uint8_t buf[512];

        s.name = "node-a";
        s.address = "10.0.0.1:7100";
        s.registry_digest = "";
        s.partial = true;
        pb.sender = &s;
        pb.body_case = FAMILYD__V1__PEER_MESSAGE__BODY_HEARTBEAT;
        pb.heartbeat = &hb;
        table.digest = 1;
        table.members = members;
        pb.table = &table;
        assert_true(familyd__v1__peer_message__get_packed_size(&pb) <= sizeof buf);
        size_t size = familyd__v1__peer_message__pack(&pb, buf);
        return codec_peer_decode(buf, size, &m);
}

/* A table of no members (it holds its sender) or past the ceiling is no daemon's. */
static void test_bounds(void **state) {
        assert_int_equal(decode_with_members(1), 0);
        assert_int_equal(decode_with_members(MEMBERSHIP_MAX_NODES_CEILING), 0);
        assert_int_equal(decode_with_members(0), -EBADMSG);
        assert_int_equal(decode_with_members(MEMBERSHIP_MAX_NODES_CEILING + 1), -EBADMSG);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_absent),
                cmocka_unit_test(test_bounds),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
