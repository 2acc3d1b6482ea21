/* test-registry.c: loading registry directories, every load error, lookups and lifetime. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "core/expr.h"
#include "core/placement-case.h"
#include "common/macro.h"
#include "core/registry.h"
#include "test-fixtures.h"
#include "core/resource-limits.h"

/* ---- helpers ---- */

static char *make_dir(void) {
        char *d = strdup("/tmp/familyd-test-registry-XXXXXX");
        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static void write_file_n(const char *dir, const char *name, const char *content, size_t n) {
        _cleanup_free_ char *path = NULL;
        FILE *f;

        assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
        f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fwrite(content, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
}

static void write_file(const char *dir, const char *name, const char *content) {
        write_file_n(dir, name, content, strlen(content));
}

/* Removes dir and what the tests put in it (files and empty subdirectories). */
static void remove_dir(char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;

        assert_non_null(d);
        while ((de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                if (unlinkat(dirfd(d), de->d_name, 0) < 0)
                        assert_int_equal(unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR), 0);
        }
        closedir(d);
        assert_int_equal(rmdir(dir), 0);
        free(dir);
}

static void print_diag(const LoadDiagnostics *diag) {
        for (size_t i = 0; i < diag->n; i++)
                print_message("  diag[%zu]: %s\n", i, diag->lines[i]);
}

static bool diag_has(const LoadDiagnostics *diag, const char *want) {
        for (size_t i = 0; i < diag->n; i++)
                if (streq(diag->lines[i], want))
                        return true;
        return false;
}

/* Loads dir and expects failure with exactly the given diagnostic lines (NULL-terminated). */
static void expect_diag_lines(const char *dir, int want_r, const char *const *want) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Registry *reg = NULL;
        size_t n = 0;
        int r;

        r = registry_load(dir, 1, &reg, &diag);
        assert_null(reg);
        while (want[n])
                n++;
        if (r != want_r || diag.n != n) {
                print_message("load returned %d (want %d), %zu lines (want %zu)\n", r, want_r, diag.n, n);
                print_diag(&diag);
        }
        assert_int_equal(r, want_r);
        assert_int_equal(diag.n, n);
        for (size_t i = 0; i < n; i++) {
                if (!diag_has(&diag, want[i])) {
                        print_message("missing: %s\n", want[i]);
                        print_diag(&diag);
                }
                assert_true(diag_has(&diag, want[i]));
        }
}

/* One file, f.yaml, holding yaml; the load must fail with exactly this one diagnostic. */
static void expect_error(const char *yaml, const char *want) {
        char *dir = make_dir();

        write_file(dir, "f.yaml", yaml);
        expect_diag_lines(dir, -EINVAL, (const char *const[]) { want, NULL });
        remove_dir(dir);
}

static Registry *load_ok(const char *dir) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Registry *reg = NULL;
        int r;

        r = registry_load(dir, 7, &reg, &diag);
        if (r < 0)
                print_diag(&diag);
        assert_int_equal(r, 0);
        assert_int_equal(diag.n, 0);
        assert_non_null(reg);
        assert_int_equal(reg->generation, 7);
        assert_string_equal(reg->path, dir);
        return reg;
}

static Registry *load_text(const char *yaml) {
        char *dir = make_dir();
        Registry *reg;

        write_file(dir, "f.yaml", yaml);
        reg = load_ok(dir);
        remove_dir(dir);
        return reg;
}

/* A minimal valid family; cases append to it or replace a part. */
#define BASE                                    \
        "name: x\n"                             \
        "baseline: a.B\n"                       \
        "variants:\n"                           \
        "  v:\n"                                \
        "    constructor: a.V\n"                \
        "    accepts: [config]\n"

static const char *source_root(void) {
        const char *s = getenv("FAMILYD_SOURCE_ROOT");
        return s ? s : ".";
}

static char *shape_text(const ParameterSpec *p) {
        char *out = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&out, &size);

        assert_non_null(f);
        fputc('[', f);
        for (size_t i = 0; i < p->n_dims; i++) {
                _cleanup_free_ char *s = expr_to_string(p->shape[i]);
                assert_non_null(s);
                fprintf(f, "%s%s", i ? ", " : "", s);
        }
        fputc(']', f);
        assert_int_equal(fclose(f), 0);
        return out;
}

static void check_shape(const ParameterSpec *p, const char *want) {
        _cleanup_free_ char *s = shape_text(p);
        assert_string_equal(s, want);
}

static const ParameterSpec *find_parameter(const ParameterSpec *p, size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (streq(p[i].name, name))
                        return &p[i];
        fail_msg("no parameter %s", name);
        return NULL;
}

/* ---- the conformance registry ---- */

static void test_conformance_registry(void **state) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(registry_unrefp) Registry *reg = NULL;

        assert_true(asprintf(&dir, "%s/registry", conformance_dir()) > 0);
        reg = load_ok(dir);

        /* Load order: files by name, then order within the file. */
        assert_int_equal(reg->n_families, 5);
        const char *names[] = { "grouped_experts", "attention", "norm", "norm", "engram" };
        for (size_t i = 0; i < 5; i++)
                assert_string_equal(reg->families[i].name, names[i]);
        assert_string_equal(reg->families[2].baseline, "hyper_parallel.components.modules.norm.RMSNorm");
        assert_string_equal(reg->families[3].baseline,
                            "hyper_parallel.components.modules.norm.OffsetRMSNorm");

        const Family *g = &reg->families[0];
        assert_string_equal(g->source, "families.yaml:3");
        assert_string_equal(g->baseline, "hyper_parallel.components.modules.grouped_experts.GroupedExperts");
        assert_string_equal(g->default_variant, "grouped");
        assert_int_equal(g->parallel_axis, AXIS_EP);

        assert_int_equal(g->n_selectors, 2);
        assert_string_equal(g->selectors[0].name, "use_mxfp8");
        assert_int_equal(g->selectors[0].type, FIELD_TYPE_BOOL);
        assert_int_equal(g->selectors[0].default_value.kind, VALUE_BOOL);
        assert_false(g->selectors[0].default_value.b);
        assert_string_equal(g->selectors[1].name, "use_fused_mxfp8");
        assert_int_equal(g->n_arguments, 1);
        assert_string_equal(g->arguments[0].name, "activation");
        assert_int_equal(g->arguments[0].type, FIELD_TYPE_STRING);
        assert_string_equal(g->arguments[0].default_value.s, "silu");
        assert_ptr_equal(family_find_selector(g, "use_mxfp8"), &g->selectors[0]);
        assert_null(family_find_selector(g, "activation"));
        assert_ptr_equal(family_find_argument(g, "activation"), &g->arguments[0]);
        assert_null(family_find_argument(g, "use_mxfp8"));

        assert_int_equal(g->n_variants, 3);
        assert_string_equal(g->variants[0].name, "grouped");
        assert_string_equal(g->variants[1].name, "grouped_ep");
        const Variant *m = family_find_variant(g, "mxfp8");
        assert_ptr_equal(m, &g->variants[2]);
        assert_null(family_find_variant(g, "nope"));
        assert_string_equal(m->constructor,
                            "hyper_parallel.components.modules.mxfp8_grouped_swiglu.MXFP8GroupedSwiGLU");
        assert_int_equal(m->n_accepts, 4);
        assert_string_equal(m->accepts[3], "context");

        /* requires: {tp: 1, cp: 1, pp: 1, ep: [1, 2]} is kept in tp, cp, ep, pp order. */
        assert_int_equal(m->n_requires, 4);
        assert_int_equal(m->requires[0].axis, AXIS_TP);
        assert_int_equal(m->requires[1].axis, AXIS_CP);
        assert_int_equal(m->requires[2].axis, AXIS_EP);
        assert_int_equal(m->requires[3].axis, AXIS_PP);
        assert_false(m->requires[0].is_list);
        assert_int_equal(m->requires[0].n_values, 1);
        assert_int_equal(m->requires[0].values[0], 1);
        assert_true(m->requires[2].is_list);
        assert_int_equal(m->requires[2].n_values, 2);
        assert_int_equal(m->requires[2].values[1], 2);

        assert_int_equal(g->n_rules, 4);
        assert_int_equal(g->rules[0].outcome, RULE_OUTCOME_ERROR);
        assert_string_equal(g->rules[0].text, "use_fused_mxfp8 requires use_mxfp8=True");
        assert_int_equal(g->rules[0].n_when, 2);
        assert_string_equal(g->rules[0].when[0].key, "use_fused_mxfp8");
        assert_true(g->rules[0].when[0].value.b);
        assert_string_equal(g->rules[0].when[1].key, "use_mxfp8");
        assert_false(g->rules[0].when[1].value.b);
        assert_int_equal(g->rules[1].outcome, RULE_OUTCOME_UNSUPPORTED);
        assert_int_equal(g->rules[2].outcome, RULE_OUTCOME_VARIANT);
        assert_string_equal(g->rules[2].text, "mxfp8");
        assert_string_equal(g->rules[3].when[0].key, "parallel");
        assert_int_equal(g->rules[3].when[0].value.kind, VALUE_BOOL);

        /* Parameters: shapes, placements, inits. No variant has its own. */
        assert_int_equal(g->n_parameters, 2);
        const ParameterSpec *gu = &g->parameters[0];
        assert_string_equal(gu->name, "gate_up_proj");
        check_shape(gu, "[num_experts, hidden_size, 2 * moe_intermediate_size]");
        assert_int_equal(gu->n_placements, 1);
        assert_string_equal(gu->placements[0].axis, "ep");
        assert_int_equal(gu->placements[0].kind, PLACEMENT_SHARD);
        assert_int_equal(gu->placements[0].dim, 0);
        assert_int_equal(gu->init.kind, INIT_NORMAL);
        assert_null(gu->init.a.field);
        assert_true(gu->init.a.value == 0.0);
        assert_string_equal(gu->init.b.field, "initializer_range");
        assert_string_equal(gu->init_text, "normal(mean=0, std=initializer_range)");
        /* mean defaults to 0 */
        assert_string_equal(g->parameters[1].init_text, "normal(mean=0, std=initializer_range)");

        const ParameterSpec *p;
        size_t n;
        variant_parameters(g, m, &p, &n);
        assert_ptr_equal(p, g->parameters);
        assert_int_equal(n, 2);
}

