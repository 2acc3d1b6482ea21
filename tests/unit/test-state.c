/* test-state.c: what restart without loss rests on: the tables' restore entry points and the
 * state records' container (daemon/state/record.c). End to end: tests/integration/
 * test_state_dir.py and test_durability_fdstore.py. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/crc32c.h"
#include "core/build-table.h"
#include "core/mesh.h"
#include "shm/segment.h"
#include "shm/shard-table.h"
#include "state/record.h"

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

static void reseal(uint8_t *data, size_t size) {
        put32(data + 24, crc32c(crc32c(0, data, 24), data + 32, size - 32));
}

static void test_mesh_record_round_trip(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 4);
        _cleanup_free_ uint8_t *data = NULL;
        StateRecord rec = {};
        char why[256];
        size_t size;

        assert_int_equal(state_record_encode_mesh(m, 1234567, &data, &size), 0);
        assert_memory_equal(data, "FAMILYDS", 8);
        assert_int_equal(state_record_decode(data, size, &rec, why, sizeof why), 0);
        assert_int_equal(rec.kind, STATE_RECORD_MESH);
        assert_int_equal(rec.created_ns, 1234567);
        assert_string_equal(rec.id, m->id);
        assert_true(mesh_spec_equal(&rec.mesh->spec, &m->spec));
        assert_null(rec.build);
        state_record_done(&rec);
}

static void expect_refused(uint8_t *data, size_t size, int error, const char *why_prefix) {
        StateRecord rec = {};
        char why[256];

        assert_int_equal(state_record_decode(data, size, &rec, why, sizeof why), error);
        if (strncmp(why, why_prefix, strlen(why_prefix)) != 0)
                fail_msg("why: '%s', expected it to start with '%s'", why, why_prefix);
        assert_null(rec.id);
}

static void test_damaged_records_are_refused(void **state) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_of(2, 4);
        _cleanup_free_ uint8_t *data = NULL;
        size_t size;

        assert_int_equal(state_record_encode_mesh(m, 1, &data, &size), 0);
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_build_restore_keeps_ids_unique),
                cmocka_unit_test(test_mesh_hooks_and_restore),
                cmocka_unit_test(test_shard_restore_keeps_tokens),
                cmocka_unit_test(test_crc32c),
                cmocka_unit_test(test_mesh_record_round_trip),
                cmocka_unit_test(test_damaged_records_are_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
