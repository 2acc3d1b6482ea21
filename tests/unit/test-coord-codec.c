/* test-coord-codec.c: etcd's messages and the member record: round trips, and every bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec/codec-coord-member.h"
#include "codec/codec-etcd.h"
#include "etcdserverpb-rpc.pb-c.h"
#include "familyd-coord-v1-member.pb-c.h"
#include "mvccpb-kv.pb-c.h"

#define DIGEST "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static Device devices[2] = {
        { .local_index = 0, .kind = "cuda", .name = "GPU 0", .uuid = "GPU-1", .pci_bus_id = "0000:01:00.0",
          .memory_bytes = 1u << 30, .numa_node = 0 },
        { .local_index = 1, .kind = "cuda", .name = "GPU 1", .uuid = "GPU-2", .pci_bus_id = "0000:02:00.0",
          .memory_bytes = 1u << 30, .numa_node = -1 },
};
static uint8_t ucx[64] = { 1, 2, 3 };

static CoordMember member(void) {
        return (CoordMember) { .name = (char *) "node-a", .node_rank = 7, .boot_id = 0x1122334455667788u,
                               .started_unix_ms = 1700000000000, .ucx_address = ucx,
                               .ucx_address_size = sizeof(ucx), .devices = devices, .n_devices = 2,
                               .registry_digest = DIGEST };
}

static void test_prefix_end(void **state) {
        _cleanup_free_ char *a = etcd_prefix_end("/fd/c1/"), *b = etcd_prefix_end("a\xff"),
                            *c = etcd_prefix_end("\xff\xff");

        assert_string_equal(a, "/fd/c10");
        assert_string_equal(b, "b");
        assert_string_equal(c, ""); /* every key */
}

static void test_member_round_trip(void **state) {
        CoordMember m = member();
        _cleanup_(coord_member_done) CoordMember back = {};
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size;

        assert_int_equal(codec_coord_member_encode(&m, &buf, &size), 0);
        assert_int_equal(codec_coord_member_decode(buf, size, "node-a", &back), 0);
        assert_string_equal(back.name, "node-a");
        assert_int_equal(back.node_rank, 7);
        assert_int_equal(back.boot_id, 0x1122334455667788u);
        assert_int_equal(back.started_unix_ms, 1700000000000);
        assert_int_equal(back.ucx_address_size, sizeof(ucx));
        assert_memory_equal(back.ucx_address, ucx, sizeof(ucx));
        assert_int_equal(back.n_devices, 2);
        assert_string_equal(back.devices[1].uuid, "GPU-2");
        assert_int_equal(back.devices[1].numa_node, -1);
        assert_string_equal(back.registry_digest, DIGEST);
        assert_string_equal(back.cluster, "");
}

/* Packs a record protobuf-c would build, bypassing the encoder's own check. */
static int decode_raw(Familyd__Coord__V1__CoordMember *pb, const char *expected) {
        _cleanup_(coord_member_done) CoordMember back = {};
        size_t n = familyd__coord__v1__coord_member__get_packed_size(pb);
        _cleanup_free_ uint8_t *buf = malloc(n + 1);

        (void) familyd__coord__v1__coord_member__pack(pb, buf);
        return codec_coord_member_decode(buf, n, expected, &back);
}

/* The cluster a record names: empty, or a valid cluster name (what the daemon compares). */
static void test_member_cluster(void **state) {
        CoordMember m = member();
        _cleanup_(coord_member_done) CoordMember back = {};
        _cleanup_free_ uint8_t *buf = NULL;
        Familyd__Coord__V1__CoordMember pb = FAMILYD__COORD__V1__COORD_MEMBER__INIT;
        char long_cluster[COORD_MAX_CLUSTER_NAME + 2];
        size_t size;

        strcpy(m.cluster, "prod-a.1_x");
        assert_int_equal(codec_coord_member_encode(&m, &buf, &size), 0);
        assert_int_equal(codec_coord_member_decode(buf, size, "node-a", &back), 0);
        assert_string_equal(back.cluster, "prod-a.1_x");

        assert_true(coord_cluster_name_valid("a"));
        assert_false(coord_cluster_name_valid(""));
        assert_false(coord_cluster_name_valid("a/b"));
        assert_false(coord_cluster_name_valid("a b"));
        memset(long_cluster, 'c', sizeof long_cluster - 1);
        long_cluster[sizeof long_cluster - 1] = '\0';
        assert_false(coord_cluster_name_valid(long_cluster));
        long_cluster[COORD_MAX_CLUSTER_NAME] = '\0';
        assert_true(coord_cluster_name_valid(long_cluster));

        pb.name = (char *) "n";
        pb.node_rank = -1;
        pb.cluster = (char *) "a/b";
        assert_int_equal(decode_raw(&pb, "n"), -EBADMSG);
        pb.cluster = (char *) "";
        assert_int_equal(decode_raw(&pb, "n"), 0);
}