/* The conformance registry's other families: attention's arguments, the norms, engram. */
static void test_conformance_registry_others(void **state) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(registry_unrefp) Registry *reg = NULL;

        assert_true(asprintf(&dir, "%s/registry", conformance_dir()) > 0);
        reg = load_ok(dir);

        const Family *a = &reg->families[1];
        assert_int_equal(a->parallel_axis, AXIS_CP);
        const TypedField *rope = family_find_argument(a, "rope_theta");
        assert_int_equal(rope->type, FIELD_TYPE_FLOAT);
        assert_int_equal(rope->default_value.kind, VALUE_FLOAT);
        assert_true(rope->default_value.f == 10000.0);
        assert_int_equal(family_find_argument(a, "window")->default_value.kind, VALUE_INT);
        const ParameterSpec *wo = find_parameter(a->parameters, a->n_parameters, "wo");
        check_shape(wo, "[hidden_size, num_attention_heads * head_dim]");
        assert_int_equal(wo->placements[0].dim, 1);

        assert_string_equal(reg->families[2].parameters[0].init_text, "ones");
        assert_int_equal(reg->families[2].parameters[0].init.kind, INIT_ONES);
        assert_int_equal(reg->families[2].parameters[0].n_placements, 0);
        assert_string_equal(reg->families[3].parameters[0].init_text, "zeros");
        assert_int_equal(reg->families[2].parallel_axis, _AXIS_INVALID);

        const Family *e = &reg->families[4];
        assert_null(e->default_variant);
        assert_int_equal(e->n_parameters, 0);
        assert_int_equal(e->n_selectors, 0);
        assert_int_equal(e->n_rules, 0);
}

