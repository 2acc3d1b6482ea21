/* test-validate.c: the pure checks of Validate, with builds described in the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/validate.h"

static int64_t shape[] = { 8, 16, 16 };
static Placement shard0[] = { { .axis = (char *) "ep", .kind = PLACEMENT_SHARD, .dim = 0 } };
static Placement shard_neg[] = {
        { .axis = (char *) "dp", .kind = PLACEMENT_REPLICATE },
        { .axis = (char *) "ep", .kind = PLACEMENT_SHARD, .dim = -3 },
};
static Placement shard1[] = { { .axis = (char *) "ep", .kind = PLACEMENT_SHARD, .dim = 1 } };
static ValidateParameter built_params[] = {
        { .name = (char *) "w", .shape = shape, .n_dims = 3, .placements = shard0,
          .n_placements = 1 },
};
static int64_t mesh_sizes[] = { 1, 1, 4, 1 }, resolved_sizes[] = { 1, 1, 4, 1 };

static int lookup(const char *id, BuiltFamily *ret, void *userdata) {
        if (!streq(id, "b1"))
                return 1;
        *ret = (BuiltFamily) { .mesh_id = "m1", .mesh_axis_size = mesh_sizes,
                               .axis_size = resolved_sizes, .parameters = built_params,
                               .n_parameters = 1 };
        return 0;
}

static ValidateJob job_on_mesh(void) {
        ValidateJob j = { .mesh_id = "m1" };
        for (Axis a = 0; a < _AXIS_MAX; a++)
                j.size[a] = mesh_sizes[a];
        return j;
}

static void test_clean_and_placements_as_sets(void **state) {
        char *fqns[] = { (char *) "l0", (char *) "alias" };
        ValidateParameter applied = built_params[0];
        applied.placements = shard_neg;
        applied.n_placements = 2;
        ModelBoundary b[2] = {
                { .fqns = fqns, .n_fqns = 2, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .mesh_id = (char *) "m1", .parameters = &applied, .n_parameters = 1 } },
                { .fqns = fqns, .n_fqns = 1, .build_id = (char *) "b1" },
        };
        ValidateJob j = job_on_mesh();
        _cleanup_(violation_list_done) ViolationList v = {};

        assert_int_equal(validate_model(b, 2, NULL, 0, &j, lookup, NULL, &v), 0);
        assert_int_equal(v.n, 0);
}

static void test_all_kinds_in_order(void **state) {
        char *u[] = { (char *) "u" }, *a[] = { (char *) "a" }, *bb[] = { (char *) "b" };
        int64_t wide[] = { 8, 16, 32 };
        ValidateParameter good = built_params[0];
        ValidateParameter bad = { .name = (char *) "w", .shape = wide, .n_dims = 3,
                                  .placements = shard1, .n_placements = 1 };
        ModelBoundary b[3] = {
                { .fqns = u, .n_fqns = 1, .build_id = (char *) "gone" },
                { .fqns = a, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .parameters = &good, .n_parameters = 1 } },
                { .fqns = bb, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .mesh_id = (char *) "m2", .parameters = &bad, .n_parameters = 1 } },
        };
        ValidateJob j = { .mesh_id = "m2" };
        for (Axis x = 0; x < _AXIS_MAX; x++)
                j.size[x] = 1;
        j.has_size[AXIS_TP] = true;
        j.context_size[AXIS_TP] = 2;
        j.size[AXIS_CP] = 2;
        _cleanup_(violation_list_done) ViolationList v = {};

        assert_int_equal(validate_model(b, 3, NULL, 0, &j, lookup, NULL, &v), 0);
        const char *want[][2] = {
                { "UNKNOWN_BUILD", "build 'gone' not found" },
                { "MESH_MISMATCH", "context and mesh belong to different jobs" },
                { "CONTEXT_MESH_DISAGREE", "context and mesh disagree on tp_size" },
                { "AXIS_SIZE_MISMATCH", "family at ('a',) was constructed with cp=1, job "
                                        "requires 2; call prepare_model_components with the job "
                                        "context before layout" },
                { "AXIS_SIZE_MISMATCH", "family at ('a',) was constructed with ep=4, job "
                                        "requires 1; call prepare_model_components with the job "
                                        "context before layout" },
                { "MESH_MISMATCH", NULL },
                { "CONTEXT_MESH_DISAGREE", NULL },
                { "LAYOUT_MESH_MISMATCH",
                  "constructed families cannot be applied with a different job mesh" },
                { "AXIS_SIZE_MISMATCH", NULL },
                { "AXIS_SIZE_MISMATCH", NULL },
                { "SHARED_PARAMETER_SHAPE",
                  "shared family parameter 'w' has conflicting logical shapes" },
                { "LAYOUT_CONFLICT", "layout at 'b' conflicts with its constructed family layout" },
        };
        assert_int_equal(v.n, ELEMENTSOF(want));
        for (size_t i = 0; i < v.n; i++) {
                assert_string_equal(v.items[i].reason, want[i][0]);
                if (want[i][1])
                        assert_string_equal(v.items[i].message, want[i][1]);
        }
        assert_string_equal(v.items[0].fqns[0], "u");
        assert_string_equal(v.items[11].fqns[0], "b");
}

/* Shared shapes compare with the first shape seen, not any earlier one (as the original). */
static void test_shared_against_the_first(void **state) {
        char *f[] = { (char *) "x" };
        int64_t s2[] = { 8, 16, 32 };
        ValidateParameter p1 = built_params[0], p2 = built_params[0];
        p2.shape = s2;
        ModelBoundary b[3] = {
                { .fqns = f, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .parameters = &p1, .n_parameters = 1 } },
                { .fqns = f, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .parameters = &p2, .n_parameters = 1 } },
                { .fqns = f, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                  .layout = { .parameters = &p1, .n_parameters = 1 } },
        };
        ValidateJob j = job_on_mesh();
        _cleanup_(violation_list_done) ViolationList v = {};

        assert_int_equal(validate_model(b, 3, NULL, 0, &j, lookup, NULL, &v), 0);
        size_t shared = 0;
        for (size_t i = 0; i < v.n; i++)
                shared += streq(v.items[i].reason, "SHARED_PARAMETER_SHAPE");
        assert_int_equal(shared, 1);
}

