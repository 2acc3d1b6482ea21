/* test-state.c: what restart without loss rests on: the tables' restore entry points, the
 * state records (daemon/codec/codec-record.c) and the store in a state dir (daemon/state/). End
 * to end: tests/integration/test_state_dir.py and test_durability_fdstore.py. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>
#include <cmocka.h>

#include "common/crc32c.h"
#include "core/build-table.h"
#include "core/mesh.h"
#include "shm/segment.h"
#include "handout/shard-table.h"
#include "codec/codec-record.h"
#include "state/state.h"

static int freed;
static void payload_free(void *p) {
        freed++;
        free(p);
}

/* ---- build table ------------------------------------------------------------------------ */

static void test_build_restore_keeps_ids_unique(void **state) {
        _cleanup_(build_table_freep) BuildTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *r = NULL;
        char id[BUILD_TABLE_ID_MAX];

        assert_int_equal(build_table_new(1, 1000, 0x0000abcd, &t), 0);

        /* Past both limits (1 build, 1000 bytes): a kept build exists already. */
        assert_int_equal(build_table_restore(t, "bld-0000abcd-7", 800, malloc(1), payload_free,
                                             NULL), 0);
        assert_int_equal(build_table_restore(t, "bld-12345678-3", 900, malloc(1), payload_free,
                                             &r), 0);
        assert_string_equal(r->id, "bld-12345678-3");
        build_record_unref(r);
        assert_int_equal(build_table_count(t), 2);
        assert_int_equal(build_table_bytes_in_use(t), 1700);

        /* The same id twice, or one familyd never gives: refused, payload left to the caller. */
        void *p = malloc(1);
        assert_int_equal(build_table_restore(t, "bld-0000abcd-7", 1, p, payload_free, NULL),
                         -EEXIST);
        assert_int_equal(build_table_restore(t, "bld-../etc", 1, p, payload_free, NULL), -EINVAL);
        assert_int_equal(build_table_restore(t, "mesh-0000abcd-1", 1, p, payload_free, NULL),
                         -EINVAL);
        free(p);

        /* This run's boot tag: the serial goes on after the kept one. */
        build_table_next_id(t, id);
        assert_string_equal(id, "bld-0000abcd-8");

        /* Over the limits now: new builds wait. */
        assert_int_equal(build_table_reserve(t, 0, &e), -EINVAL);
        assert_string_equal(e.reason, "BUILD_LIMIT");
        family_error_done(&e);

        /* Released, the bytes go back; an id drawn early commits under that id. */
        assert_int_equal(build_table_remove(t, "bld-0000abcd-7", &e), 0);
        assert_int_equal(build_table_remove(t, "bld-12345678-3", &e), 0);
        assert_int_equal(build_table_bytes_in_use(t), 0);
        assert_int_equal(build_table_reserve(t, 10, &e), 0);
        assert_int_equal(build_table_commit_id(t, id, 10, malloc(1), payload_free, &r), 0);
        assert_string_equal(r->id, "bld-0000abcd-8");
        build_record_unref(r);
        build_table_next_id(t, id);
        assert_string_equal(id, "bld-0000abcd-9");
}

/* ---- mesh table ------------------------------------------------------------------------- */

static Mesh *mesh_of(int64_t dp, int64_t tp) {
        MeshDim dims[] = { { (char *) "dp", dp }, { (char *) "tp", tp } };
        MeshSpec spec = { .device = { .dims = dims, .n = 2 } };
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;

        assert_int_equal(mesh_new(&spec, dp * tp, &m, &e), 0);
        return m;
}

typedef struct Hooks {
        int added, removed;
        bool fail;
} Hooks;

static int hook_added(const Mesh *m, void *userdata, FamilyError *ret_error) {
        Hooks *h = userdata;
        if (h->fail)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "FDSTORE_LIMIT", NULL, "no room for %s", m->id);
        h->added++;
        return 0;
}

static void hook_removed(const Mesh *m, void *userdata) {
        Hooks *h = userdata;
        h->removed++;
}