static void test_find(void **state) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        _cleanup_(family_error_done) FamilyError err = {};
        const Family *f = NULL;

        assert_true(asprintf(&dir, "%s/registry", conformance_dir()) > 0);
        reg = load_ok(dir);

        assert_int_equal(registry_find(reg, "grouped_experts", &f, &err), 0);
        assert_ptr_equal(f, &reg->families[0]);
        assert_false(family_error_is_set(&err));

        f = NULL;
        assert_int_equal(registry_find(reg, "hyper_parallel.components.modules.grouped_experts.GroupedExperts",
                                       &f, &err), 0);
        assert_ptr_equal(f, &reg->families[0]);

        /* A shared name is ambiguous, but each registration is reachable by its baseline. */
        f = NULL;
        assert_int_equal(registry_find(reg, "norm", &f, &err), -EINVAL);
        assert_null(f);
        assert_int_equal(err.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(err.reason, "AMBIGUOUS_FAMILY");
        assert_string_equal(err.message, "family name 'norm' must identify exactly one registration");
        family_error_done(&err);

        assert_int_equal(registry_find(reg, "hyper_parallel.components.modules.norm.OffsetRMSNorm", &f,
                                       &err), 0);
        assert_ptr_equal(f, &reg->families[3]);
        assert_string_equal(f->default_variant, "offset");

        f = NULL;
        assert_int_equal(registry_find(reg, "nope", &f, &err), -EINVAL);
        assert_null(f);
        assert_int_equal(err.status, FAMILY_STATUS_NOT_FOUND);
        assert_string_equal(err.reason, "UNKNOWN_FAMILY");
        assert_string_equal(err.message, "family name 'nope' must identify exactly one registration");
        family_error_done(&err);

        /* Python's repr quoting in the text. */
        assert_int_equal(registry_find(reg, "it's", &f, &err), -EINVAL);
        assert_string_equal(err.message, "family name \"it's\" must identify exactly one registration");
        family_error_done(&err);

        assert_int_equal(registry_find(reg, "", &f, &err), -EINVAL);
        assert_string_equal(err.message, "family name '' must identify exactly one registration");
        family_error_done(&err);

        assert_int_equal(registry_find(reg, "engram", &f, &err), -EINVAL);
        assert_null(f);
        assert_int_equal(err.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(err.reason, "NO_DEFAULT_VARIANT");
        assert_string_equal(err.message, "FamilyRequest requires a family with a concrete default_variant");
        assert_string_equal(err.field, "family");
        family_error_done(&err);

        /* The same error, for callers that already hold the family (Resolve's select stage). */
        assert_int_equal(registry_no_default_variant(&err), -EINVAL);
        assert_int_equal(err.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(err.reason, "NO_DEFAULT_VARIANT");
        assert_string_equal(err.field, "family");
        assert_string_equal(err.message, "FamilyRequest requires a family with a concrete default_variant");
        family_error_done(&err);

        /* registry_lookup: the same target rules without the default_variant check. */
        assert_int_equal(registry_lookup(reg, "engram", &f, &err), 0);
        assert_ptr_equal(f, &reg->families[4]);
        assert_int_equal(registry_lookup(reg, "norm", &f, &err), -EINVAL);
        assert_string_equal(err.reason, "AMBIGUOUS_FAMILY");
        family_error_done(&err);

        /* A name equal to another family's baseline: the baseline wins. */
        _cleanup_(registry_unrefp) Registry *r2 = load_text(
                "families:\n"
                "  - name: a.B\n"
                "    baseline: c.D\n"
                "    default_variant: v\n"
                "    variants: {v: {constructor: c.V, accepts: []}}\n"
                "  - name: other\n"
                "    baseline: a.B\n"
                "    default_variant: v\n"
                "    variants: {v: {constructor: a.V, accepts: []}}\n");
        assert_int_equal(registry_find(r2, "a.B", &f, &err), 0);
        assert_string_equal(f->name, "other");
}

static void test_refcount(void **state) {
        Registry *reg = load_text(BASE);

        assert_int_equal(atomic_load(&reg->n_ref), 1);
        assert_ptr_equal(registry_ref(reg), reg);
        assert_int_equal(atomic_load(&reg->n_ref), 2);
        assert_null(registry_unref(reg));
        assert_int_equal(atomic_load(&reg->n_ref), 1);
        assert_string_equal(reg->families[0].name, "x"); /* still alive */
        assert_null(registry_unref(reg));                 /* freed: ASan checks */
        assert_null(registry_ref(NULL));
        assert_null(registry_unref(NULL));

        /* registry_new with nothing in it, and the cleanup helper. */
        _cleanup_(registry_unrefp) Registry *empty = NULL;
        assert_int_equal(registry_new(NULL, 3, NULL, 0, &empty), 0);
        assert_int_equal(empty->n_families, 0);
}

static void test_helpers(void **state) {
        assert_string_equal(placement_kind_to_string(PLACEMENT_SHARD), "shard");
        assert_string_equal(placement_kind_to_string(PLACEMENT_REPLICATE), "replicate");
        assert_null(placement_kind_to_string(_PLACEMENT_KIND_MAX));
        assert_string_equal(init_kind_to_string(INIT_ZEROS), "zeros");
        assert_string_equal(init_kind_to_string(INIT_UNIFORM), "uniform");
        assert_string_equal(init_kind_to_string(INIT_MODULE), "module");
        assert_null(init_kind_to_string(_INIT_KIND_INVALID));
        assert_true(is_reserved_runtime_name("config"));
        assert_true(is_reserved_runtime_name("module"));
        assert_true(is_reserved_runtime_name("module_fqn"));
        assert_true(is_reserved_runtime_name("context"));
        assert_false(is_reserved_runtime_name("parallel"));
        assert_false(is_reserved_runtime_name(NULL));

        _cleanup_(load_diagnostics_done) LoadDiagnostics d = {};
        assert_int_equal(load_diagnostics_add(&d, "f.yaml", 3, 7, "bad %s", "thing"), 0);
        assert_int_equal(load_diagnostics_add(&d, "g.yaml", 0, 0, "unreadable"), 0);
        _cleanup_free_ char *j = load_diagnostics_join(&d);
        assert_string_equal(j, "f.yaml:3:7: bad thing\ng.yaml: unreadable");
        _cleanup_(load_diagnostics_done) LoadDiagnostics none = {};
        _cleanup_free_ char *j0 = load_diagnostics_join(&none);
        assert_string_equal(j0, "");
}

/* ---- the example registry in deploy/ ---- */

/* One decided list of activations as text: "[tp=shard(-2) cp=replicate, ]" (declared axis order). */
static char *activations_text(const ActivationLayout *l, ActivationField f) {
        char *buf = NULL;
        size_t size = 0;
        FILE *out = open_memstream(&buf, &size);

        assert_non_null(out);
        fputc('[', out);
        for (size_t i = 0; i < l->n_lists[f]; i++) {
                const Activation *a = &l->lists[f][i];

                for (size_t j = 0; j < a->n_placements; j++) {
                        fprintf(out, "%s%s=%s", j ? " " : "", a->placements[j].axis, a->placements[j].kind);
                        if (streq(a->placements[j].kind, "shard"))
                                fprintf(out, "(%" PRId64 ")", a->placements[j].dim);
                }
                fputs(", ", out);
        }
        fputc(']', out);
        assert_int_equal(fclose(out), 0);
        return buf;
}

static void expect_decided(const ActivationLayout *declared, const PlacementJob *job, ActivationField f,
                           const char *want) {
        _cleanup_(activation_layout_done) ActivationLayout l = {};
        _cleanup_free_ char *got = NULL;

        assert_int_equal(activation_layout_decide(declared, job, &l, NULL), 0);
        got = activations_text(&l, f);
        assert_string_equal(got, want);
}

static int llama_lookup(const char *name, int64_t *ret, void *userdata) {
        static const struct {
                const char *name;
                int64_t value;
        } config[] = {
                { "hidden_size", 4096 },       { "intermediate_size", 14336 },
                { "num_attention_heads", 32 }, { "num_key_value_heads", 8 },
                { "head_dim", 128 },           { "vocab_size", 128256 },
                { "num_experts", 8 },          { "moe_intermediate_size", 14336 },
        };
        for (size_t i = 0; i < ELEMENTSOF(config); i++)
                if (streq(config[i].name, name)) {
                        *ret = config[i].value;
                        return 0;
                }
        return streq(name, "initializer_range") ? -EDOM : -ENOENT;
}

static void check_evaluated(const ParameterSpec *p, const int64_t *want, size_t n) {
        assert_int_equal(p->n_dims, n);
        for (size_t i = 0; i < n; i++) {
                ExprEvalError err = {};
                int64_t v = 0;
                assert_int_equal(expr_eval(p->shape[i], llama_lookup, NULL, &v, &err), 0);
                assert_int_equal(v, want[i]);
        }
}

static void check_placement(const ParameterSpec *p, const char *axis, PlacementKind kind, int64_t dim) {
        assert_int_equal(p->n_placements, 1);
        assert_string_equal(p->placements[0].axis, axis);
        assert_int_equal(p->placements[0].kind, kind);
        if (kind == PLACEMENT_SHARD)
                assert_int_equal(p->placements[0].dim, dim);
}

static void test_deploy_registry(void **state) {
        _cleanup_free_ char *dir = NULL, *conf = NULL;
        _cleanup_(registry_unrefp) Registry *reg = NULL, *creg = NULL;
        const Family *f;

        assert_true(asprintf(&dir, "%s/deploy/registry", source_root()) > 0);
        reg = load_ok(dir);
        assert_true(reg->n_families >= 5);

        /* Every family can be requested and every parameter evaluates on the Llama config. */
        for (size_t i = 0; i < reg->n_families; i++) {
                _cleanup_(family_error_done) FamilyError err = {};
                f = &reg->families[i];
                assert_int_equal(registry_find(reg, f->name, &f, &err), 0);
                for (size_t v = 0; v < f->n_variants + 1; v++) {
                        const ParameterSpec *p;
                        size_t n;
                        variant_parameters(f, v < f->n_variants ? &f->variants[v] : NULL, &p, &n);
                        for (size_t k = 0; k < n; k++)
                                for (size_t d = 0; d < p[k].n_dims; d++) {
                                        int64_t x;
                                        assert_int_equal(expr_eval(p[k].shape[d], llama_lookup, NULL, &x,
                                                                   NULL), 0);
                                        assert_true(x > 0);
                                }
                }
        }

        /* grouped_experts of deploy/registry is the same family as the conformance one. */
        assert_true(asprintf(&conf, "%s/registry", conformance_dir()) > 0);
        creg = load_ok(conf);
        const Family *g, *cg;
        assert_int_equal(registry_find(reg, "grouped_experts", &g, NULL), 0);
        assert_int_equal(registry_find(creg, "grouped_experts", &cg, NULL), 0);
        assert_string_equal(g->baseline, cg->baseline);
        assert_int_equal(g->n_variants, cg->n_variants);
        assert_int_equal(g->n_rules, cg->n_rules);
        for (size_t i = 0; i < g->n_rules; i++)
                assert_string_equal(g->rules[i].text, cg->rules[i].text);
        for (size_t i = 0; i < g->n_parameters; i++) {
                _cleanup_free_ char *a = shape_text(&g->parameters[i]), *b = shape_text(&cg->parameters[i]);
                assert_string_equal(a, b);
                assert_string_equal(g->parameters[i].init_text, cg->parameters[i].init_text);
        }
        check_evaluated(&g->parameters[0], (const int64_t[]) { 8, 4096, 28672 }, 3);

        assert_int_equal(registry_find(reg, "attention", &f, NULL), 0);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "wq"), (const int64_t[]) { 4096, 4096 }, 2);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "wk"), (const int64_t[]) { 1024, 4096 }, 2);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "wv"), (const int64_t[]) { 1024, 4096 }, 2);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "wo"), (const int64_t[]) { 4096, 4096 }, 2);
        check_placement(find_parameter(f->parameters, f->n_parameters, "wq"), "tp", PLACEMENT_SHARD, 0);
        check_placement(find_parameter(f->parameters, f->n_parameters, "wk"), "tp", PLACEMENT_SHARD, 0);
        check_placement(find_parameter(f->parameters, f->n_parameters, "wv"), "tp", PLACEMENT_SHARD, 0);
        check_placement(find_parameter(f->parameters, f->n_parameters, "wo"), "tp", PLACEMENT_SHARD, 1);

        assert_int_equal(registry_find(reg, "mlp", &f, NULL), 0);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "gate_proj"),
                        (const int64_t[]) { 14336, 4096 }, 2);
        check_evaluated(find_parameter(f->parameters, f->n_parameters, "down_proj"),
                        (const int64_t[]) { 4096, 14336 }, 2);
        check_placement(find_parameter(f->parameters, f->n_parameters, "gate_proj"), "tp", PLACEMENT_SHARD, 0);
        check_placement(find_parameter(f->parameters, f->n_parameters, "up_proj"), "tp", PLACEMENT_SHARD, 0);
        check_placement(find_parameter(f->parameters, f->n_parameters, "down_proj"), "tp", PLACEMENT_SHARD, 1);

        assert_int_equal(registry_find(reg, "embedding", &f, NULL), 0);
        check_evaluated(&f->parameters[0], (const int64_t[]) { 128256, 4096 }, 2);
        check_placement(&f->parameters[0], "tp", PLACEMENT_SHARD, 0);

        assert_int_equal(registry_find(reg, "norm", &f, NULL), 0);
        check_evaluated(&f->parameters[0], (const int64_t[]) { 4096 }, 1);
        assert_int_equal(f->parameters[0].init.kind, INIT_ONES);
        check_placement(&f->parameters[0], "tp", PLACEMENT_REPLICATE, 0);

        /* Activation layouts, as the members' forwards place them: over tp the whole input and
         * a partial output handed on all-reduced, with sequence parallelism the sequence's piece
         * in and out; the experts each ep rank's own tokens. */
        const PlacementJob plain = { .axis_size = { [AXIS_TP] = 2, [AXIS_CP] = 1, [AXIS_EP] = 2, [AXIS_PP] = 1 } };
        const PlacementJob sp = { .axis_size = { [AXIS_TP] = 2, [AXIS_CP] = 1, [AXIS_EP] = 1, [AXIS_PP] = 1 },
                                  .sequence_parallel = true };
        const PlacementJob one = { .axis_size = { [AXIS_TP] = 1, [AXIS_CP] = 2, [AXIS_EP] = 1, [AXIS_PP] = 1 },
                                   .sequence_parallel = true };
        static const char *const boundary_families[] = { "attention", "embedding", "grouped_experts", "mlp" };
        for (size_t i = 0; i < ELEMENTSOF(boundary_families); i++) {
                assert_int_equal(registry_find(reg, boundary_families[i], &f, NULL), 0);
                assert_true(f->has_layout);
                assert_true(f->layout.is_boundary);
                assert_int_equal(f->layout.n_out_names, 1);
                assert_string_equal(f->layout.out_names[0], "hidden_states");
        }
        assert_int_equal(registry_find(reg, "mlp", &f, NULL), 0);
        expect_decided(&f->layout, &plain, ACTIVATION_IN_SRC, "[tp=replicate, ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_SRC, "[tp=partial, ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_DST, "[tp=replicate, ]");
        expect_decided(&f->layout, &sp, ACTIVATION_IN_SRC, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &sp, ACTIVATION_IN_DST, "[tp=replicate, ]");
        expect_decided(&f->layout, &sp, ACTIVATION_OUT_SRC, "[tp=partial, ]");
        expect_decided(&f->layout, &sp, ACTIVATION_OUT_DST, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &one, ACTIVATION_OUT_SRC, "[tp=replicate, ]");
        expect_decided(&f->layout, &one, ACTIVATION_OUT_DST, "[tp=replicate, ]");
        assert_int_equal(registry_find(reg, "attention", &f, NULL), 0);
        expect_decided(&f->layout, &sp, ACTIVATION_IN_SRC, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_DST, "[tp=replicate, ]");
        expect_decided(&f->layout, &one, ACTIVATION_IN_SRC, "[tp=replicate cp=shard(-2), ]");
        expect_decided(&f->layout, &one, ACTIVATION_OUT_SRC, "[tp=replicate cp=shard(-2), ]");
        assert_int_equal(registry_find(reg, "embedding", &f, NULL), 0);
        expect_decided(&f->layout, &sp, ACTIVATION_IN_SRC, "[tp=replicate, ]");
        expect_decided(&f->layout, &sp, ACTIVATION_OUT_SRC, "[tp=partial, ]");
        expect_decided(&f->layout, &sp, ACTIVATION_OUT_DST, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_DST, "[tp=replicate, ]");
        assert_int_equal(registry_find(reg, "norm", &f, NULL), 0);
        assert_false(f->layout.is_boundary);
        expect_decided(&f->layout, &sp, ACTIVATION_IN_SRC, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &sp, ACTIVATION_OUT_DST, "[tp=shard(-2), ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_DST, "[tp=replicate, ]");
        assert_int_equal(registry_find(reg, "grouped_experts", &f, NULL), 0);
        expect_decided(&f->layout, &plain, ACTIVATION_IN_SRC, "[ep=shard(0), ep=shard(0), ep=shard(0), ]");
        expect_decided(&f->layout, &plain, ACTIVATION_OUT_DST, "[ep=shard(0), ]");
        expect_decided(&f->layout, &sp, ACTIVATION_IN_DST, "[, , , ]");
}

/* ---- directories and files ---- */

static void test_directory(void **state) {
        char *dir = make_dir();
        _cleanup_(registry_unrefp) Registry *empty = NULL, *reg = NULL;

        /* An empty directory is an empty registry. */
        empty = load_ok(dir);
        assert_int_equal(empty->n_families, 0);

        /* Only *.yaml and *.yml, hidden files skipped, byte order of names (upper case first). */
        write_file(dir, "b.yml", "name: b\nbaseline: m.B\nvariants: {v: {constructor: m.V, accepts: []}}\n");
        write_file(dir, "a.yaml", "name: a\nbaseline: m.A\nvariants: {v: {constructor: m.V, accepts: []}}\n");
        write_file(dir, "C.yaml", "name: c\nbaseline: m.C\nvariants: {v: {constructor: m.V, accepts: []}}\n");
        write_file(dir, ".hidden.yaml", "garbage: [");
        write_file(dir, "notes.txt", "garbage: [");
        write_file(dir, "x.yaml.bak", "garbage: [");
        write_file(dir, "comments.yaml", "# nothing here yet\n");
        reg = load_ok(dir);
        assert_int_equal(reg->n_families, 3);
        assert_string_equal(reg->families[0].name, "c");
        assert_string_equal(reg->families[1].name, "a");
        assert_string_equal(reg->families[2].name, "b");
        assert_string_equal(reg->families[2].source, "b.yml:1");
        remove_dir(dir);

        /* A directory that does not exist: its errno, with a line. */
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Registry *none = NULL;
        assert_int_equal(registry_load("/nonexistent/familyd", 1, &none, &diag), -ENOENT);
        assert_null(none);
        assert_int_equal(diag.n, 1);
        assert_string_equal(diag.lines[0],
                            "/nonexistent/familyd: cannot open the registry directory: No such file or directory");
}

static void test_file_limits(void **state) {
        char *dir = make_dir();
        size_t n = FAMILYD_MAX_REGISTRY_FILE_BYTES + 1;
        _cleanup_free_ char *big = malloc(n);

        assert_non_null(big);
        memset(big, '#', n);
        write_file_n(dir, "big.yaml", big, n);
        expect_diag_lines(dir, -EINVAL, (const char *const[]) {
                "big.yaml: file is larger than 4194304 bytes", NULL });
        remove_dir(dir);

        /* A directory named like a registry file. */
        dir = make_dir();
        _cleanup_free_ char *sub = NULL;
        assert_true(asprintf(&sub, "%s/sub.yaml", dir) > 0);
        assert_int_equal(mkdir(sub, 0755), 0);
        expect_diag_lines(dir, -EINVAL, (const char *const[]) { "sub.yaml: not a regular file", NULL });
        remove_dir(dir);
}

/* ---- every kind of load error, with its position ---- */

static void test_yaml_errors(void **state) {
        expect_error("name: [x\n", "f.yaml:2:1: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence)");
        expect_error("a: &x 1\nb: *x\n", "f.yaml:2:4: YAML aliases are not supported");
        expect_error("a: &x [*x]\n", "f.yaml:1:8: YAML aliases are not supported");
        expect_error(BASE "---\n" BASE, "f.yaml:7:1: a registry file holds one YAML document");
        expect_error("name: !custom x\n", "f.yaml:1:7: unsupported YAML tag '!custom' (only !!str, !!int, !!float, !!bool, !!null, !!seq, !!map)");
        expect_error("name: !!binary eA==\n", "f.yaml:1:7: unsupported YAML tag 'tag:yaml.org,2002:binary' (only !!str, !!int, !!float, !!bool, !!null, !!seq, !!map)");
        expect_error("name: \"a\\0b\"\n", "f.yaml:1:7: scalar contains a NUL character");
        expect_error("name: \xff\xfe\n", "f.yaml: invalid YAML input at byte 6: invalid leading UTF-8 octet");
        expect_error("- a\n- b\n", "f.yaml:1:1: a registry file holds one family (a mapping) or 'families:' with a list");
        expect_error("plain\n", "f.yaml:1:1: a registry file holds one family (a mapping) or 'families:' with a list");
        expect_error("families: {a: 1}\n", "f.yaml:1:11: 'families' must be a list");
        expect_error("families:\n  - 3\n", "f.yaml:2:5: a family must be a mapping");
        expect_error("families: []\nextra: 1\n", "f.yaml:2:1: unknown key 'extra'");

        /* Deep nesting is cut off by depth, not by the stack. */
        char deep[400];
        size_t n = 0;
        n += (size_t) snprintf(deep, sizeof deep, "name: ");
        for (int i = 0; i < 100; i++)
                deep[n++] = '[';
        deep[n] = 0;
        expect_error(deep, "f.yaml:1:38: YAML nested deeper than 32 levels");
}

static void test_schema_errors_family(void **state) {
        expect_error(BASE "foo: 1\n", "f.yaml:7:1: family 'x': unknown key 'foo'");
        expect_error(BASE "name: y\n", "f.yaml:7:1: family 'x': duplicate key 'name'");
        expect_error("baseline: a.B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:1:1: family: missing key 'name'");
        expect_error("name: x\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:1:1: family 'x': missing key 'baseline'");
        expect_error("name: x\nbaseline: a.B\n", "f.yaml:1:1: family 'x': missing key 'variants'");
        expect_error("name: ''\nbaseline: a.B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:1:7: family: 'name' must not be empty");
        expect_error("name: 3\nbaseline: a.B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:1:7: family: 'name' must be a string, not an int");
        expect_error("name: [x]\nbaseline: a.B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:1:7: family: 'name' must be a string, not a collection");
        expect_error("name: x\nbaseline: a..B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:2:11: family 'x': 'baseline' must be a dotted path, got 'a..B'");
        expect_error("name: x\nbaseline: a.1B\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:2:11: family 'x': 'baseline' must be a dotted path, got 'a.1B'");
        expect_error("name: x\nbaseline: null\nvariants: {v: {constructor: a.V, accepts: []}}\n",
                     "f.yaml:2:11: family 'x': 'baseline' must be a string, not null");
        expect_error(BASE "default_variant: w\n",
                     "f.yaml:7:18: family 'x': 'default_variant': 'w' is not a variant of this family");
        expect_error(BASE "parallel_axis: xp\n",
                     "f.yaml:7:16: family 'x': 'parallel_axis' must be one of tp, cp, ep, pp");
        expect_error("name: x\nbaseline: a.B\nvariants: {}\n",
                     "f.yaml:3:11: family 'x': 'variants' must declare at least one variant");
        expect_error("name: x\nbaseline: a.B\nvariants: [v]\n",
                     "f.yaml:3:11: family 'x': 'variants' must be a mapping");
        expect_error(BASE "  v:\n    constructor: a.W\n    accepts: []\n",
                     "f.yaml:7:3: family 'x': duplicate key 'v'");

        /* Duplicate baselines across files: reported at the later one. */
        char *dir = make_dir();
        write_file(dir, "a.yaml", BASE);
        write_file(dir, "b.yaml", "families:\n  - name: y\n    baseline: a.B\n"
                                  "    variants: {v: {constructor: a.V, accepts: []}}\n");
        expect_diag_lines(dir, -EINVAL, (const char *const[]) {
                "b.yaml:3:15: family 'y': baseline 'a.B' is already registered (family at a.yaml:1)",
                NULL });
        remove_dir(dir);
}

static void test_schema_errors_fields(void **state) {
        expect_error(BASE "selectors:\n  parallel: {type: bool, default: false}\n",
                     "f.yaml:8:3: family 'x': selector name 'parallel' is reserved");
        expect_error(BASE "selectors:\n  sequence_parallel: {type: bool, default: false}\n",
                     "f.yaml:8:3: family 'x': selector name 'sequence_parallel' is reserved");
        expect_error(BASE "selectors:\n  loss_parallel: {type: bool, default: false}\n",
                     "f.yaml:8:3: family 'x': selector name 'loss_parallel' is reserved");
        expect_error(BASE "selectors:\n  context: {type: bool, default: false}\n",
                     "f.yaml:8:3: family 'x': selector name 'context' is reserved");
        expect_error(BASE "selectors:\n  s: {type: int, default: 0}\n  module_fqn: {type: string, default: a}\n",
                     "f.yaml:9:3: family 'x': selector name 'module_fqn' is reserved");
        expect_error(BASE "arguments:\n  config: {type: int}\n",
                     "f.yaml:8:3: family 'x': argument name 'config' is reserved");
        expect_error(BASE "arguments:\n  context: {type: int}\n",
                     "f.yaml:8:3: family 'x': argument name 'context' is reserved");
        expect_error(BASE "selectors:\n  s: {type: bool, default: false}\narguments:\n  s: {type: int}\n",
                     "f.yaml:10:3: family 'x': 's' is both a selector and an argument");
        expect_error(BASE "selectors:\n  s: {type: bool}\n",
                     "f.yaml:8:6: family 'x': selector 's': missing key 'default'");
        expect_error(BASE "selectors:\n  s: {default: false}\n",
                     "f.yaml:8:6: family 'x': selector 's': missing key 'type'");
        expect_error(BASE "selectors:\n  s: {type: complex, default: 1}\n",
                     "f.yaml:8:13: family 'x': selector 's': 'type' must be one of bool, int, float, string");
        expect_error(BASE "selectors:\n  s: {type: bool, default: 'true'}\n",
                     "f.yaml:8:28: family 'x': selector 's': 'default' must be bool");
        expect_error(BASE "selectors:\n  s: {type: int, default: 1.5}\n",
                     "f.yaml:8:27: family 'x': selector 's': 'default' must be int");
        expect_error(BASE "selectors:\n  s: {type: int, default: true}\n",
                     "f.yaml:8:27: family 'x': selector 's': 'default' must be int");
        expect_error(BASE "selectors:\n  s: {type: string, default: 5}\n",
                     "f.yaml:8:30: family 'x': selector 's': 'default' must be string");
        expect_error(BASE "selectors:\n  s: {type: int, default: 99999999999999999999}\n",
                     "f.yaml:8:27: family 'x': selector 's': 'default': integer out of range");
        expect_error(BASE "selectors:\n  s: {type: bool, default: false, help: x}\n",
                     "f.yaml:8:35: family 'x': selector 's': unknown key 'help'");
        expect_error(BASE "selectors:\n  s: true\n",
                     "f.yaml:8:6: family 'x': selector 's': the declaration must be a mapping");
        expect_error(BASE "selectors:\n  s: {type: bool, default: false}\n  s: {type: bool, default: true}\n",
                     "f.yaml:9:3: family 'x': duplicate key 's'");
        expect_error(BASE "selectors: [a]\n", "f.yaml:7:12: family 'x': 'selectors' must be a mapping");
        expect_error(BASE "arguments:\n  w: {type: float, default: x}\n",
                     "f.yaml:8:29: family 'x': argument 'w': 'default' must be float");
        expect_error(BASE "arguments:\n  '': {type: float}\n",
                     "f.yaml:8:3: family 'x': 'arguments': names must not be empty");
}

static void test_schema_errors_variants(void **state) {
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: []\n    foo: 1\n",
                     "f.yaml:7:5: family 'x': variant 'v': unknown key 'foo'");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    accepts: []\n",
                     "f.yaml:5:5: family 'x': variant 'v': missing key 'constructor'");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n",
                     "f.yaml:5:5: family 'x': variant 'v': missing key 'accepts'");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: 'a V'\n    accepts: []\n",
                     "f.yaml:5:18: family 'x': variant 'v': 'constructor' must be a dotted path, got 'a V'");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v: a.V\n",
                     "f.yaml:4:6: family 'x': variant 'v': the variant must be a mapping");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: config\n",
                     "f.yaml:6:14: family 'x': variant 'v': 'accepts' must be a list");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: [config, window]\n",
                     "f.yaml:6:23: family 'x': variant 'v': 'accepts' names 'window', which is neither a declared argument nor a runtime name (config, module, module_fqn, context)");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: [config, config]\n",
                     "f.yaml:6:23: family 'x': variant 'v': 'accepts' lists 'config' twice");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: [[config]]\n",
                     "f.yaml:6:15: family 'x': variant 'v': 'accepts' entries must be a string, not a collection");
        expect_error(BASE "    requires: {xp: 1}\n",
                     "f.yaml:7:16: family 'x': variant 'v': 'requires': unknown key 'xp' (axes are tp, cp, ep, pp; flags are sequence_parallel, loss_parallel)");
        expect_error(BASE "    requires: {sequence_parallel: 1}\n",
                     "f.yaml:7:35: family 'x': variant 'v': 'requires': 'sequence_parallel' must be bool");
        expect_error(BASE "    requires: {loss_parallel: [true]}\n",
                     "f.yaml:7:31: family 'x': variant 'v': 'requires': 'loss_parallel' must be bool");
        expect_error(BASE "    requires: {loss_parallel: true, loss_parallel: false}\n",
                     "f.yaml:7:37: family 'x': variant 'v': duplicate key 'loss_parallel'");
        expect_error(BASE "    requires: {tp: 0}\n",
                     "f.yaml:7:20: family 'x': variant 'v': 'requires' tp must be an integer >= 1 or a non-empty list of them");
        expect_error(BASE "    requires: {ep: []}\n",
                     "f.yaml:7:20: family 'x': variant 'v': 'requires' ep must be an integer >= 1 or a non-empty list of them");
        expect_error(BASE "    requires: {ep: [1, true]}\n",
                     "f.yaml:7:24: family 'x': variant 'v': 'requires' ep must be an integer >= 1 or a non-empty list of them");
        expect_error(BASE "    requires: {pp: '1'}\n",
                     "f.yaml:7:20: family 'x': variant 'v': 'requires' pp must be an integer >= 1 or a non-empty list of them");
        expect_error(BASE "    requires: {tp: 1, tp: 2}\n",
                     "f.yaml:7:23: family 'x': variant 'v': duplicate key 'tp'");
        expect_error(BASE "    requires: [tp]\n",
                     "f.yaml:7:15: family 'x': variant 'v': 'requires' must be a mapping");
}

