/* test-resolve.c: Resolve's steps and texts over the conformance registry and a test registry. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "common/macro.h"
#include "core/mesh.h"
#include "core/registry.h"
#include "test-fixtures.h"
#include "core/resolve.h"

/* Families that the conformance registry lacks: a factory member, typed selectors of every kind
 * with int/float rule values, requires over several axes (declared out of axis order). */
static const char extra_yaml[] =
        "families:\n"
        "  - name: factory\n"
        "    baseline: pkg.Factory\n"
        "    default_variant: self\n"
        "    variants:\n"
        "      self: {constructor: pkg.Factory, accepts: [config]}\n"
        "  - name: knobs\n"
        "    baseline: pkg.Knobs\n"
        "    default_variant: plain\n"
        "    parallel_axis: tp\n"
        "    selectors:\n"
        "      scale: {type: float, default: 1.0}\n"
        "      mode: {type: string, default: a}\n"
        "      count: {type: int, default: 0}\n"
        "    arguments:\n"
        "      ratio: {type: float}\n"
        "      name: {type: string, default: x}\n"
        "      flag: {type: bool, default: false}\n"
        "    variants:\n"
        "      plain: {constructor: pkg.Plain, accepts: [config, ratio, name, flag]}\n"
        "      double: {constructor: pkg.Double, accepts: [config]}\n"
        "      half: {constructor: pkg.Half, accepts: [config]}\n"
        "      strict:\n"
        "        constructor: pkg.Strict\n"
        "        accepts: [config]\n"
        "        requires: {pp: [2, 4], ep: 1, tp: [1, 2], cp: 1}\n"
        "      tp_only: {constructor: pkg.TP, accepts: [config]}\n"
        "      factory: {constructor: pkg.Knobs, accepts: [config]}\n"
        "      pow53: {constructor: pkg.Pow53, accepts: [config]}\n"
        "    rules:\n"
        "      - when: {scale: 2}\n"
        "        variant: double\n"
        "      - when: {scale: 9007199254740992}\n"
        "        variant: pow53\n"
        "      - when: {scale: 0.5}\n"
        "        variant: half\n"
        "      - when: {mode: strict}\n"
        "        variant: strict\n"
        "      - when: {mode: factory}\n"
        "        variant: factory\n"
        "      - when: {count: 3, parallel: false}\n"
        "        error: \"count=3 needs tp\"\n"
        "      - when: {parallel: true, count: 3}\n"
        "        variant: tp_only\n"
        "      - when: {count: 4}\n"
        "        unsupported: \"count=4 is not supported\"\n"
        "  - name: seq\n"
        "    baseline: pkg.Seq\n"
        "    default_variant: plain\n"
        "    selectors:\n"
        "      fused: {type: bool, default: false}\n"
        "    variants:\n"
        "      plain: {constructor: pkg.SeqPlain, accepts: [config], requires: {sequence_parallel: false}}\n"
        "      sp:\n"
        "        constructor: pkg.SeqSP\n"
        "        accepts: [config]\n"
        "        requires: {loss_parallel: false, tp: [2, 4], sequence_parallel: true}\n"
        "      fused_lp: {constructor: pkg.SeqLP, accepts: [config], requires: {loss_parallel: true, sequence_parallel: false}}\n"
        "    rules:\n"
        "      - when: {sequence_parallel: true, fused: false}\n"
        "        variant: sp\n"
        "      - when: {fused: true, loss_parallel: false}\n"
        "        error: \"fused needs loss_parallel\"\n"
        "      - when: {fused: true}\n"
        "        variant: fused_lp\n";

typedef struct Fixture {
        Registry *conformance;
        Registry *extra;
        MeshTable *meshes;
        char dir[64];
} Fixture;

static Fixture fx;

static Registry *load(const char *dir) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Registry *r = NULL;

        int k = registry_load(dir, 1, &r, &diag);
        if (k < 0) {
                _cleanup_free_ char *text = load_diagnostics_join(&diag);
                fail_msg("registry_load(%s): %d\n%s", dir, k, strempty(text));
        }
        return r;
}