static void test_mesh_hooks_and_restore(void **state) {
        _cleanup_(mesh_table_freep) MeshTable *t = NULL;
        _cleanup_(mesh_unrefp) Mesh *a = mesh_of(2, 2), *b = mesh_of(1, 4), *c = mesh_of(4, 1);
        FamilyError e = FAMILY_ERROR_NULL;
        Hooks h = {};
        Mesh *got = NULL;

        assert_int_equal(mesh_table_new(2, &t), 0);
        mesh_table_set_hooks(t, &(MeshTableHooks) { hook_added, hook_removed, &h });

        assert_int_equal(mesh_table_add(t, a, &got, &e), 0);
        mesh_unref(got);
        assert_int_equal(h.added, 1);
        /* Found by id: nothing new to keep. */
        assert_int_equal(mesh_table_add(t, a, &got, &e), 0);
        mesh_unref(got);
        assert_int_equal(h.added, 1);

        /* A hook that fails: the mesh is not added, its error is the answer. */
        h.fail = true;
        assert_int_equal(mesh_table_add(t, b, &got, &e), -EINVAL);
        assert_string_equal(e.reason, "FDSTORE_LIMIT");
        family_error_done(&e);
        assert_int_equal(mesh_table_size(t), 1);
        h.fail = false;

        /* Restore: no hook, past the limit of 2, never twice. */
        assert_int_equal(mesh_table_restore(t, b, NULL), 0);
        assert_int_equal(mesh_table_restore(t, c, &got), 0);
        assert_ptr_equal(got, c);
        mesh_unref(got);
        assert_int_equal(mesh_table_restore(t, c, NULL), -EEXIST);
        assert_int_equal(mesh_table_size(t), 3);
        assert_int_equal(h.added, 1);

        assert_int_equal(mesh_table_remove(t, b->id, &e), 0);
        assert_int_equal(h.removed, 1);
        assert_int_equal(mesh_table_remove(t, b->id, &e), -EINVAL);
        family_error_done(&e);
        assert_int_equal(h.removed, 1);
}

/* ---- shard table ------------------------------------------------------------------------ */

static void test_shard_restore_keeps_tokens(void **state) {
        _cleanup_(shard_table_unrefp) ShardTable *t = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        ShardSegment *got = NULL;
        const char *tok = "0123456789abcdef0123456789abcdef";
        ShardToken fresh;

        assert_int_equal(shard_table_new(1, &t), 0);
        assert_int_equal(shard_segment_new_host("test-state", 4096, 0, &s), 0);

        assert_int_equal(shard_table_restore(t, "g1", s, tok), 0);
        /* Past the cap of 1: the descriptor is open already. */
        assert_int_equal(shard_table_restore(t, "g1", s, "ffffffffffffffffffffffffffffffff"), 0);
        assert_int_equal(shard_table_size(t), 2);
        assert_int_equal(shard_table_add(t, "g2", s, &fresh), SHARD_TABLE_FULL);

        assert_int_equal(shard_table_restore(t, "g2", s, tok), -EEXIST);
        assert_int_equal(shard_table_restore(t, "g2", s, "0123456789ABCDEF0123456789abcdef"),
                         -EINVAL);
        assert_int_equal(shard_table_restore(t, "g2", s, "0123"), -EINVAL);

        assert_int_equal(shard_table_lookup(t, tok, &got), 0);
        assert_ptr_equal(got, s);
        shard_segment_unref(got);
        assert_int_equal(shard_table_remove_group(t, "g1"), 2);
        assert_int_equal(shard_table_lookup(t, tok, &got), SHARD_TABLE_NOT_FOUND);
}

/* ---- records ---------------------------------------------------------------------------- */

static void test_crc32c(void **state) {
        /* The check value of CRC-32C (iSCSI, RFC 3720). */
        assert_int_equal(crc32c(0, "123456789", 9), 0xe3069283);
        assert_int_equal(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xe3069283);
}

static void put32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
               (uint32_t) p[3] << 24;
}

static void reseal(uint8_t *data, size_t size) {
        put32(data + 24, crc32c(crc32c(0, data, 24), data + 32, size - 32));
}

static void test_mesh_record_round_trip(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 4);
        _cleanup_free_ uint8_t *data = NULL;
        StateRecord rec = {};
        char why[256];
        size_t size;

        assert_int_equal(codec_record_encode_mesh(m, 1234567, &data, &size), 0);
        assert_memory_equal(data, "FAMILYDS", 8);
        assert_int_equal(codec_record_decode(data, size, &rec, why, sizeof why), 0);
        assert_int_equal(rec.kind, STATE_RECORD_MESH);
        assert_int_equal(rec.created_ns, 1234567);
        assert_string_equal(rec.id, m->id);
        assert_true(mesh_spec_equal(&rec.mesh->spec, &m->spec));
        assert_null(rec.build);
        codec_record_done(&rec);
}

