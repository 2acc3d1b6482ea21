/* test-build-plan.c: Build steps 1-4 (the plan), every text of semantics.md and both origins. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include <inttypes.h>

#include "core/build-plan.h"
#include "common/macro.h"
#include "core/mesh.h"
#include "core/registry.h"
#include "test-fixtures.h"

/* Families the conformance registry lacks: every shape and init failure, variant-local
 * parameters, members that accept only config or only module, a family without parameters. */
static const char extra_yaml[] =
        "families:\n"
        "  - name: attn\n"
        "    baseline: pkg.Attn\n"
        "    default_variant: plain\n"
        "    parallel_axis: tp\n"
        "    selectors:\n"
        "      pick: {type: string, default: plain}\n"
        "    arguments:\n"
        "      activation: {type: string}\n"
        "      zeta: {type: int, default: 1}\n"
        "    variants:\n"
        "      plain: {constructor: pkg.Plain, accepts: [config, module, module_fqn, context, activation, zeta]}\n"
        "      direct_only: {constructor: pkg.DirectOnly, accepts: [config]}\n"
        "      module_only: {constructor: pkg.ModuleOnly, accepts: [module, module_fqn]}\n"
        "      scalar:\n"
        "        constructor: pkg.Scalar\n"
        "        accepts: [config, module]\n"
        "        parameters:\n"
        "          bias: {shape: [], init: {constant: {value: 3}}}\n"
        "          gauss: {shape: [2], init: {normal: {mean: mu, std: sigma}}}\n"
        "      bound_init:\n"
        "        constructor: pkg.BoundInit\n"
        "        accepts: [config, module]\n"
        "        parameters:\n"
        "          w: {shape: [n, n + 1], init: {uniform: {low: 0, high: n}}}\n"
        "          v: {shape: [2 * n], init: {uniform: {low: 0, high: m}}}\n"
        "      mixed:\n"
        "        constructor: pkg.Mixed\n"
        "        accepts: [config, module]\n"
        "        parameters:\n"
        "          norm: {shape: [4], dtype: float32}\n"
        "          w: {shape: [4, 4], dtype: bf16}\n"
        "          v: {shape: [2]}\n"
        "      exprinit:\n"
        "        constructor: pkg.ExprInit\n"
        "        accepts: [config, module]\n"
        "        parameters:\n"
        "          w: {shape: [n, 3 * n], init: {normal: {std: 'r / sqrt(2 * layers)'}}}\n"
        "          t: {shape: [n, n, 2], init: {trunc_normal: {mean: mu, std: '1 / sqrt(fan_in)', a: '-2 / sqrt(fan_in)', b: hi}}}\n"
        "      fan1d:\n"
        "        constructor: pkg.Fan1d\n"
        "        accepts: [config]\n"
        "        parameters:\n"
        "          v: {shape: [n], init: {uniform: {low: 0, high: '1 / fan_in'}}}\n"
        "      square:\n"
        "        constructor: pkg.Square\n"
        "        accepts: [module]\n"
        "        parameters:\n"
        "          x: {shape: [n]}\n"
        "          y: {shape: [n * n]}\n"
        "          z: {shape: [n / 3]}\n"
        "    rules:\n"
        "      - when: {pick: direct_only}\n"
        "        variant: direct_only\n"
        "      - when: {pick: module_only}\n"
        "        variant: module_only\n"
        "      - when: {pick: scalar}\n"
        "        variant: scalar\n"
        "      - when: {pick: bound_init}\n"
        "        variant: bound_init\n"
        "      - when: {pick: mixed}\n"
        "        variant: mixed\n"
        "      - when: {pick: exprinit}\n"
        "        variant: exprinit\n"
        "      - when: {pick: fan1d}\n"
        "        variant: fan1d\n"
        "      - when: {pick: square}\n"
        "        variant: square\n"
        "    parameters:\n"
        "      wq:\n"
        "        shape: [num_attention_heads * head_dim, hidden_size]\n"
        "        placements: {tp: shard(0)}\n"
        "        init: {normal: {mean: 0, std: initializer_range}}\n"
        "      wo:\n"
        "        shape: [hidden_size / num_groups, 2]\n"
        "        placements: {dp: replicate, tp: shard(-1)}\n"
        "        init: {uniform: {low: lo, high: 1.5}}\n"
        "  - name: jobdep\n"
        "    baseline: pkg.JobDep\n"
        "    default_variant: v\n"
        "    variants:\n"
        "      v: {constructor: pkg.JobDepV, accepts: [config, module]}\n"
        "      bad:\n"
        "        constructor: pkg.JobDepBad\n"
        "        accepts: [config]\n"
        "        parameters:\n"
        "          w:\n"
        "            shape: [4]\n"
        "            placements:\n"
        "              tp: [{when: 'loss_parallel or tp_size / (cp_size - 1) > 1', placement: shard(0)}]\n"
        "    selectors:\n"
        "      pick: {type: string, default: v}\n"
        "    rules:\n"
        "      - {when: {pick: bad}, variant: bad}\n"
        "    parameters:\n"
        "      experts:\n"
        "        shape: [8, 4]\n"
        "        placements:\n"
        "          dp: replicate\n"
        "          ep: [{when: ep_size > 1, placement: shard(0)}]\n"
        "          tp:\n"
        "            - {when: ep_size > 1, placement: none}\n"
        "            - {when: tp_size > 1 and sequence_parallel, placement: shard(-1)}\n"
        "            - {placement: replicate}\n"
        "      norm:\n"
        "        shape: [4]\n"
        "        placements:\n"
        "          tp: [{when: loss_parallel, placement: shard(0)}]\n"
        "  - name: nop\n"
        "    baseline: pkg.Nop\n"
        "    default_variant: v\n"
        "    variants:\n"
        "      v: {constructor: pkg.NopV, accepts: [config, module]}\n";

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

        strcpy(fx.dir, "/tmp/test-build-plan-XXXXXX");
        assert_non_null(mkdtemp(fx.dir));
        snprintf(path, sizeof path, "%s/extra.yaml", fx.dir);
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        assert_true(fputs(extra_yaml, f) >= 0);
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

#define BOOL(x) ((Value) { .kind = VALUE_BOOL, .b = (x) })
#define INT(x) ((Value) { .kind = VALUE_INT, .i = (x) })
#define FLOAT(x) ((Value) { .kind = VALUE_FLOAT, .f = (x) })
#define STRING(x) ((Value) { .kind = VALUE_STRING, .s = strdup(x) })

static BuildRequest req(const char *family) {
        BuildRequest r = { .family = strdup(family) };
        assert_non_null(r.family);
        return r;
}

static void arg(BuildRequest *r, const char *name, Value v) {
        assert_int_equal(value_map_put(&r->arguments, name, &v), 0);
}

static void cfg(BuildRequest *r, const char *name, Value v) {
        r->has_config = true;
        assert_int_equal(value_map_put(&r->config, name, &v), 0);
}

/* The conformance grouped_experts config, or the attn one, complete. */
static void grouped_config(BuildRequest *r) {
        cfg(r, "num_experts", INT(8));
        cfg(r, "hidden_size", INT(16));
        cfg(r, "moe_intermediate_size", INT(32));
        cfg(r, "initializer_range", FLOAT(0.02));
}

static void attn_config(BuildRequest *r) {
        cfg(r, "num_attention_heads", INT(4));
        cfg(r, "head_dim", INT(8));
        cfg(r, "hidden_size", INT(32));
        cfg(r, "num_groups", INT(4));
        cfg(r, "initializer_range", FLOAT(0.02));
        cfg(r, "lo", INT(-1));
}

static void scfg(BuildRequest *r, const char *name, Value v) {
        r->has_source_config = true;
        assert_int_equal(value_map_put(&r->source_config, name, &v), 0);
}

static void module(BuildRequest *r, const char *fqn) {
        r->has_module = true;
        free(r->module.fqn);
        r->module.fqn = fqn ? strdup(fqn) : NULL;
}

