/* test-build-share-key.c: build/build-share-key.c: which Builds are one build (the sharing key). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "build/build-private.h"

static int64_t w_shape[] = { 4, 6 };
static Placement w_placements[] = { { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 0 } };

/* A build of w (4, 6), sharded over tp of a dp=2 tp=2 mesh; ranks 0 and 1 materialised here. */
typedef struct Fixture {
        Mesh *mesh;
        PlanParameter parameter;
        BuildRankState ranks[4];
        BuildState b;
} Fixture;

static int setup(void **state) {
        MeshDim dims[2] = { { .name = (char *) "dp", .size = 2 },
                            { .name = (char *) "tp", .size = 2 } };
        MeshSpec spec = { .device = { .dims = dims, .n = 2 } };
        FamilyError e = FAMILY_ERROR_NULL;
        Fixture *f = calloc(1, sizeof *f);

        assert_non_null(f);
        assert_int_equal(mesh_new(&spec, 4, &f->mesh, &e), 0);
        f->parameter = (PlanParameter) { .name = (char *) "w", .shape = w_shape, .n_dims = 2,
                                         .n_elements = 24, .placements = w_placements,
                                         .n_placements = 1 };
        f->b.plan = (BuildPlan) { .mesh = f->mesh, .parameters = &f->parameter, .n_parameters = 1,
                                  .module_fqn = (char *) "model.Linear",
                                  .materialize = { .enabled = true } };
        f->b.dtype = DTYPE_FLOAT32;
        f->b.seed = 7;
        snprintf(f->b.registry_digest, sizeof f->b.registry_digest, "%s", "sha256:abc");
        assert_int_equal(build_compute_layout(&f->b, &e), 0);
        for (size_t k = 0; k < 4; k++)
                f->ranks[k] = (BuildRankState) {
                        .node = (char *) (k < 2 ? "a" : "b"), .local_device = (int32_t) (k % 2),
                        .device_kind = SHARD_SEGMENT_DEVICE_KIND_HOST, .materialized = k < 2,
                        .allocation_bytes = k < 2 ? 4096 : 0 };
        f->b.ranks = f->ranks;
        f->b.n_ranks = 4;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        layout_done(&f->b.layout);
        mesh_unref(f->mesh);
        free(f);
        return 0;
}

typedef struct Key {
        uint8_t *bytes;
        size_t size;
} Key;

static Key key_of(const BuildState *b, bool writable, uint32_t uid, bool share_group) {
        Key k = {};

        assert_int_equal(build_share_key(b, writable, uid, share_group, &k.bytes, &k.size), 0);
        assert_non_null(k.bytes);
        return k;
}

static bool key_equal(Key a, Key b) {
        return a.size == b.size && memcmp(a.bytes, b.bytes, a.size) == 0;
}

/* The key's tail after the packed Build message (its length first, 8 bytes). */
static void expect_tail(Key k, const char *tail, size_t tail_size) {
        uint64_t packed;

        assert_true(k.size > sizeof packed);
        memcpy(&packed, k.bytes, sizeof packed);
        assert_true(packed > 0);
        assert_int_equal(k.size, sizeof packed + packed + tail_size);
        assert_memory_equal(k.bytes + sizeof packed + packed, tail, tail_size);
}

#define EXPECT_TAIL(k, literal) expect_tail((k), (literal), sizeof(literal) - 1)

static void test_key_names_what_the_message_leaves_out(void **state) {
        Fixture *f = *state;
        char tail[512];
        int n;
        Key k = key_of(&f->b, false, 1000, false);

        n = snprintf(tail, sizeof tail,
                     "mesh=%s%cseed=7%cdtype=float32%cranks=1100%cwritable=0%cuid=1000%c"
                     "module=model.Linear%cregistry=sha256:abc%c",
                     f->mesh->id, 0, 0, 0, 0, 0, 0, 0, 0);
        assert_true(n > 0 && (size_t) n < sizeof tail);
        expect_tail(k, tail, (size_t) n);
        free(k.bytes);

        k = key_of(&f->b, true, 0, true);
        n = snprintf(tail, sizeof tail,
                     "mesh=%s%cseed=7%cdtype=float32%cranks=1100%cwritable=1%cuid=0 share=group%c"
                     "module=model.Linear%cregistry=sha256:abc%c",
                     f->mesh->id, 0, 0, 0, 0, 0, 0, 0, 0);
        expect_tail(k, tail, (size_t) n);
        free(k.bytes);
}