static void expect_refused(uint8_t *data, size_t size, int error, const char *why_prefix) {
        StateRecord rec = {};
        char why[256];

        assert_int_equal(codec_record_decode(data, size, &rec, why, sizeof why), error);
        if (strncmp(why, why_prefix, strlen(why_prefix)) != 0)
                fail_msg("why: '%s', expected it to start with '%s'", why, why_prefix);
        assert_null(rec.id);
}

static void test_damaged_records_are_refused(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 4);
        _cleanup_free_ uint8_t *data = NULL;
        size_t size;

        assert_int_equal(codec_record_encode_mesh(m, 1, &data, &size), 0);
        _cleanup_free_ uint8_t *copy = malloc(size);
        assert_non_null(copy);

        expect_refused(data, 16, -EBADMSG, "not a familyd state record");
        expect_refused((uint8_t *) "garbage", 7, -EBADMSG, "not a familyd state record");

        memcpy(copy, data, size);
        copy[size - 1] ^= 0x40;
        expect_refused(copy, size, -EBADMSG, "checksum mismatch");

        expect_refused(data, size - 1, -EBADMSG, "the record is");

        /* Another version, or kind, with a right checksum: unknown, not damaged. */
        memcpy(copy, data, size);
        put32(copy + 8, 2);
        reseal(copy, size);
        expect_refused(copy, size, -EPROTONOSUPPORT, "record version 2, this familyd reads");
        memcpy(copy, data, size);
        put32(copy + 12, 9);
        reseal(copy, size);
        expect_refused(copy, size, -EPROTONOSUPPORT, "record kind 9 is unknown");

        /* A section longer than what is left. */
        memcpy(copy, data, size);
        put32(copy + 36, 1u << 20);
        reseal(copy, size);
        expect_refused(copy, size, -EBADMSG, "section 2 is cut off");

        /* A mesh whose content does not give its id: a changed dimension size. */
        memcpy(copy, data, size);
        uint8_t *p = memmem(copy + 40, size - 40, "tp", 2);
        assert_non_null(p);
        p[0] = 'x';
        reseal(copy, size);
        expect_refused(copy, size, -EBADMSG, "the mesh's content gives the id");

        /* A build record missing its sections. */
        memcpy(copy, data, size);
        put32(copy + 12, STATE_RECORD_BUILD);
        reseal(copy, size);
        expect_refused(copy, size, -EBADMSG, "a build record without");
}

/* A build of one parameter over a 2x2 mesh, ranks 0 and 3 materialised here, as its record
 * says it and as re-adoption reads it back. */
