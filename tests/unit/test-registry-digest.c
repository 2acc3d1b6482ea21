/* test-registry-digest.c: what the registry digest counts and ignores, and Build's agreement check. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "codec/codec-registry-digest.h"
#include "core/manager.h"

/* Two files: one family in the one-family form, one in the list form. */
static const char *const EXPERTS =
        "# the experts\n"
        "name: experts\n"
        "baseline: pkg.Experts\n"
        "default_variant: plain\n"
        "parallel_axis: ep\n"
        "selectors:\n"
        "  use_fast: {type: bool, default: false}\n"
        "  mode: {type: string, default: x}\n"
        "arguments:\n"
        "  act: {type: string}\n"
        "  bias: {type: bool, default: true}\n"
        "variants:\n"
        "  plain:\n"
        "    constructor: pkg.PlainExperts\n"
        "    accepts: [config, act]\n"
        "  fast:\n"
        "    constructor: pkg.FastExperts\n"
        "    accepts: [config, module, act]\n"
        "    requires: {tp: 1, ep: [1, 2]}\n"
        "  bare:\n"
        "    constructor: pkg.BareExperts\n"
        "    accepts: [config]\n"
        "rules:\n"
        "  - when: {use_fast: true, parallel: true}\n"
        "    variant: fast\n"
        "  - when: {mode: y}\n"
        "    error: mode y is not supported\n"
        "parameters:\n"
        "  w1:\n"
        "    shape: [num_experts, 2 * hidden_size]\n"
        "    placements: {ep: shard(0), tp: replicate}\n"
        "    init: {normal: {std: initializer_range}}\n"
        "  w2:\n"
        "    shape: [num_experts, hidden_size]\n"
        "    placements: {ep: shard(-2)}\n"
        "    init: zeros\n";

/* EXPERTS with every mapping's keys in another order, other styles and other comments. */
static const char *const EXPERTS_REORDERED =
        "parameters:   # declared order kept: w1 before w2\n"
        "  w1:\n"
        "    init:\n"
        "      normal: {std: initializer_range}\n"
        "    placements: {tp: replicate, ep: shard(0)}\n"
        "    shape: [num_experts, '2*hidden_size']\n"
        "  w2: {init: zeros, placements: {ep: shard(0)}, shape: [num_experts, hidden_size]}\n"
        "rules:\n"
        "  - variant: fast\n"
        "    when: {parallel: true, use_fast: true}\n"
        "  - {error: mode y is not supported, when: {mode: y}}\n"
        "variants:\n"
        "  bare: {accepts: [config], constructor: pkg.BareExperts}\n"
        "  fast:\n"
        "    requires:\n"
        "      ep: [1, 2]\n"
        "      tp: 1\n"
        "    accepts: [config, module, act]\n"
        "    constructor: pkg.FastExperts\n"
        "  plain:\n"
        "    accepts: [config, act]\n"
        "    constructor: pkg.PlainExperts\n"
        "arguments:\n"
        "  bias: {default: true, type: bool}\n"
        "  act: {type: string}\n"
        "selectors:\n"
        "  mode: {default: x, type: string}\n"
        "  use_fast:\n"
        "    default: false\n"
        "    type: bool\n"
        "parallel_axis: ep\n"
        "default_variant: plain\n"
        "baseline: pkg.Experts\n"
        "name: experts\n";

static const char *const NORM =
        "families:\n"
        "  - name: norm\n"
        "    baseline: pkg.Norm\n"
        "    default_variant: plain\n"
        "    variants:\n"
        "      plain:\n"
        "        constructor: pkg.PlainNorm\n"
        "        accepts: [config]\n"
        "    parameters:\n"
        "      weight:\n"
        "        shape: [hidden_size]\n"
        "        init: ones\n";

/* ---- helpers ---- */

static void write_file(const char *dir, const char *name, const char *content) {
        _cleanup_free_ char *path = NULL;
        FILE *f;

        assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
        f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fwrite(content, 1, strlen(content), f), strlen(content));
        assert_int_equal(fclose(f), 0);
}

static void empty_dir(const char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        assert_int_equal(unlinkat(dirfd(d), de->d_name, 0), 0);
        closedir(d);
}