static void test_schema_errors_rules(void **state) {
#define SEL BASE "selectors:\n  s: {type: int, default: 0}\n"
        expect_error(SEL "rules:\n  - variant: v\n",
                     "f.yaml:10:5: family 'x': rule 1: missing key 'when'");
        expect_error(SEL "rules:\n  - {when: {}, variant: v}\n",
                     "f.yaml:10:12: family 'x': rule 1: 'when' must not be empty");
        expect_error(SEL "rules:\n  - {when: {s: 1}, variant: v}\n  - {when: {t: 1}, variant: v}\n",
                     "f.yaml:11:13: family 'x': rule 2: 'when': 't' is not a declared selector (nor 'parallel', 'sequence_parallel', 'loss_parallel')");
        expect_error(SEL "rules:\n  - {when: {sequence_parallel: yes}, variant: v}\n",
                     "f.yaml:10:32: family 'x': rule 1: 'when': 'sequence_parallel' must be bool");
        expect_error(SEL "rules:\n  - {when: {loss_parallel: 0}, variant: v}\n",
                     "f.yaml:10:28: family 'x': rule 1: 'when': 'loss_parallel' must be bool");
        expect_error(SEL "rules:\n  - {when: {s: x}, variant: v}\n",
                     "f.yaml:10:16: family 'x': rule 1: 'when': 's' must be int");
        expect_error(SEL "rules:\n  - {when: {parallel: 1}, variant: v}\n",
                     "f.yaml:10:23: family 'x': rule 1: 'when': 'parallel' must be bool");
        expect_error(SEL "rules:\n  - {when: {s: 1}}\n",
                     "f.yaml:10:5: family 'x': rule 1: a rule needs exactly one of 'variant', 'error', 'unsupported'");
        expect_error(SEL "rules:\n  - {when: {s: 1}, variant: v, error: no}\n",
                     "f.yaml:10:5: family 'x': rule 1: a rule needs exactly one of 'variant', 'error', 'unsupported'");
        expect_error(SEL "rules:\n  - {when: {s: 1}, variant: w}\n",
                     "f.yaml:10:29: family 'x': rule 1: 'variant': 'w' is not a variant of this family");
        expect_error(SEL "rules:\n  - {when: {s: 1}, error: ''}\n",
                     "f.yaml:10:27: family 'x': rule 1: 'error' must not be empty");
        expect_error(SEL "rules:\n  - {when: {s: 1}, unsupported: [x]}\n",
                     "f.yaml:10:33: family 'x': rule 1: 'unsupported' must be a string, not a collection");
        expect_error(SEL "rules:\n  - {when: {s: 1}, variant: v, because: x}\n",
                     "f.yaml:10:32: family 'x': rule 1: unknown key 'because'");
        expect_error(SEL "rules: {when: {s: 1}}\n", "f.yaml:9:8: family 'x': 'rules' must be a list");
        expect_error(SEL "rules:\n  - [when]\n", "f.yaml:10:5: family 'x': rule 1: a rule must be a mapping");
#undef SEL
}