static void test_build_record_round_trip(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 2);
        const int64_t shape[] = { 4, 8 };
        const Placement place[] = {
                { .axis = (char *) "dp", .kind = PLACEMENT_SHARD, .dim = 0 },
                { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 1 },
        };
        const LayoutParameter param = { "w", shape, 2, place, 2 };
        const char *tok0 = "0123456789abcdef0123456789abcdef",
                   *tok3 = "fedcba9876543210fedcba9876543210",
                   *group = "00112233445566778899aabbccddeeff";
        FamilyError e = FAMILY_ERROR_NULL;
        Layout layout = {};
        _cleanup_free_ uint8_t *data = NULL;
        StateRecord rec = {};
        char why[256];
        size_t size;

        assert_int_equal(layout_compute(m, &param, 1, DTYPE_BFLOAT16, LAYOUT_MIN_ALIGN, &layout, &e), 0);
        BuildPlan plan = {
                .request = { .family = (char *) "attention" },
                .resolved = { .family = (char *) "attention",
                              .variant = (char *) "gqa",
                              .constructor = (char *) "Attention" },
                .origin = BUILD_ORIGIN_DIRECT,
                .mesh = m,
        };
        CodecBuildRank ranks[] = {
                { "n0", 0, CODEC_DEVICE_KIND_HOST, 0, tok0 },
                { "n0", 1, CODEC_DEVICE_KIND_HOST, 0, NULL },
                { "n1", 0, CODEC_DEVICE_KIND_HOST, 0, NULL },
                { "n1", 1, NULL, 0, tok3 },
        };
        CodecBuild b = { &plan, &layout, DTYPE_BFLOAT16, 42, group, ranks, ELEMENTSOF(ranks) };

        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, NULL, 0, 99, &data, &size), 0);
        assert_int_equal(codec_record_decode(data, size, &rec, why, sizeof why), 0);
        assert_int_equal(rec.kind, STATE_RECORD_BUILD);
        assert_int_equal(rec.created_ns, 99);
        assert_string_equal(rec.id, "bld-0000abcd-7");
        assert_non_null(rec.mesh);
        assert_string_equal(rec.mesh->id, m->id);

        const RecordBuild *rb = rec.build;
        assert_non_null(rb);
        assert_int_equal(rb->dtype, DTYPE_BFLOAT16);
        assert_int_equal(rb->seed, 42);
        assert_string_equal(rb->group, group);
        assert_string_equal(rb->plan.resolved.family, "attention");
        assert_string_equal(rb->plan.resolved.variant, "gqa");
        assert_null(rb->plan.mesh);
        assert_int_equal(rb->layout.n_ranks, 4);
        assert_int_equal(rb->layout.total_bytes, layout.total_bytes);
        assert_int_equal(rb->n_ranks, 4);
        assert_string_equal(rb->ranks[0].node, "n0");
        assert_string_equal(rb->ranks[0].token, tok0);
        assert_int_equal(rb->ranks[0].size_bytes, layout.ranks[0].size_bytes);
        assert_string_equal(rb->ranks[1].token, "");
        assert_int_equal(rb->ranks[1].size_bytes, 0);
        assert_string_equal(rb->ranks[3].node, "n1");
        assert_int_equal(rb->ranks[3].local_device, 1);
        assert_string_equal(rb->ranks[3].device_kind, CODEC_DEVICE_KIND_HOST);
        assert_string_equal(rb->ranks[3].token, tok3);
        assert_int_equal(rb->bytes, layout.ranks[0].size_bytes + layout.ranks[3].size_bytes);
        /* Without a replicas section (records written before replicas), every rank has its
         * own segment. */
        for (size_t i = 0; i < rb->n_ranks; i++)
                assert_false(rb->ranks[i].replica);
        /* no activation layout declared: none read back */
        assert_false(rb->plan.has_activations);
        codec_record_done(&rec);
        free(TAKE_PTR(data));


        /* A rank in GPU memory is never kept: its record is refused. */
        ranks[0].device_kind = CODEC_DEVICE_KIND_CUDA;
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, NULL, 0, 99, &data, &size), 0);
        expect_refused(data, size, -EBADMSG, "rank 0 is in GPU memory (cuda)");
        free(TAKE_PTR(data));
        ranks[0].device_kind = CODEC_DEVICE_KIND_HOST;

        /* Ids name files: only the ones familyd gives. */
        assert_int_equal(codec_record_encode_build("bld-../x", &b, NULL, 0, 99, &data, &size), 0);
        expect_refused(data, size, -EBADMSG, "the build's id is not one familyd gives");
        free(TAKE_PTR(data));

        /* A group that is not a token cannot be written. */
        b.group = "0011";
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, NULL, 0, 99, &data, &size),
                         -EINVAL);
        layout_done(&layout);
}

/* A (dp 2, tp 2) build of a tp-sharded parameter: the dp=1 ranks (indices 2 and 3) hold the
 * bytes of the dp=0 ones (0 and 1). The record's replicas section says so; the build's bytes
 * count each segment once; a section that does not hold together is refused. */