static int setup(void **state) {
        char path[4096];

        snprintf(path, sizeof path, "%s/registry", conformance_dir());
        fx.conformance = load(path);

        strcpy(fx.dir, "/tmp/test-resolve-XXXXXX");
        assert_non_null(mkdtemp(fx.dir));
        snprintf(path, sizeof path, "%s/extra.yaml", fx.dir);
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fputs(extra_yaml, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
        fx.extra = load(fx.dir);

        assert_int_equal(mesh_table_new(0, &fx.meshes), 0);
        return 0;
}

static int teardown(void **state) {
        char path[128];

        snprintf(path, sizeof path, "%s/extra.yaml", fx.dir);
        (void) unlink(path);
        (void) rmdir(fx.dir);
        fx.conformance = registry_unref(fx.conformance);
        fx.extra = registry_unref(fx.extra);
        fx.meshes = mesh_table_free(fx.meshes);
        return 0;
}

/* Request builders. */

static ResolveRequest req(const char *family) {
        ResolveRequest r = { .family = strdup(family) };
        assert_non_null(r.family);
        return r;
}

static void arg(ResolveRequest *r, const char *name, Value v) {
        assert_int_equal(value_map_put(&r->arguments, name, &v), 0);
}

#define BOOL(x) ((Value) { .kind = VALUE_BOOL, .b = (x) })
#define INT(x) ((Value) { .kind = VALUE_INT, .i = (x) })
#define FLOAT(x) ((Value) { .kind = VALUE_FLOAT, .f = (x) })
#define STRING(x) ((Value) { .kind = VALUE_STRING, .s = strdup(x) })
#define NONE ((Value) { .kind = VALUE_NONE })

static void size(ResolveRequest *r, Axis a, int64_t n) {
        r->context.has_size[a] = true;
        r->context.size[a] = n;
}

static void mesh_id(ResolveRequest *r, const char *id) {
        free(r->context.mesh_id);
        r->context.mesh_id = strdup(id);
}

static const Registry *registry_for(const ResolveRequest *r) {
        return strncmp(r->family, "pkg.", 4) == 0 || streq(r->family, "factory") || streq(r->family, "knobs") ||
                streq(r->family, "seq") ?
                fx.extra : fx.conformance;
}

/* Resolves r (consumed) and asserts the exact failure; the result is not written. */
static void expect_fail(ResolveRequest r, FamilyStatus status, const char *reason, const char *message) {
        ResolvedFamily out = { .family = (char *) "untouched" };
        FamilyError e = FAMILY_ERROR_NULL;

        int k = resolve_family(registry_for(&r), fx.meshes, &r, &out, &e);
        if (k != -EINVAL)
                fail_msg("%s: expected -EINVAL with '%s', got %d", r.family, message, k);
        assert_string_equal(out.family, "untouched");
        assert_string_equal(e.message, message);
        assert_string_equal(family_status_to_string(e.status), family_status_to_string(status));
        assert_string_equal(e.reason, reason);
        family_error_done(&e);
        resolve_request_done(&r);
}

static ResolvedFamily expect_ok(ResolveRequest r) {
        ResolvedFamily out = {};
        FamilyError e = FAMILY_ERROR_NULL;

        int k = resolve_family(registry_for(&r), fx.meshes, &r, &out, &e);
        if (k < 0)
                fail_msg("%s: %d %s", r.family, k, strempty(e.message));
        assert_false(family_error_is_set(&e));
        resolve_request_done(&r);
        return out;
}

static void expect_variant(ResolveRequest r, const char *variant) {
        _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
        assert_string_equal(out.variant, variant);
}

static void assert_sizes(const ResolvedFamily *out, int64_t tp, int64_t cp, int64_t ep, int64_t pp) {
        assert_int_equal(out->axis_size[AXIS_TP], tp);
        assert_int_equal(out->axis_size[AXIS_CP], cp);
        assert_int_equal(out->axis_size[AXIS_EP], ep);
        assert_int_equal(out->axis_size[AXIS_PP], pp);
}

static void assert_selector_bool(const ResolvedFamily *out, size_t i, const char *name, bool b) {
        assert_true(i < out->selectors.n);
        assert_string_equal(out->selectors.items[i].name, name);
        assert_int_equal(out->selectors.items[i].value.kind, VALUE_BOOL);
        assert_int_equal(out->selectors.items[i].value.b, b);
}

static char *create_mesh(const char *device, const char *expert, Axis declared, int64_t declared_size) {
        MeshSpec s = {};
        const char *views[2] = { device, expert };
        MeshView *targets[2] = { &s.device, &s.expert };

        for (size_t k = 0; k < 2; k++) {
                _cleanup_free_ char *copy = strdup(views[k]);
                char *save = NULL;

                targets[k]->dims = calloc(8, sizeof(MeshDim));
                for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
                        char *eq = strchr(t, '=');
                        *eq = 0;
                        targets[k]->dims[targets[k]->n].name = strdup(t);
                        targets[k]->dims[targets[k]->n++].size = atoll(eq + 1);
                }
        }
        if (declared >= 0) {
                s.has_size[declared] = true;
                s.size[declared] = declared_size;
        }

        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL, *got = NULL;
        int k = mesh_new(&s, 8, &m, &e);
        if (k < 0)
                fail_msg("mesh_new: %s", strempty(e.message));
        mesh_spec_done(&s);
        assert_int_equal(mesh_table_add(fx.meshes, m, &got, &e), 0);
        char *id = strdup(got->id);
        mesh_unref(got);
        mesh_unref(m);
        return id;
}

/* A mesh of the device view `device` with the two flags set. */
static char *create_flag_mesh(const char *device, bool sequence_parallel, bool loss_parallel) {
        MeshSpec s = { .sequence_parallel = sequence_parallel, .loss_parallel = loss_parallel };
        _cleanup_free_ char *copy = strdup(device);
        char *save = NULL;

        s.device.dims = calloc(8, sizeof(MeshDim));
        for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
                char *eq = strchr(t, '=');
                *eq = 0;
                s.device.dims[s.device.n].name = strdup(t);
                s.device.dims[s.device.n++].size = atoll(eq + 1);
        }

        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL, *got = NULL;
        int k = mesh_new(&s, 8, &m, &e);
        if (k < 0)
                fail_msg("mesh_new: %s", strempty(e.message));
        mesh_spec_done(&s);
        assert_int_equal(mesh_table_add(fx.meshes, m, &got, &e), 0);
        char *id = strdup(got->id);
        mesh_unref(got);
        mesh_unref(m);
        return id;
}

/* The Resolve cases of conformance/cases.json, one for one. */