static void test_schema_errors_parameters(void **state) {
#define PAR BASE "parameters:\n  w:\n"
        expect_error(PAR "    placements: {tp: shard(0)}\n",
                     "f.yaml:9:5: family 'x': parameter 'w': missing key 'shape'");
        expect_error(PAR "    shape: hidden_size\n",
                     "f.yaml:9:12: family 'x': parameter 'w': 'shape' must be a list");
        expect_error(PAR "    shape: [hidden_size, 2 *]\n",
                     "f.yaml:9:26: family 'x': parameter 'w': 'shape': unexpected end of expression");
        expect_error(PAR "    shape: ['a b']\n",
                     "f.yaml:9:13: family 'x': parameter 'w': 'shape': unexpected 'b' at column 3");
        expect_error(PAR "    shape: [1.5]\n",
                     "f.yaml:9:13: family 'x': parameter 'w': 'shape' entries must be integers or expressions");
        expect_error(PAR "    shape: [true]\n",
                     "f.yaml:9:13: family 'x': parameter 'w': 'shape' entries must be integers or expressions");
        expect_error(PAR "    shape: [4]\n    stride: [1]\n",
                     "f.yaml:10:5: family 'x': parameter 'w': unknown key 'stride'");
        expect_error(PAR "    shape: [4]\n    placements: {tp: shard}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp' must be shard(d) or replicate");
        expect_error(PAR "    shape: [4]\n    placements: {tp: shard(x)}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp' must be shard(d) or replicate");
        expect_error(PAR "    shape: [4]\n    placements: {tp: shard(1)}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp': shard(1) is out of range for 1 dimensions");
        expect_error(PAR "    shape: [4, 4]\n    placements: {tp: shard(-3)}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp': shard(-3) is out of range for 2 dimensions");
        expect_error(PAR "    shape: []\n    placements: {tp: shard(0)}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp': shard(0) is out of range for 0 dimensions");
        expect_error(PAR "    shape: [4]\n    placements: {tp: 0}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp' must be a string, not an int");
        expect_error(PAR "    shape: [4]\n    placements: [tp]\n",
                     "f.yaml:10:17: family 'x': parameter 'w': 'placements' must be a mapping");
        expect_error(PAR "    shape: [4]\n    init: random\n",
                     "f.yaml:10:11: family 'x': parameter 'w': 'init' must be zeros, ones, module, or one of constant: {value}, normal: {mean, std}, uniform: {low, high}, trunc_normal: {mean, std, a, b}");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: 1}, uniform: {low: 0, high: 1}}\n",
                     "f.yaml:10:11: family 'x': parameter 'w': 'init' must be zeros, ones, module, or one of constant: {value}, normal: {mean, std}, uniform: {low, high}, trunc_normal: {mean, std, a, b}");
        expect_error(PAR "    shape: [4]\n    init: {xavier: {gain: 1}}\n",
                     "f.yaml:10:12: family 'x': parameter 'w': unknown key 'xavier'");
        expect_error(PAR "    shape: [4]\n    init: {normal: {mean: 0}}\n",
                     "f.yaml:10:20: family 'x': parameter 'w': init normal: missing key 'std'");
        expect_error(PAR "    shape: [4]\n    init: {uniform: {low: 0}}\n",
                     "f.yaml:10:21: family 'x': parameter 'w': init uniform: missing key 'high'");
        expect_error(PAR "    shape: [4]\n    init: {constant: {}}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': init constant: missing key 'value'");
        expect_error(PAR "    shape: [4]\n    init: {constant: 1}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': init constant: the init's arguments must be a mapping");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: [0.02]}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std' must be a number, a config field name or an expression");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: '0.02 *'}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std': unexpected end of expression at column 7");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: '1 / log(fan_in)'}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std': unknown function 'log' at column 5 (only sqrt)");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: '(1 / sqrt(fan_in)'}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std': unclosed '(' at column 1");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: 'sqrt'}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std': sqrt at column 1 needs an argument in parentheses");
        expect_error(PAR "    shape: [4]\n    init: {trunc_normal: {std: 1, a: 2, b: -2}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init trunc_normal: 'a' must be less than 'b'");
        expect_error(PAR "    shape: [4]\n    init: {trunc_normal: {std: 1, low: -2}}\n",
                     "f.yaml:10:35: family 'x': parameter 'w': init trunc_normal: unknown key 'low'");
        expect_error(PAR "    shape: [4]\n    init: {normal: {std: .inf}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': init normal: 'std' must be finite");
        expect_error(PAR "    shape: [4]\n    init: {constant: {value: 1, scale: 2}}\n",
                     "f.yaml:10:33: family 'x': parameter 'w': init constant: unknown key 'scale'");
        expect_error(PAR "    shape: [4]\n  w:\n    shape: [4]\n",
                     "f.yaml:10:3: family 'x': duplicate key 'w'");
        expect_error("name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: []\n"
                     "    parameters:\n      w: {shape: [a +]}\n",
                     "f.yaml:8:19: family 'x': variant 'v': parameter 'w': 'shape': unexpected end of expression");
#undef PAR
}

/* Placements that depend on the job: cases {when, placement}, the first that holds deciding. */
static void test_placement_cases(void **state) {
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                BASE
                "parameters:\n"
                "  w:\n"
                "    shape: [8, 4]\n"
                "    placements:\n"
                "      dp: replicate\n"
                "      tp:\n"
                "        - {when: 'sequence_parallel and tp_size>1', placement: shard( -2 )}\n"
                "        - {when: 'ep_size == 1 or not loss_parallel', placement: none}\n"
                "        - {placement: shard(1)}\n"
                "  v:\n"
                "    shape: [4]\n"
                "    placements: {ep: shard(0)}\n");
        const ParameterSpec *w = &reg->families[0].parameters[0];
        const ParameterSpec *v = &reg->families[0].parameters[1];
        _cleanup_free_ char *t0 = NULL, *t1 = NULL;

        assert_int_equal(w->n_placements, 2);
        assert_non_null(w->placement_cases);
        assert_int_equal(w->placement_cases[0].n, 0); /* dp is static */
        assert_int_equal(w->placements[0].kind, PLACEMENT_REPLICATE);
        assert_string_equal(w->placements[1].axis, "tp");
        /* until Build decides: replicate, dim 0 */
        assert_int_equal(w->placements[1].kind, PLACEMENT_REPLICATE);
        const PlacementCases *c = &w->placement_cases[1];
        assert_int_equal(c->n, 3);
        t0 = expr_to_string(c->items[0].when);
        t1 = expr_to_string(c->items[1].when);
        assert_string_equal(t0, "sequence_parallel and tp_size > 1");
        assert_string_equal(t1, "ep_size == 1 or not loss_parallel");
        assert_false(c->items[0].none);
        assert_int_equal(c->items[0].kind, PLACEMENT_SHARD);
        assert_int_equal(c->items[0].dim, -2);
        assert_true(c->items[1].none);
        assert_null(c->items[2].when);
        assert_int_equal(c->items[2].dim, 1);
        assert_null(v->placement_cases);

