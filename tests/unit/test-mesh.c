/* test-mesh.c: CreateMesh's checks and texts, content-derived ids, the mesh table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include <pthread.h>

#include "common/macro.h"
#include "core/mesh.h"
#include "core/resource-limits.h"

/* "dp=2 tp=4" -> a view; "" -> an empty view. Sizes may be negative ("tp=-1"). */
static MeshView view(const char *text) {
        MeshView v = {};
        _cleanup_free_ char *copy = strdup(text);
        char *save = NULL;

        assert_non_null(copy);
        v.dims = calloc(32, sizeof(MeshDim));
        assert_non_null(v.dims);
        for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                char *eq = strrchr(tok, '=');
                assert_non_null(eq);
                *eq = 0;
                v.dims[v.n].name = strdup(tok);
                v.dims[v.n].size = strtoll(eq + 1, NULL, 10);
                v.n++;
        }
        return v;
}

static MeshSpec spec(const char *device, const char *expert) {
        return (MeshSpec) { .device = view(device), .expert = view(expert) };
}

static void set_ranks(MeshSpec *s, const int64_t *ranks, size_t n) {
        free(s->ranks);
        s->ranks = calloc(n + 1, sizeof(int64_t));
        assert_non_null(s->ranks);
        memcpy(s->ranks, ranks, n * sizeof(int64_t));
        s->n_ranks = n;
}

static void declare(MeshSpec *s, Axis a, int64_t size) {
        s->has_size[a] = true;
        s->size[a] = size;
}