static void test_conformance_success(void **state) {
        ResolveRequest r;

        /* default member, no context */
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(req("grouped_experts"));
                assert_string_equal(out.family, "grouped_experts");
                assert_string_equal(out.variant, "grouped");
                assert_string_equal(out.constructor,
                                    "hyper_parallel.components.modules.grouped_experts.GroupedExpertsLocal");
                assert_int_equal(out.arguments.n, 0);
                assert_int_equal(out.selectors.n, 2);
                assert_selector_bool(&out, 0, "use_mxfp8", false);
                assert_selector_bool(&out, 1, "use_fused_mxfp8", false);
                assert_sizes(&out, 1, 1, 1, 1);
        }

        /* by baseline path: the result names the family by its name */
        {
                _cleanup_(resolved_family_done) ResolvedFamily out =
                        expect_ok(req("hyper_parallel.components.modules.grouped_experts.GroupedExperts"));
                assert_string_equal(out.family, "grouped_experts");
                assert_string_equal(out.variant, "grouped");
        }

        /* selector picks mxfp8 and is consumed */
        {
                r = req("grouped_experts");
                arg(&r, "use_mxfp8", BOOL(true));
                arg(&r, "activation", STRING("silu"));
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "mxfp8");
                assert_string_equal(out.constructor,
                                    "hyper_parallel.components.modules.mxfp8_grouped_swiglu.MXFP8GroupedSwiGLU");
                assert_int_equal(out.arguments.n, 1);
                assert_string_equal(out.arguments.items[0].name, "activation");
                assert_string_equal(out.arguments.items[0].value.s, "silu");
                assert_selector_bool(&out, 0, "use_mxfp8", true);
                assert_selector_bool(&out, 1, "use_fused_mxfp8", false);
        }

        /* explicit false selectors keep the default */
        {
                r = req("grouped_experts");
                arg(&r, "use_mxfp8", BOOL(false));
                arg(&r, "use_fused_mxfp8", BOOL(false));
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "grouped");
                assert_int_equal(out.arguments.n, 0);
        }

        /* parallel axis active selects the parallel member */
        {
                r = req("grouped_experts");
                size(&r, AXIS_EP, 4);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "grouped_ep");
                assert_sizes(&out, 1, 1, 4, 1);
        }

        /* mxfp8 at ep=2 is allowed */
        {
                r = req("grouped_experts");
                arg(&r, "use_mxfp8", BOOL(true));
                size(&r, AXIS_EP, 2);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "mxfp8");
                assert_int_equal(out.axis_size[AXIS_EP], 2);
        }

        /* pp does not trigger an ep family */
        {
                r = req("grouped_experts");
                size(&r, AXIS_PP, 2);
                r.context.active[AXIS_PP] = true;
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "grouped");
                assert_sizes(&out, 1, 1, 1, 2);
        }

        /* cp family goes ring under cp */
        r = req("attention");
        size(&r, AXIS_CP, 2);
        expect_variant(r, "ring");

        /* fused attention without cp */
        r = req("attention");
        arg(&r, "use_mxfp8", BOOL(true));
        arg(&r, "use_fused_mxfp8", BOOL(true));
        expect_variant(r, "mxfp8_fused");

        /* a shared name is still reachable by baseline */
        {
                _cleanup_(resolved_family_done) ResolvedFamily out =
                        expect_ok(req("hyper_parallel.components.modules.norm.OffsetRMSNorm"));
                assert_string_equal(out.family, "norm");
                assert_string_equal(out.variant, "offset");
                assert_int_equal(out.selectors.n, 0);
        }
}

static void test_conformance_failures(void **state) {
        ResolveRequest r;

        r = req("grouped_experts");
        arg(&r, "use_fused_mxfp8", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "RULE_ERROR", "use_fused_mxfp8 requires use_mxfp8=True");

        r = req("grouped_experts");
        arg(&r, "use_fused_mxfp8", BOOL(true));
        arg(&r, "use_mxfp8", BOOL(true));
        expect_fail(r, FAMILY_STATUS_UNIMPLEMENTED, "RULE_UNSUPPORTED",
                    "use_fused_mxfp8=True is not supported; use non-fused MXFP8");

        r = req("grouped_experts");
        arg(&r, "use_mxfp8", INT(1));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'use_mxfp8' must be bool");

        r = req("grouped_experts");
        arg(&r, "use_mxfp8", STRING("true"));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'use_mxfp8' must be bool");

        r = req("grouped_experts");
        arg(&r, "zeta", BOOL(true));
        arg(&r, "alpha", INT(1));
        arg(&r, "use_mxfp8", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "UNKNOWN_ARGUMENTS",
                    "grouped_experts: unknown arguments: ['alpha', 'zeta']");

        r = req("attention");
        arg(&r, "window", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "argument 'window' must be int");

        r = req("grouped_experts");
        arg(&r, "use_mxfp8", BOOL(true));
        size(&r, AXIS_EP, 4);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'mxfp8' requires ep in [1, 2]; job has ep=4");

        r = req("grouped_experts");
        arg(&r, "use_mxfp8", BOOL(true));
        size(&r, AXIS_TP, 2);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", "variant 'mxfp8' requires tp=1; job has tp=2");

        r = req("grouped_experts");
        r.context.active[AXIS_EP] = true;
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_REQUIRED", "ep_size is required when ep is active");

        r = req("grouped_experts");
        size(&r, AXIS_TP, 0);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_SIZE", "tp_size must be a positive integer");

        r = req("grouped_experts");
        size(&r, AXIS_CP, -2);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_SIZE", "cp_size must be a positive integer");

        r = req("attention");
        arg(&r, "use_mxfp8", BOOL(true));
        arg(&r, "use_fused_mxfp8", BOOL(true));
        size(&r, AXIS_CP, 2);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'mxfp8_fused' requires cp=1; job has cp=2");

        expect_fail(req("norm"), FAMILY_STATUS_INVALID_ARGUMENT, "AMBIGUOUS_FAMILY",
                    "family name 'norm' must identify exactly one registration");
        expect_fail(req("nope"), FAMILY_STATUS_NOT_FOUND, "UNKNOWN_FAMILY",
                    "family name 'nope' must identify exactly one registration");
        expect_fail(req("engram"), FAMILY_STATUS_INVALID_ARGUMENT, "NO_DEFAULT_VARIANT",
                    "FamilyRequest requires a family with a concrete default_variant");

        r = req("grouped_experts");
        mesh_id(&r, "no-such-mesh");
        expect_fail(r, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh 'no-such-mesh' not found");
}

static void test_conformance_meshes(void **state) {
        ResolveRequest r;

        /* mesh gives the sizes */
        _cleanup_free_ char *dense = create_mesh("dp=2 tp=4", "", _AXIS_INVALID, 0);
        {
                r = req("grouped_experts");
                mesh_id(&r, dense);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "grouped");
                assert_sizes(&out, 4, 1, 1, 1);
        }
        {
                r = req("attention");
                mesh_id(&r, dense);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "eager");
                assert_int_equal(out.axis_size[AXIS_TP], 4);
        }

        /* expert view gives ep */
        _cleanup_free_ char *expert = create_mesh("dp=8", "edp_shard=2 ep=4", _AXIS_INVALID, 0);
        {
                r = req("grouped_experts");
                mesh_id(&r, expert);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "grouped_ep");
                assert_sizes(&out, 1, 1, 4, 1);
        }

        /* context disagreeing with its mesh */
        r = req("grouped_experts");
        mesh_id(&r, dense);
        size(&r, AXIS_TP, 2);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "CONTEXT_MESH_DISAGREE", "context and mesh disagree on tp_size");
}