/* A source parameter: n dimensions follow. */
static void src(BuildRequest *r, const char *name, size_t n, ...) {
        SourceModule *m = &r->module;
        va_list ap;

        r->has_module = true;
        m->parameters = realloc(m->parameters, (m->n_parameters + 1) * sizeof(SourceParameter));
        assert_non_null(m->parameters);
        SourceParameter *p = &m->parameters[m->n_parameters++];
        *p = (SourceParameter) { .name = strdup(name), .n_dims = n, .dtype = strdup("float32") };
        p->shape = n > 0 ? calloc(n, sizeof(int64_t)) : NULL;
        va_start(ap, n);
        for (size_t i = 0; i < n; i++)
                p->shape[i] = va_arg(ap, int64_t);
        va_end(ap);
}

static void size(BuildRequest *r, Axis a, int64_t n) {
        r->context.has_size[a] = true;
        r->context.size[a] = n;
}

static void set_str(char **p, const char *s) {
        free(*p);
        *p = s ? strdup(s) : NULL;
}

static const Registry *registry_for(const BuildRequest *r) {
        return strncmp(r->family, "pkg.", 4) == 0 || streq(r->family, "attn") || streq(r->family, "nop") ||
                streq(r->family, "jobdep") ?
                fx.extra : fx.conformance;
}

/* Plans r (consumed) and asserts the exact failure; the result is not written. */
static void expect_fail(BuildRequest r, FamilyStatus status, const char *reason, const char *message) {
        BuildPlan out = { .module_fqn = (char *) "untouched" };
        FamilyError e = FAMILY_ERROR_NULL;

        int k = build_plan(registry_for(&r), fx.meshes, &r, &out, &e);
        if (k != -EINVAL)
                fail_msg("%s: expected -EINVAL with '%s', got %d", r.family, message, k);
        assert_string_equal(out.module_fqn, "untouched");
        assert_null(out.parameters);
        assert_null(out.mesh);
        assert_string_equal(e.message, message);
        assert_string_equal(family_status_to_string(e.status), family_status_to_string(status));
        assert_string_equal(e.reason, reason);
        family_error_done(&e);
        build_request_done(&r);
}

#define INVALID(r, reason, message) expect_fail((r), FAMILY_STATUS_INVALID_ARGUMENT, (reason), (message))

static BuildPlan expect_ok(BuildRequest r) {
        BuildPlan out = {};
        FamilyError e = FAMILY_ERROR_NULL;

        int k = build_plan(registry_for(&r), fx.meshes, &r, &out, &e);
        if (k < 0)
                fail_msg("%s: %d %s", r.family, k, strempty(e.message));
        assert_false(family_error_is_set(&e));
        build_request_done(&r);
        return out;
}

static void assert_shape(const PlanParameter *p, const char *name, size_t n, ...) {
        va_list ap;

        assert_string_equal(p->name, name);
        assert_int_equal(p->n_dims, n);
        int64_t elements = 1;
        va_start(ap, n);
        for (size_t i = 0; i < n; i++) {
                int64_t d = va_arg(ap, int64_t);
                assert_int_equal(p->shape[i], d);
                elements *= d;
        }
        va_end(ap);
        assert_int_equal(p->n_elements, elements);
}

static char *create_mesh_flags(const char *device, const char *expert, bool sequence_parallel,
                               bool loss_parallel) {
        MeshSpec s = { .sequence_parallel = sequence_parallel, .loss_parallel = loss_parallel };
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

static char *create_mesh(const char *device, const char *expert) {
        return create_mesh_flags(device, expert, false, false);
}

/* Step 1: target and arguments as Resolve 1-2, then `config` among the arguments. */
static void test_step1(void **state) {
        BuildRequest r;

        r = req("nope");
        attn_config(&r);
        expect_fail(r, FAMILY_STATUS_NOT_FOUND, "UNKNOWN_FAMILY",
                    "family name 'nope' must identify exactly one registration");

        r = req("norm");
        cfg(&r, "hidden_size", INT(4));
        INVALID(r, "AMBIGUOUS_FAMILY", "family name 'norm' must identify exactly one registration");

        r = req("engram");
        cfg(&r, "hidden_size", INT(4));
        INVALID(r, "NO_DEFAULT_VARIANT", "FamilyRequest requires a family with a concrete default_variant");

        /* config with config also given */
        r = req("attn");
        attn_config(&r);
        arg(&r, "config", INT(1));
        INVALID(r, "CONFIG", "config was supplied twice");

        /* config alone: with a module, or with nothing else at all (step 1 precedes step 2) */
        r = req("attn");
        src(&r, "wq", 2, (int64_t) 4, (int64_t) 4);
        arg(&r, "config", STRING("x"));
        INVALID(r, "CONFIG", "config must be given in BuildRequest.config");

        r = req("attn");
        arg(&r, "config", INT(1));
        INVALID(r, "CONFIG", "config must be given in BuildRequest.config");

        /* Resolve 2 comes first: config is allowed there (neither unknown nor type-checked), so an
         * unknown key or a wrong type answers before the config checks, as in the seed. */
        r = req("attn");
        attn_config(&r);
        arg(&r, "config", INT(1));
        arg(&r, "bogus", INT(1));
        arg(&r, "another", INT(1));
        INVALID(r, "UNKNOWN_ARGUMENTS", "attn: unknown arguments: ['another', 'bogus']");

        r = req("attn");
        arg(&r, "config", INT(1));
        arg(&r, "zeta", STRING("x"));
        arg(&r, "activation", INT(3));
        INVALID(r, "ARGUMENT_TYPE", "argument 'activation' must be string");

        r = req("attn");
        arg(&r, "pick", INT(3));
        INVALID(r, "ARGUMENT_TYPE", "selector 'pick' must be string");

        /* The other reserved runtime names stay unknown arguments. */
        r = req("attn");
        attn_config(&r);
        arg(&r, "module", STRING("x"));
        arg(&r, "module_fqn", STRING("x"));
        arg(&r, "context", STRING("x"));
        INVALID(r, "UNKNOWN_ARGUMENTS", "attn: unknown arguments: ['context', 'module', 'module_fqn']");

        /* The target comes before the arguments. */
        r = req("nope");
        arg(&r, "config", INT(1));
        expect_fail(r, FAMILY_STATUS_NOT_FOUND, "UNKNOWN_FAMILY",
                    "family name 'nope' must identify exactly one registration");
}

/* Step 2: exactly one origin; module_fqn against module.fqn. */
static void test_step2(void **state) {
        BuildRequest r;

        r = req("attn");
        INVALID(r, "BINDING", "provide exactly one of config or module");

        /* an empty config is a config */
        r = req("attn");
        r.has_config = true;
        module(&r, "layers.0.attn");
        INVALID(r, "BINDING", "provide exactly one of config or module");

        /* before the mesh is looked at */
        r = req("attn");
        set_str(&r.mesh_id, "missing");
        INVALID(r, "BINDING", "provide exactly one of config or module");

        r = req("attn");
        module(&r, "b");
        set_str(&r.module_fqn, "a");
        INVALID(r, "BINDING", "module_fqn 'a' disagrees with module.fqn 'b'");

        r = req("attn");
        module(&r, "layers.0.it's");
        set_str(&r.module_fqn, "layers.0.mlp");
        INVALID(r, "BINDING", "module_fqn 'layers.0.mlp' disagrees with module.fqn \"layers.0.it's\"");

        /* before the mesh: both checks of step 2 precede step 3 */
        r = req("attn");
        module(&r, "b");
        set_str(&r.module_fqn, "a");
        set_str(&r.mesh_id, "missing");
        INVALID(r, "BINDING", "module_fqn 'a' disagrees with module.fqn 'b'");

        /* module_fqn defaults to module.fqn; module_fqn stands in for an empty module.fqn */
        {
                r = req("attn");
                module(&r, "layers.3.attn");
                src(&r, "wq", 2, (int64_t) 32, (int64_t) 16);
                src(&r, "wo", 2, (int64_t) 4, (int64_t) 2);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.module_fqn, "layers.3.attn");
        }
        {
                r = req("attn");
                module(&r, NULL);
                set_str(&r.module_fqn, "layers.4.attn");
                src(&r, "wq", 2, (int64_t) 32, (int64_t) 16);
                INVALID(r, "SHAPE", "module 'layers.4.attn' has no parameter 'wo'");
        }
        {
                r = req("attn");
                module(&r, "same");
                set_str(&r.module_fqn, "same");
                src(&r, "wq", 2, (int64_t) 32, (int64_t) 16);
                src(&r, "wo", 2, (int64_t) 4, (int64_t) 2);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.module_fqn, "same");
        }
        {
                /* direct: module_fqn as given, "" when absent */
                r = req("attn");
                attn_config(&r);
                set_str(&r.module_fqn, "layers.1.attn");
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.module_fqn, "layers.1.attn");
        }
        {
                r = req("nop");
                r.has_config = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.module_fqn, "");
        }
}