/* Asserts that CreateMesh refuses s with exactly this text, and writes no mesh. */
static void expect_invalid(MeshSpec *s, int64_t world_size, const char *message) {
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = (Mesh *) 0x1;

        assert_int_equal(mesh_new(s, world_size, &m, &e), -EINVAL);
        assert_ptr_equal(m, (Mesh *) 0x1);
        assert_int_equal(e.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(e.reason, "MESH_INVALID");
        assert_string_equal(e.message, message);
        family_error_done(&e);
        mesh_spec_done(s);
}

static Mesh *make(MeshSpec *s, int64_t world_size) {
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;

        int r = mesh_new(s, world_size, &m, &e);
        if (r < 0)
                fail_msg("mesh_new: %d %s", r, strempty(e.message));
        assert_false(family_error_is_set(&e));
        mesh_spec_done(s);
        return m;
}

static void test_ranks(void **state) {
        MeshSpec s;

        s = spec("tp=2", "");
        set_ranks(&s, (int64_t[]) { 7, 9 }, 2);
        expect_invalid(&s, 8, "rank 9 is not in the topology (world size 8)");

        s = spec("tp=2", "");
        set_ranks(&s, (int64_t[]) { -1, 0 }, 2);
        expect_invalid(&s, 8, "rank -1 is not in the topology (world size 8)");

        s = spec("tp=2", "");
        set_ranks(&s, (int64_t[]) { 0, 1 }, 2);
        expect_invalid(&s, 0, "rank 0 is not in the topology (world size 0)");

        s = spec("tp=4", "");
        set_ranks(&s, (int64_t[]) { 3, 1, 3, 0 }, 4);
        expect_invalid(&s, 8, "rank 3 appears twice");

        /* The duplicate whose second appearance comes first is named. */
        s = spec("tp=4", "");
        set_ranks(&s, (int64_t[]) { 1, 5, 5, 1 }, 4);
        expect_invalid(&s, 8, "rank 5 appears twice");

        s = spec("tp=4", "");
        set_ranks(&s, (int64_t[]) { 2, 2, 2, 2 }, 4);
        expect_invalid(&s, 8, "rank 2 appears twice");

        /* Every rank is range-checked before duplicates are looked for. */
        s = spec("tp=3", "");
        set_ranks(&s, (int64_t[]) { 3, 3, 9 }, 3);
        expect_invalid(&s, 8, "rank 9 is not in the topology (world size 8)");

        /* Ranks come before dimensions. */
        s = spec("", "");
        set_ranks(&s, (int64_t[]) { 8 }, 1);
        expect_invalid(&s, 8, "rank 8 is not in the topology (world size 8)");
}

static void test_dimensions(void **state) {
        MeshSpec s;

        s = spec("", "");
        expect_invalid(&s, 8, "device_mesh must have at least one dimension");

        s = spec("", "ep=8");
        expect_invalid(&s, 8, "device_mesh must have at least one dimension");

        s = spec("dp=2 =4", "");
        expect_invalid(&s, 8, "mesh dimension names must be non-empty");

        s = spec("tp=2 tp=4", "");
        expect_invalid(&s, 8, "duplicate mesh dimension 'tp'");

        s = spec("dp=1 tp=0", "");
        expect_invalid(&s, 8, "mesh dimension 'tp' must have a positive size");

        s = spec("tp=-4", "");
        expect_invalid(&s, 8, "mesh dimension 'tp' must have a positive size");

        /* Names are quoted as Python's repr does. */
        s = spec("it's=0", "");
        expect_invalid(&s, 8, "mesh dimension \"it's\" must have a positive size");

        /* Within a view each kind of problem is looked for over all dimensions in turn. */
        s = spec("tp=0 =2", "");
        expect_invalid(&s, 8, "mesh dimension names must be non-empty");
        s = spec("tp=0 dp=2 dp=4", "");
        expect_invalid(&s, 8, "duplicate mesh dimension 'dp'");

        /* The device view before the expert view. */
        s = spec("dp=0", "=8");
        expect_invalid(&s, 8, "mesh dimension 'dp' must have a positive size");
        s = spec("dp=8", "ep=4 =2");
        expect_invalid(&s, 8, "mesh dimension names must be non-empty");
        s = spec("dp=8", "ep=4 ep=2");
        expect_invalid(&s, 8, "duplicate mesh dimension 'ep'");
        s = spec("dp=8", "edp=2 ep=0");
        expect_invalid(&s, 8, "mesh dimension 'ep' must have a positive size");

        /* Dimensions before sizes. */
        s = spec("dp=3", "ep=0");
        expect_invalid(&s, 8, "mesh dimension 'ep' must have a positive size");

        /* One name may appear in both views. */
        Mesh *m;
        s = spec("dp=2 ep=4", "edp=2 ep=4");
        m = make(&s, 8);
        assert_int_equal(m->axis_size[AXIS_EP], 4);
        mesh_unref(m);
}

static void test_sizes(void **state) {
        MeshSpec s;

        s = spec("dp=2 tp=2", "");
        expect_invalid(&s, 8, "device_mesh size 4 does not match 8 ranks");

        s = spec("dp=8", "edp=2 ep=2");
        expect_invalid(&s, 8, "expert_mesh size 4 does not match 8 ranks");

        s = spec("tp=4", "");
        set_ranks(&s, (int64_t[]) { 4, 5 }, 2);
        expect_invalid(&s, 8, "device_mesh size 4 does not match 2 ranks");

        /* The device view's size before the expert view's. */
        s = spec("dp=4", "ep=2");
        expect_invalid(&s, 8, "device_mesh size 4 does not match 8 ranks");

        /* A product past int64 is an error, not undefined behaviour. */
        s = spec("a=4611686018427387904 b=4", "");
        expect_invalid(&s, 8, "device_mesh size overflows a 64-bit integer and does not match 8 ranks");
        s = spec("dp=8", "a=9223372036854775807 b=2 c=2");
        expect_invalid(&s, 8, "expert_mesh size overflows a 64-bit integer and does not match 8 ranks");
}

static void test_declared_sizes(void **state) {
        MeshSpec s;

        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_TP, 0);
        expect_invalid(&s, 8, "tp_size must be a positive integer");

        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_PP, -1);
        expect_invalid(&s, 8, "pp_size must be a positive integer");

        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_TP, 2);
        expect_invalid(&s, 8, "tp_size=2 disagrees with the mesh size 4");

        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_EP, 4);
        expect_invalid(&s, 8, "ep_size=4 requires an axis named 'ep'; available mesh axes: ('dp', 'tp')");

        s = spec("dp=8", "");
        declare(&s, AXIS_CP, 2);
        expect_invalid(&s, 8, "cp_size=2 requires an axis named 'cp'; available mesh axes: ('dp',)");

        /* ep is read from the expert view when there is one, even if the device view has ep. */
        s = spec("dp=4 ep=2", "edp=2 ep=4");
        declare(&s, AXIS_EP, 2);
        expect_invalid(&s, 8, "ep_size=2 disagrees with the mesh size 4");

        s = spec("dp=2 ep=4", "edp=8");
        declare(&s, AXIS_EP, 4);
        expect_invalid(&s, 8, "ep_size=4 requires an axis named 'ep'; available mesh axes: ('edp',)");

        /* Other axes are read from the device view, even if the expert view has them. */
        s = spec("dp=8", "tp=8");
        declare(&s, AXIS_TP, 8);
        expect_invalid(&s, 8, "tp_size=8 requires an axis named 'tp'; available mesh axes: ('dp',)");

        /* Axes in the order tp, cp, ep, pp. */
        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_EP, 4);
        declare(&s, AXIS_TP, 2);
        expect_invalid(&s, 8, "tp_size=2 disagrees with the mesh size 4");
        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_CP, 0);
        declare(&s, AXIS_EP, 4);
        expect_invalid(&s, 8, "cp_size must be a positive integer");

        /* pp is exempt from needing an axis; a size of 1 needs no axis; declared sizes stand. */
        Mesh *m;
        s = spec("dp=2 tp=4", "");
        declare(&s, AXIS_PP, 4);
        declare(&s, AXIS_CP, 1);
        declare(&s, AXIS_TP, 4);
        m = make(&s, 8);
        assert_int_equal(m->axis_size[AXIS_TP], 4);
        assert_int_equal(m->axis_size[AXIS_CP], 1);
        assert_int_equal(m->axis_size[AXIS_EP], 1);
        assert_int_equal(m->axis_size[AXIS_PP], 4);
        mesh_unref(m);
}