#define PC BASE "parameters:\n  w:\n    shape: [4]\n    placements:\n      tp:\n"
        expect_error(PC "        - {when: 'hidden_size > 1', placement: shard(0)}\n",
                     "f.yaml:12:18: family 'x': parameter 'w': placement 'tp' case 1: 'when' names "
                     "'hidden_size'; a condition may name tp_size, cp_size, ep_size, pp_size, "
                     "sequence_parallel and loss_parallel");
        expect_error(PC "        - {when: 'tp_size >', placement: shard(0)}\n",
                     "f.yaml:12:18: family 'x': parameter 'w': placement 'tp' case 1: 'when': "
                     "unexpected end of expression");
        expect_error(PC "        - {placement: replicate}\n        - {placement: shard(1)}\n",
                     "f.yaml:13:23: family 'x': parameter 'w': placement 'tp' case 2: shard(1) is "
                     "out of range for 1 dimensions");
        expect_error(PC "        - {placement: split}\n",
                     "f.yaml:12:23: family 'x': parameter 'w': placement 'tp' case 1 must be "
                     "shard(d), replicate or none");
        expect_error(PC "        - {when: sequence_parallel}\n",
                     "f.yaml:12:11: family 'x': parameter 'w': missing key 'placement'");
        expect_error(PC "        - {placement: replicate, if: tp_size}\n",
                     "f.yaml:12:34: family 'x': parameter 'w': unknown key 'if'");
        expect_error(PC "        - replicate\n",
                     "f.yaml:12:11: family 'x': parameter 'w': placement 'tp' case 1 must be a mapping");
        expect_error(BASE "parameters:\n  w:\n    shape: [4]\n    placements: {tp: []}\n",
                     "f.yaml:10:22: family 'x': parameter 'w': placement 'tp' must list 1 to 16 cases");
#undef PC
}

/* A family's activation layout: its inputs' and outputs' placements, out_names, boundary. */
static void test_activation_layout(void **state) {
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                BASE
                "layout:\n"
                "  in_src: [{tp: shard(1), dp: replicate}]\n"
                "  in_dst: [{tp: replicate}]\n"
                "  out_src: [{tp: partial}, {}]\n"
                "  out_dst: [{tp: shard( -1 )}]\n"
                "  out_names: [hidden, aux]\n"
                "  boundary: true\n");
        const Family *f = &reg->families[0];
        const ActivationLayout *l = &f->layout;

        assert_true(f->has_layout);
        assert_int_equal(l->n_lists[ACTIVATION_IN_SRC], 1);
        assert_int_equal(l->lists[ACTIVATION_IN_SRC][0].n_placements, 2);
        assert_string_equal(l->lists[ACTIVATION_IN_SRC][0].placements[0].axis, "tp");
        assert_string_equal(l->lists[ACTIVATION_IN_SRC][0].placements[0].kind, "shard");
        assert_int_equal(l->lists[ACTIVATION_IN_SRC][0].placements[0].dim, 1);
        assert_string_equal(l->lists[ACTIVATION_IN_SRC][0].placements[1].kind, "replicate");
        assert_int_equal(l->n_lists[ACTIVATION_OUT_SRC], 2);
        assert_string_equal(l->lists[ACTIVATION_OUT_SRC][0].placements[0].kind, "partial");
        assert_int_equal(l->lists[ACTIVATION_OUT_SRC][1].n_placements, 0);
        assert_int_equal(l->lists[ACTIVATION_OUT_DST][0].placements[0].dim, -1);
        assert_int_equal(l->n_out_names, 2);
        assert_string_equal(l->out_names[1], "aux");
        assert_true(l->is_boundary);

        _cleanup_(registry_unrefp) Registry *none = load_text(BASE);
        assert_false(none->families[0].has_layout);
        _cleanup_(registry_unrefp) Registry *empty = load_text(BASE "layout: {}\n");
        assert_true(empty->families[0].has_layout);
        assert_false(empty->families[0].layout.is_boundary);

        expect_error(BASE "layout: {in_src: [{tp: split}]}\n",
                     "f.yaml:7:24: family 'x': 'in_src' entry 1 placement 'tp' must be shard(d), replicate or partial");
        expect_error(BASE "layout: {in_dst: {tp: replicate}}\n",
                     "f.yaml:7:18: family 'x': 'in_dst' must be a list");
        expect_error(BASE "layout: {out_names: [y, y]}\n",
                     "f.yaml:7:25: family 'x': 'out_names' names 'y' twice");
        expect_error(BASE "layout: {boundary: 1}\n",
                     "f.yaml:7:20: family 'x': 'boundary' must be bool");
        expect_error(BASE "layout: {is_boundary: true}\n",
                     "f.yaml:7:10: family 'x': unknown key 'is_boundary'");
        expect_error(BASE "layout: [in_src]\n",
                     "f.yaml:7:9: family 'x': 'layout' must be a mapping");
}

/* Activation placements that depend on the job: a parameter's case syntax, partial allowed. */
static void test_activation_layout_cases(void **state) {
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                BASE
                "layout:\n"
                "  out_src:\n"
                "    - tp:\n"
                "        - {when: 'tp_size > 1', placement: partial}\n"
                "        - {placement: replicate}\n"
                "      cp: [{when: 'cp_size > 1', placement: shard(-2)}, {placement: none}]\n"
                "      dp: replicate\n"
                "  out_dst:\n"
                "    - tp: [{when: 'sequence_parallel and tp_size > 1', placement: shard(1)}]\n");
        const ActivationLayout *l = &reg->families[0].layout;
        const ActivationPlacement *p = &l->lists[ACTIVATION_OUT_SRC][0].placements[0];
        const PlacementJob tp2 = { .axis_size = { [AXIS_TP] = 2, [AXIS_CP] = 1, [AXIS_EP] = 1, [AXIS_PP] = 1 } };
        const PlacementJob cp2 = { .axis_size = { [AXIS_TP] = 1, [AXIS_CP] = 2, [AXIS_EP] = 1, [AXIS_PP] = 1 } };
        const PlacementJob sp = { .axis_size = { [AXIS_TP] = 2, [AXIS_CP] = 1, [AXIS_EP] = 1, [AXIS_PP] = 1 },
                                  .sequence_parallel = true };
        const PlacementJob zero = { .axis_size = { [AXIS_TP] = 0 } };

        assert_string_equal(p->kind, "cases");
        assert_int_equal(p->n_cases, 2);
        assert_string_equal(p->cases[0].kind, "partial");
        assert_non_null(p->cases[0].when);
        assert_null(p->cases[1].when);
        assert_null(l->lists[ACTIVATION_OUT_SRC][0].placements[1].cases[1].kind); /* none */
        assert_true(activation_layout_has_cases(l));

        expect_decided(l, &tp2, ACTIVATION_OUT_SRC, "[tp=partial dp=replicate, ]");
        expect_decided(l, &cp2, ACTIVATION_OUT_SRC, "[tp=replicate cp=shard(-2) dp=replicate, ]");
        expect_decided(l, &tp2, ACTIVATION_OUT_DST, "[, ]");   /* none holds: not placed */
        expect_decided(l, &sp, ACTIVATION_OUT_DST, "[tp=shard(1), ]");

        /* A decided layout has no cases left; a condition that cannot be evaluated names its place. */
        {
                _cleanup_(activation_layout_done) ActivationLayout d = {};
                _cleanup_(registry_unrefp) Registry *div = load_text(
                        BASE "layout: {in_src: [{}, {tp: [{when: '4 / tp_size > 1', placement: partial}]}]}\n");
                ActivationDecideError err = {};

                assert_int_equal(activation_layout_decide(l, &tp2, &d, NULL), 0);
                assert_false(activation_layout_has_cases(&d));
                assert_int_equal(activation_layout_decide(&div->families[0].layout, &zero, &d, &err), -EINVAL);
                assert_int_equal(err.field, ACTIVATION_IN_SRC);
                assert_int_equal(err.activation, 1);
                assert_string_equal(err.axis, "tp");
                assert_int_equal(err.case_index, 0);
                assert_int_equal(err.eval.failure, EXPR_FAILURE_DIVISION_BY_ZERO);
        }

        expect_error(BASE "layout: {in_src: [{tp: [{placement: split}]}]}\n",
                     "f.yaml:7:37: family 'x': 'in_src' entry 1 placement 'tp' case 1 must be shard(d), "
                     "replicate, partial or none");
        expect_error(BASE "layout: {in_src: [{tp: []}]}\n",
                     "f.yaml:7:24: family 'x': 'in_src' entry 1 placement 'tp' must list 1 to 16 cases");
        expect_error(BASE "layout: {in_src: [{tp: [{when: 'tp_size > 1'}]}]}\n",
                     "f.yaml:7:25: family 'x': missing key 'placement'");
        expect_error(BASE "layout: {in_src: [{tp: [{when: 'tp_size >', placement: partial}]}]}\n",
                     "f.yaml:7:32: family 'x': 'in_src' entry 1 placement 'tp' case 1: 'when': "
                     "unexpected end of expression");
        expect_error(BASE "layout: {in_src: [{tp: [{when: 'hidden_size > 1', placement: partial}]}]}\n",
                     "f.yaml:7:32: family 'x': 'in_src' entry 1 placement 'tp' case 1: 'when' names "
                     "'hidden_size'; a condition may name tp_size, cp_size, ep_size, pp_size, "
                     "sequence_parallel and loss_parallel");
        expect_error(BASE "layout: {in_src: [{tp: [{placement: partial, if: x}]}]}\n",
                     "f.yaml:7:46: family 'x': unknown key 'if'");
}