/* Step 3: the mesh, Resolve 3-8, binding. */
static void test_step3_mesh(void **state) {
        _cleanup_free_ char *id = create_mesh("dp=2 ep=4", "");
        _cleanup_free_ char *other = create_mesh("dp=4 tp=2", "");
        BuildRequest r;

        /* both set and different, even if one of them is unknown */
        r = req("grouped_experts");
        grouped_config(&r);
        set_str(&r.mesh_id, id);
        set_str(&r.context.mesh_id, other);
        INVALID(r, "MESH_MISMATCH", "context and mesh belong to different jobs");

        r = req("grouped_experts");
        grouped_config(&r);
        set_str(&r.mesh_id, "missing");
        set_str(&r.context.mesh_id, id);
        INVALID(r, "MESH_MISMATCH", "context and mesh belong to different jobs");

        /* before Resolve 3 */
        r = req("grouped_experts");
        grouped_config(&r);
        set_str(&r.mesh_id, id);
        set_str(&r.context.mesh_id, other);
        size(&r, AXIS_TP, 0);
        INVALID(r, "MESH_MISMATCH", "context and mesh belong to different jobs");

        r = req("grouped_experts");
        grouped_config(&r);
        set_str(&r.mesh_id, "missing");
        expect_fail(r, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh 'missing' not found");

        r = req("grouped_experts");
        grouped_config(&r);
        size(&r, AXIS_TP, 0);
        INVALID(r, "AXIS_SIZE", "tp_size must be a positive integer");

        r = req("grouped_experts");
        grouped_config(&r);
        r.context.active[AXIS_CP] = true;
        INVALID(r, "AXIS_REQUIRED", "cp_size is required when cp is active");

        r = req("grouped_experts");
        grouped_config(&r);
        set_str(&r.mesh_id, id);
        size(&r, AXIS_EP, 2);
        INVALID(r, "CONTEXT_MESH_DISAGREE", "context and mesh disagree on ep_size");

        /* Without a table every mesh is unknown. */
        {
                BuildRequest q = req("grouped_experts");
                BuildPlan out = {};
                FamilyError e = FAMILY_ERROR_NULL;

                grouped_config(&q);
                set_str(&q.mesh_id, id);
                assert_int_equal(build_plan(fx.conformance, NULL, &q, &out, &e), -EINVAL);
                assert_string_equal(e.reason, "MESH_NOT_FOUND");
                family_error_done(&e);
                build_request_done(&q);
        }

        /* mesh_id names the mesh: ep=4 makes the family parallel */
        {
                r = req("grouped_experts");
                grouped_config(&r);
                set_str(&r.mesh_id, id);
                size(&r, AXIS_EP, 4);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_non_null(p.mesh);
                assert_string_equal(p.mesh->id, id);
                assert_string_equal(p.resolved.variant, "grouped_ep");
                assert_int_equal(p.resolved.axis_size[AXIS_EP], 4);
                assert_string_equal(p.request.context.mesh_id, id);
                assert_string_equal(p.request.family, "grouped_experts");
        }
        /* the context names it; or both name the same one */
        {
                r = req("grouped_experts");
                grouped_config(&r);
                set_str(&r.context.mesh_id, id);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.mesh->id, id);
                assert_string_equal(p.resolved.variant, "grouped_ep");
        }
        {
                r = req("grouped_experts");
                grouped_config(&r);
                set_str(&r.context.mesh_id, id);
                set_str(&r.mesh_id, id);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.mesh->id, id);
        }
        /* an empty mesh_id is none */
        {
                r = req("grouped_experts");
                grouped_config(&r);
                set_str(&r.mesh_id, "");
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_null(p.mesh);
                assert_string_equal(p.resolved.variant, "grouped");
        }
}

static void test_step3_resolve_and_binding(void **state) {
        BuildRequest r;

        r = req("grouped_experts");
        grouped_config(&r);
        arg(&r, "use_fused_mxfp8", BOOL(true));
        INVALID(r, "RULE_ERROR", "use_fused_mxfp8 requires use_mxfp8=True");

        r = req("grouped_experts");
        grouped_config(&r);
        arg(&r, "use_fused_mxfp8", BOOL(true));
        arg(&r, "use_mxfp8", BOOL(true));
        expect_fail(r, FAMILY_STATUS_UNIMPLEMENTED, "RULE_UNSUPPORTED",
                    "use_fused_mxfp8=True is not supported; use non-fused MXFP8");

        r = req("grouped_experts");
        grouped_config(&r);
        arg(&r, "use_mxfp8", BOOL(true));
        size(&r, AXIS_EP, 4);
        expect_fail(r, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT",
                    "variant 'mxfp8' requires ep in [1, 2]; job has ep=4");

        r = req("grouped_experts");
        grouped_config(&r);
        arg(&r, "use_mxfp8", BOOL(true));
        arg(&r, "activation", STRING("gelu"));
        INVALID(r, "BINDING", "member 'mxfp8' does not accept ['activation']");

        /* all unaccepted arguments, sorted */
        r = req("attn");
        attn_config(&r);
        arg(&r, "zeta", INT(2));
        arg(&r, "activation", STRING("gelu"));
        arg(&r, "pick", STRING("direct_only"));
        INVALID(r, "BINDING", "member 'direct_only' does not accept ['activation', 'zeta']");

        /* the member must accept its origin's runtime name, checked before the arguments */
        r = req("attention");
        arg(&r, "use_mxfp8", BOOL(true));
        src(&r, "wq", 2, (int64_t) 4, (int64_t) 4);
        module(&r, "layers.0.attn");
        INVALID(r, "BINDING", "member 'mxfp8' must explicitly accept module");

        r = req("attn");
        arg(&r, "pick", STRING("direct_only"));
        arg(&r, "activation", STRING("gelu"));
        module(&r, "m");
        INVALID(r, "BINDING", "member 'direct_only' must explicitly accept module");

        r = req("attn");
        arg(&r, "pick", STRING("module_only"));
        attn_config(&r);
        INVALID(r, "BINDING", "member 'module_only' must explicitly accept config");

        /* binding precedes the parameters: an empty config would fail step 4 */
        r = req("attn");
        r.has_config = true;
        arg(&r, "pick", STRING("module_only"));
        INVALID(r, "BINDING", "member 'module_only' must explicitly accept config");

        r = req("attn");
        r.has_config = true;
        arg(&r, "pick", STRING("direct_only"));
        arg(&r, "zeta", INT(2));
        INVALID(r, "BINDING", "member 'direct_only' does not accept ['zeta']");

        /* selectors are consumed: they never need accepting */
        {
                r = req("grouped_experts");
                grouped_config(&r);
                arg(&r, "use_mxfp8", BOOL(true));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.resolved.variant, "mxfp8");
                assert_int_equal(p.resolved.arguments.n, 0);
                assert_int_equal(p.request.arguments.n, 1);
                assert_string_equal(p.request.arguments.items[0].name, "use_mxfp8");
        }
}