static void test_limits(void **state) {
        MeshSpec s;
        char buf[FAMILYD_MAX_MESH_DIMS * 8 + 8] = "";

        for (unsigned i = 0; i <= FAMILYD_MAX_MESH_DIMS; i++) {
                char d[16];
                snprintf(d, sizeof d, "d%u=1 ", i);
                strcat(buf, d);
        }
        s = spec("dp=8", buf);
        expect_invalid(&s, 8, "expert_mesh has 17 dimensions, more than the limit of 16");
        s = spec(buf, "");
        expect_invalid(&s, 8, "device_mesh has 17 dimensions, more than the limit of 16");

        s = spec("dp=2", "");
        expect_invalid(&s, (int64_t) FAMILYD_MAX_RANKS + 1, "mesh has 1048577 ranks, more than the limit of 1048576");

        _cleanup_free_ char *long_name = calloc(FAMILYD_MAX_NAME_LENGTH + 8, 1);
        assert_non_null(long_name);
        memset(long_name, 'x', FAMILYD_MAX_NAME_LENGTH + 1);
        strcat(long_name, "=8");
        s = spec(long_name, "");
        expect_invalid(&s, 8, "mesh dimension names must be at most 256 bytes long");

        /* Exactly at the limits is fine. */
        Mesh *m;
        memset(buf, 0, sizeof buf);
        for (unsigned i = 0; i < FAMILYD_MAX_MESH_DIMS; i++) {
                char d[16];
                snprintf(d, sizeof d, "d%u=1 ", i);
                strcat(buf, d);
        }
        s = spec(buf, "");
        m = make(&s, 1);
        assert_int_equal(m->spec.device.n, FAMILYD_MAX_MESH_DIMS);
        mesh_unref(m);
}