/* The family's activation layout is kept with the build and read back whole. */
static void test_build_record_activations(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 2);
        const int64_t shape[] = { 4, 8 };
        const Placement place[] = { { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 1 } };
        const LayoutParameter param = { "w", shape, 2, place, 1 };
        ActivationPlacement in[] = { { (char *) "tp", (char *) "shard", -1 } };
        ActivationPlacement out[] = { { (char *) "tp", (char *) "partial", 0 } };
        Activation in_act = { in, 1 }, out_act = { out, 1 };
        char *names[] = { (char *) "hidden" };
        FamilyError e = FAMILY_ERROR_NULL;
        _cleanup_(layout_done) Layout layout = {};
        _cleanup_free_ uint8_t *data = NULL;
        StateRecord rec = {};
        char why[256];
        size_t size;

        assert_int_equal(layout_compute(m, &param, 1, DTYPE_FLOAT32, LAYOUT_MIN_ALIGN, &layout, &e), 0);
        BuildPlan with = {
                .request = { .family = (char *) "attention" },
                .resolved = { .family = (char *) "attention", .variant = (char *) "gqa",
                              .constructor = (char *) "Attention" },
                .origin = BUILD_ORIGIN_DIRECT,
                .mesh = m,
                .has_activations = true,
                .activations = {
                        .lists = { &in_act, &in_act, &out_act, NULL },
                        .n_lists = { 1, 1, 1, 0 },
                        .out_names = names,
                        .n_out_names = 1,
                        .is_boundary = true,
                },
        };
        CodecBuildRank ranks[] = {
                { "n0", 0, CODEC_DEVICE_KIND_HOST, 0, NULL }, { "n0", 1, CODEC_DEVICE_KIND_HOST, 0, NULL },
                { "n1", 0, CODEC_DEVICE_KIND_HOST, 0, NULL }, { "n1", 1, CODEC_DEVICE_KIND_HOST, 0, NULL },
        };
        CodecBuild wb = { &with, &layout, DTYPE_FLOAT32, 42, "00112233445566778899aabbccddeeff", ranks, 4 };

        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &wb, NULL, 0, 99, &data, &size), 0);
        assert_int_equal(codec_record_decode(data, size, &rec, why, sizeof why), 0);
        const ActivationLayout *got = &rec.build->plan.activations;
        assert_true(rec.build->plan.has_activations);
        for (ActivationField f = 0; f < _ACTIVATION_FIELD_MAX; f++)
                assert_true(activation_layout_field_equal(got, &with.activations, f));
        assert_string_equal(got->lists[ACTIVATION_IN_SRC][0].placements[0].kind, "shard");
        assert_int_equal(got->lists[ACTIVATION_IN_SRC][0].placements[0].dim, -1);
        assert_int_equal(got->n_lists[ACTIVATION_OUT_DST], 0);
        codec_record_done(&rec);
}

