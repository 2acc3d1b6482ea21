/* test-validate.c: the pure checks of Validate, with builds described in the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "core/resource-limits.h"
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
                                        "requires 2; build it again on the job's mesh "
                                        "(familyd.torch.build_module with mesh=)" },
                { "AXIS_SIZE_MISMATCH", "family at ('a',) was constructed with ep=4, job "
                                        "requires 1; build it again on the job's mesh "
                                        "(familyd.torch.build_module with mesh=)" },
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

/* Builds for shared parameters: an embedding "emb" and a head "head" whose parameters differ
 * from emb's weight in one way each. */
static int64_t emb_shape[] = { 32, 8 }, head_t_shape[] = { 8, 32 };
static Placement tp0[] = { { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 0 } };
static Placement tp0_as_set[] = {
        { .axis = (char *) "dp", .kind = PLACEMENT_REPLICATE },
        { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = -2 },
};
static Placement tp1_cp0[] = {
        { .axis = (char *) "tp", .kind = PLACEMENT_SHARD, .dim = 1 },
        { .axis = (char *) "cp", .kind = PLACEMENT_SHARD, .dim = 0 },
};
static ValidateParameter emb_params[] = {
        { .name = (char *) "weight", .shape = emb_shape, .n_dims = 2, .placements = tp0,
          .n_placements = 1, .dtype = (char *) "bfloat16" },
};
static ValidateParameter head_params[] = {
        { .name = (char *) "weight", .shape = emb_shape, .n_dims = 2, .placements = tp0_as_set,
          .n_placements = 2, .dtype = (char *) "bf16" },
        { .name = (char *) "transposed", .shape = head_t_shape, .n_dims = 2, .placements = tp0,
          .n_placements = 1, .dtype = (char *) "bfloat16" },
        { .name = (char *) "placed", .shape = emb_shape, .n_dims = 2, .placements = tp1_cp0,
          .n_placements = 2, .dtype = (char *) "bfloat16" },
        { .name = (char *) "replicated", .shape = emb_shape, .n_dims = 2,
          .dtype = (char *) "bfloat16" },
        { .name = (char *) "fp32", .shape = emb_shape, .n_dims = 2, .placements = tp0,
          .n_placements = 1, .dtype = (char *) "float32" },
        { .name = (char *) "all", .shape = head_t_shape, .n_dims = 2, .placements = tp1_cp0,
          .n_placements = 2, .dtype = (char *) "float32" },
        { .name = (char *) "undeclared", .shape = emb_shape, .n_dims = 2, .placements = tp0,
          .n_placements = 1 },
};

static int lookup_tied(const char *id, BuiltFamily *ret, void *userdata) {
        if (streq(id, "emb"))
                *ret = (BuiltFamily) { .axis_size = resolved_sizes, .parameters = emb_params,
                                       .n_parameters = ELEMENTSOF(emb_params) };
        else if (streq(id, "head"))
                *ret = (BuiltFamily) { .axis_size = resolved_sizes, .parameters = head_params,
                                       .n_parameters = ELEMENTSOF(head_params) };
        else
                return 1;
        return 0;
}

static ValidateJob job_plain(void) {
        ValidateJob j = {};
        for (Axis a = 0; a < _AXIS_MAX; a++)
                j.size[a] = resolved_sizes[a];
        return j;
}

#define USE(f, b, p) { .fqn = (char *) (f), .build_id = (char *) (b), .parameter = (char *) (p) }

/* Equal shape, placements as sets (replicate dropped, dim normalised), dtype by alias: ok. */
static void test_tied_equal(void **state) {
        SharedParameterUse uses[] = { USE("embed.weight", "emb", "weight"),
                                      USE("head.weight", "head", "weight"),
                                      USE("again.weight", "emb", "weight"),
                                      USE("loose.weight", "head", "undeclared") };
        SharedParameter s = { .uses = uses, .n_uses = ELEMENTSOF(uses) };
        ValidateJob j = job_plain();
        _cleanup_(violation_list_done) ViolationList v = {};
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(validate_shared_check(&s, 1, &e), 0);
        assert_false(family_error_is_set(&e));
        assert_int_equal(validate_model(NULL, 0, &s, 1, &j, lookup_tied, NULL, &v), 0);
        assert_int_equal(v.n, 0);
}