static void test_success(void **state) {
        MeshSpec s;
        Mesh *m;

        s = spec("dp=2 tp=4", "");
        m = make(&s, 8);
        assert_int_equal(m->spec.n_ranks, 8);
        for (size_t i = 0; i < 8; i++)
                assert_int_equal(m->spec.ranks[i], (int64_t) i);
        assert_int_equal(m->axis_size[AXIS_TP], 4);
        assert_int_equal(m->axis_size[AXIS_CP], 1);
        assert_int_equal(m->axis_size[AXIS_EP], 1);
        assert_int_equal(m->axis_size[AXIS_PP], 1);
        assert_int_equal(atomic_load(&m->n_ref), 1);
        assert_int_equal(atomic_load(&m->n_builds), 0);
        assert_ptr_equal(mesh_axis_view(m, AXIS_EP), &m->spec.device);
        assert_int_equal(mesh_view_dim_size(&m->spec.device, "tp"), 4);
        assert_int_equal(mesh_view_dim_size(&m->spec.device, "dp"), 2);
        assert_int_equal(mesh_view_dim_size(&m->spec.device, "ep"), 0);
        mesh_unref(m);

        s = spec("dp=8", "edp_shard=2 ep=4");
        m = make(&s, 8);
        assert_int_equal(m->axis_size[AXIS_EP], 4);
        assert_int_equal(m->axis_size[AXIS_TP], 1);
        assert_ptr_equal(mesh_axis_view(m, AXIS_EP), &m->spec.expert);
        assert_ptr_equal(mesh_axis_view(m, AXIS_TP), &m->spec.device);
        mesh_unref(m);

        s = spec("tp=4", "");
        set_ranks(&s, (int64_t[]) { 4, 5, 6, 7 }, 4);
        m = make(&s, 8);
        assert_int_equal(m->spec.n_ranks, 4);
        assert_int_equal(m->spec.ranks[0], 4);
        assert_int_equal(m->spec.ranks[3], 7);
        assert_int_equal(m->axis_size[AXIS_TP], 4);
        mesh_unref(m);
}

static char *id_of(MeshSpec *s, int64_t world_size) {
        Mesh *m = make(s, world_size);
        char *id = strdup(m->id);
        mesh_unref(m);
        return id;
}

static void test_ids(void **state) {
        MeshSpec s;

        /* Pinned: every daemon and every build derive the same id (checked with an independent
         * implementation of the serialisation and FNV-1a). */
        s = spec("dp=2 tp=4", "");
        _cleanup_free_ char *base = id_of(&s, 8);
        assert_string_equal(base, "mesh-def74d73aacb4d50");

        s = spec("dp=8", "edp_shard=2 ep=4");
        declare(&s, AXIS_EP, 4);
        s.sequence_parallel = true;
        set_ranks(&s, (int64_t[]) { 7, 6, 5, 4, 3, 2, 1, 0 }, 8);
        _cleanup_free_ char *other = id_of(&s, 8);
        assert_string_equal(other, "mesh-e7f55f9b978263c9");

        /* The same content, the same id; explicit ranks equal to the default are the default. */
        s = spec("dp=2 tp=4", "");
        _cleanup_free_ char *again = id_of(&s, 8);
        assert_string_equal(again, base);
        s = spec("dp=2 tp=4", "");
        set_ranks(&s, (int64_t[]) { 0, 1, 2, 3, 4, 5, 6, 7 }, 8);
        _cleanup_free_ char *explicit_ranks = id_of(&s, 8);
        assert_string_equal(explicit_ranks, base);

        /* Any change of content changes the id. */
        MeshSpec variants[12];
        size_t n = 0;
        variants[n++] = spec("dp=4 tp=2", "");
        variants[n++] = spec("tp=4 dp=2", "");
        variants[n++] = spec("dp=2 mp=4", "");
        variants[n++] = spec("dp=8", "");
        variants[n++] = spec("dp=2 tp=4", "edp=2 ep=4");
        variants[n] = spec("dp=2 tp=4", "");
        declare(&variants[n++], AXIS_TP, 4);
        variants[n] = spec("dp=2 tp=4", "");
        declare(&variants[n++], AXIS_PP, 1);
        variants[n] = spec("dp=2 tp=4", "");
        variants[n++].sequence_parallel = true;
        variants[n] = spec("dp=2 tp=4", "");
        variants[n++].loss_parallel = true;
        variants[n] = spec("dp=2 tp=4", "");
        set_ranks(&variants[n++], (int64_t[]) { 1, 0, 2, 3, 4, 5, 6, 7 }, 8);
        variants[n] = spec("dp=2 tp=4", "");
        set_ranks(&variants[n++], (int64_t[]) { 8, 9, 10, 11, 12, 13, 14, 15 }, 8);
        /* Length prefixes keep "d" "p2" apart from "dp" "2". */
        variants[n++] = spec("d=2 ptp=4", "");

        char *ids[12] = {};
        for (size_t i = 0; i < n; i++) {
                /* The world size is not content: explicit ranks may lie beyond 8. */
                ids[i] = id_of(&variants[i], variants[i].n_ranks > 0 ? 16 : 8);
                assert_int_equal(strlen(ids[i]), strlen("mesh-") + 16);
                assert_memory_equal(ids[i], "mesh-", 5);
                for (const char *p = ids[i] + 5; *p; p++)
                        assert_non_null(strchr("0123456789abcdef", *p));
                assert_string_not_equal(ids[i], base);
                for (size_t j = 0; j < i; j++)
                        assert_string_not_equal(ids[i], ids[j]);
        }
        for (size_t i = 0; i < n; i++)
                free(ids[i]);
}