static void test_arguments(void **state) {
        ResolveRequest r;

        /* Reserved runtime names are unknown arguments in Resolve; parallel is no selector. */
        r = req("knobs");
        arg(&r, "module", NONE);
        arg(&r, "config", NONE);
        arg(&r, "parallel", BOOL(true));
        arg(&r, "context", NONE);
        arg(&r, "module_fqn", STRING("a"));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "UNKNOWN_ARGUMENTS",
                    "knobs: unknown arguments: ['config', 'context', 'module', 'module_fqn', 'parallel']");

        /* One unknown key; quoted as Python's repr does; unknown keys come before types. */
        r = req("pkg.Knobs");
        arg(&r, "scale", STRING("big"));
        arg(&r, "it's", INT(1));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "UNKNOWN_ARGUMENTS", "knobs: unknown arguments: [\"it's\"]");

        /* Types in sorted key order, selectors and arguments mixed. */
        r = req("knobs");
        arg(&r, "ratio", STRING("x"));
        arg(&r, "flag", INT(1));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "argument 'flag' must be bool");
        r = req("knobs");
        arg(&r, "scale", STRING("x"));
        arg(&r, "count", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'count' must be int");
        r = req("knobs");
        arg(&r, "count", FLOAT(3.0));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'count' must be int");
        r = req("knobs");
        arg(&r, "mode", INT(1));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'mode' must be string");
        r = req("knobs");
        arg(&r, "scale", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "selector 'scale' must be float");
        r = req("knobs");
        arg(&r, "ratio", STRING("0.5"));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "argument 'ratio' must be float");
        /* A value with no kind set matches nothing. */
        r = req("knobs");
        arg(&r, "name", NONE);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "argument 'name' must be string");

        /* Arguments before topology. */
        r = req("knobs");
        arg(&r, "flag", INT(1));
        size(&r, AXIS_TP, 0);
        mesh_id(&r, "no-such-mesh");
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", "argument 'flag' must be bool");

        /* An int is accepted for a float argument and kept unchanged; defaults are not filled;
         * the caller's order is kept and selectors are consumed. */
        r = req("knobs");
        arg(&r, "ratio", INT(2));
        arg(&r, "scale", FLOAT(1.0));
        arg(&r, "flag", BOOL(true));
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "plain");
                assert_int_equal(out.arguments.n, 2);
                assert_string_equal(out.arguments.items[0].name, "ratio");
                assert_int_equal(out.arguments.items[0].value.kind, VALUE_INT);
                assert_int_equal(out.arguments.items[0].value.i, 2);
                assert_string_equal(out.arguments.items[1].name, "flag");
                assert_null(value_map_get(&out.arguments, "name"));
                /* Every selector, in declaration order, defaults filled. */
                assert_int_equal(out.selectors.n, 3);
                assert_string_equal(out.selectors.items[0].name, "scale");
                assert_string_equal(out.selectors.items[1].name, "mode");
                assert_string_equal(out.selectors.items[1].value.s, "a");
                assert_string_equal(out.selectors.items[2].name, "count");
                assert_int_equal(out.selectors.items[2].value.i, 0);
        }
}

static void test_check_arguments_allow(void **state) {
        const Family *f = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        _cleanup_(value_map_done) ValueMap args = {};
        const char *const allow[] = { "config", NULL };
        Value v = NONE;

        assert_int_equal(registry_find(fx.extra, "knobs", &f, &e), 0);
        assert_int_equal(value_map_put(&args, "config", &v), 0);
        v = INT(1);
        assert_int_equal(value_map_put(&args, "ratio", &v), 0);

        /* An allowed name passes without a type check; the others are still checked. */
        assert_int_equal(resolve_check_arguments(f, &args, allow, &e), 0);
        assert_int_equal(resolve_check_arguments(f, &args, NULL, &e), -EINVAL);
        assert_string_equal(e.message, "knobs: unknown arguments: ['config']");
        assert_string_equal(e.field, "arguments");
        family_error_done(&e);

        v = STRING("x");
        assert_int_equal(value_map_put(&args, "ratio", &v), 0);
        assert_int_equal(resolve_check_arguments(f, &args, allow, &e), -EINVAL);
        assert_string_equal(e.message, "argument 'ratio' must be float");
        /* The metadata names the key. */
        assert_string_equal(e.field, "ratio");
        family_error_done(&e);

        _cleanup_(value_map_done) ValueMap empty = {};
        assert_int_equal(resolve_check_arguments(f, &empty, NULL, &e), 0);
}