static void assert_violation(const Violation *v, const char *message, const char *fqn0,
                             const char *fqn1) {
        assert_string_equal(v->reason, "SHARED_PARAMETER_CONFLICT");
        assert_string_equal(v->message, message);
        assert_int_equal(v->n_fqns, fqn1 ? 2 : 1);
        assert_string_equal(v->fqns[0], fqn0);
        if (fqn1)
                assert_string_equal(v->fqns[1], fqn1);
}

/* Every message, each use against the first (not the one before), shared parameters after
 * every boundary and in request order; an unknown first use once, the rest skipped. */
static void test_tied_every_message_in_order(void **state) {
        SharedParameterUse a[] = {
                USE("embed.weight", "emb", "weight"),   USE("h.transposed", "head", "transposed"),
                USE("h.placed", "head", "placed"),      USE("h.replicated", "head", "replicated"),
                USE("h.fp32", "head", "fp32"),          USE("h.gone", "gone", "weight"),
                USE("h.nope", "head", "nope"),          USE("h.weight", "head", "weight"),
                USE("h.all", "head", "all"),
        };
        SharedParameterUse b[] = { USE("x.weight", "gone", "weight"), USE("y", "emb", "nope") };
        SharedParameterUse c[] = { USE("z.weight", "emb", "nope"), USE("w", "gone", "weight") };
        SharedParameter s[] = { { a, ELEMENTSOF(a) }, { b, 2 }, { c, 2 } };
        char *u[] = { (char *) "u" };
        ModelBoundary boundary = { .fqns = u, .n_fqns = 1, .build_id = (char *) "gone" };
        ValidateJob j = job_plain();
        _cleanup_(violation_list_done) ViolationList v = {};

        assert_int_equal(validate_model(&boundary, 1, s, 3, &j, lookup_tied, NULL, &v), 0);
        assert_int_equal(v.n, 12);
        assert_string_equal(v.items[0].reason, "UNKNOWN_BUILD");
        assert_violation(&v.items[1],
                         "shared parameter 'h.transposed' has shape [8, 32] but 'embed.weight' "
                         "has [32, 8]", "embed.weight", "h.transposed");
        assert_violation(&v.items[2],
                         "shared parameter 'h.placed' has placements [('tp', 1), ('cp', 0)] but "
                         "'embed.weight' has [('tp', 0)]", "embed.weight", "h.placed");
        assert_violation(&v.items[3],
                         "shared parameter 'h.replicated' has placements [] but 'embed.weight' "
                         "has [('tp', 0)]", "embed.weight", "h.replicated");
        assert_violation(&v.items[4],
                         "shared parameter 'h.fp32' has dtype 'float32' but 'embed.weight' has "
                         "'bfloat16'", "embed.weight", "h.fp32");
        assert_violation(&v.items[5],
                         "shared parameter 'h.gone' is in build 'gone', which is not found",
                         "embed.weight", "h.gone");
        assert_violation(&v.items[6],
                         "shared parameter 'h.nope' is not a parameter 'nope' of build 'head'",
                         "embed.weight", "h.nope");
        /* h.weight equals the first: nothing. h.all differs in all three, in order. */
        assert_violation(&v.items[7],
                         "shared parameter 'h.all' has shape [8, 32] but 'embed.weight' has "
                         "[32, 8]", "embed.weight", "h.all");
        assert_violation(&v.items[8],
                         "shared parameter 'h.all' has placements [('tp', 1), ('cp', 0)] but "
                         "'embed.weight' has [('tp', 0)]", "embed.weight", "h.all");
        assert_violation(&v.items[9],
                         "shared parameter 'h.all' has dtype 'float32' but 'embed.weight' has "
                         "'bfloat16'", "embed.weight", "h.all");
        assert_violation(&v.items[10],
                         "shared parameter 'x.weight' is in build 'gone', which is not found",
                         "x.weight", NULL);
        assert_violation(&v.items[11],
                         "shared parameter 'z.weight' is not a parameter 'nope' of build 'emb'",
                         "z.weight", NULL);
}

/* A dtype either build leaves unstated is not compared; later uses compare with the first
 * even when an earlier one differed. */
static void test_tied_against_the_first(void **state) {
        SharedParameterUse uses[] = { USE("a", "head", "undeclared"), USE("b", "head", "fp32"),
                                      USE("c", "head", "transposed"), USE("d", "emb", "weight") };
        SharedParameter s = { .uses = uses, .n_uses = ELEMENTSOF(uses) };
        ValidateJob j = job_plain();
        _cleanup_(violation_list_done) ViolationList v = {};

        assert_int_equal(validate_model(NULL, 0, &s, 1, &j, lookup_tied, NULL, &v), 0);
        assert_int_equal(v.n, 1);
        assert_violation(&v.items[0], "shared parameter 'c' has shape [8, 32] but 'a' has [32, 8]",
                         "a", "c");
}