/* Step 4, direct. */
static void test_direct_success(void **state) {
        BuildRequest r = req("attn");

        attn_config(&r);
        arg(&r, "activation", STRING("gelu"));
        r.materialize = (MaterializeOptions) {
                .enabled = true, .dtype = strdup("bf16"), .has_seed = true, .seed = 7,
                .ranks = calloc(2, sizeof(int64_t)), .n_ranks = 2,
        };
        r.materialize.ranks[1] = 5;

        _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
        assert_int_equal(p.origin, BUILD_ORIGIN_DIRECT);
        assert_string_equal(build_origin_to_string(p.origin), "direct");
        assert_string_equal(p.resolved.family, "attn");
        assert_string_equal(p.resolved.variant, "plain");
        assert_string_equal(p.resolved.constructor, "pkg.Plain");
        assert_int_equal(p.resolved.arguments.n, 1);
        assert_null(p.mesh);
        assert_true(p.reset_after_materialization);
        assert_true(p.has_config);
        assert_int_equal(p.config.n, 6);
        assert_int_equal(value_map_get(&p.config, "head_dim")->i, 8);
        assert_int_equal(p.bound_fields.n, 0);

        assert_int_equal(p.n_parameters, 2);
        assert_shape(&p.parameters[0], "wq", 2, (int64_t) 32, (int64_t) 32);
        assert_int_equal(p.parameters[0].n_placements, 1);
        assert_string_equal(p.parameters[0].placements[0].axis, "tp");
        assert_int_equal(p.parameters[0].placements[0].kind, PLACEMENT_SHARD);
        assert_int_equal(p.parameters[0].placements[0].dim, 0);
        assert_true(p.parameters[0].init_resolved);
        assert_int_equal(p.parameters[0].init.kind, INIT_NORMAL);
        assert_true(p.parameters[0].init.a == 0.0);
        assert_true(p.parameters[0].init.b == 0.02);
        assert_string_equal(p.parameters[0].init_text, "normal(mean=0, std=initializer_range)");

        assert_shape(&p.parameters[1], "wo", 2, (int64_t) 8, (int64_t) 2);
        assert_int_equal(p.parameters[1].n_placements, 2);
        assert_string_equal(p.parameters[1].placements[0].axis, "dp");
        assert_int_equal(p.parameters[1].placements[0].kind, PLACEMENT_REPLICATE);
        assert_string_equal(p.parameters[1].placements[1].axis, "tp");
        assert_int_equal(p.parameters[1].placements[1].dim, -1);
        /* an int config field is a number for an init */
        assert_int_equal(p.parameters[1].init.kind, INIT_UNIFORM);
        assert_true(p.parameters[1].init.a == -1.0);
        assert_true(p.parameters[1].init.b == 1.5);

        /* carried through */
        assert_true(p.materialize.enabled);
        assert_string_equal(p.materialize.dtype, "bf16");
        assert_true(p.materialize.has_seed);
        assert_int_equal(p.materialize.seed, 7);
        assert_int_equal(p.materialize.n_ranks, 2);
        assert_int_equal(p.materialize.ranks[1], 5);
        assert_string_equal(p.request.family, "attn");
        assert_null(p.request.context.mesh_id);
}

/* Expression inits and trunc_normal: evaluated at Build in double, with the parameter's fans. */
static BuildRequest exprinit_request(int64_t n, double r, int64_t layers, double hi) {
        BuildRequest q = req("attn");
        arg(&q, "pick", STRING("exprinit"));
        cfg(&q, "n", INT(n));
        cfg(&q, "r", FLOAT(r));
        cfg(&q, "layers", INT(layers));
        cfg(&q, "mu", INT(0));
        cfg(&q, "hi", FLOAT(hi));
        return q;
}

static void test_init_expressions(void **state) {
        {
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(exprinit_request(4, 0.02, 12, 0.5));
                assert_int_equal(p.parameters[0].init.kind, INIT_NORMAL);
                assert_true(p.parameters[0].init.b == 0.02 / sqrt(2.0 * 12));
                assert_string_equal(p.parameters[0].init_text, "normal(mean=0, std=r / sqrt(2 * layers))");
                /* fan_in of [4, 4, 2]: 4 * 2 */
                assert_int_equal(p.parameters[1].init.kind, INIT_TRUNC_NORMAL);
                assert_true(p.parameters[1].init.a == 0);
                assert_true(p.parameters[1].init.b == 1 / sqrt(8.0));
                assert_true(p.parameters[1].init.c == -2 / sqrt(8.0));
                assert_true(p.parameters[1].init.d == 0.5);
                assert_string_equal(p.parameters[1].init_text,
                                    "trunc_normal(mean=mu, std=1 / sqrt(fan_in), a=-2 / sqrt(fan_in), b=hi)");
        }
        INVALID(exprinit_request(4, 0.02, 0, 0.5), "INIT",
                "parameter 'w': init std 'r / sqrt(2 * layers)' is not finite");
        INVALID(exprinit_request(4, 0.02, -1, 0.5), "INIT",
                "parameter 'w': init std 'r / sqrt(2 * layers)' takes the square root of -2");
        INVALID(exprinit_request(4, -0.02, 2, 0.5), "INIT", "parameter 'w': init std must not be negative, got -0.01");
        INVALID(exprinit_request(4, 0.02, 2, -1), "INIT",
                "parameter 't': init bound a must be less than b, got a=-0.7071067811865475, b=-1");
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("exprinit"));
                cfg(&q, "n", INT(4));
                cfg(&q, "r", FLOAT(0.02));
                INVALID(q, "CONFIG", "parameter 'w' needs config field 'layers'");
        }
        {
                BuildRequest q = exprinit_request(4, 0.02, 2, 0.5);
                Value v = STRING("x");
                assert_int_equal(value_map_put(&q.config, "r", &v), 0);
                INVALID(q, "CONFIG", "config field 'r' must be float");
        }
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("fan1d"));
                cfg(&q, "n", INT(4));
                INVALID(q, "INIT",
                        "parameter 'v': init high '1 / fan_in' uses fan_in, which needs at least 2 dimensions; "
                        "the parameter has 1");
        }
        /* A replacement: fields from the source's shapes and source_config; one in neither leaves zeros. */
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("exprinit"));
                module(&q, "m");
                src(&q, "w", 2, (int64_t) 4, (int64_t) 12);
                src(&q, "t", 3, (int64_t) 4, (int64_t) 4, (int64_t) 2);
                scfg(&q, "r", FLOAT(0.02));
                scfg(&q, "layers", INT(2));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(q);
                assert_true(p.parameters[0].init_resolved);
                assert_true(p.parameters[0].init.b == 0.02 / 2);
                assert_false(p.parameters[1].init_resolved); /* mu and hi are in neither */
                assert_int_equal(p.parameters[1].init.kind, INIT_ZEROS);
                assert_int_equal(p.init_fields.n, 2);
                assert_non_null(value_map_get(&p.init_fields, "r"));
                assert_non_null(value_map_get(&p.init_fields, "layers"));
        }
}

static void test_direct_variants(void **state) {
        /* a variant's own parameters replace the family's; a scalar has no dimensions */
        {
                BuildRequest r = req("attn");
                arg(&r, "pick", STRING("scalar"));
                cfg(&r, "mu", FLOAT(0.5));
                cfg(&r, "sigma", INT(2));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.n_parameters, 2);
                assert_shape(&p.parameters[0], "bias", 0);
                assert_null(p.parameters[0].shape);
                assert_int_equal(p.parameters[0].init.kind, INIT_CONSTANT);
                assert_true(p.parameters[0].init.a == 3.0);
                assert_int_equal(p.parameters[0].n_placements, 0);
                assert_true(p.parameters[1].init.a == 0.5);
                assert_true(p.parameters[1].init.b == 2.0);
        }
        /* the conformance family, by baseline */
        {
                BuildRequest r = req("hyper_parallel.components.modules.grouped_experts.GroupedExperts");
                grouped_config(&r);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_string_equal(p.resolved.family, "grouped_experts");
                assert_shape(&p.parameters[0], "gate_up_proj", 3, (int64_t) 8, (int64_t) 16, (int64_t) 64);
                assert_shape(&p.parameters[1], "down_proj", 3, (int64_t) 8, (int64_t) 32, (int64_t) 16);
                assert_string_equal(p.parameters[1].placements[0].axis, "ep");
                assert_true(p.parameters[1].init.a == 0.0);
                assert_true(p.parameters[1].init.b == 0.02);
        }
        /* zeros when no init is declared; a norm with ones */
        {
                BuildRequest r = req("hyper_parallel.components.modules.norm.RMSNorm");
                cfg(&r, "hidden_size", INT(64));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_shape(&p.parameters[0], "weight", 1, (int64_t) 64);
                assert_int_equal(p.parameters[0].init.kind, INIT_ONES);
                assert_true(p.reset_after_materialization);
        }
        /* no parameters: nothing to reset */
        {
                BuildRequest r = req("nop");
                r.has_config = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.n_parameters, 0);
                assert_null(p.parameters);
                assert_false(p.reset_after_materialization);
                assert_true(p.has_config);
                assert_int_equal(p.config.n, 0);
        }
}