static void print_diag(const LoadDiagnostics *diag) {
        for (size_t i = 0; i < diag->n; i++)
                print_message("  %s\n", diag->lines[i]);
}

/* files: name, text, name, text, ..., NULL. The registry must load. */
static void digest_files(char ret[REGISTRY_DIGEST_LENGTH + 1], ...) {
        char dir[] = "/tmp/familyd-test-digest-XXXXXX";
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        const char *name;
        va_list ap;

        assert_non_null(mkdtemp(dir));
        va_start(ap, ret);
        while ((name = va_arg(ap, const char *)))
                write_file(dir, name, va_arg(ap, const char *));
        va_end(ap);
        int r = registry_load(dir, 1, &reg, &diag);
        if (r < 0)
                print_diag(&diag);
        assert_int_equal(r, 0);
        assert_int_equal(codec_registry_digest(reg, ret), 0);
        empty_dir(dir);
        assert_int_equal(rmdir(dir), 0);
}

/* text with `from` (which must occur once) replaced by `to`. */
static char *replace(const char *text, const char *from, const char *to) {
        const char *at = strstr(text, from);
        char *out;

        assert_non_null(at);
        assert_null(strstr(at + 1, from));
        assert_true(asprintf(&out, "%.*s%s%s", (int) (at - text), text, to,
                             at + strlen(from)) > 0);
        return out;
}

static void base_digest(char ret[REGISTRY_DIGEST_LENGTH + 1]) {
        digest_files(ret, "a.yaml", EXPERTS, "b.yaml", NORM, NULL);
}