/* A lookup that states its parameters sorted is searched by bisection: every name found,
 * names before, between and after them not; applied layouts use the same search. */
static ValidateParameter sorted_params[] = {
        { .name = (char *) "a", .shape = emb_shape, .n_dims = 2 },
        { .name = (char *) "c", .shape = emb_shape, .n_dims = 2 },
        { .name = (char *) "e", .shape = emb_shape, .n_dims = 2 },
        { .name = (char *) "g", .shape = emb_shape, .n_dims = 2 },
        { .name = (char *) "i", .shape = emb_shape, .n_dims = 2 },
};

static int lookup_sorted(const char *id, BuiltFamily *ret, void *userdata) {
        *ret = (BuiltFamily) { .axis_size = resolved_sizes, .parameters = sorted_params,
                               .n_parameters = ELEMENTSOF(sorted_params), .sorted = true };
        return 0;
}

static void test_tied_sorted_lookup(void **state) {
        static const char *found[] = { "a", "c", "e", "g", "i" };
        static const char *missing[] = { "", "0", "b", "d", "f", "h", "j", "aa" };
        ValidateJob j = job_plain();

        for (size_t i = 0; i < ELEMENTSOF(found); i++) {
                SharedParameterUse uses[] = { USE("x", "s", "a"), USE("y", "s", found[i]) };
                SharedParameter s = { uses, 2 };
                _cleanup_(violation_list_done) ViolationList v = {};
                assert_int_equal(validate_model(NULL, 0, &s, 1, &j, lookup_sorted, NULL, &v), 0);
                assert_int_equal(v.n, 0);
        }
        for (size_t i = 0; i < ELEMENTSOF(missing); i++) {
                SharedParameterUse uses[] = { USE("x", "s", "a"), USE("y", "s", missing[i]) };
                SharedParameter s = { uses, 2 };
                ValidateParameter applied = sorted_params[0];
                applied.name = (char *) missing[i];
                char *fqns[] = { (char *) "m" };
                ModelBoundary b = { .fqns = fqns, .n_fqns = 1, .build_id = (char *) "s",
                                    .has_layout = true,
                                    .layout = { .parameters = &applied, .n_parameters = 1 } };
                _cleanup_(violation_list_done) ViolationList v = {};
                assert_int_equal(validate_model(&b, 1, &s, 1, &j, lookup_sorted, NULL, &v), 0);
                assert_int_equal(v.n, 2);
                assert_string_equal(v.items[0].reason, "LAYOUT_CONFLICT");
                assert_string_equal(v.items[1].reason, "SHARED_PARAMETER_CONFLICT");
        }
}