static void test_direct_failures(void **state) {
        BuildRequest r;

        /* missing field, in the first parameter that needs it */
        r = req("attn");
        attn_config(&r);
        value_map_done(&r.config);
        cfg(&r, "num_attention_heads", INT(4));
        cfg(&r, "hidden_size", INT(32));
        INVALID(r, "CONFIG", "parameter 'wq' needs config field 'head_dim'");

        r = req("attn");
        cfg(&r, "num_attention_heads", INT(4));
        cfg(&r, "head_dim", INT(8));
        cfg(&r, "hidden_size", INT(32));
        cfg(&r, "initializer_range", FLOAT(0.02));
        INVALID(r, "CONFIG", "parameter 'wo' needs config field 'num_groups'");

        /* a shape field must be an int: not a float, a bool, a string, a value with no kind */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "head_dim", FLOAT(8.0));
        INVALID(r, "CONFIG", "config field 'head_dim' must be int");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "hidden_size", BOOL(true));
        INVALID(r, "CONFIG", "config field 'hidden_size' must be int");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_groups", STRING("4"));
        INVALID(r, "CONFIG", "config field 'num_groups' must be int");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_groups", ((Value) { .kind = VALUE_NONE }));
        INVALID(r, "CONFIG", "config field 'num_groups' must be int");

        /* the semantics example */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "hidden_size", INT(4096));
        cfg(&r, "num_groups", INT(30));
        INVALID(r, "SHAPE", "parameter 'wo': 4096 / 30 does not divide exactly");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_groups", INT(0));
        INVALID(r, "SHAPE", "parameter 'wo': 32 / 0 does not divide exactly");

        /* dimensions count from 0 (as shard(d) does) */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "hidden_size", INT(-3));
        cfg(&r, "num_groups", INT(1));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 1 must be positive, got -3");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_attention_heads", INT(0));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 0 must be positive, got 0");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_groups", INT(-4));
        INVALID(r, "SHAPE", "parameter 'wo': dimension 0 must be positive, got -8");

        /* the first failing dimension answers: dimension 0 negative before dimension 1 missing */
        r = req("attn");
        cfg(&r, "num_attention_heads", INT(-1));
        cfg(&r, "head_dim", INT(8));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 0 must be positive, got -8");

}

static void test_direct_failures_sizes(void **state) {
        BuildRequest r;

        /* overflow in a dimension, and of the element count */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_attention_heads", INT(INT64_MAX));
        cfg(&r, "head_dim", INT(2));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 0 overflows int64");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_attention_heads", INT(INT64_MIN));
        cfg(&r, "head_dim", INT(-1));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 0 overflows int64");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "hidden_size", INT(INT64_MIN));
        cfg(&r, "num_groups", INT(-1));
        cfg(&r, "num_attention_heads", INT(1));
        cfg(&r, "head_dim", INT(1));
        INVALID(r, "SHAPE", "parameter 'wq': dimension 1 must be positive, got -9223372036854775808");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_attention_heads", INT(INT64_C(1) << 32));
        cfg(&r, "head_dim", INT(1));
        cfg(&r, "hidden_size", INT(INT64_C(1) << 32));
        INVALID(r, "SHAPE", "parameter 'wq': shape [4294967296, 4294967296] is too large");

        /* the bound: 2^60 - 1 elements pass, 2^60 do not */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "num_attention_heads", INT(INT64_C(1) << 30));
        cfg(&r, "head_dim", INT(1));
        cfg(&r, "hidden_size", INT(INT64_C(1) << 30));
        cfg(&r, "num_groups", INT(1));
        INVALID(r, "SHAPE", "parameter 'wq': shape [1073741824, 1073741824] is too large");
        {
                r = req("attn");
                attn_config(&r);
                cfg(&r, "num_attention_heads", INT(3));
                cfg(&r, "head_dim", INT(1));
                cfg(&r, "hidden_size", INT(((INT64_C(1) << 60) - 1) / 3));
                cfg(&r, "num_groups", INT(1));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.parameters[0].n_elements, BUILD_PLAN_MAX_ELEMENTS);
                assert_int_equal(BUILD_PLAN_MAX_ELEMENTS, (INT64_C(1) << 60) - 1);
        }

        /* init numbers: after the shape, a config field that is a number */
        r = req("attn");
        attn_config(&r);
        value_map_done(&r.config);
        cfg(&r, "num_attention_heads", INT(4));
        cfg(&r, "head_dim", INT(8));
        cfg(&r, "hidden_size", INT(32));
        cfg(&r, "num_groups", INT(4));
        INVALID(r, "CONFIG", "parameter 'wq' needs config field 'initializer_range'");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "initializer_range", STRING("0.02"));
        INVALID(r, "CONFIG", "config field 'initializer_range' must be float");

        r = req("attn");
        attn_config(&r);
        cfg(&r, "lo", BOOL(false));
        INVALID(r, "CONFIG", "config field 'lo' must be float");

        r = req("attn");
        arg(&r, "pick", STRING("scalar"));
        cfg(&r, "mu", FLOAT(0.5));
        INVALID(r, "CONFIG", "parameter 'gauss' needs config field 'sigma'");

        /* a shape field must be an int even where another parameter's init reads it as a number */
        r = req("attn");
        attn_config(&r);
        cfg(&r, "initializer_range", INT(1));
        cfg(&r, "hidden_size", FLOAT(32.0));
        INVALID(r, "CONFIG", "config field 'hidden_size' must be int");
}

/* Step 4, replacement. */
static void grouped_source(BuildRequest *r, int64_t e1, int64_t h1, int64_t i2, int64_t e2, int64_t i, int64_t h2) {
        module(r, "layers.0.mlp");
        src(r, "gate_up_proj", 3, e1, h1, i2);
        src(r, "down_proj", 3, e2, i, h2);
}