static void test_build_record_replicas(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 2);
        const int64_t shape[] = { 4, 8 };
        const Placement place[] = {
                { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 1 },
        };
        const LayoutParameter param = { "w", shape, 2, place, 1 };
        const char *group = "00112233445566778899aabbccddeeff";
        FamilyError e = FAMILY_ERROR_NULL;
        Layout layout = {};
        _cleanup_free_ uint8_t *data = NULL;
        StateRecord rec = {};
        char why[256];
        size_t size;

        assert_int_equal(layout_compute(m, &param, 1, DTYPE_FLOAT32, LAYOUT_MIN_ALIGN, &layout, &e), 0);
        BuildPlan plan = {
                .request = { .family = (char *) "attention" },
                .resolved = { .family = (char *) "attention",
                              .variant = (char *) "gqa",
                              .constructor = (char *) "Attention" },
                .origin = BUILD_ORIGIN_DIRECT,
                .mesh = m,
        };
        CodecBuildRank ranks[] = {
                { "n0", 0, CODEC_DEVICE_KIND_HOST, 0, "00000000000000000000000000000000" },
                { "n0", 1, CODEC_DEVICE_KIND_HOST, 0, "11111111111111111111111111111111" },
                { "n0", 2, CODEC_DEVICE_KIND_HOST, 0, "22222222222222222222222222222222" },
                { "n0", 3, CODEC_DEVICE_KIND_HOST, 0, "33333333333333333333333333333333" },
        };
        CodecBuild b = { &plan, &layout, DTYPE_FLOAT32, 42, group, ranks, ELEMENTSOF(ranks) };
        RecordReplica replicas[] = { { 2, 0 }, { 3, 1 } };
        uint64_t one = layout.ranks[0].size_bytes;

        assert_true(one > 0);
        assert_int_equal(layout.ranks[1].size_bytes, one);
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, replicas, 2, 99, &data,
                                                   &size), 0);
        assert_int_equal(codec_record_decode(data, size, &rec, why, sizeof why), 0);
        const RecordBuild *rb = rec.build;
        assert_false(rb->ranks[0].replica);
        assert_false(rb->ranks[1].replica);
        assert_true(rb->ranks[2].replica);
        assert_int_equal(rb->ranks[2].primary, 0);
        assert_true(rb->ranks[3].replica);
        assert_int_equal(rb->ranks[3].primary, 1);
        /* Each rank keeps its token and size; the bytes held are two segments'. */
        assert_string_equal(rb->ranks[3].token, "33333333333333333333333333333333");
        assert_int_equal(rb->ranks[3].size_bytes, one);
        assert_int_equal(rb->bytes, 2 * one);
        codec_record_done(&rec);

        /* The section is the record's last: tag, length, then (rank, primary) pairs. */
        _cleanup_free_ uint8_t *copy = malloc(size);
        const uint8_t *sec = data + size - 24;
        assert_non_null(copy);
        assert_int_equal(get32(sec), 7);
        assert_int_equal(get32(sec + 4), 16);

        /* A replica of itself, of a later rank, out of order, of a replica, of a rank not
         * materialised here, of another size; a cut pair; a writable build. */
        static const uint32_t bad[][4] = {
                { 2, 2, 3, 1 }, { 2, 3, 3, 1 }, { 3, 1, 2, 0 }, { 2, 0, 3, 2 }, { 2, 0, 9, 1 },
        };
        for (size_t k = 0; k < ELEMENTSOF(bad); k++) {
                memcpy(copy, data, size);
                for (unsigned j = 0; j < 4; j++)
                        put32(copy + size - 16 + 4 * j, bad[k][j]);
                reseal(copy, size);
                expect_refused(copy, size, -EBADMSG, k == 3 ? "the build's rank at 3 cannot share"
                                                            : "the build's replica");
        }
        memcpy(copy, data, size);
        put32(copy + size - 20, 12);
        put32(copy + 16, (uint32_t) (size - 32 - 4));
        reseal(copy, size - 4);
        expect_refused(copy, size - 4, -EBADMSG, "the build's replicas section has 12 bytes");
        free(TAKE_PTR(data));

        ranks[1].token = NULL;
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, replicas, 2, 99, &data,
                                                   &size), 0);
        expect_refused(data, size, -EBADMSG, "the build's rank at 3 cannot share the segment "
                                             "of the rank at 1");
        free(TAKE_PTR(data));
        ranks[1].token = "11111111111111111111111111111111";

        b.writable = true;
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, replicas, 2, 99, &data,
                                                   &size), 0);
        expect_refused(data, size, -EBADMSG, "a writable build has replicas");
        free(TAKE_PTR(data));
        b.writable = false;

        /* The encoder writes only what holds together. */
        RecordReplica later[] = { { 2, 3 } }, order[] = { { 3, 1 }, { 2, 0 } },
                      outside[] = { { 4, 0 } };
        RecordReplica all[] = { { 1, 0 }, { 2, 0 }, { 3, 0 }, { 3, 0 } };
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, later, 1, 99, &data,
                                                   &size), -EINVAL);
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, order, 2, 99, &data,
                                                   &size), -EINVAL);
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, outside, 1, 99, &data,
                                                   &size), -EINVAL);
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, all, 4, 99, &data,
                                                   &size), -EINVAL);
        assert_int_equal(codec_record_encode_build("bld-0000abcd-7", &b, NULL, 1, 99, &data,
                                                   &size), -EINVAL);
        layout_done(&layout);
}

static bool dir_has(int dir_fd, const char *name) {
        return faccessat(dir_fd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

static void make_file(int dir_fd, const char *name, const char *text) {
        int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t) strlen(text));
        assert_int_equal(close(fd), 0);
}

/* The store in a state dir: a record after its descriptor, both taken over at the next start
 * (a half-written record removed, what is not the store's left alone), the record let go of
 * first, one familyd per dir. */