static void assert_malformed(const SharedParameter *s, size_t n, const char *reason,
                             const char *field, const char *message) {
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(validate_shared_check(s, n, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(e.reason, reason);
        assert_string_equal(e.field, field);
        assert_string_equal(e.message, message);
        family_error_done(&e);
}

static void assert_well_formed(const SharedParameter *s, size_t n) {
        FamilyError e = FAMILY_ERROR_NULL;
        assert_int_equal(validate_shared_check(s, n, &e), 0);
        assert_false(family_error_is_set(&e));
}

/* The limits and required fields, each at its bound and one past it, first problem first. */
static void test_tied_malformed(void **state) {
        SharedParameterUse many[FAMILYD_MAX_SHARED_PARAMETER_USES + 1];
        for (size_t i = 0; i < ELEMENTSOF(many); i++)
                many[i] = (SharedParameterUse) USE("f", "emb", "weight");
        _cleanup_free_ SharedParameter *lots = calloc(FAMILYD_MAX_SHARED_PARAMETERS + 1,
                                                       sizeof(SharedParameter));
        assert_non_null(lots);
        for (size_t i = 0; i <= FAMILYD_MAX_SHARED_PARAMETERS; i++)
                lots[i] = (SharedParameter) { many, 2 };

        assert_well_formed(lots, FAMILYD_MAX_SHARED_PARAMETERS);
        assert_malformed(lots, FAMILYD_MAX_SHARED_PARAMETERS + 1, "LIMIT", "shared_parameters",
                         "shared_parameters has more than 4096 entries");
        assert_well_formed(&(SharedParameter) { many, FAMILYD_MAX_SHARED_PARAMETER_USES }, 1);
        assert_malformed(&(SharedParameter) { many, FAMILYD_MAX_SHARED_PARAMETER_USES + 1 }, 1,
                         "LIMIT", "shared_parameters.uses",
                         "a shared parameter has more than 64 uses");
        assert_malformed(&(SharedParameter) { many, 1 }, 1, "BAD_REQUEST",
                         "shared_parameters.uses", "a shared parameter has fewer than two uses");
        assert_malformed(&(SharedParameter) { NULL, 0 }, 1, "BAD_REQUEST",
                         "shared_parameters.uses", "a shared parameter has fewer than two uses");

        char fqn[1026], id[258];
        memset(fqn, 'f', sizeof(fqn) - 1);
        memset(id, 'i', sizeof(id) - 1);
        fqn[1024] = id[256] = 0;
        SharedParameterUse at_limit[] = { USE(fqn, id, id), USE("f", "emb", "weight") };
        assert_well_formed(&(SharedParameter) { at_limit, 2 }, 1);
        fqn[1024] = 'f';
        fqn[1025] = 0;
        id[256] = 'i';
        id[257] = 0;
        static const struct {
                const char *fqn, *build_id, *parameter, *reason, *field, *message;
        } cases[] = {
                { "", "emb", "weight", "BAD_REQUEST", "shared_parameters.uses.fqn",
                  "shared_parameters.uses.fqn is required" },
                { "f", "", "weight", "BAD_REQUEST", "shared_parameters.uses.build_id",
                  "shared_parameters.uses.build_id is required" },
                { "f", "emb", NULL, "BAD_REQUEST", "shared_parameters.uses.parameter",
                  "shared_parameters.uses.parameter is required" },
                { NULL, "", "", "BAD_REQUEST", "shared_parameters.uses.fqn",
                  "shared_parameters.uses.fqn is required" },
                { "long", "emb", "weight", "LIMIT", "shared_parameters.uses.fqn",
                  "shared_parameters.uses.fqn is longer than 1024 bytes" },
                { "f", "long", "weight", "LIMIT", "shared_parameters.uses.build_id",
                  "shared_parameters.uses.build_id is longer than 256 bytes" },
                { "f", "emb", "long", "LIMIT", "shared_parameters.uses.parameter",
                  "shared_parameters.uses.parameter is longer than 256 bytes" },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                SharedParameterUse bad = {
                        .fqn = (char *) (streq_ptr(cases[i].fqn, "long") ? fqn : cases[i].fqn),
                        .build_id = (char *) (streq_ptr(cases[i].build_id, "long")
                                                      ? id : cases[i].build_id),
                        .parameter = (char *) (streq_ptr(cases[i].parameter, "long")
                                                       ? id : cases[i].parameter),
                };
                /* the bad use second, in the second shared parameter, after a well-formed one;
                 * a later problem (one use) does not hide it */
                SharedParameterUse uses[] = { USE("f", "emb", "weight"), bad };
                SharedParameter s[] = { { many, 2 }, { uses, 2 }, { many, 1 } };
                assert_malformed(s, 3, cases[i].reason, cases[i].field, cases[i].message);
        }
}

/* The activation layout a model applies, against the constructed family's, field by field. */
static ActivationPlacement tp_replicate[] = { { .axis = (char *) "tp", .kind = (char *) "replicate" } };
static ActivationPlacement tp_partial[] = { { .axis = (char *) "tp", .kind = (char *) "partial" } };
static ActivationPlacement seq[] = {
        { .axis = (char *) "tp", .kind = (char *) "shard", .dim = 1 },
        { .axis = (char *) "dp", .kind = (char *) "replicate" },
};
static ActivationPlacement seq_reordered[] = {
        { .axis = (char *) "dp", .kind = (char *) "replicate" },
        { .axis = (char *) "tp", .kind = (char *) "shard", .dim = 1 },
};
static ActivationPlacement seq_other_dim[] = {
        { .axis = (char *) "tp", .kind = (char *) "shard", .dim = 0 },
        { .axis = (char *) "dp", .kind = (char *) "replicate" },
};
static Activation act_replicate = { tp_replicate, 1 }, act_partial = { tp_partial, 1 }, act_seq = { seq, 2 },
                  act_seq_reordered = { seq_reordered, 2 }, act_seq_other = { seq_other_dim, 2 };
static char *names_h[] = { (char *) "hidden" }, *names_y[] = { (char *) "y" };

static ActivationLayout constructed(void) {
        return (ActivationLayout) {
                .lists = { &act_seq, &act_replicate, &act_partial, &act_seq },
                .n_lists = { 1, 1, 1, 1 },
                .out_names = names_h,
                .n_out_names = 1,
                .is_boundary = true,
        };
}

static ActivationLayout built_activations;

static int lookup_act(const char *id, BuiltFamily *ret, void *userdata) {
        int r = lookup(id, ret, userdata);
        if (r == 0 && streq(id, "b1"))
                ret->activations = userdata ? &built_activations : NULL;
        return r;
}

static void expect_activation_violations(const ActivationLayout *applied, bool declared, const char *const *want) {
        char *fqns[] = { (char *) "layers.0.mlp", (char *) "alias" };
        ModelBoundary b = { .fqns = fqns, .n_fqns = 2, .build_id = (char *) "b1", .has_layout = true,
                            .layout = { .mesh_id = (char *) "m1", .parameters = built_params,
                                        .n_parameters = 1, .has_activations = true,
                                        .activations = *applied } };
        ValidateJob j = job_on_mesh();
        _cleanup_(violation_list_done) ViolationList v = {};
        size_t n = 0;

        built_activations = constructed();
        assert_int_equal(validate_model(&b, 1, NULL, 0, &j, lookup_act, declared ? (void *) 1 : NULL, &v), 0);
        while (want[n])
                n++;
        if (v.n != n)
                for (size_t i = 0; i < v.n; i++)
                        print_message("violation %zu: %s %s\n", i, v.items[i].reason, v.items[i].message);
        assert_int_equal(v.n, n);
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ char *msg = NULL;
                assert_true(asprintf(&msg, "%s at 'layers.0.mlp' conflicts with its constructed family layout",
                                     want[i]) > 0);
                assert_string_equal(v.items[i].reason, "ACTIVATION_LAYOUT_CONFLICT");
                assert_string_equal(v.items[i].message, msg);
                assert_int_equal(v.items[i].n_fqns, 2);
        }
}

static void test_activation_layout(void **state) {
        ActivationLayout a = constructed();

        /* the same, placements in another axis order: nothing */
        expect_activation_violations(&a, true, (const char *const[]) { NULL });
        a.lists[ACTIVATION_IN_SRC] = &act_seq_reordered;
        expect_activation_violations(&a, true, (const char *const[]) { NULL });

        /* each field alone, then several in field order */
        a = constructed();
        a.lists[ACTIVATION_IN_SRC] = &act_seq_other;
        expect_activation_violations(&a, true, (const char *const[]) { "in_src", NULL });
        a = constructed();
        a.lists[ACTIVATION_IN_DST] = &act_partial;
        expect_activation_violations(&a, true, (const char *const[]) { "in_dst", NULL });
        a = constructed();
        a.lists[ACTIVATION_OUT_SRC] = &act_replicate;
        expect_activation_violations(&a, true, (const char *const[]) { "out_src", NULL });
        a = constructed();
        a.n_lists[ACTIVATION_OUT_DST] = 0;
        expect_activation_violations(&a, true, (const char *const[]) { "out_dst", NULL });
        a = constructed();
        a.out_names = names_y;
        expect_activation_violations(&a, true, (const char *const[]) { "out_names", NULL });
        a = constructed();
        a.is_boundary = false;
        expect_activation_violations(&a, true, (const char *const[]) { "is_boundary", NULL });
        a = constructed();
        a.lists[ACTIVATION_IN_DST] = &act_seq;
        a.n_out_names = 0;
        a.is_boundary = false;
        expect_activation_violations(&a, true, (const char *const[]) { "in_dst", "out_names", "is_boundary", NULL });

        /* a family that declares none: an applied one that states anything conflicts */
        ActivationLayout empty = {};
        expect_activation_violations(&empty, false, (const char *const[]) { NULL });
        a = constructed();
        expect_activation_violations(&a, false, (const char *const[]) {
                "in_src", "in_dst", "out_src", "out_dst", "out_names", "is_boundary", NULL });
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_clean_and_placements_as_sets),
                cmocka_unit_test(test_all_kinds_in_order),
                cmocka_unit_test(test_shared_against_the_first),
                cmocka_unit_test(test_dtype_per_parameter),
                cmocka_unit_test(test_tied_equal),
                cmocka_unit_test(test_tied_every_message_in_order),
                cmocka_unit_test(test_tied_against_the_first),
                cmocka_unit_test(test_tied_sorted_lookup),
                cmocka_unit_test(test_tied_malformed),
                cmocka_unit_test(test_activation_layout),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