/* Several mismatches in every insertion order: the smallest key in byte order is reported;
 * unknown keys, all of them sorted, still come first. */
static void test_check_arguments_order(void **state) {
        static const char *const names[] = { "scale", "count", "ratio", "mode", "flag" };
        static const char *const perms[][5] = {
                { "scale", "count", "ratio", "mode", "flag" },
                { "flag", "mode", "ratio", "count", "scale" },
                { "ratio", "flag", "scale", "mode", "count" },
                { "mode", "scale", "count", "flag", "ratio" },
        };
        const Family *f = NULL;
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(registry_find(fx.extra, "knobs", &f, &e), 0);
        for (size_t p = 0; p < ELEMENTSOF(perms); p++) {
                _cleanup_(value_map_done) ValueMap args = {};

                for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                        Value v = STRING("x"); /* wrong for every key but mode */
                        assert_int_equal(value_map_put(&args, perms[p][i], &v), 0);
                }
                assert_int_equal(resolve_check_arguments(f, &args, NULL, &e), -EINVAL);
                assert_string_equal(e.message, "selector 'count' must be int");
                assert_string_equal(e.field, "count");
                family_error_done(&e);

                /* An allowed name below every other is skipped, not reported. */
                Value c = INT(1);
                assert_int_equal(value_map_put(&args, "count", &c), 0);
                const char *const allow[] = { "a", NULL };
                Value a = STRING("anything");
                assert_int_equal(value_map_put(&args, "a", &a), 0);
                assert_int_equal(resolve_check_arguments(f, &args, allow, &e), -EINVAL);
                assert_string_equal(e.message, "argument 'flag' must be bool");
                family_error_done(&e);

                Value z = INT(0), b = INT(0);
                assert_int_equal(value_map_put(&args, "zz", &z), 0);
                assert_int_equal(value_map_put(&args, "b", &b), 0);
                assert_int_equal(resolve_check_arguments(f, &args, allow, &e), -EINVAL);
                assert_string_equal(e.message, "knobs: unknown arguments: ['b', 'zz']");
                family_error_done(&e);
        }
}

/*
 * The check runs on every Resolve and Build: its success path allocates nothing. Counted with
 * the sanitizer's allocation hooks, so only in an ASan build (CI's); skipped elsewhere.
 */
#if defined(__SANITIZE_ADDRESS__)
#  define HAVE_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define HAVE_ASAN 1
#  endif
#endif

#ifdef HAVE_ASAN
/* From <sanitizer/allocator_interface.h>, which not every toolchain installs. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

static atomic_bool counting;
static atomic_uint n_allocations;

static void count_malloc(const volatile void *p, size_t n) {
        if (atomic_load(&counting))
                atomic_fetch_add(&n_allocations, 1);
}

static void count_free(const volatile void *p) {
}
#endif

static void test_check_arguments_allocates_nothing(void **state) {
#ifdef HAVE_ASAN
        static bool installed;
        const char *const allow[] = { "config", NULL };
        _cleanup_(value_map_done) ValueMap args = {};
        const Family *f = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        Value v;

        if (!installed) {
                assert_int_equal(__sanitizer_install_malloc_and_free_hooks(count_malloc, count_free), 1);
                installed = true;
        }

        assert_int_equal(registry_find(fx.extra, "knobs", &f, &e), 0);
        v = FLOAT(2.0);
        assert_int_equal(value_map_put(&args, "scale", &v), 0);
        v = STRING("x");
        assert_int_equal(value_map_put(&args, "name", &v), 0);
        v = INT(3);
        assert_int_equal(value_map_put(&args, "ratio", &v), 0);
        v = NONE;
        assert_int_equal(value_map_put(&args, "config", &v), 0);

        /* The hooks do see an allocation. */
        atomic_store(&counting, true);
        _cleanup_free_ char *probe = strdup("probe");
        atomic_store(&counting, false);
        assert_non_null(probe);
        assert_int_equal(atomic_load(&n_allocations), 1);

        atomic_store(&n_allocations, 0);
        atomic_store(&counting, true);
        int k = resolve_check_arguments(f, &args, allow, &e);
        atomic_store(&counting, false);
        assert_int_equal(k, 0);
        assert_int_equal(atomic_load(&n_allocations), 0);
#else
        skip();
#endif
}

static void test_rules_numbers(void **state) {
        ResolveRequest r;

        /* A rule's `scale: 2` matches a float selector given 2 or 2.0 (numeric equality). */
        r = req("knobs");
        arg(&r, "scale", INT(2));
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "double");
                /* The effective selector is the value passed, an int kept as given. */
                assert_int_equal(out.selectors.items[0].value.kind, VALUE_INT);
                assert_int_equal(out.selectors.items[0].value.i, 2);
        }
        r = req("knobs");
        arg(&r, "scale", FLOAT(2.0));
        expect_variant(r, "double");
        r = req("knobs");
        arg(&r, "scale", FLOAT(0.5));
        expect_variant(r, "half");
        r = req("knobs");
        arg(&r, "scale", FLOAT(2.5));
        expect_variant(r, "plain");
        r = req("knobs");
        arg(&r, "scale", FLOAT(2.0000001));
        expect_variant(r, "plain");
        r = req("knobs");
        arg(&r, "scale", FLOAT(1e300));
        expect_variant(r, "plain");

        /* Past 2^53 an int is compared exactly, never through a double: 2^53 + 1 is not 2^53. */
        r = req("knobs");
        arg(&r, "scale", INT(9007199254740992));
        expect_variant(r, "pow53");
        r = req("knobs");
        arg(&r, "scale", FLOAT(9007199254740992.0));
        expect_variant(r, "pow53");
        {
                r = req("knobs");
                arg(&r, "scale", INT(9007199254740993));
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "plain");
                assert_int_equal(out.selectors.items[0].value.kind, VALUE_INT);
                assert_int_equal(out.selectors.items[0].value.i, 9007199254740993);
        }
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(req("knobs"));
                assert_string_equal(out.variant, "plain");
                assert_int_equal(out.selectors.items[0].value.kind, VALUE_FLOAT);
                assert_true(out.selectors.items[0].value.f == 1.0);
        }
}