static void test_replacement_success(void **state) {
        BuildRequest r = req("grouped_experts");

        grouped_source(&r, 4, 32, 32, 4, 16, 32);
        src(&r, "ignored", 1, (int64_t) -5);
        arg(&r, "activation", STRING("gelu"));

        _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
        assert_int_equal(p.origin, BUILD_ORIGIN_REPLACEMENT);
        assert_string_equal(build_origin_to_string(p.origin), "replacement");
        assert_string_equal(p.module_fqn, "layers.0.mlp");
        assert_false(p.reset_after_materialization);
        assert_false(p.has_config);
        assert_int_equal(p.config.n, 0);
        assert_int_equal(p.n_parameters, 2);
        assert_shape(&p.parameters[0], "gate_up_proj", 3, (int64_t) 4, (int64_t) 32, (int64_t) 32);
        assert_shape(&p.parameters[1], "down_proj", 3, (int64_t) 4, (int64_t) 16, (int64_t) 32);
        assert_string_equal(p.parameters[0].placements[0].axis, "ep");

        /* bound in declared order */
        assert_int_equal(p.bound_fields.n, 3);
        assert_string_equal(p.bound_fields.items[0].name, "num_experts");
        assert_int_equal(p.bound_fields.items[0].value.i, 4);
        assert_string_equal(p.bound_fields.items[1].name, "hidden_size");
        assert_string_equal(p.bound_fields.items[2].name, "moe_intermediate_size");
        assert_int_equal(p.bound_fields.items[2].value.i, 16);

        /* initializer_range is no shape's field: unresolved, zeros */
        assert_false(p.parameters[0].init_resolved);
        assert_int_equal(p.parameters[0].init.kind, INIT_ZEROS);
        assert_string_equal(p.parameters[0].init_text, "normal(mean=0, std=initializer_range)");

        /* the last of a name given twice wins */
        {
                BuildRequest q = req("grouped_experts");
                grouped_source(&q, 4, 32, 32, 4, 16, 32);
                src(&q, "down_proj", 3, (int64_t) 4, (int64_t) 16, (int64_t) 32);
                src(&q, "gate_up_proj", 3, (int64_t) 4, (int64_t) 32, (int64_t) 32);
                q.module.parameters[0].shape[0] = 9; /* the first gate_up_proj, overridden */
                _cleanup_(build_plan_done) BuildPlan p2 = expect_ok(q);
                assert_int_equal(p2.parameters[0].shape[0], 4);
        }
        /* an init number a shape binds resolves; one that nothing binds leaves zeros */
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("bound_init"));
                module(&q, "m");
                src(&q, "w", 2, (int64_t) 6, (int64_t) 7);
                src(&q, "v", 1, (int64_t) 12);
                _cleanup_(build_plan_done) BuildPlan p3 = expect_ok(q);
                assert_true(p3.parameters[0].init_resolved);
                assert_int_equal(p3.parameters[0].init.kind, INIT_UNIFORM);
                assert_true(p3.parameters[0].init.a == 0.0);
                assert_true(p3.parameters[0].init.b == 6.0);
                assert_false(p3.parameters[1].init_resolved);
                assert_int_equal(p3.parameters[1].init.kind, INIT_ZEROS);
        }
        /* a literal init in a replacement build resolves; a module-only member */
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("scalar"));
                module(&q, "m");
                src(&q, "bias", 0);
                src(&q, "gauss", 1, (int64_t) 2);
                _cleanup_(build_plan_done) BuildPlan p4 = expect_ok(q);
                assert_true(p4.parameters[0].init_resolved);
                assert_int_equal(p4.parameters[0].init.kind, INIT_CONSTANT);
                assert_true(p4.parameters[0].init.a == 3.0);
                assert_int_equal(p4.parameters[0].n_elements, 1);
        }
        {
                BuildRequest q = req("attn");
                arg(&q, "pick", STRING("module_only"));
                module(&q, "m");
                src(&q, "wq", 2, (int64_t) 32, (int64_t) 16);
                src(&q, "wo", 2, (int64_t) 5, (int64_t) 2);
                _cleanup_(build_plan_done) BuildPlan p5 = expect_ok(q);
                assert_string_equal(p5.resolved.variant, "module_only");
                /* hidden_size / num_groups: num_groups is never bound, so it goes unchecked */
                assert_int_equal(p5.parameters[1].shape[0], 5);
        }
        /* a replacement over a mesh */
        {
                _cleanup_free_ char *id = create_mesh("dp=4 ep=2", "");
                BuildRequest q = req("grouped_experts");
                grouped_source(&q, 4, 32, 32, 4, 16, 32);
                set_str(&q.mesh_id, id);
                _cleanup_(build_plan_done) BuildPlan p6 = expect_ok(q);
                assert_string_equal(p6.mesh->id, id);
                assert_string_equal(p6.resolved.variant, "grouped_ep");
        }
}

static void test_replacement_failures(void **state) {
        BuildRequest r;

        r = req("grouped_experts");
        module(&r, "layers.0.mlp");
        src(&r, "gate_up_proj", 3, (int64_t) 4, (int64_t) 32, (int64_t) 32);
        INVALID(r, "SHAPE", "module 'layers.0.mlp' has no parameter 'down_proj'");

        /* presence and rank of every parameter precede any binding */
        r = req("grouped_experts");
        module(&r, "layers.0.mlp");
        src(&r, "gate_up_proj", 3, (int64_t) 4, (int64_t) 32, (int64_t) 32);
        src(&r, "down_proj", 2, (int64_t) 8, (int64_t) 16);
        INVALID(r, "SHAPE", "parameter 'down_proj' of module 'layers.0.mlp' has 2 dimensions, expected 3");

        r = req("grouped_experts");
        module(&r, "layers.0.mlp");
        src(&r, "gate_up_proj", 4, (int64_t) 4, (int64_t) 32, (int64_t) 32, (int64_t) 1);
        INVALID(r, "SHAPE", "parameter 'gate_up_proj' of module 'layers.0.mlp' has 4 dimensions, expected 3");

        r = req("grouped_experts");
        module(&r, "layers.0.mlp");
        src(&r, "gate_up_proj", 3, (int64_t) 4, (int64_t) 32, (int64_t) 32);
        src(&r, "down_proj", 3, (int64_t) 8, (int64_t) 16, (int64_t) 32);
        src(&r, "w1", 2, (int64_t) 8, (int64_t) 16);
        INVALID(r, "SHAPE", "parameter 'down_proj' of module 'layers.0.mlp' has shape [8, 16, 32], which contradicts num_experts=4");

        /* a compound expression is checked once its fields are bound, even by a later parameter */
        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 30, 4, 16, 32);
        INVALID(r, "SHAPE", "parameter 'gate_up_proj' of module 'layers.0.mlp' has shape [4, 32, 30], which contradicts moe_intermediate_size=16");

        /* a lone-name contradiction anywhere answers before any compound one */
        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 30, 4, 16, 64);
        INVALID(r, "SHAPE", "parameter 'down_proj' of module 'layers.0.mlp' has shape [4, 16, 64], which contradicts hidden_size=32");

        /* one field twice in one parameter */
        r = req("attn");
        arg(&r, "pick", STRING("bound_init"));
        module(&r, "m");
        src(&r, "w", 2, (int64_t) 6, (int64_t) 8);
        src(&r, "v", 1, (int64_t) 12);
        INVALID(r, "SHAPE", "parameter 'w' of module 'm' has shape [6, 8], which contradicts n=6");

        r = req("attn");
        arg(&r, "pick", STRING("bound_init"));
        module(&r, "m");
        src(&r, "w", 2, (int64_t) 6, (int64_t) 7);
        src(&r, "v", 1, (int64_t) 13);
        INVALID(r, "SHAPE", "parameter 'v' of module 'm' has shape [13], which contradicts n=6");

        r = req("attn");
        module(&r, "layers.0.attn");
        src(&r, "wq", 2, (int64_t) 32, (int64_t) 16);
        src(&r, "wo", 2, (int64_t) 4, (int64_t) 2);
        src(&r, "x", 0);
        {
                /* only hidden_size is a lone name: wq's dim 0 stays unchecked, wo's literal 2 is checked */
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.bound_fields.n, 1);
        }
        r = req("attn");
        module(&r, "layers.0.attn");
        src(&r, "wq", 2, (int64_t) 32, (int64_t) 16);
        src(&r, "wo", 2, (int64_t) 4, (int64_t) 3);
        INVALID(r, "SHAPE", "parameter 'wo' of module 'layers.0.attn' has shape [4, 3], which contradicts 2");

        /* source dimensions must be positive, and the element count bounded */
        r = req("grouped_experts");
        grouped_source(&r, 4, 0, 32, 4, 16, 32);
        INVALID(r, "SHAPE", "parameter 'gate_up_proj': dimension 1 must be positive, got 0");

        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 32, INT64_C(1) << 40, INT64_C(1) << 40, 32);
        INVALID(r, "SHAPE", "parameter 'down_proj': shape [1099511627776, 1099511627776, 32] is too large");

        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 32, 4, INT64_C(1) << 62, 32);
        INVALID(r, "SHAPE", "parameter 'down_proj': shape [4, 4611686018427387904, 32] is too large");

        /* bound fields whose expression has no value (overflow, inexact division) contradict it */
        r = req("attn");
        arg(&r, "pick", STRING("square"));
        module(&r, "m");
        src(&r, "x", 1, INT64_C(1) << 32);
        src(&r, "y", 1, (int64_t) 5);
        src(&r, "z", 1, (int64_t) 5);
        INVALID(r, "SHAPE", "parameter 'y' of module 'm' has shape [5], which contradicts n=4294967296");

        r = req("attn");
        arg(&r, "pick", STRING("square"));
        module(&r, "m");
        src(&r, "x", 1, (int64_t) 4);
        src(&r, "y", 1, (int64_t) 16);
        src(&r, "z", 1, (int64_t) 1);
        INVALID(r, "SHAPE", "parameter 'z' of module 'm' has shape [1], which contradicts n=4");
        {
                r = req("attn");
                arg(&r, "pick", STRING("square"));
                module(&r, "m");
                src(&r, "z", 1, (int64_t) 2);
                src(&r, "y", 1, (int64_t) 36);
                src(&r, "x", 1, (int64_t) 6);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_shape(&p.parameters[0], "x", 1, (int64_t) 6);
                assert_shape(&p.parameters[2], "z", 1, (int64_t) 2);
                assert_true(p.parameters[2].init_resolved);
                assert_int_equal(p.parameters[2].init.kind, INIT_ZEROS);
        }
}