/* Expression inits and trunc_normal: canonical texts (GetFamily's), lone names still fields. */
static void test_init_expressions(void **state) {
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                BASE "parameters:\n"
                "  a:\n    shape: [4, 8]\n    init: {normal: {std: 'initializer_range/sqrt( 2*num_layers )'}}\n"
                "  b:\n    shape: [4, 8]\n    init: {normal: {mean: 0, std: '1 / sqrt(fan_in)'}}\n"
                "  c:\n    shape: [4, 8]\n    init: {trunc_normal: {std: 0.02, a: -0.04, b: 0.04}}\n"
                "  d:\n    shape: [4, 8]\n    init: {trunc_normal: {mean: m, std: 'fan_out * 2e-3', a: '-(2 * s)', b: '(x - y) - (z - 1.5)'}}\n"
                "  e:\n    shape: [4]\n    init: {trunc_normal: {}}\n"
                "  f:\n    shape: [4]\n    init: {uniform: {low: '-1 / sqrt(h)', high: '1 / sqrt(h)'}}\n"
                "  g:\n    shape: [4]\n    init: {constant: {value: '0.5'}}\n");
        const Family *f = &reg->families[0];

        assert_int_equal(f->n_parameters, 7);
        assert_string_equal(f->parameters[0].init_text, "normal(mean=0, std=initializer_range / sqrt(2 * num_layers))");
        assert_non_null(f->parameters[0].init.b.expr);
        assert_string_equal(f->parameters[1].init_text, "normal(mean=0, std=1 / sqrt(fan_in))");
        assert_int_equal(f->parameters[2].init.kind, INIT_TRUNC_NORMAL);
        assert_string_equal(f->parameters[2].init_text, "trunc_normal(mean=0, std=0.02, a=-0.04, b=0.04)");
        assert_string_equal(f->parameters[3].init_text,
                            "trunc_normal(mean=m, std=fan_out * 0.002, a=-(2 * s), b=x - y - (z - 1.5))");
        assert_string_equal(f->parameters[3].init.a.field, "m");
        assert_null(f->parameters[3].init.a.expr);
        /* torch.nn.init.trunc_normal_'s defaults */
        assert_string_equal(f->parameters[4].init_text, "trunc_normal(mean=0, std=1, a=-2, b=2)");
        assert_string_equal(f->parameters[5].init_text, "uniform(low=-1 / sqrt(h), high=1 / sqrt(h))");
        assert_string_equal(f->parameters[6].init_text, "constant(value=0.5)");
}

/* A parameter's `checkpoint`: the tensors its values come from (checkpoint-source.h), kept
 * with a canonical text; every refusal at its node. */
static void test_parameter_checkpoint(void **state) {
#define PAR3 BASE "parameters:\n  w:\n    shape: [e, h, 2 * i]\n"
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                PAR3 "    checkpoint:\n"
                "      stack: {dim: 0, key: expert}\n"
                "      concat:\n"
                "        dim: -1\n"
                "        parts:\n"
                "          - {tensor: '{prefix}.experts.{expert}.w1.weight', transpose: true}\n"
                "          - {tensor: '{prefix}.experts.{expert}.w3.weight', transpose: true}\n"
                "  n:\n    shape: [h]\n    checkpoint: '{prefix}.norm.weight'\n"
                "  t:\n    shape: [h, i]\n    checkpoint: {tensor: '{prefix}.x', transpose: true}\n"
                "  z:\n    shape: [h]\n");
        const ParameterSpec *p = reg->families[0].parameters;
        assert_true(p[0].has_checkpoint);
        assert_true(p[0].checkpoint.stack);
        assert_int_equal(p[0].checkpoint.stack_dim, 0);
        assert_string_equal(p[0].checkpoint.stack_key, "expert");
        assert_true(p[0].checkpoint.concat);
        assert_int_equal(p[0].checkpoint.concat_dim, 2); /* -1 of 3 */
        assert_int_equal(p[0].checkpoint.n_parts, 2);
        assert_true(p[0].checkpoint.parts[1].transpose);
        assert_string_equal(p[0].checkpoint.text,
                            "stack(dim=0, key=expert): concat(dim=2): "
                            "{prefix}.experts.{expert}.w1.weight (transposed), "
                            "{prefix}.experts.{expert}.w3.weight (transposed)");
        assert_string_equal(p[1].checkpoint.text, "{prefix}.norm.weight");
        assert_int_equal(p[1].checkpoint.n_parts, 1);
        assert_false(p[1].checkpoint.parts[0].transpose);
        assert_string_equal(p[2].checkpoint.text, "{prefix}.x (transposed)");
        assert_false(p[3].has_checkpoint);

        /* Names from templates. */
        _cleanup_free_ char *a = NULL, *b = NULL, *c = NULL;
        assert_int_equal(checkpoint_tensor_name(p[0].checkpoint.parts[0].tensor,
                                                "model.layers.3.block_sparse_moe", "expert", 7,
                                                &a), 0);
        assert_string_equal(a, "model.layers.3.block_sparse_moe.experts.7.w1.weight");
        assert_int_equal(checkpoint_tensor_name("{prefix}.weight", "", NULL, 0, &b), 0);
        assert_string_equal(b, "weight");
        assert_int_equal(checkpoint_tensor_name("lm_head.weight", "ignored", NULL, 0, &c), 0);
        assert_string_equal(c, "lm_head.weight");
        char big[CHECKPOINT_TEMPLATE_MAX];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = 0;
        char *d = NULL;
        assert_int_equal(checkpoint_tensor_name("{prefix}.ab", big, NULL, 0, &d), -ENAMETOOLONG);
        assert_null(d);

        expect_error(PAR3 "    checkpoint: '{prefix}.{layer}.w'\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: tensor name "
                     "'{prefix}.{layer}.w': unknown placeholder '{layer}' (only {prefix})");
        expect_error(PAR3 "    checkpoint: 'a.{prefix'\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: tensor name "
                     "'a.{prefix': '{' at column 3 is not closed");
        expect_error(PAR3 "    checkpoint: 'a}'\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: tensor name 'a}': '}' "
                     "at column 2 closes no '{'");
        expect_error(PAR3 "    checkpoint: ''\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: tensor name '': a "
                     "tensor name must have 1 to 1024 bytes");
        expect_error(PAR3 "    checkpoint: {tensor: a, concat: {dim: 0, parts: [b, c]}}\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: 'checkpoint' needs "
                     "one of 'tensor' and 'concat'");
        expect_error(PAR3 "    checkpoint: {stack: {dim: 0, key: e}}\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: 'checkpoint' needs "
                     "one of 'tensor' and 'concat'");
        expect_error(PAR3 "    checkpoint: {tensor: 'a.{e}', stack: {dim: 3, key: e}}\n",
                     "f.yaml:10:48: family 'x': parameter 'w': checkpoint: 'stack' dim 3 is out "
                     "of range for 3 dimensions");
        expect_error(PAR3 "    checkpoint: {tensor: 'a.w', stack: {dim: 0, key: e}}\n",
                     "f.yaml:10:26: family 'x': parameter 'w': checkpoint: tensor name 'a.w': a "
                     "stacked tensor's name must use {e}");
        expect_error(PAR3 "    checkpoint: {tensor: 'a.{e}', stack: {dim: 0, key: prefix}}\n",
                     "f.yaml:10:56: family 'x': parameter 'w': checkpoint: 'stack' key must be an "
                     "identifier other than prefix, not 'prefix'");
        expect_error(PAR3 "    checkpoint: {tensor: a, stack: {dim: 0}}\n",
                     "f.yaml:10:36: family 'x': parameter 'w': checkpoint: missing key 'key'");
        expect_error(PAR3 "    checkpoint: {concat: {dim: 1, parts: [a]}}\n",
                     "f.yaml:10:42: family 'x': parameter 'w': checkpoint: 'parts' must list 2 "
                     "to 16 tensors");
        expect_error(PAR3 "    checkpoint: {concat: {dim: 0, parts: ['a.{e}', 'b.{e}']}, "
                     "stack: {dim: 0, key: e}}\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: 'stack' and 'concat' "
                     "name the same dimension 0");
        expect_error(PAR3 "    checkpoint: {concat: {dim: 1, parts: [a, {tensor: b, flip: true}]}}\n",
                     "f.yaml:10:58: family 'x': parameter 'w': checkpoint: unknown key 'flip'");
        expect_error(PAR3 "    checkpoint: {transpose: true, concat: {dim: 1, parts: [a, b]}}\n",
                     "f.yaml:10:29: family 'x': parameter 'w': checkpoint: 'transpose' goes "
                     "with 'tensor' (or inside each of concat's parts)");
        expect_error(PAR3 "    checkpoint: {tensor: a, transpose: yes}\n",
                     "f.yaml:10:40: family 'x': parameter 'w': checkpoint: 'transpose' must be "
                     "bool");
        expect_error(BASE "parameters:\n  w:\n    shape: [h]\n"
                     "    checkpoint: {tensor: a, transpose: true}\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: a transposed tensor "
                     "needs two dimensions besides the stacked one");
        expect_error(PAR3 "    checkpoint: 3\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: a tensor name must be "
                     "a string, not an int");
        expect_error(PAR3 "    checkpoint: [a]\n",
                     "f.yaml:10:17: family 'x': parameter 'w': checkpoint: 'checkpoint' must be a "
                     "mapping");
#undef PAR3
}

/* A parameter's `dtype`: the names and aliases materialize.dtype takes, kept canonical;
 * anything else is a load error at the value, with its line. */
static void test_parameter_dtype(void **state) {
        static const struct {
                const char *given, *canonical;
        } ok[] = {
                { "float32", "float32" }, { "f32", "float32" },   { "fp32", "float32" },
                { "bfloat16", "bfloat16" }, { "bf16", "bfloat16" }, { "float16", "float16" },
                { "f16", "float16" },     { "fp16", "float16" },
        };
#define PAR BASE "parameters:\n  w:\n    shape: [4]\n"

        for (size_t i = 0; i < ELEMENTSOF(ok); i++) {
                _cleanup_free_ char *yaml = NULL;
                assert_true(asprintf(&yaml, PAR "    dtype: %s\n  n:\n    shape: [4]\n",
                                     ok[i].given) > 0);
                _cleanup_(registry_unrefp) Registry *reg = load_text(yaml);
                const Family *f = &reg->families[0];
                assert_int_equal(f->n_parameters, 2);
                assert_string_equal(f->parameters[0].dtype, ok[i].canonical);
                /* none named: NULL, the Build's */
                assert_null(f->parameters[1].dtype);
        }

        /* variant parameters too */
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                "name: x\nbaseline: a.B\nvariants:\n  v:\n    constructor: a.V\n    accepts: []\n"
                "    parameters:\n      norm: {shape: [8], dtype: fp32}\n");
        assert_string_equal(reg->families[0].variants[0].parameters[0].dtype, "float32");

        expect_error(PAR "    dtype: int8\n",
                     "f.yaml:10:12: family 'x': parameter 'w': 'dtype' must be float32, bfloat16 or "
                     "float16 (or f32, fp32, bf16, f16, fp16), not 'int8'");
        expect_error(PAR "    dtype: BF16\n",
                     "f.yaml:10:12: family 'x': parameter 'w': 'dtype' must be float32, bfloat16 or "
                     "float16 (or f32, fp32, bf16, f16, fp16), not 'BF16'");
        expect_error(PAR "    dtype: ''\n",
                     "f.yaml:10:12: family 'x': parameter 'w': 'dtype' must be float32, bfloat16 or "
                     "float16 (or f32, fp32, bf16, f16, fp16), not ''");
        expect_error(PAR "    dtype: 16\n",
                     "f.yaml:10:12: family 'x': parameter 'w': 'dtype' must be a string, not an int");
        expect_error(PAR "    dtype: [bf16]\n",
                     "f.yaml:10:12: family 'x': parameter 'w': 'dtype' must be a string, not a collection");
        expect_error(PAR "    dtype: bf16\n    dtype: f32\n",
                     "f.yaml:11:5: family 'x': parameter 'w': duplicate key 'dtype'");