/* The comparison itself, on a family built by hand: the loader stores a float selector's rule
 * values as floats, but a hand-made or future registry may hold an int there. */
static void test_select_mixed_numbers(void **state) {
        RuleCondition three = { .key = (char *) "s", .value = INT(3) };
        RuleCondition four = { .key = (char *) "s", .value = FLOAT(4.0) };
        RuleCondition big = { .key = (char *) "s", .value = INT(INT64_MAX) };
        Rule rules[] = {
                { .when = &three, .n_when = 1, .outcome = RULE_OUTCOME_VARIANT, .text = (char *) "three" },
                { .when = &four, .n_when = 1, .outcome = RULE_OUTCOME_VARIANT, .text = (char *) "four" },
                { .when = &big, .n_when = 1, .outcome = RULE_OUTCOME_VARIANT, .text = (char *) "big" },
        };
        Variant variants[] = {
                { .name = (char *) "base", .constructor = (char *) "pkg.Base" },
                { .name = (char *) "three", .constructor = (char *) "pkg.Three" },
                { .name = (char *) "four", .constructor = (char *) "pkg.Four" },
                { .name = (char *) "big", .constructor = (char *) "pkg.Big" },
        };
        TypedField selector = { .name = (char *) "s", .type = FIELD_TYPE_FLOAT, .default_value = FLOAT(0) };
        Family f = {
                .name = (char *) "mixed", .baseline = (char *) "pkg.Mixed", .default_variant = (char *) "base",
                .parallel_axis = _AXIS_INVALID, .selectors = &selector, .n_selectors = 1,
                .variants = variants, .n_variants = ELEMENTSOF(variants), .rules = rules,
                .n_rules = ELEMENTSOF(rules),
        };
        const int64_t sizes[_AXIS_MAX] = { 1, 1, 1, 1 };
        const struct {
                Value given;
                const char *variant;
        } cases[] = {
                { FLOAT(3.0), "three" },
                { INT(3), "three" },
                { INT(4), "four" },
                { FLOAT(4.0), "four" },
                { FLOAT(3.5), "base" },
                /* 2^63 is no int64: it must not match INT64_MAX through a wrapped conversion. */
                { FLOAT(9223372036854775808.0), "base" },
                { FLOAT(-0.0), "base" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                _cleanup_(value_map_done) ValueMap args = {};
                _cleanup_(resolved_family_done) ResolvedFamily out = {};
                FamilyError e = FAMILY_ERROR_NULL;
                Value v = cases[i].given;

                assert_int_equal(value_map_put(&args, "s", &v), 0);
                assert_int_equal(resolve_select(&f, &args, sizes, NULL, &out, &e), 0);
                assert_string_equal(out.variant, cases[i].variant);
        }

        /* No rule matches and no usable default: registry_find's words. */
        const char *const defaults[] = { NULL, "missing" };
        for (size_t i = 0; i < ELEMENTSOF(defaults); i++) {
                _cleanup_(value_map_done) ValueMap args = {};
                ResolvedFamily out = { .family = (char *) "untouched" };
                FamilyError e = FAMILY_ERROR_NULL;

                f.default_variant = (char *) defaults[i];
                assert_int_equal(resolve_select(&f, &args, sizes, NULL, &out, &e), -EINVAL);
                assert_string_equal(out.family, "untouched");
                assert_int_equal(e.status, FAMILY_STATUS_INVALID_ARGUMENT);
                assert_string_equal(e.reason, "NO_DEFAULT_VARIANT");
                assert_string_equal(e.field, "family");
                assert_string_equal(e.message, "FamilyRequest requires a family with a concrete default_variant");
                family_error_done(&e);
        }
}

static void test_rules_parallel_and_outcomes(void **state) {
        ResolveRequest r;

        /* `parallel` joins a selector in one rule; the error rule matches only without tp. */
        r = req("knobs");
        arg(&r, "count", INT(3));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "RULE_ERROR", "count=3 needs tp");
        r = req("knobs");
        arg(&r, "count", INT(3));
        size(&r, AXIS_TP, 2);
        expect_variant(r, "tp_only");
        /* Another axis does not make a tp family parallel. */
        r = req("knobs");
        arg(&r, "count", INT(3));
        size(&r, AXIS_EP, 2);
        size(&r, AXIS_CP, 2);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "RULE_ERROR", "count=3 needs tp");

        r = req("knobs");
        arg(&r, "count", INT(4));
        expect_fail(r, FAMILY_STATUS_UNIMPLEMENTED, "RULE_UNSUPPORTED", "count=4 is not supported");

        /* No rule matches: the default variant, parallel or not. */
        r = req("knobs");
        size(&r, AXIS_TP, 8);
        expect_variant(r, "plain");

        /* A member equal to the family's factory. */
        expect_fail(req("factory"), FAMILY_STATUS_INVALID_ARGUMENT, "MEMBER_IS_FACTORY",
                    "a concrete family member cannot be its public factory");
        r = req("knobs");
        arg(&r, "mode", STRING("factory"));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "MEMBER_IS_FACTORY",
                    "a concrete family member cannot be its public factory");
}