static void test_spec_copy_equal(void **state) {
        _cleanup_(mesh_spec_done) MeshSpec s = spec("dp=2 tp=4", "edp=4 ep=2");
        _cleanup_(mesh_spec_done) MeshSpec c = {};

        declare(&s, AXIS_EP, 2);
        s.loss_parallel = true;
        set_ranks(&s, (int64_t[]) { 3, 2, 1, 0, 4, 5, 6, 7 }, 8);

        assert_int_equal(mesh_spec_copy(&s, &c), 0);
        assert_true(mesh_spec_equal(&s, &c));
        assert_ptr_not_equal(c.device.dims, s.device.dims);
        assert_ptr_not_equal(c.ranks, s.ranks);
        c.ranks[0] = 0;
        c.ranks[3] = 3;
        assert_false(mesh_spec_equal(&s, &c));
        c.ranks[0] = 3;
        c.ranks[3] = 0;
        c.expert.dims[1].size = 3;
        assert_false(mesh_spec_equal(&s, &c));

        mesh_spec_done(NULL);
}

static void test_refcount(void **state) {
        MeshSpec s = spec("dp=8", "");
        Mesh *m = make(&s, 8);

        assert_ptr_equal(mesh_ref(m), m);
        assert_int_equal(atomic_load(&m->n_ref), 2);
        assert_null(mesh_unref(m));
        assert_int_equal(atomic_load(&m->n_ref), 1);
        assert_null(mesh_unref(m));
        assert_null(mesh_unref(NULL));
        assert_null(mesh_ref(NULL));
}

static Mesh *make_simple(const char *device) {
        MeshSpec s = spec(device, "");
        return make(&s, 8);
}

static void expect_error(const FamilyError *e, FamilyStatus status, const char *reason, const char *message) {
        assert_int_equal(e->status, status);
        assert_string_equal(e->reason, reason);
        assert_string_equal(e->message, message);
}