/* EXPERTS changed as said: the digest must differ from the base's. */
static void expect_differs(const char *from, const char *to) {
        char base[REGISTRY_DIGEST_LENGTH + 1], other[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ char *changed = replace(EXPERTS, from, to);

        base_digest(base);
        digest_files(other, "a.yaml", changed, "b.yaml", NORM, NULL);
        if (streq(base, other))
                fail_msg("same digest after replacing '%s' with '%s'", from, to);
}

/* EXPERTS with `from` replaced by a, then by b: the two digests must differ. */
static void expect_pair_differs(const char *from, const char *a, const char *b) {
        char da[REGISTRY_DIGEST_LENGTH + 1], db[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ char *ta = replace(EXPERTS, from, a), *tb = replace(EXPERTS, from, b);

        digest_files(da, "a.yaml", ta, "b.yaml", NORM, NULL);
        digest_files(db, "a.yaml", tb, "b.yaml", NORM, NULL);
        if (streq(da, db))
                fail_msg("same digest for '%s' and '%s'", a, b);
}

static void expect_same(const char *from, const char *to) {
        char base[REGISTRY_DIGEST_LENGTH + 1], other[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ char *changed = replace(EXPERTS, from, to);

        base_digest(base);
        digest_files(other, "a.yaml", changed, "b.yaml", NORM, NULL);
        if (!streq(base, other))
                fail_msg("digest changed after replacing '%s' with '%s'", from, to);
}

/* EXPERTS with its flow-style init replaced by a, then by b: the digests compared. */
static void expect_inits(const char *a, const char *b, bool same) {
        char da[REGISTRY_DIGEST_LENGTH + 1], db[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ char *ta = replace(EXPERTS, "{normal: {std: initializer_range}}", a),
                            *tb = replace(EXPERTS, "{normal: {std: initializer_range}}", b);

        digest_files(da, "a.yaml", ta, "b.yaml", NORM, NULL);
        digest_files(db, "a.yaml", tb, "b.yaml", NORM, NULL);
        if (streq(da, db) != same)
                fail_msg("init '%s' and init '%s': digests %s", a, b, same ? "differ" : "are the same");
}

/* ---- the digest ---- */

static void test_format_and_determinism(void **state) {
        char a[REGISTRY_DIGEST_LENGTH + 1], b[REGISTRY_DIGEST_LENGTH + 1];
        char empty[REGISTRY_DIGEST_LENGTH + 1];

        base_digest(a);
        base_digest(b);
        assert_string_equal(a, b);
        assert_int_equal(strlen(a), REGISTRY_DIGEST_LENGTH);
        assert_true(node_registry_digest_valid(a));
        assert_int_equal(strspn(a, "0123456789abcdef"), REGISTRY_DIGEST_LENGTH);

        /* An empty registry has a digest of its own. */
        digest_files(empty, "README.md", "no families\n", NULL);
        assert_int_equal(strlen(empty), REGISTRY_DIGEST_LENGTH);
        assert_string_not_equal(empty, a);
}

static void test_ignores_comments_names_order_and_style(void **state) {
        char base[REGISTRY_DIGEST_LENGTH + 1], other[REGISTRY_DIGEST_LENGTH + 1];

        base_digest(base);

        /* Comments. */
        expect_same("# the experts\n", "# other words\n\n# and more\n");
        expect_same("variants:\n", "variants:   # the members\n");
        /* File names, and with them the file order (norm now loads first). */
        digest_files(other, "z-experts.yml", EXPERTS, "b.yaml", NORM, NULL);
        assert_string_equal(base, other);
        digest_files(other, "0.yaml", NORM, "1.yaml", EXPERTS, NULL);
        assert_string_equal(base, other);
        /* Key order in every mapping, flow or block style, quoting, expression spacing and a
         * negative shard dim. */
        digest_files(other, "a.yaml", EXPERTS_REORDERED, "b.yaml", NORM, NULL);
        assert_string_equal(base, other);
        expect_same("2 * hidden_size", "(2*hidden_size)");
        expect_same("{normal: {std: initializer_range}}",
                    "{normal: {mean: 0, std: initializer_range}}");
        /* an init expression counts by its canonical text, not its spelling */
        expect_inits("{normal: {std: 'initializer_range/sqrt(2*num_layers)'}}",
                     "{normal: {std: '(initializer_range) / sqrt(2 * num_layers)'}}", true);
        expect_inits("{trunc_normal: {std: 0.02}}", "{trunc_normal: {mean: 0, std: 0.02, a: -2, b: 2}}", true);
}

static void test_counts_what_resolve_and_build_read(void **state) {
        /* Rules: outcome, condition, order. */
        expect_differs("    variant: fast\n", "    variant: plain\n");
        expect_differs("{use_fast: true, parallel: true}", "{use_fast: true}");
        expect_differs("    error: mode y is not supported\n", "    unsupported: not yet\n");
        expect_differs("  - when: {use_fast: true, parallel: true}\n"
                       "    variant: fast\n"
                       "  - when: {mode: y}\n"
                       "    error: mode y is not supported\n",
                       "  - when: {mode: y}\n"
                       "    error: mode y is not supported\n"
                       "  - when: {use_fast: true, parallel: true}\n"
                       "    variant: fast\n");
        /* Selectors, arguments, the family's own keys. */
        expect_differs("use_fast: {type: bool, default: false}",
                       "use_fast: {type: bool, default: true}");
        expect_differs("mode: {type: string, default: x}", "mode: {type: string, default: z}");
        expect_differs("  act: {type: string}\n", "  act: {type: string}\n  gain: {type: float}\n");
        expect_differs("default_variant: plain\n", "default_variant: bare\n");
        expect_differs("parallel_axis: ep\n", "parallel_axis: tp\n");
        /* An activation layout: declared or not, and each of its fields. */
        expect_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {}\n");
        expect_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {boundary: true}\n");
        expect_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {out_src: [{tp: partial}]}\n");
        /* ...and an activation placement's cases: the condition, the placement, their order. */
        expect_pair_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {out_src: [{tp: [{when: 'tp_size > 1', placement: partial}]}]}\n",
                            "parallel_axis: ep\nlayout: {out_src: [{tp: [{when: 'tp_size > 2', placement: partial}]}]}\n");
        expect_pair_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {out_src: [{tp: [{when: 'tp_size > 1', placement: partial}]}]}\n",
                            "parallel_axis: ep\nlayout: {out_src: [{tp: [{when: 'tp_size > 1', placement: none}]}]}\n");
        expect_pair_differs("parallel_axis: ep\n", "parallel_axis: ep\nlayout: {out_src: [{tp: [{placement: partial}, {placement: none}]}]}\n",
                            "parallel_axis: ep\nlayout: {out_src: [{tp: [{placement: none}, {placement: partial}]}]}\n");
        /* Variants: constructor, accepts (a list: its order too), requires, and a variant
         * whose `parameters: {}` replaces the family's with none. */
        expect_differs("pkg.BareExperts", "pkg.OtherExperts");
        expect_differs("accepts: [config, act]", "accepts: [act, config]");
        expect_differs("ep: [1, 2]", "ep: [1, 2, 4]");
        expect_differs("    accepts: [config]\n", "    accepts: [config]\n    parameters: {}\n");
        /* Parameters: shape, placement, init, and their order (Build lays them out in it). */
        expect_differs("[num_experts, hidden_size]", "[num_experts, 2 * hidden_size]");
        expect_differs("tp: replicate", "tp: shard(1)");
        expect_differs("ep: shard(-2)", "ep: shard(-1)");
        /* Placements that depend on the job: a case list is not its static placement, and its
         * conditions, outcomes and order count; the condition's spacing and a negative dim do not. */
        expect_differs("tp: replicate", "tp: [{placement: replicate}]");
        {
                char a[REGISTRY_DIGEST_LENGTH + 1], b[REGISTRY_DIGEST_LENGTH + 1];
                char c[REGISTRY_DIGEST_LENGTH + 1], d[REGISTRY_DIGEST_LENGTH + 1];
                _cleanup_free_ char *one = replace(EXPERTS, "tp: replicate",
                        "tp: [{when: 'tp_size>1', placement: shard(1)}, {placement: none}]");
                _cleanup_free_ char *spaced = replace(EXPERTS, "tp: replicate",
                        "tp: [{when: '(tp_size  >  1)', placement: shard(-1)}, {placement: none}]");
                _cleanup_free_ char *swapped = replace(EXPERTS, "tp: replicate",
                        "tp: [{placement: none}, {when: 'tp_size>1', placement: shard(1)}]");
                _cleanup_free_ char *other = replace(EXPERTS, "tp: replicate",
                        "tp: [{when: 'tp_size>2', placement: shard(1)}, {placement: none}]");

                digest_files(a, "a.yaml", one, "b.yaml", NORM, NULL);
                digest_files(b, "a.yaml", spaced, "b.yaml", NORM, NULL);
                digest_files(c, "a.yaml", swapped, "b.yaml", NORM, NULL);
                digest_files(d, "a.yaml", other, "b.yaml", NORM, NULL);
                assert_string_equal(a, b);
                assert_string_not_equal(a, c);
                assert_string_not_equal(a, d);
        }
        expect_differs("    init: zeros\n", "    init: ones\n");
        expect_differs("    init: zeros\n", "    init: module\n");
        expect_differs("{normal: {std: initializer_range}}", "{normal: {std: 0.02}}");
        expect_differs("{normal: {std: initializer_range}}",
                       "{normal: {std: 'initializer_range / sqrt(2 * num_layers)'}}");
        expect_inits("{normal: {std: 'initializer_range / sqrt(2 * num_layers)'}}",
                     "{normal: {std: 'initializer_range / sqrt(2 * num_hidden_layers)'}}", false);
        expect_inits("{normal: {std: '1 / sqrt(fan_in)'}}", "{normal: {std: '1 / sqrt(fan_out)'}}", false);
        expect_inits("{normal: {std: 'a - b - c'}}", "{normal: {std: 'a - (b - c)'}}", false);
        expect_inits("{normal: {std: 0.02}}", "{trunc_normal: {std: 0.02}}", false);
        expect_inits("{trunc_normal: {std: 0.02, a: -0.04}}", "{trunc_normal: {std: 0.02, a: -0.05}}", false);
        expect_differs("  w1:\n"
                       "    shape: [num_experts, 2 * hidden_size]\n"
                       "    placements: {ep: shard(0), tp: replicate}\n"
                       "    init: {normal: {std: initializer_range}}\n"
                       "  w2:\n"
                       "    shape: [num_experts, hidden_size]\n"
                       "    placements: {ep: shard(-2)}\n"
                       "    init: zeros\n",
                       "  w2:\n"
                       "    shape: [num_experts, hidden_size]\n"
                       "    placements: {ep: shard(-2)}\n"
                       "    init: zeros\n"
                       "  w1:\n"
                       "    shape: [num_experts, 2 * hidden_size]\n"
                       "    placements: {ep: shard(0), tp: replicate}\n"
                       "    init: {normal: {std: initializer_range}}\n");
        /* Names. */
        expect_differs("name: experts\n", "name: moe\n");
        expect_differs("baseline: pkg.Experts\n", "baseline: pkg.MoE\n");
}

static void test_counts_families(void **state) {
        char base[REGISTRY_DIGEST_LENGTH + 1], other[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ char *norm2 = replace(NORM, "init: ones", "init: zeros");

        base_digest(base);
        digest_files(other, "a.yaml", EXPERTS, NULL);
        assert_string_not_equal(base, other);
        digest_files(other, "a.yaml", EXPERTS, "b.yaml", norm2, NULL);
        assert_string_not_equal(base, other);
}

/* ---- the manager: digest with the snapshot, Build's agreement check ---- */

typedef struct ManagerFixture {
        char dir[64];
        Manager *m;
} ManagerFixture;

static void fixture_start(ManagerFixture *fx) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};

        snprintf(fx->dir, sizeof fx->dir, "/tmp/familyd-test-digest-XXXXXX");
        assert_non_null(mkdtemp(fx->dir));
        write_file(fx->dir, "a.yaml", EXPERTS);
        ManagerParams params = {
                .registry_path = fx->dir,
                .node_name = "n2",
                .node_rank = -1,
                .address = "",
                .host_devices = 1,
                .shm_budget_bytes = 1u << 20,
                .max_builds = 4,
                .registry_digest = codec_registry_digest,
        };
        assert_int_equal(manager_new(&params, &fx->m, &diag), 0);
}

static void fixture_stop(ManagerFixture *fx) {
        manager_free(fx->m);
        empty_dir(fx->dir);
        assert_int_equal(rmdir(fx->dir), 0);
}

/* Nodes n0..n{count-1} of one host device each; n2 is local. digests[i] NULL: unknown. */
static Topology *topology_of(size_t count, const char *const *digests) {
        Node *nodes = calloc(count, sizeof(Node));
        Topology *t = NULL;

        assert_non_null(nodes);
        for (size_t i = 0; i < count; i++) {
                Device d = { .kind = "host", .name = "host0", .uuid = "", .pci_bus_id = "",
                             .numa_node = -1 };
                nodes[i].node_rank = (int64_t) i;
                assert_true(asprintf(&nodes[i].name, "n%zu", i) > 0);
                nodes[i].address = strdup("");
                nodes[i].devices = calloc(1, sizeof(Device));
                assert_non_null(nodes[i].devices);
                assert_int_equal(device_copy(&d, &nodes[i].devices[0]), 0);
                nodes[i].n_devices = 1;
                snprintf(nodes[i].registry_digest, sizeof nodes[i].registry_digest, "%s",
                         digests[i] ? digests[i] : "");
        }
        assert_int_equal(topology_new(nodes, count, "n2", 5, &t), 0);
        return t;
}

static Mesh *mesh_over(Manager *m, int64_t *ranks, size_t n) {
        MeshDim dim = { .name = "dp", .size = (int64_t) n };
        MeshSpec spec = { .device = { .dims = &dim, .n = 1 }, .ranks = ranks, .n_ranks = n };
        _cleanup_(family_error_done) FamilyError e = {};
        Mesh *mesh = NULL;

        assert_int_equal(manager_create_mesh(m, &spec, &mesh, &e), 0);
        return mesh;
}

static void test_manager_keeps_digest_with_registry(void **state) {
        char base[REGISTRY_DIGEST_LENGTH + 1], here[REGISTRY_DIGEST_LENGTH + 1];
        char old[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(registry_unrefp) Registry *before = NULL, *after = NULL;
        ManagerFixture fx;

        fixture_start(&fx);
        digest_files(base, "x.yaml", EXPERTS, NULL);
        manager_registry_digest(fx.m, here);
        assert_string_equal(here, base);
        {
                _cleanup_(topology_unrefp) Topology *t = manager_topology(fx.m);
                assert_string_equal(topology_local_node(t)->registry_digest, base);
        }
        before = manager_registry(fx.m);

        /* A reload with another registry: the digest and the local node follow at once. */
        write_file(fx.dir, "b.yaml", NORM);
        assert_int_equal(manager_reload(fx.m, &after, &diag), 0);
        manager_registry_digest(fx.m, here);
        assert_string_not_equal(here, base);
        digest_files(base, "a.yaml", EXPERTS, "b.yaml", NORM, NULL);
        assert_string_equal(here, base);
        {
                _cleanup_(topology_unrefp) Topology *t = manager_topology(fx.m);
                assert_string_equal(topology_local_node(t)->registry_digest, here);
                assert_int_equal(t->version, 1);
        }
        /* A topology built before the reload (the peer thread's) is stamped on the way in. */
        {
                const char *digests[3] = { NULL, NULL, "0123" };
                _cleanup_(topology_unrefp) Topology *stale = topology_of(3, digests);
                manager_set_topology(fx.m, stale);
                _cleanup_(topology_unrefp) Topology *t = manager_topology(fx.m);
                assert_ptr_not_equal(t, stale);
                assert_int_equal(t->version, 5);
                assert_int_equal(t->n_nodes, 3);
                assert_string_equal(topology_local_node(t)->registry_digest, here);
                assert_string_equal(t->nodes[0].registry_digest, "");
        }
        /* The digest of an older snapshot is its own. */
        assert_int_equal(manager_registry_digest_of(fx.m, before, old), 0);
        digest_files(base, "x.yaml", EXPERTS, NULL);
        assert_string_equal(old, base);
        assert_int_equal(manager_registry_digest_of(fx.m, after, old), 0);
        assert_string_equal(old, here);
        fixture_stop(&fx);
}

static void test_agreement(void **state) {
        char d[REGISTRY_DIGEST_LENGTH + 1];
        const char *other = "9f8e000000000000000000000000000000000000000000000000000000000000";
        _cleanup_(family_error_done) FamilyError e = {};
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        _cleanup_free_ char *expected = NULL;
        ManagerFixture fx;

        fixture_start(&fx);
        reg = manager_registry(fx.m);
        manager_registry_digest(fx.m, d);
        /* n0 agrees, n1 differs, n2 is this node, n3 is not known yet, n4..n7 differ. */
        const char *digests[8] = { d, other, "", NULL, other, other, other, other };
        _cleanup_(topology_unrefp) Topology *t = topology_of(8, digests);
        manager_set_topology(fx.m, t);

        /* Nodes that agree, and this node, pass; nodes outside the mesh do not count. */
        int64_t agree[] = { 0, 2 };
        _cleanup_(mesh_unrefp) Mesh *m1 = mesh_over(fx.m, agree, 2);
        assert_int_equal(manager_check_registry_agreement(fx.m, reg, t, m1, &e), 0);
        assert_false(family_error_is_set(&e));

        int64_t two[] = { 2, 1, 0 };
        _cleanup_(mesh_unrefp) Mesh *m2 = mesh_over(fx.m, two, 3);
        assert_int_equal(manager_check_registry_agreement(fx.m, reg, t, m2, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_FAILED_PRECONDITION);
        assert_string_equal(e.reason, "REGISTRY_MISMATCH");
        assert_null(e.field);
        assert_true(asprintf(&expected,
                             "registry differs across the mesh's nodes: node 'n2' has %s, "
                             "node 'n1' has %s; reload the registries so they agree",
                             d, other) > 0);
        assert_string_equal(e.message, expected);
        expected = mfree(expected);

        /* A node not known yet differs; past four nodes the rest are counted. */
        int64_t all[] = { 7, 6, 5, 4, 3, 2, 1, 0 };
        _cleanup_(mesh_unrefp) Mesh *m3 = mesh_over(fx.m, all, 8);
        assert_int_equal(manager_check_registry_agreement(fx.m, reg, t, m3, &e), -EINVAL);
        assert_true(asprintf(&expected,
                             "registry differs across the mesh's nodes: node 'n2' has %s, "
                             "node 'n1' has %s, node 'n3' has unknown, node 'n4' has %s, "
                             "node 'n5' has %s, and 2 more; reload the registries so they "
                             "agree",
                             d, other, other, other) > 0);
        assert_string_equal(e.message, expected);
        fixture_stop(&fx);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_format_and_determinism),
                cmocka_unit_test(test_ignores_comments_names_order_and_style),
                cmocka_unit_test(test_counts_what_resolve_and_build_read),
                cmocka_unit_test(test_counts_families),
                cmocka_unit_test(test_manager_keeps_digest_with_registry),
                cmocka_unit_test(test_agreement),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