static void test_requires(void **state) {
        ResolveRequest r;

        /* Axes checked in the order tp, cp, ep, pp whatever the file's order. */
        r = req("knobs");
        arg(&r, "mode", STRING("strict"));
        size(&r, AXIS_TP, 4);
        size(&r, AXIS_CP, 2);
        size(&r, AXIS_EP, 2);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'strict' requires tp in [1, 2]; job has tp=4");
        r = req("knobs");
        arg(&r, "mode", STRING("strict"));
        size(&r, AXIS_TP, 2);
        size(&r, AXIS_CP, 2);
        size(&r, AXIS_EP, 2);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", "variant 'strict' requires cp=1; job has cp=2");
        r = req("knobs");
        arg(&r, "mode", STRING("strict"));
        size(&r, AXIS_EP, 2);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", "variant 'strict' requires ep=1; job has ep=2");
        r = req("knobs");
        arg(&r, "mode", STRING("strict"));
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'strict' requires pp in [2, 4]; job has pp=1");
        r = req("knobs");
        arg(&r, "mode", STRING("strict"));
        size(&r, AXIS_PP, 4);
        size(&r, AXIS_TP, 2);
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "strict");
                assert_sizes(&out, 2, 1, 1, 4);
        }
}

static void assert_flags(const ResolvedFamily *out, bool sequence_parallel, bool loss_parallel) {
        assert_int_equal(out->flag[JOB_FLAG_SEQUENCE_PARALLEL], sequence_parallel);
        assert_int_equal(out->flag[JOB_FLAG_LOSS_PARALLEL], loss_parallel);
}

static ResolveRequest seq(bool sequence_parallel, bool loss_parallel) {
        ResolveRequest r = req("seq");
        r.context.sequence_parallel = sequence_parallel;
        r.context.loss_parallel = loss_parallel;
        return r;
}

/* sequence_parallel and loss_parallel: rules select on them, requires demand or exclude them,
 * the answer carries them, and a mesh's flags are the job's whatever the context says. */
static void test_job_flags(void **state) {
        ResolveRequest r;

        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(seq(false, false));
                assert_string_equal(out.variant, "plain");
                assert_flags(&out, false, false);
        }
        r = seq(true, false);
        size(&r, AXIS_TP, 2);
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "sp");
                assert_flags(&out, true, false);
        }
        /* Axes first, then sequence_parallel, then loss_parallel, whatever the file's order. */
        r = seq(true, true);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'sp' requires tp in [2, 4]; job has tp=1");
        r = seq(true, true);
        size(&r, AXIS_TP, 4);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'sp' requires loss_parallel=False; job has loss_parallel=True");
        {
                FamilyError e = FAMILY_ERROR_NULL;
                ResolvedFamily out = {};
                r = seq(true, true);
                size(&r, AXIS_TP, 4);
                assert_int_equal(resolve_family(fx.extra, fx.meshes, &r, &out, &e), -EINVAL);
                assert_string_equal(e.field, "loss_parallel");
                family_error_done(&e);
                resolve_request_done(&r);
        }
        r = seq(false, false);
        arg(&r, "fused", BOOL(true));
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "RULE_ERROR", "fused needs loss_parallel");
        r = seq(false, true);
        arg(&r, "fused", BOOL(true));
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "fused_lp");
                assert_flags(&out, false, true);
        }
        /* A flag may be excluded: fused_lp refuses sequence parallelism. */
        r = seq(true, true);
        arg(&r, "fused", BOOL(true));
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'fused_lp' requires sequence_parallel=False; job has sequence_parallel=True");

        /* A mesh's word wins over the request's, both ways. */
        _cleanup_free_ char *plain_mesh = create_mesh("dp=4 tp=2", "", _AXIS_INVALID, 0);
        _cleanup_free_ char *sp_mesh = create_flag_mesh("dp=4 tp=2", true, false);
        _cleanup_free_ char *lp_mesh = create_flag_mesh("dp=4 tp=2", false, true);
        r = seq(true, true);
        mesh_id(&r, plain_mesh);
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "plain");
                assert_flags(&out, false, false);
        }
        r = seq(false, true);
        mesh_id(&r, sp_mesh);
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "sp");
                assert_flags(&out, true, false);
        }
        r = seq(false, false);
        mesh_id(&r, lp_mesh);
        arg(&r, "fused", BOOL(true));
        {
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_string_equal(out.variant, "fused_lp");
                assert_flags(&out, false, true);
        }

        /* The stages alone: resolve_job_flags, and resolve_select without flags (all off). */
        bool flag[_JOB_FLAG_MAX] = { true, true };
        JobContext ctx = { .sequence_parallel = true };
        resolve_job_flags(&ctx, NULL, flag);
        assert_true(flag[JOB_FLAG_SEQUENCE_PARALLEL]);
        assert_false(flag[JOB_FLAG_LOSS_PARALLEL]);
        resolve_job_flags(NULL, NULL, flag);
        assert_false(flag[JOB_FLAG_SEQUENCE_PARALLEL]);

        assert_string_equal(job_flag_to_string(JOB_FLAG_LOSS_PARALLEL), "loss_parallel");
        assert_null(job_flag_to_string(_JOB_FLAG_MAX));
        assert_int_equal(job_flag_from_string("sequence_parallel"), JOB_FLAG_SEQUENCE_PARALLEL);
        assert_int_equal(job_flag_from_string("parallel"), _JOB_FLAG_INVALID);
        assert_int_equal(job_flag_from_string(NULL), _JOB_FLAG_INVALID);
}