/* The same request is the same key; what tells two builds apart changes it; tokens and
 * allocation sizes (this daemon's, not the build's) do not. */
static void test_key_tells_builds_apart(void **state) {
        Fixture *f = *state;
        Key base = key_of(&f->b, false, 1000, false), k;

        k = key_of(&f->b, false, 1000, false);
        assert_true(key_equal(base, k));
        free(k.bytes);

        f->ranks[0].allocation_bytes = 8192;
        snprintf(f->ranks[0].token.hex, sizeof f->ranks[0].token.hex, "%s", "0123abcd");
        k = key_of(&f->b, false, 1000, false);
        assert_true(key_equal(base, k));
        free(k.bytes);

        /* Each of these is another build. */
        k = key_of(&f->b, false, 1001, false);
        assert_false(key_equal(base, k));
        free(k.bytes);
        k = key_of(&f->b, false, 1000, true);
        assert_false(key_equal(base, k));
        free(k.bytes);
        k = key_of(&f->b, true, 1000, false);
        assert_false(key_equal(base, k));
        free(k.bytes);
        f->b.seed = 8;
        k = key_of(&f->b, false, 1000, false);
        assert_false(key_equal(base, k));
        free(k.bytes);
        f->b.seed = 7;
        f->ranks[1].materialized = false;
        k = key_of(&f->b, false, 1000, false);
        assert_false(key_equal(base, k));
        free(k.bytes);
        f->ranks[1].materialized = true;
        f->ranks[3].node = (char *) "c"; /* the layout's placement is in the message */
        k = key_of(&f->b, false, 1000, false);
        assert_false(key_equal(base, k));
        free(k.bytes);
        f->ranks[3].node = (char *) "b";

        k = key_of(&f->b, false, 1000, false);
        assert_true(key_equal(base, k)); /* all back */
        free(k.bytes);
        free(base.bytes);
}

/* A Build from a checkpoint names its files and where in them; a replacement's init fields are
 * named exactly (an int is not the float of the same value, a float to its last bit). */
static void test_key_checkpoint_and_init_fields(void **state) {
        Fixture *f = *state;
        BuildCheckpoint none = {};
        Key k, k2;
        char tail[1024];
        int n;

        f->b.checkpoint = &none;
        memset(f->b.checkpoint_identity, 'e', BUILD_CHECKPOINT_ID_HEX);
        f->b.checkpoint_identity[BUILD_CHECKPOINT_ID_HEX] = 0;
        f->b.checkpoint_prefix = (char *) "model.";
        k = key_of(&f->b, false, 5, false);
        n = snprintf(tail, sizeof tail,
                     "mesh=%s%cseed=7%cdtype=float32%cranks=1100%cwritable=0%cuid=5%c"
                     "module=model.Linear%cregistry=sha256:abc%ccheckpoint=%s prefix=model. "
                     "names=registry%c",
                     f->mesh->id, 0, 0, 0, 0, 0, 0, 0, 0, f->b.checkpoint_identity, 0);
        expect_tail(k, tail, (size_t) n);
        f->b.checkpoint_by_parameter = true;
        k2 = key_of(&f->b, false, 5, false);
        assert_false(key_equal(k, k2));
        free(k.bytes);
        free(k2.bytes);
        f->b.checkpoint = NULL;
        f->b.checkpoint_by_parameter = false;
        f->b.checkpoint_prefix = NULL;

        NamedValue items[2] = {
                { .name = (char *) "n", .value = { .kind = VALUE_INT, .i = 3 } },
                { .name = (char *) "std", .value = { .kind = VALUE_FLOAT, .f = 0.5 } },
        };
        f->b.plan.init_fields = (ValueMap) { .items = items, .n = 2 };
        k = key_of(&f->b, false, 5, false);
        n = snprintf(tail, sizeof tail,
                     "mesh=%s%cseed=7%cdtype=float32%cranks=1100%cwritable=0%cuid=5%c"
                     "module=model.Linear%cregistry=sha256:abc%cinit_fields=n=3;std=0x1p-1;%c",
                     f->mesh->id, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        expect_tail(k, tail, (size_t) n);
        items[1].value.f = 0.5 + 0x1p-52;
        k2 = key_of(&f->b, false, 5, false);
        assert_false(key_equal(k, k2));
        free(k.bytes);
        free(k2.bytes);
        f->b.plan.init_fields = (ValueMap) {};
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_key_names_what_the_message_leaves_out,
                                                setup, teardown),
                cmocka_unit_test_setup_teardown(test_key_tells_builds_apart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_key_checkpoint_and_init_fields, setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