#undef PAR
}

static void test_all_diagnostics_collected(void **state) {
        char *dir = make_dir();

        /* Two files, several problems in one family, and two families in one file: all reported. */
        write_file(dir, "a.yaml",
                   "families:\n"
                   "  - name: one\n"
                   "    baseline: m.One\n"
                   "    foo: 1\n"
                   "    variants: {v: {constructor: m.V, accepts: [nope]}}\n"
                   "  - name: two\n"
                   "    baseline: m.Two\n"
                   "    parallel_axis: zz\n"
                   "    variants: {v: {constructor: m.V, accepts: []}}\n");
        write_file(dir, "b.yaml", "name: [\n");
        expect_diag_lines(dir, -EINVAL, (const char *const[]) {
                "a.yaml:4:5: family 'one': unknown key 'foo'",
                "a.yaml:5:48: family 'one': variant 'v': 'accepts' names 'nope', which is neither a declared argument nor a runtime name (config, module, module_fqn, context)",
                "a.yaml:8:20: family 'two': 'parallel_axis' must be one of tp, cp, ep, pp",
                "b.yaml:2:1: invalid YAML: did not find expected node content (while parsing a flow node)",
                NULL });
        remove_dir(dir);
}

static void test_values_and_texts(void **state) {
        _cleanup_(registry_unrefp) Registry *reg = load_text(
                "name: x\n"
                "baseline: a.B\n"
                "default_variant: v\n"
                "selectors:\n"
                "  f: {type: float, default: 2}\n"
                "  g: {type: float, default: !!float 3}\n"
                "  i: {type: int, default: 0x10}\n"
                "  o: {type: int, default: 0o17}\n"
                "  s: {type: string, default: !!str 5}\n"
                "  t: {type: string, default: 'true'}\n"
                "  b: {type: bool, default: True}\n"
                "arguments:\n"
                "  n: {type: int}\n"
                "  m: {type: float, default: -1.5e3}\n"
                "variants:\n"
                "  v:\n"
                "    constructor: a.V\n"
                "    accepts: [n, module]\n"
                "    requires: {pp: 0x2, tp: [4, 2]}\n"
                "    parameters: {}\n"
                "  w:\n"
                "    constructor: a.B\n"
                "    accepts: []\n"
                "    parameters:\n"
                "      own: {shape: [7]}\n"
                "rules:\n"
                "  - {when: {f: 1, parallel: false}, variant: w}\n"
                "parameters:\n"
                "  c: {shape: [], init: {constant: {value: 1}}}\n"
                "  u: {shape: [2, 3], init: {uniform: {low: -1, high: 1}}, placements: {dp: replicate, tp: shard(-1)}}\n"
                "  n1: {shape: [\"hidden_size / 2\", 16], init: {normal: {mean: 0.1, std: 0.02}}}\n"
                "  n2: {shape: [8], init: {normal: {mean: mu, std: sigma}}}\n"
                "  z: {shape: [8], init: zeros}\n"
                "  big: {shape: [8], init: {constant: {value: 1e300}}}\n"
                "  mod: {shape: [8], init: module}\n");
        const Family *f = &reg->families[0];

        assert_int_equal(family_find_selector(f, "f")->default_value.kind, VALUE_FLOAT);
        assert_true(family_find_selector(f, "f")->default_value.f == 2.0);
        assert_true(family_find_selector(f, "g")->default_value.f == 3.0);
        assert_int_equal(family_find_selector(f, "i")->default_value.i, 16);
        assert_int_equal(family_find_selector(f, "o")->default_value.i, 15);
        assert_string_equal(family_find_selector(f, "s")->default_value.s, "5");
        assert_string_equal(family_find_selector(f, "t")->default_value.s, "true");
        assert_true(family_find_selector(f, "b")->default_value.b);
        assert_int_equal(family_find_argument(f, "n")->default_value.kind, VALUE_NONE);
        assert_true(family_find_argument(f, "m")->default_value.f == -1500.0);

        /* A rule value of a float selector is a float, as the default is. */
        assert_int_equal(f->rules[0].when[0].value.kind, VALUE_FLOAT);

        const Variant *v = family_find_variant(f, "v");
        assert_int_equal(v->n_requires, 2);
        assert_int_equal(v->requires[0].axis, AXIS_TP);
        assert_int_equal(v->requires[0].values[0], 4);
        assert_int_equal(v->requires[1].axis, AXIS_PP);
        assert_int_equal(v->requires[1].values[0], 2);

        /* An empty parameters map on a variant still replaces the family's. */
        const ParameterSpec *p;
        size_t n;
        variant_parameters(f, v, &p, &n);
        assert_int_equal(n, 0);
        variant_parameters(f, family_find_variant(f, "w"), &p, &n);
        assert_int_equal(n, 1);
        assert_string_equal(p[0].name, "own");
        assert_string_equal(p[0].init_text, "zeros");
        variant_parameters(f, NULL, &p, &n);
        assert_int_equal(n, 7);

        assert_string_equal(p[0].init_text, "constant(value=1)");
        assert_int_equal(p[0].n_dims, 0);
        assert_string_equal(p[1].init_text, "uniform(low=-1, high=1)");
        assert_int_equal(p[1].n_placements, 2);
        assert_string_equal(p[1].placements[0].axis, "dp");
        assert_int_equal(p[1].placements[0].kind, PLACEMENT_REPLICATE);
        assert_int_equal(p[1].placements[1].dim, -1);
        assert_string_equal(p[2].init_text, "normal(mean=0.1, std=0.02)");
        check_shape(&p[2], "[hidden_size / 2, 16]");
        assert_string_equal(p[3].init_text, "normal(mean=mu, std=sigma)");
        assert_string_equal(p[3].init.a.field, "mu");
        assert_string_equal(p[4].init_text, "zeros");
        assert_string_equal(p[5].init_text, "constant(value=1e+300)");
        assert_string_equal(p[6].init_text, "module");
        assert_int_equal(p[6].init.kind, INIT_MODULE);
}

/* ---- robustness: nothing crashes or leaks on mangled input ---- */

static void test_mangled_inputs(void **state) {
        _cleanup_free_ char *path = NULL, *orig = NULL;
        char *dir = make_dir();
        FILE *f;
        long size;
        uint32_t seed = 12345;

        assert_true(asprintf(&path, "%s/registry/families.yaml", conformance_dir()) > 0);
        f = fopen(path, "re");
        assert_non_null(f);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        size = ftell(f);
        assert_true(size > 0);
        rewind(f);
        orig = malloc((size_t) size);
        assert_non_null(orig);
        assert_int_equal(fread(orig, 1, (size_t) size, f), (size_t) size);
        fclose(f);

        static const char *const tokens[] = {
                "&a ", "*a ", "!!int ", "[", "{", "]", "}", ": ", "- ", "\"", "'", "\n  ", "\xff",
                "99999999999999999999", ".nan", "~", "? ", "---\n", "%YAML 1.1\n", "\t", "\\0",
                "shard(-9)", "(((", "x", ",", "#",
        };
        for (int round = 0; round < 300; round++) {
                _cleanup_free_ char *buf = malloc((size_t) size + 64);
                size_t n = (size_t) size;
                memcpy(buf, orig, n);

                for (int k = 0; k < 1 + round % 4; k++) {
                        seed = seed * 1103515245u + 12345u;
                        size_t at = (seed >> 8) % n;
                        seed = seed * 1103515245u + 12345u;
                        if (seed & 0x10000) {
                                /* overwrite a byte */
                                buf[at] = (char) (seed >> 17);
                        } else {
                                /* splice a token in place */
                                const char *t = tokens[(seed >> 17) % ELEMENTSOF(tokens)];
                                size_t tl = strlen(t);
                                if (at + tl > n)
                                        continue;
                                memcpy(buf + at, t, tl);
                        }
                }
                write_file_n(dir, "f.yaml", buf, n);

                _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
                _cleanup_(registry_unrefp) Registry *reg = NULL;
                int r = registry_load(dir, 1, &reg, &diag);
                if (r < 0) {
                        assert_null(reg);
                        assert_true(diag.n > 0);
                } else
                        assert_int_equal(diag.n, 0);
        }
        remove_dir(dir);
}

static void test_many_problems_capped(void **state) {
        /* A flood of unknown keys: reported up to a cap, then one closing line. */
        _cleanup_free_ char *yaml = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&yaml, &size);
        char *dir = make_dir();

        assert_non_null(f);
        fputs(BASE, f);
        for (int i = 0; i < 3000; i++)
                fprintf(f, "k%d: 1\n", i);
        assert_int_equal(fclose(f), 0);
        write_file(dir, "f.yaml", yaml);

        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Registry *reg = NULL;
        assert_int_equal(registry_load(dir, 1, &reg, &diag), -EINVAL);
        assert_null(reg);
        assert_true(diag.n > 10 && diag.n <= 1001);
        assert_string_equal(diag.lines[0], "f.yaml:7:1: family 'x': unknown key 'k0'");
        assert_non_null(strstr(diag.lines[diag.n - 1], "problems, stopped"));
        remove_dir(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_conformance_registry),
                cmocka_unit_test(test_conformance_registry_others),
                cmocka_unit_test(test_find),
                cmocka_unit_test(test_refcount),
                cmocka_unit_test(test_helpers),
                cmocka_unit_test(test_deploy_registry),
                cmocka_unit_test(test_directory),
                cmocka_unit_test(test_file_limits),
                cmocka_unit_test(test_yaml_errors),
                cmocka_unit_test(test_schema_errors_family),
                cmocka_unit_test(test_schema_errors_fields),
                cmocka_unit_test(test_schema_errors_variants),
                cmocka_unit_test(test_schema_errors_rules),
                cmocka_unit_test(test_schema_errors_parameters),
                cmocka_unit_test(test_placement_cases),
                cmocka_unit_test(test_activation_layout),
                cmocka_unit_test(test_activation_layout_cases),
                cmocka_unit_test(test_parameter_dtype),
                cmocka_unit_test(test_init_expressions),
                cmocka_unit_test(test_parameter_checkpoint),
                cmocka_unit_test(test_all_diagnostics_collected),
                cmocka_unit_test(test_values_and_texts),
                cmocka_unit_test(test_mangled_inputs),
                cmocka_unit_test(test_many_problems_capped),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