static void test_axis_sizes(void **state) {
        ResolveRequest r;

        /* Given sizes in the order tp, cp, ep, pp, before the mesh. */
        r = req("knobs");
        size(&r, AXIS_PP, 0);
        size(&r, AXIS_EP, -1);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_SIZE", "ep_size must be a positive integer");
        r = req("knobs");
        size(&r, AXIS_PP, -5);
        mesh_id(&r, "no-such-mesh");
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_SIZE", "pp_size must be a positive integer");

        /* Active flags in axis order; a flag with a size is satisfied; an empty mesh id is none. */
        r = req("knobs");
        r.context.active[AXIS_PP] = true;
        r.context.active[AXIS_CP] = true;
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_REQUIRED", "cp_size is required when cp is active");
        r = req("knobs");
        r.context.active[AXIS_TP] = true;
        size(&r, AXIS_TP, 1);
        mesh_id(&r, "");
        r.context.active[AXIS_PP] = true;
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_REQUIRED", "pp_size is required when pp is active");

        /* With a mesh: flags ignored, equal sizes accepted, declared sizes stand. */
        _cleanup_free_ char *dense = create_mesh("dp=2 tp=4", "", AXIS_PP, 4);
        {
                r = req("knobs");
                mesh_id(&r, dense);
                r.context.active[AXIS_CP] = true;
                r.context.active[AXIS_EP] = true;
                size(&r, AXIS_TP, 4);
                size(&r, AXIS_PP, 4);
                _cleanup_(resolved_family_done) ResolvedFamily out = expect_ok(r);
                assert_sizes(&out, 4, 1, 1, 4);
        }
        r = req("knobs");
        mesh_id(&r, dense);
        size(&r, AXIS_PP, 1);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "CONTEXT_MESH_DISAGREE", "context and mesh disagree on pp_size");
        r = req("knobs");
        mesh_id(&r, dense);
        size(&r, AXIS_EP, 2);
        size(&r, AXIS_CP, 2);
        expect_fail(r, FAMILY_STATUS_INVALID_ARGUMENT, "CONTEXT_MESH_DISAGREE", "context and mesh disagree on cp_size");

        /* The stage alone: the mesh comes back as a new reference; nothing written on failure. */
        JobContext ctx = { .mesh_id = dense };
        int64_t sizes[_AXIS_MAX] = { -9, -9, -9, -9 };
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;
        assert_int_equal(resolve_axis_sizes(fx.meshes, &ctx, sizes, &m, &e), 0);
        assert_non_null(m);
        assert_string_equal(m->id, dense);
        assert_int_equal(sizes[AXIS_TP], 4);
        assert_int_equal(sizes[AXIS_PP], 4);
        m = mesh_unref(m);

        int64_t untouched[_AXIS_MAX] = { -9, -9, -9, -9 };
        ctx.mesh_id = (char *) "missing";
        m = (Mesh *) 0x1;
        assert_int_equal(resolve_axis_sizes(fx.meshes, &ctx, untouched, &m, &e), -EINVAL);
        assert_string_equal(e.message, "mesh 'missing' not found");
        assert_ptr_equal(m, (Mesh *) 0x1);
        assert_int_equal(untouched[AXIS_TP], -9);
        family_error_done(&e);

        /* Without a mesh table every id is unknown. */
        assert_int_equal(resolve_axis_sizes(NULL, &ctx, untouched, NULL, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_NOT_FOUND);
        assert_string_equal(e.reason, "MESH_NOT_FOUND");
        assert_string_equal(e.message, "mesh 'missing' not found");
        family_error_done(&e);

        ctx = (JobContext) {};
        m = (Mesh *) 0x1;
        assert_int_equal(resolve_axis_sizes(NULL, &ctx, sizes, &m, &e), 0);
        assert_null(m);
        assert_int_equal(sizes[AXIS_EP], 1);
}

static void test_helpers(void **state) {
        JobContext c = { .mesh_id = strdup("m"), .has_size = { true }, .size = { 2 } }, copy = {};

        assert_int_equal(job_context_copy(&c, &copy), 0);
        assert_string_equal(copy.mesh_id, "m");
        assert_ptr_not_equal(copy.mesh_id, c.mesh_id);
        assert_int_equal(copy.size[AXIS_TP], 2);
        job_context_done(&c);
        job_context_done(&copy);
        job_context_done(NULL);
        assert_null(copy.mesh_id);

        ResolveRequest r = req("x");
        arg(&r, "a", STRING("b"));
        resolve_request_done(&r);
        resolve_request_done(NULL);
        resolved_family_done(NULL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_conformance_success),
                cmocka_unit_test(test_conformance_failures),
                cmocka_unit_test(test_conformance_meshes),
                cmocka_unit_test(test_arguments),
                cmocka_unit_test(test_check_arguments_allow),
                cmocka_unit_test(test_check_arguments_order),
                cmocka_unit_test(test_check_arguments_allocates_nothing),
                cmocka_unit_test(test_rules_numbers),
                cmocka_unit_test(test_select_mixed_numbers),
                cmocka_unit_test(test_rules_parallel_and_outcomes),
                cmocka_unit_test(test_requires),
                cmocka_unit_test(test_job_flags),
                cmocka_unit_test(test_axis_sizes),
                cmocka_unit_test(test_helpers),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