static void test_store_in_a_state_dir(void **state) {
        char dir[] = "/dev/shm/test-state-XXXXXX";
        State *s = NULL, *other = NULL;
        StateFds records = {}, segments = {};
        _cleanup_free_ uint8_t *data = NULL;
        size_t size = 0;
        struct statfs sf;

        if (statfs("/dev/shm", &sf) < 0 || (unsigned long) sf.f_type != TMPFS_MAGIC ||
            !mkdtemp(dir))
                skip();

        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &s), 0);
        assert_int_equal(state_mode(s), STATE_MODE_DIR);
        assert_string_equal(state_dir(s), dir);
        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &other), -EBUSY);

        int dir_fd = state_segment_dir(s);
        assert_true(dir_fd >= 0);
        make_file(dir_fd, "shard-bld-1-3", "shard bytes");
        int fd = openat(dir_fd, "shard-bld-1-3", O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        StateFd fds[] = { { (char *) "shard-bld-1-3", fd } };
        assert_int_equal(state_keep(s, "bld-1", (const uint8_t *) "a record", 8, fds, 1), 0);
        assert_int_equal(close(fd), 0);
        assert_true(dir_has(dir_fd, "meta-bld-1"));
        assert_false(dir_has(dir_fd, "meta-bld-1.tmp"));
        make_file(dir_fd, "meta-bld-2.tmp", "cut off");
        make_file(dir_fd, "not-ours", "left alone");
        s = state_free(s);

        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &s), 0);
        dir_fd = state_segment_dir(s);
        assert_int_equal(state_take_kept(s, &records, &segments), 0);
        assert_int_equal(records.n, 1);
        assert_string_equal(records.items[0].name, "meta-bld-1");
        assert_int_equal(segments.n, 1);
        assert_string_equal(segments.items[0].name, "shard-bld-1-3");
        assert_ptr_equal(state_fds_find(&segments, "shard-bld-1-3"), &segments.items[0]);
        assert_null(state_fds_find(&segments, "shard-bld-1-4"));
        assert_int_equal(state_read_record(records.items[0].fd, 64, &data, &size), 0);
        assert_int_equal(size, 8);
        assert_memory_equal(data, "a record", 8);
        assert_int_equal(state_read_record(records.items[0].fd, 4, &data, &size), -EFBIG);
        assert_false(dir_has(dir_fd, "meta-bld-2.tmp"));
        assert_true(dir_has(dir_fd, "not-ours"));
        state_fds_done(&records);
        state_fds_done(&segments);

        state_forget(s, "bld-1", 1);
        assert_false(dir_has(dir_fd, "meta-bld-1"));
        assert_true(dir_has(dir_fd, "shard-bld-1-3"));
        state_drop(s, "shard-bld-1-3");
        assert_false(dir_has(dir_fd, "shard-bld-1-3"));
        make_file(dir_fd, "shard-bld-4-0", "never kept");
        state_discard(s, "shard-bld-4-0");
        assert_false(dir_has(dir_fd, "shard-bld-4-0"));

        assert_int_equal(unlinkat(dir_fd, "not-ours", 0), 0);
        state_free(s);
        assert_int_equal(rmdir(dir), 0);
}

/* Without a state dir or a service manager nothing is kept, and nothing fails. */
static void test_store_without_a_place(void **state) {
        _cleanup_(state_freep) State *s = NULL;
        StateFds records = {}, segments = {};
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(state_new(&(StateParams) {}, &s), 0);
        assert_int_equal(state_mode(s), STATE_MODE_NONE);
        assert_int_equal(state_segment_dir(s), -1);
        assert_null(state_dir(s));
        assert_int_equal(state_reserve(s, 100000, "build", &e), 0);
        assert_int_equal(state_keep(s, "bld-1", (const uint8_t *) "x", 1, NULL, 0), 0);
        assert_int_equal(state_take_kept(s, &records, &segments), 0);
        assert_int_equal(records.n + segments.n, 0);
        assert_int_equal(state_mode(NULL), STATE_MODE_NONE);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_build_restore_keeps_ids_unique),
                cmocka_unit_test(test_mesh_hooks_and_restore),
                cmocka_unit_test(test_shard_restore_keeps_tokens),
                cmocka_unit_test(test_crc32c),
                cmocka_unit_test(test_mesh_record_round_trip),
                cmocka_unit_test(test_damaged_records_are_refused),
                cmocka_unit_test(test_build_record_round_trip),
                cmocka_unit_test(test_build_record_activations),
                cmocka_unit_test(test_build_record_replicas),
                cmocka_unit_test(test_store_in_a_state_dir),
                cmocka_unit_test(test_store_without_a_place),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