/* BuildRequest.source_config: a replacement's init numbers, after the source's bindings. */
static void test_replacement_source_config(void **state) {
        BuildRequest r;

        /* direct: refused, whatever it holds (an empty one is present too) */
        r = req("grouped_experts");
        grouped_config(&r);
        scfg(&r, "initializer_range", FLOAT(0.02));
        INVALID(r, "BINDING",
                "source_config is only for a replacement (module); a direct build's config is BuildRequest.config");
        r = req("nop");
        r.has_config = true;
        r.has_source_config = true;
        INVALID(r, "BINDING",
                "source_config is only for a replacement (module); a direct build's config is BuildRequest.config");
        /* neither config nor module: step 2's first error stands */
        r = req("grouped_experts");
        scfg(&r, "initializer_range", FLOAT(0.02));
        INVALID(r, "BINDING", "provide exactly one of config or module");

        /* the fallback: the registry's init, as the direct build of that config has it */
        {
                BuildRequest d = req("grouped_experts");
                grouped_config(&d);
                _cleanup_(build_plan_done) BuildPlan direct = expect_ok(d);

                r = req("grouped_experts");
                grouped_source(&r, 8, 16, 64, 8, 32, 16);
                scfg(&r, "num_experts", INT(8));
                scfg(&r, "hidden_size", INT(16));
                scfg(&r, "moe_intermediate_size", INT(32));
                scfg(&r, "initializer_range", FLOAT(0.02));
                scfg(&r, "unused", STRING("anything"));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.n_parameters, direct.n_parameters);
                for (size_t i = 0; i < p.n_parameters; i++) {
                        assert_true(p.parameters[i].init_resolved);
                        assert_int_equal(p.parameters[i].init.kind, direct.parameters[i].init.kind);
                        assert_true(p.parameters[i].init.a == direct.parameters[i].init.a);
                        assert_true(p.parameters[i].init.b == direct.parameters[i].init.b);
                        assert_int_equal(p.parameters[i].n_elements, direct.parameters[i].n_elements);
                }
                assert_int_equal(p.parameters[0].init.kind, INIT_NORMAL);
                assert_true(p.parameters[0].init.b == 0.02);
                /* only the field an init took; the shapes bind the others */
                assert_int_equal(p.init_fields.n, 1);
                assert_string_equal(p.init_fields.items[0].name, "initializer_range");
                assert_true(p.init_fields.items[0].value.f == 0.02);
                assert_int_equal(p.bound_fields.n, 3);
                assert_false(p.has_config);
        }
        /* an int is a number too; a field it lacks leaves that parameter zeros */
        {
                r = req("grouped_experts");
                grouped_source(&r, 4, 32, 32, 4, 16, 32);
                scfg(&r, "initializer_range", INT(2));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_true(p.parameters[0].init.b == 2.0);
                assert_int_equal(p.init_fields.items[0].value.kind, VALUE_INT);

                r = req("grouped_experts");
                grouped_source(&r, 4, 32, 32, 4, 16, 32);
                scfg(&r, "other", FLOAT(0.5));
                _cleanup_(build_plan_done) BuildPlan z = expect_ok(r);
                assert_false(z.parameters[0].init_resolved);
                assert_int_equal(z.parameters[0].init.kind, INIT_ZEROS);
                assert_int_equal(z.init_fields.n, 0);
        }
}

static void test_replacement_source_config_bound(void **state) {
        BuildRequest r;

        /* the bound value wins: n comes from the shapes (and agrees), m from source_config */
        {
                r = req("attn");
                arg(&r, "pick", STRING("bound_init"));
                module(&r, "m");
                src(&r, "w", 2, (int64_t) 6, (int64_t) 7);
                src(&r, "v", 1, (int64_t) 12);
                scfg(&r, "m", FLOAT(2.5));
                scfg(&r, "n", INT(6));
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_true(p.parameters[0].init_resolved);
                assert_true(p.parameters[0].init.b == 6.0);
                assert_true(p.parameters[1].init_resolved);
                assert_true(p.parameters[1].init.b == 2.5);
                assert_int_equal(p.init_fields.n, 1);
                assert_string_equal(p.init_fields.items[0].name, "m");
        }

        /* a bound field source_config gives otherwise: the first binding contradicts it */
        r = req("attn");
        arg(&r, "pick", STRING("bound_init"));
        module(&r, "m");
        src(&r, "w", 2, (int64_t) 6, (int64_t) 7);
        src(&r, "v", 1, (int64_t) 12);
        scfg(&r, "n", INT(5));
        INVALID(r, "SHAPE", "parameter 'w' of module 'm' has shape [6, 7], which contradicts n=5");

        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 32, 4, 16, 32);
        scfg(&r, "initializer_range", FLOAT(0.02));
        scfg(&r, "moe_intermediate_size", INT(32));
        INVALID(r, "SHAPE",
                "parameter 'down_proj' of module 'layers.0.mlp' has shape [4, 16, 32], which contradicts moe_intermediate_size=32");

        /* the source's own contradiction is found where it was, source_config agreeing */
        r = req("attn");
        arg(&r, "pick", STRING("bound_init"));
        module(&r, "m");
        src(&r, "w", 2, (int64_t) 6, (int64_t) 7);
        src(&r, "v", 1, (int64_t) 13);
        scfg(&r, "n", INT(6));
        INVALID(r, "SHAPE", "parameter 'v' of module 'm' has shape [13], which contradicts n=6");

        /* a bound field must be an int there, even of the same value */
        r = req("attn");
        arg(&r, "pick", STRING("bound_init"));
        module(&r, "m");
        src(&r, "w", 2, (int64_t) 6, (int64_t) 7);
        src(&r, "v", 1, (int64_t) 12);
        scfg(&r, "n", FLOAT(6.0));
        INVALID(r, "CONFIG", "config field 'n' must be int");

        /* an init's field that is no number */
        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 32, 4, 16, 32);
        scfg(&r, "initializer_range", STRING("0.02"));
        INVALID(r, "CONFIG", "config field 'initializer_range' must be float");

        r = req("grouped_experts");
        grouped_source(&r, 4, 32, 32, 4, 16, 32);
        scfg(&r, "initializer_range", BOOL(true));
        INVALID(r, "CONFIG", "config field 'initializer_range' must be float");
}

static void dtype_entry(BuildRequest *r, const char *name, const char *dtype) {
        r->parameter_dtypes = realloc(r->parameter_dtypes, (r->n_parameter_dtypes + 1) * sizeof(ParameterDtype));
        assert_non_null(r->parameter_dtypes);
        r->parameter_dtypes[r->n_parameter_dtypes++] = (ParameterDtype) { strdup(name), strdup(dtype) };
}

static BuildRequest mixed_request(void) {
        BuildRequest r = req("attn");
        arg(&r, "pick", STRING("mixed"));
        r.has_config = true;
        return r;
}