static void test_table(void **state) {
        _cleanup_(mesh_table_freep) MeshTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *got = NULL, *got2 = NULL;

        assert_int_equal(mesh_table_new(2, &t), 0);
        assert_int_equal(mesh_table_size(t), 0);

        Mesh *a = make_simple("dp=2 tp=4"), *a2 = make_simple("dp=2 tp=4");
        Mesh *b = make_simple("dp=8"), *c = make_simple("tp=8");

        assert_int_equal(mesh_table_add(t, a, &got, &e), 0);
        assert_ptr_equal(got, a);
        mesh_unref(got);
        /* An equal definition gets the mesh already in the table. */
        assert_int_equal(mesh_table_add(t, a2, &got, &e), 0);
        assert_ptr_equal(got, a);
        mesh_unref(got);
        assert_int_equal(mesh_table_add(t, b, &got, &e), 0);
        mesh_unref(got);
        assert_int_equal(mesh_table_size(t), 2);

        got = (Mesh *) 0x1;
        assert_int_equal(mesh_table_add(t, c, &got, &e), -EINVAL);
        assert_ptr_equal(got, (Mesh *) 0x1);
        expect_error(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "MESH_LIMIT", "mesh limit reached: 2 meshes");
        family_error_done(&e);
        /* A full table still answers an existing definition. */
        assert_int_equal(mesh_table_add(t, a2, &got, &e), 0);
        assert_ptr_equal(got, a);
        mesh_unref(got);

        assert_int_equal(mesh_table_get(t, a->id, &got, &e), 0);
        assert_ptr_equal(got, a);
        mesh_unref(got);
        got = (Mesh *) 0x1;
        assert_int_equal(mesh_table_get(t, "no-such-mesh", &got, &e), -EINVAL);
        assert_ptr_equal(got, (Mesh *) 0x1);
        expect_error(&e, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh 'no-such-mesh' not found");
        family_error_done(&e);
        /* The same words for callers without a table (Resolve with meshes == NULL). */
        assert_int_equal(mesh_table_not_found("no-such-mesh", &e), -EINVAL);
        expect_error(&e, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh 'no-such-mesh' not found");
        assert_string_equal(e.field, "mesh_id");
        family_error_done(&e);
        assert_int_equal(mesh_table_not_found("it's", &e), -EINVAL);
        expect_error(&e, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh \"it's\" not found");
        family_error_done(&e);

        /* A mesh with live builds stays. */
        assert_int_equal(mesh_table_acquire(t, a->id, &got, &e), 0);
        assert_int_equal(mesh_table_acquire(t, a->id, &got2, &e), 0);
        assert_int_equal(atomic_load(&a->n_builds), 2);
        assert_int_equal(mesh_table_remove(t, a->id, &e), -EINVAL);
        char want[128];
        snprintf(want, sizeof want, "mesh '%s' is used by 2 builds", a->id);
        expect_error(&e, FAMILY_STATUS_FAILED_PRECONDITION, "MESH_IN_USE", want);
        family_error_done(&e);
        mesh_build_release(got2);
        mesh_unref(got2);
        assert_int_equal(mesh_table_remove(t, a->id, &e), -EINVAL);
        snprintf(want, sizeof want, "mesh '%s' is used by 1 builds", a->id);
        expect_error(&e, FAMILY_STATUS_FAILED_PRECONDITION, "MESH_IN_USE", want);
        family_error_done(&e);
        mesh_build_release(got);
        mesh_unref(got);

        assert_int_equal(mesh_table_acquire(t, "nope", &got, &e), -EINVAL);
        expect_error(&e, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh 'nope' not found");
        family_error_done(&e);

        /* A reference held outside the table survives removal. */
        assert_int_equal(mesh_table_get(t, a->id, &got, &e), 0);
        assert_int_equal(mesh_table_remove(t, a->id, &e), 0);
        assert_int_equal(mesh_table_size(t), 1);
        assert_int_equal(got->axis_size[AXIS_TP], 4);
        mesh_unref(got);

        assert_int_equal(mesh_table_remove(t, a->id, &e), -EINVAL);
        snprintf(want, sizeof want, "mesh '%s' not found", a->id);
        expect_error(&e, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", want);
        family_error_done(&e);

        /* Room again; creation order is kept. */
        assert_int_equal(mesh_table_add(t, c, &got, &e), 0);
        mesh_unref(got);
        Mesh **list = NULL;
        size_t n = 0;
        assert_int_equal(mesh_table_list(t, &list, &n), 0);
        assert_int_equal(n, 2);
        assert_ptr_equal(list[0], b);
        assert_ptr_equal(list[1], c);
        mesh_list_free(list, n);

        mesh_unref(a);
        mesh_unref(a2);
        mesh_unref(b);
        mesh_unref(c);
}

static void test_table_order_and_default_limit(void **state) {
        _cleanup_(mesh_table_freep) MeshTable *t = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        const char *defs[] = { "a=8", "b=8", "c=8", "d=8" };
        char *ids[4];

        assert_int_equal(mesh_table_new(0, &t), 0);
        for (size_t i = 0; i < ELEMENTSOF(defs); i++) {
                Mesh *m = make_simple(defs[i]), *got = NULL;
                assert_int_equal(mesh_table_add(t, m, &got, &e), 0);
                ids[i] = strdup(m->id);
                mesh_unref(got);
                mesh_unref(m);
        }
        assert_int_equal(mesh_table_remove(t, ids[1], &e), 0);

        Mesh **list = NULL;
        size_t n = 0;
        assert_int_equal(mesh_table_list(t, &list, &n), 0);
        assert_int_equal(n, 3);
        assert_string_equal(list[0]->id, ids[0]);
        assert_string_equal(list[1]->id, ids[2]);
        assert_string_equal(list[2]->id, ids[3]);
        mesh_list_free(list, n);
        for (size_t i = 0; i < ELEMENTSOF(ids); i++)
                free(ids[i]);

        /* 0 selects FAMILYD_MAX_MESHES. */
        for (unsigned i = 3; i < FAMILYD_MAX_MESHES; i++) {
                MeshSpec s = spec("dp=8", "");
                declare(&s, AXIS_PP, i + 1);
                Mesh *m = make(&s, 8), *got = NULL;
                assert_int_equal(mesh_table_add(t, m, &got, &e), 0);
                mesh_unref(got);
                mesh_unref(m);
        }
        assert_int_equal(mesh_table_size(t), FAMILYD_MAX_MESHES);
        Mesh *extra = make_simple("z=8"), *got = NULL;
        assert_int_equal(mesh_table_add(t, extra, &got, &e), -EINVAL);
        char want[64];
        snprintf(want, sizeof want, "mesh limit reached: %u meshes", FAMILYD_MAX_MESHES);
        expect_error(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "MESH_LIMIT", want);
        family_error_done(&e);
        mesh_unref(extra);

        mesh_list_free(NULL, 0);
        assert_null(mesh_table_free(NULL));
}

typedef struct Worker {
        MeshTable *table;
        unsigned seed;
        unsigned added;
} Worker;

/* Each worker adds the same 32 definitions and gets, lists and removes some concurrently. */
static void *worker_run(void *p) {
        Worker *w = p;

        for (unsigned round = 0; round < 4; round++)
                for (unsigned i = 0; i < 32; i++) {
                        FamilyError e = FAMILY_ERROR_NULL;
                        MeshSpec s = spec("dp=8", "");
                        Mesh *m = NULL, *got = NULL;
                        Mesh **list = NULL;
                        size_t n = 0;

                        declare(&s, AXIS_PP, i + 1);
                        if (mesh_new(&s, 8, &m, &e) < 0)
                                abort();
                        mesh_spec_done(&s);
                        if (mesh_table_add(w->table, m, &got, &e) < 0)
                                abort();
                        mesh_unref(got);
                        got = NULL;
                        /* Another worker may have removed it already. */
                        if (mesh_table_get(w->table, m->id, &got, &e) == 0)
                                mesh_unref(got);
                        if (mesh_table_list(w->table, &list, &n) < 0)
                                abort();
                        mesh_list_free(list, n);
                        if ((i + w->seed) % 7 == 0)
                                (void) mesh_table_remove(w->table, m->id, &e);
                        family_error_done(&e);
                        mesh_unref(m);
                        w->added++;
                }
        return NULL;
}

static void test_table_threads(void **state) {
        _cleanup_(mesh_table_freep) MeshTable *t = NULL;
        pthread_t threads[8];
        Worker workers[8];

        assert_int_equal(mesh_table_new(64, &t), 0);
        for (size_t i = 0; i < ELEMENTSOF(threads); i++) {
                workers[i] = (Worker) { .table = t, .seed = (unsigned) i };
                assert_int_equal(pthread_create(&threads[i], NULL, worker_run, &workers[i]), 0);
        }
        for (size_t i = 0; i < ELEMENTSOF(threads); i++) {
                assert_int_equal(pthread_join(threads[i], NULL), 0);
                assert_int_equal(workers[i].added, 128);
        }
        assert_true(mesh_table_size(t) <= 32);

        /* Ids stay unique in the table. */
        Mesh **list = NULL;
        size_t n = 0;
        assert_int_equal(mesh_table_list(t, &list, &n), 0);
        for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < i; j++)
                        assert_string_not_equal(list[i]->id, list[j]->id);
        mesh_list_free(list, n);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ranks),
                cmocka_unit_test(test_dimensions),
                cmocka_unit_test(test_sizes),
                cmocka_unit_test(test_declared_sizes),
                cmocka_unit_test(test_limits),
                cmocka_unit_test(test_success),
                cmocka_unit_test(test_ids),
                cmocka_unit_test(test_spec_copy_equal),
                cmocka_unit_test(test_refcount),
                cmocka_unit_test(test_table),
                cmocka_unit_test(test_table_order_and_default_limit),
                cmocka_unit_test(test_table_threads),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