/* A build whose parameters have their own dtypes: a float32 norm beside a bfloat16 matrix. */
static ValidateParameter mixed_params[] = {
        { .name = (char *) "w", .shape = shape, .n_dims = 3, .placements = shard0,
          .n_placements = 1, .dtype = (char *) "bfloat16" },
        { .name = (char *) "norm", .shape = shape, .n_dims = 1, .dtype = (char *) "float32" },
};

static int lookup_mixed(const char *id, BuiltFamily *ret, void *userdata) {
        *ret = (BuiltFamily) { .mesh_id = "m1", .mesh_axis_size = mesh_sizes,
                               .axis_size = resolved_sizes, .parameters = mixed_params,
                               .n_parameters = 2 };
        return 0;
}

/* Each applied dtype against that parameter's own dtype: aliases match, another dtype is a
 * LAYOUT_CONFLICT, an unstated one (applied or built) is not compared. */
static void test_dtype_per_parameter(void **state) {
        static const struct {
                const char *w, *norm;
                bool conflict;
        } cases[] = {
                { "bfloat16", "float32", false }, { "bf16", "fp32", false },
                { "", "", false },                { NULL, "f32", false },
                { "float32", "float32", true },   { "bfloat16", "bfloat16", true },
                { "bf16", "float16", true },      { "int8", "float32", true },
        };
        char *fqns[] = { (char *) "l0" };
        ValidateJob j = job_on_mesh();

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                ValidateParameter applied[2] = { mixed_params[0], mixed_params[1] };
                _cleanup_(violation_list_done) ViolationList v = {};
                applied[0].dtype = (char *) cases[i].w;
                applied[1].dtype = (char *) cases[i].norm;
                ModelBoundary b = { .fqns = fqns, .n_fqns = 1, .build_id = (char *) "b1",
                                    .has_layout = true,
                                    .layout = { .parameters = applied, .n_parameters = 2 } };

                assert_int_equal(validate_model(&b, 1, NULL, 0, &j, lookup_mixed, NULL, &v), 0);
                assert_int_equal(v.n, cases[i].conflict ? 1 : 0);
                if (cases[i].conflict) {
                        assert_string_equal(v.items[0].reason, "LAYOUT_CONFLICT");
                        assert_string_equal(v.items[0].message,
                                            "layout at 'l0' conflicts with its constructed family layout");
                }
        }

        /* a build that states no dtype (one described without them) compares none */
        ValidateParameter applied = built_params[0];
        applied.dtype = (char *) "float16";
        ModelBoundary b = { .fqns = fqns, .n_fqns = 1, .build_id = (char *) "b1", .has_layout = true,
                            .layout = { .parameters = &applied, .n_parameters = 1 } };
        _cleanup_(violation_list_done) ViolationList v = {};
        assert_int_equal(validate_model(&b, 1, NULL, 0, &j, lookup, NULL, &v), 0);
        assert_int_equal(v.n, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_clean_and_placements_as_sets),
                cmocka_unit_test(test_all_kinds_in_order),
                cmocka_unit_test(test_shared_against_the_first),
                cmocka_unit_test(test_dtype_per_parameter),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