/* Build step 7's parameter_dtypes check, on a planned request. */
static void expect_dtype_fail(BuildRequest r, const char *message) {
        _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(build_plan_check_dtypes(&p, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(e.reason, "DTYPE");
        assert_string_equal(e.field, "parameter_dtypes");
        assert_string_equal(e.message, message);
        family_error_done(&e);
}

/* Per-parameter dtypes: the registry's (canonical), the request's map; precedence and checks. */
static void test_parameter_dtypes(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;

        {
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(mixed_request());
                assert_int_equal(p.n_parameters, 3);
                assert_string_equal(p.parameters[0].dtype, "float32");
                assert_string_equal(p.parameters[1].dtype, "bfloat16");
                assert_null(p.parameters[2].dtype);
                assert_int_equal(build_plan_check_dtypes(&p, &e), 0);
                /* the registry's over the build's; the build's where it names none */
                assert_int_equal(build_plan_parameter_dtype(&p, 0, DTYPE_FLOAT16), DTYPE_FLOAT32);
                assert_int_equal(build_plan_parameter_dtype(&p, 1, DTYPE_FLOAT16), DTYPE_BFLOAT16);
                assert_int_equal(build_plan_parameter_dtype(&p, 2, DTYPE_FLOAT16), DTYPE_FLOAT16);
                assert_int_equal(build_plan_parameter_dtype(&p, 2, DTYPE_FLOAT32), DTYPE_FLOAT32);
        }
        {
                /* the map over the registry; a name given twice: the last wins */
                BuildRequest r = mixed_request();
                dtype_entry(&r, "v", "f32");
                dtype_entry(&r, "norm", "fp16");
                dtype_entry(&r, "w", "float16");
                dtype_entry(&r, "norm", "bf16");
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                assert_int_equal(p.n_parameter_dtypes, 4);
                assert_string_equal(p.parameter_dtypes[3].name, "norm");
                assert_string_equal(p.parameter_dtypes[3].dtype, "bf16");
                assert_int_equal(build_plan_check_dtypes(&p, &e), 0);
                assert_int_equal(build_plan_parameter_dtype(&p, 0, DTYPE_FLOAT32), DTYPE_BFLOAT16);
                assert_int_equal(build_plan_parameter_dtype(&p, 1, DTYPE_FLOAT32), DTYPE_FLOAT16);
                assert_int_equal(build_plan_parameter_dtype(&p, 2, DTYPE_BFLOAT16), DTYPE_FLOAT32);
        }
        assert_false(family_error_is_set(&e));

        /* a name that is no parameter of the member; checked in name order */
        BuildRequest r = mixed_request();
        dtype_entry(&r, "zz", "bf16");
        dtype_entry(&r, "w", "bf16");
        dtype_entry(&r, "a", "bf16");
        expect_dtype_fail(r, "parameter_dtypes names 'a', which is not a parameter of member 'mixed'");
        /* wq is the family's, but the member has its own parameters */
        r = mixed_request();
        dtype_entry(&r, "wq", "bf16");
        expect_dtype_fail(r, "parameter_dtypes names 'wq', which is not a parameter of member 'mixed'");
        /* bad values, the empty one too */
        r = mixed_request();
        dtype_entry(&r, "w", "int8");
        expect_dtype_fail(r, "dtype 'int8' of parameter 'w' is not supported; use float32, bfloat16 or float16");
        r = mixed_request();
        dtype_entry(&r, "v", "");
        expect_dtype_fail(r, "dtype '' of parameter 'v' is not supported; use float32, bfloat16 or float16");
        r = mixed_request();
        dtype_entry(&r, "w", "Float32");
        dtype_entry(&r, "v", "bf16");
        dtype_entry(&r, "norm", "x");
        expect_dtype_fail(r, "dtype 'x' of parameter 'norm' is not supported; use float32, bfloat16 or float16");
}

static void test_helpers(void **state) {
        BuildRequest r = req("x");
        arg(&r, "a", STRING("b"));
        cfg(&r, "c", STRING("d"));
        src(&r, "w", 1, (int64_t) 3);
        module(&r, "m");
        set_str(&r.module_fqn, "m");
        set_str(&r.mesh_id, "id");
        set_str(&r.context.mesh_id, "id");
        r.materialize.dtype = strdup("f32");
        r.materialize.ranks = calloc(1, sizeof(int64_t));
        r.materialize.n_ranks = 1;

        MaterializeOptions copy = {};
        assert_int_equal(materialize_options_copy(&r.materialize, &copy), 0);
        assert_string_equal(copy.dtype, "f32");
        assert_ptr_not_equal(copy.ranks, r.materialize.ranks);
        materialize_options_done(&copy);
        assert_null(copy.dtype);

        MaterializeOptions empty = {}, copy2 = { .dtype = (char *) "junk" };
        assert_int_equal(materialize_options_copy(&empty, &copy2), 0);
        assert_null(copy2.dtype);
        assert_null(copy2.ranks);

        build_request_done(&r);
        assert_null(r.family);
        build_request_done(NULL);
        build_plan_done(NULL);
        source_module_done(NULL);
        materialize_options_done(NULL);
        assert_null(build_origin_to_string(_BUILD_ORIGIN_MAX));
        assert_null(build_origin_to_string(_BUILD_ORIGIN_INVALID));

        BuildPlan p = {};
        FamilyError e = FAMILY_ERROR_NULL;
        assert_int_equal(build_plan(NULL, NULL, &r, &p, &e), -EINVAL);
        assert_false(family_error_is_set(&e));

        /* a NULL error object still fails */
        BuildRequest q = req("nope");
        assert_int_equal(build_plan(fx.conformance, fx.meshes, &q, &p, NULL), -EINVAL);
        build_request_done(&q);
}

/* Placements that depend on the job: the first case that holds decides, over Resolve's axis
 * sizes and the flags (the mesh's when there is one). */
static void expect_placements(const PlanParameter *p, const char *want) {
        char got[256] = "";

        for (size_t i = 0; i < p->n_placements; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s:%s(%" PRId64 ")", i ? " " : "",
                         p->placements[i].axis, placement_kind_to_string(p->placements[i].kind),
                         p->placements[i].dim);
        assert_string_equal(got, want);
}

static void test_job_placements(void **state) {
        {
                /* no job: ep has no case that holds (not placed), tp falls to replicate */
                BuildRequest r = req("jobdep");
                r.has_config = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) tp:replicate(0)");
                expect_placements(&p.parameters[1], "");
        }
        {
                BuildRequest r = req("jobdep");
                r.has_config = true;
                size(&r, AXIS_EP, 4);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) ep:shard(0)");
        }
        {
                BuildRequest r = req("jobdep");
                r.has_config = true;
                size(&r, AXIS_TP, 2);
                r.context.sequence_parallel = true;
                r.context.loss_parallel = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) tp:shard(-1)");
                expect_placements(&p.parameters[1], "tp:shard(0)");
        }
        {
                /* sequence_parallel without tp > 1 does not hold */
                BuildRequest r = req("jobdep");
                r.has_config = true;
                r.context.sequence_parallel = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) tp:replicate(0)");
        }
        {
                /* the mesh's sizes and flags */
                _cleanup_free_ char *id = create_mesh_flags("dp=4 tp=2", "", true, true);
                BuildRequest r = req("jobdep");
                r.has_config = true;
                set_str(&r.mesh_id, id);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) tp:shard(-1)");
                expect_placements(&p.parameters[1], "tp:shard(0)");
        }
        {
                _cleanup_free_ char *id = create_mesh("dp=4 tp=2", "edp=2 ep=4");
                BuildRequest r = req("jobdep");
                r.has_config = true;
                set_str(&r.mesh_id, id);
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "dp:replicate(0) ep:shard(0)");
                expect_placements(&p.parameters[1], "");
        }
        {
                /* a condition that cannot be evaluated: and/or decide left to right */
                BuildRequest r = req("jobdep");
                r.has_config = true;
                arg(&r, "pick", STRING("bad"));
                INVALID(r, "PLACEMENT", "parameter 'w': the placement over 'tp' cannot be decided: case 1's "
                                        "condition 'loss_parallel or tp_size / (cp_size - 1) > 1' division by zero");
                r = req("jobdep");
                r.has_config = true;
                arg(&r, "pick", STRING("bad"));
                r.context.loss_parallel = true;
                _cleanup_(build_plan_done) BuildPlan p = expect_ok(r);
                expect_placements(&p.parameters[0], "tp:shard(0)");
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_step1),
                cmocka_unit_test(test_step2),
                cmocka_unit_test(test_step3_mesh),
                cmocka_unit_test(test_step3_resolve_and_binding),
                cmocka_unit_test(test_direct_success),
                cmocka_unit_test(test_direct_variants),
                cmocka_unit_test(test_init_expressions),
                cmocka_unit_test(test_direct_failures),
                cmocka_unit_test(test_direct_failures_sizes),
                cmocka_unit_test(test_replacement_success),
                cmocka_unit_test(test_replacement_failures),
                cmocka_unit_test(test_replacement_source_config),
                cmocka_unit_test(test_replacement_source_config_bound),
                cmocka_unit_test(test_parameter_dtypes),
                cmocka_unit_test(test_helpers),
                cmocka_unit_test(test_job_placements),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