static void test_member_refusals(void **state) {
        Familyd__Coord__V1__CoordDevice d0 = FAMILYD__COORD__V1__COORD_DEVICE__INIT, d1;
        Familyd__Coord__V1__CoordDevice *devs[2] = { &d0, &d1 };
        Familyd__Coord__V1__CoordMember pb = FAMILYD__COORD__V1__COORD_MEMBER__INIT, bad;
        _cleanup_free_ uint8_t *big = calloc(1, 5000);
        _cleanup_free_ Familyd__Coord__V1__CoordDevice **many = calloc(257, sizeof(*many));
        _cleanup_free_ Familyd__Coord__V1__CoordDevice *many_devs = calloc(257, sizeof(*many_devs));
        char long_name[300];

        d0.kind = (char *) "host";
        d1 = d0;
        d1.local_index = 1;
        pb.name = (char *) "node-a";
        pb.node_rank = -1;
        pb.devices = devs;
        pb.n_devices = 2;
        assert_int_equal(decode_raw(&pb, "node-a"), 0);
        assert_int_equal(decode_raw(&pb, NULL), 0);
        assert_int_equal(decode_raw(&pb, "node-b"), -EBADMSG); /* the key names another node */

#define REFUSED(field, value)                                                \
        do {                                                                 \
                bad = pb;                                                    \
                bad.field = value;                                           \
                assert_int_equal(decode_raw(&bad, NULL), -EBADMSG);          \
        } while (0)
        REFUSED(name, (char *) "");
        REFUSED(name, (char *) "a/b");
        REFUSED(name, (char *) "tab\there");
        memset(long_name, 'x', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = '\0';
        REFUSED(name, long_name);
        REFUSED(node_rank, -2);
        REFUSED(registry_digest, (char *) "abc");
        REFUSED(ucx_address, ((ProtobufCBinaryData) { .data = big, .len = COORD_MEMBER_MAX_UCX_ADDRESS + 1 }));
        for (size_t i = 0; i < 257; i++) {
                many_devs[i] = d0;
                many_devs[i].local_index = (int32_t) i;
                many[i] = &many_devs[i];
        }
        bad = pb;
        bad.devices = many;
        bad.n_devices = 256; /* FAMILYD_MAX_NODE_DEVICES: accepted */
        assert_int_equal(decode_raw(&bad, NULL), 0);
        bad.n_devices = 257;
        assert_int_equal(decode_raw(&bad, NULL), -EBADMSG);
        for (size_t i = 0; i < 257; i++)
                many[i] = &d0;
        bad = pb;
        bad.devices = many;
        bad.n_devices = 2; /* two devices both numbered 0 */
        assert_int_equal(decode_raw(&bad, NULL), -EBADMSG);
        d1.numa_node = -2;
        assert_int_equal(decode_raw(&pb, NULL), -EBADMSG);
        d1.numa_node = 0;
        d1.kind = (char *) "";
        assert_int_equal(decode_raw(&pb, NULL), -EBADMSG);
}

static void test_member_garbage(void **state) {
        static const uint8_t garbage[] = "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01" "garbage";
        _cleanup_(coord_member_done) CoordMember back = {};
        CoordMember m = member();
        uint8_t *buf;
        size_t size;

        assert_int_equal(codec_coord_member_decode(garbage, sizeof(garbage) - 1, NULL, &back), -EBADMSG);
        assert_int_equal(codec_coord_member_decode((const uint8_t *) "\x0a\x05" "ab", 4, NULL, &back), -EBADMSG);
        m.name = (char *) "a/b";
        assert_int_equal(codec_coord_member_encode(&m, &buf, &size), -EINVAL);
}

static void test_create_is_a_txn_on_create_revision(void **state) {
        _cleanup_free_ uint8_t *buf = NULL;
        Etcdserverpb__TxnRequest *t;
        size_t size;

        assert_int_equal(codec_etcd_create_encode("/k", (const uint8_t *) "v", 1, 5, &buf, &size), 0);
        t = etcdserverpb__txn_request__unpack(NULL, size, buf);
        assert_non_null(t);
        assert_int_equal(t->n_compare, 1);
        assert_int_equal(t->compare[0]->target, ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE);
        assert_int_equal(t->compare[0]->result, ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL);
        assert_int_equal(t->compare[0]->target_union_case, ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION);
        assert_int_equal(t->compare[0]->create_revision, 0);
        assert_int_equal(t->n_success, 1);
        assert_int_equal(t->success[0]->request_put->lease, 5);
        assert_int_equal(t->n_failure, 0);
        etcdserverpb__txn_request__free_unpacked(t, NULL);
}

static uint8_t *pack_range(Mvccpb__KeyValue *kv, size_t *ret_size) {
        Etcdserverpb__RangeResponse r = ETCDSERVERPB__RANGE_RESPONSE__INIT;
        Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
        Mvccpb__KeyValue *kvs[] = { kv };
        uint8_t *buf;

        h.revision = 42;
        r.header = &h;
        r.kvs = kvs;
        r.n_kvs = 1;
        *ret_size = etcdserverpb__range_response__get_packed_size(&r);
        buf = malloc(*ret_size);
        (void) etcdserverpb__range_response__pack(&r, buf);
        return buf;
}

static void test_range_answers_bounded(void **state) {
        Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;
        _cleanup_free_ uint8_t *big = calloc(1, CODEC_ETCD_MAX_VALUE_BYTES + 1);
        _cleanup_(etcd_range_done) EtcdRange rg = {};
        EtcdRange never = {};
        uint8_t *buf;
        size_t size;

        kv.key = (ProtobufCBinaryData) { .data = (uint8_t *) "/fd/k", .len = 5 };
        kv.value = (ProtobufCBinaryData) { .data = (uint8_t *) "v", .len = 1 };
        kv.mod_revision = 40;
        buf = pack_range(&kv, &size);
        assert_int_equal(codec_etcd_range_decode(buf, size, &rg), 0);
        free(buf);
        assert_int_equal(rg.revision, 42);
        assert_int_equal(rg.n_kvs, 1);
        assert_string_equal(rg.kvs[0].key, "/fd/k");
        assert_int_equal(rg.kvs[0].mod_revision, 40);

        kv.key = (ProtobufCBinaryData) { .data = (uint8_t *) "/fd\0k", .len = 5 };
        buf = pack_range(&kv, &size);
        assert_int_equal(codec_etcd_range_decode(buf, size, &never), -EBADMSG);
        free(buf);
        kv.key = (ProtobufCBinaryData) { .data = (uint8_t *) "/fd/k", .len = 5 };
        kv.value = (ProtobufCBinaryData) { .data = big, .len = CODEC_ETCD_MAX_VALUE_BYTES + 1 };
        buf = pack_range(&kv, &size);
        assert_int_equal(codec_etcd_range_decode(buf, size, &never), -EBADMSG);
        free(buf);
        assert_int_equal(codec_etcd_range_decode((const uint8_t *) "\xff", 1, &never), -EBADMSG);
}

static void test_watch_and_lease_answers(void **state) {
        Etcdserverpb__WatchResponse w = ETCDSERVERPB__WATCH_RESPONSE__INIT;
        Etcdserverpb__LeaseGrantResponse g = ETCDSERVERPB__LEASE_GRANT_RESPONSE__INIT;
        Mvccpb__Event e0 = MVCCPB__EVENT__INIT, e1 = MVCCPB__EVENT__INIT;
        Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;
        Mvccpb__Event *events[] = { &e0, &e1 };
        _cleanup_(etcd_watch_response_done) EtcdWatchResponse back = {};
        EtcdWatchResponse never = {};
        uint8_t buf[256];
        size_t size;
        int64_t id, ttl;

        kv.key = (ProtobufCBinaryData) { .data = (uint8_t *) "/k", .len = 2 };
        kv.mod_revision = 9;
        e0.kv = &kv;
        e1.type = MVCCPB__EVENT__EVENT_TYPE__DELETE;
        e1.kv = &kv;
        w.events = events;
        w.n_events = 2;
        size = etcdserverpb__watch_response__pack(&w, buf);
        assert_int_equal(codec_etcd_watch_decode(buf, size, &back), 0);
        assert_int_equal(back.n_events, 2);
        assert_int_equal(back.events[0].type, ETCD_EVENT_PUT);
        assert_int_equal(back.events[1].type, ETCD_EVENT_DELETE);
        assert_int_equal(back.events[1].kv.mod_revision, 9);
        e1.type = 7;
        size = etcdserverpb__watch_response__pack(&w, buf);
        assert_int_equal(codec_etcd_watch_decode(buf, size, &never), -EBADMSG);

        g.id = 77;
        g.ttl = 2;
        size = etcdserverpb__lease_grant_response__pack(&g, buf);
        assert_int_equal(codec_etcd_lease_grant_decode(buf, size, &id, &ttl), 0);
        assert_int_equal(id, 77);
        assert_int_equal(ttl, 2);
        g.error = (char *) "lease already exists";
        size = etcdserverpb__lease_grant_response__pack(&g, buf);
        assert_int_equal(codec_etcd_lease_grant_decode(buf, size, &id, &ttl), -ENOSPC);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_prefix_end),
                cmocka_unit_test(test_member_round_trip),
                cmocka_unit_test(test_member_refusals),
                cmocka_unit_test(test_member_cluster),
                cmocka_unit_test(test_member_garbage),
                cmocka_unit_test(test_create_is_a_txn_on_create_revision),
                cmocka_unit_test(test_range_answers_bounded),
                cmocka_unit_test(test_watch_and_lease_answers),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
