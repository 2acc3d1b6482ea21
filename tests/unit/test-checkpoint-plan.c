/* test-checkpoint-plan.c: core/checkpoint-plan.c: the boxes that fill a slice, executed here by
 * a naive reader and compared with the parameter assembled directly from its tensors; slices of
 * layouts that shard a concatenated dimension against an element-by-element oracle. */
#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/checkpoint-plan.h"
#include "core/layout.h"
#include "core/mesh.h"

/* Tensors of a fake checkpoint: each element's value encodes (tensor, flat index). */
typedef struct Tensor {
        char name[96];
        size_t n_dims;
        int64_t shape[4];
} Tensor;

typedef struct Checkpoint {
        Tensor t[64];
        size_t n;
} Checkpoint;

static void add(Checkpoint *c, const char *name, size_t n_dims, const int64_t *shape) {
        Tensor *t = &c->t[c->n++];
        (void) snprintf(t->name, sizeof t->name, "%s", name);
        t->n_dims = n_dims;
        memcpy(t->shape, shape, n_dims * sizeof *shape);
}

static const Tensor *find(const Checkpoint *c, const char *name) {
        for (size_t i = 0; i < c->n; i++)
                if (streq(c->t[i].name, name))
                        return &c->t[i];
        return NULL;
}

static int shape_of(const char *name, size_t *ret_n, int64_t ret_shape[static FAMILYD_MAX_SHAPE_RANK],
                    void *userdata) {
        const Tensor *t = find(userdata, name);
        if (!t)
                return -ENOENT;
        *ret_n = t->n_dims;
        memcpy(ret_shape, t->shape, t->n_dims * sizeof *ret_shape);
        return 0;
}

/* The value of a source element: its tensor's index * 1000 + its flat index. */
static double value(const Checkpoint *c, const char *name, const int64_t *at) {
        const Tensor *t = find(c, name);
        int64_t flat = 0;
        assert_non_null(t);
        for (size_t d = 0; d < t->n_dims; d++) {
                assert_true(at[d] >= 0 && at[d] < t->shape[d]);
                flat = flat * t->shape[d] + at[d];
        }
        return (double) (t - c->t) * 1000 + (double) flat;
}

/* A naive reader: every element of every block, into the slice's local tensor. */
static void execute(const Checkpoint *c, const CheckpointBlock *b, size_t n, const ShardSlice *s,
                    double *out) {
        for (size_t k = 0; k < n; k++) {
                int64_t idx[FAMILYD_MAX_SHAPE_RANK] = {}, total = 1;
                for (size_t j = 0; j < b[k].n_src_dims; j++)
                        total *= b[k].src_extent[j];
                for (int64_t e = 0; e < total; e++) {
                        int64_t rem = e, src[FAMILYD_MAX_SHAPE_RANK], flat = 0;
                        for (size_t j = b[k].n_src_dims; j-- > 0;) {
                                idx[j] = rem % b[k].src_extent[j];
                                rem /= b[k].src_extent[j];
                                src[j] = b[k].src_offset[j] + idx[j];
                        }
                        for (size_t d = 0; d < s->n_dims; d++) {
                                size_t a = b[k].src_axis[d];
                                int64_t at = b[k].dst_offset[d] + (a == CHECKPOINT_NO_AXIS ? 0 : idx[a]);
                                assert_true(at >= 0 && at < s->local_shape[d]);
                                flat = flat * s->local_shape[d] + at;
                        }
                        out[flat] = value(c, b[k].tensor, src);
                }
        }
}

/* gate_up [E, H, 2I] of Mixtral's experts.E.w1 and w3 ([I, H] each), transposed; down [E, I, H]
 * of experts.E.w2 [H, I], transposed. */
enum { E = 4, H = 3, I = 2 };

static Checkpoint mixtral(void) {
        Checkpoint c = {};
        char n[96];
        for (int e = 0; e < E; e++) {
                (void) snprintf(n, sizeof n, "m.experts.%d.w1.weight", e);
                add(&c, n, 2, (int64_t[]) { I, H });
                (void) snprintf(n, sizeof n, "m.experts.%d.w3.weight", e);
                add(&c, n, 2, (int64_t[]) { I, H });
                (void) snprintf(n, sizeof n, "m.experts.%d.w2.weight", e);
                add(&c, n, 2, (int64_t[]) { H, I });
        }
        return c;
}

static double gate_up_expected(const Checkpoint *c, int64_t e, int64_t h, int64_t j) {
        char n[96];
        (void) snprintf(n, sizeof n, "m.experts.%" PRId64 ".%s.weight", e, j < I ? "w1" : "w3");
        return value(c, n, (int64_t[]) { j % I, h });
}

static CheckpointSource gate_up_source(void) {
        static CheckpointPart parts[2] = {
                { "{prefix}.experts.{expert}.w1.weight", true },
                { "{prefix}.experts.{expert}.w3.weight", true },
        };
        return (CheckpointSource) { .parts = parts, .n_parts = 2, .concat = true, .concat_dim = 2,
                                    .stack = true, .stack_dim = 0, .stack_key = (char *) "expert" };
}

static void check_gate_up_slice(const int64_t *off, const int64_t *loc, size_t want_blocks) {
        Checkpoint c = mixtral();
        CheckpointSource src = gate_up_source();
        int64_t shape[3] = { E, H, 2 * I }, o[3], l[3];
        memcpy(o, off, sizeof o);
        memcpy(l, loc, sizeof l);
        ParameterLayout p = { .name = (char *) "gate_up_proj", .shape = shape, .n_dims = 3 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 3 };
        CheckpointBlock *b = NULL;
        size_t n = 0;
        FamilyError err = FAMILY_ERROR_NULL;
        double out[E * H * 2 * I];

        for (size_t i = 0; i < ELEMENTSOF(out); i++)
                out[i] = -1;
        assert_int_equal(checkpoint_plan_slice(&src, "m", &p, &s, shape_of, &c, &b, &n, &err), 0);
        assert_int_equal(n, want_blocks);
        execute(&c, b, n, &s, out);
        for (int64_t e = 0; e < l[0]; e++)
                for (int64_t h = 0; h < l[1]; h++)
                        for (int64_t j = 0; j < l[2]; j++)
                                assert_true(out[(e * l[1] + h) * l[2] + j] ==
                                            gate_up_expected(&c, o[0] + e, o[1] + h, o[2] + j));
        checkpoint_blocks_free(b, n);
}

static void test_gate_up(void **state) {
        /* whole: 4 experts x 2 parts */
        check_gate_up_slice((int64_t[]) { 0, 0, 0 }, (int64_t[]) { E, H, 2 * I }, 8);
        /* ep=2, rank 1: experts 2 and 3 */
        check_gate_up_slice((int64_t[]) { 2, 0, 0 }, (int64_t[]) { 2, H, 2 * I }, 4);
        /* a slice across the join of the concat dimension: columns 1 and 2 */
        check_gate_up_slice((int64_t[]) { 1, 1, 1 }, (int64_t[]) { 2, 2, 2 }, 4);
        /* inside the second part only: all of it, then its last column */
        check_gate_up_slice((int64_t[]) { 3, 0, 2 }, (int64_t[]) { 1, H, 2 }, 1);
        check_gate_up_slice((int64_t[]) { 0, 0, 3 }, (int64_t[]) { E, H, 1 }, 4);
        /* the first part's last column */
        check_gate_up_slice((int64_t[]) { 0, 2, 1 }, (int64_t[]) { 2, 1, 1 }, 2);
}

static void test_down_transposed(void **state) {
        Checkpoint c = mixtral();
        CheckpointPart part = { "{prefix}.experts.{expert}.w2.weight", true };
        CheckpointSource src = { .parts = &part, .n_parts = 1, .stack = true, .stack_dim = 0,
                                 .stack_key = (char *) "expert" };
        int64_t shape[3] = { E, I, H }, o[3] = { 1, 1, 0 }, l[3] = { 2, 1, H };
        ParameterLayout p = { .name = (char *) "down_proj", .shape = shape, .n_dims = 3 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 3 };
        CheckpointBlock *b = NULL;
        size_t n = 0;
        FamilyError err = FAMILY_ERROR_NULL;
        double out[2 * 1 * H];
        char name[96];

        assert_int_equal(checkpoint_plan_slice(&src, "m", &p, &s, shape_of, &c, &b, &n, &err), 0);
        assert_int_equal(n, 2);
        assert_string_equal(b[0].tensor, "m.experts.1.w2.weight");
        /* the parameter's axis 1 (I) reads the tensor's axis 1, axis 2 (H) its axis 0 */
        assert_int_equal(b[0].src_axis[0], CHECKPOINT_NO_AXIS);
        assert_int_equal(b[0].src_axis[1], 1);
        assert_int_equal(b[0].src_axis[2], 0);
        execute(&c, b, n, &s, out);
        for (int64_t e = 0; e < 2; e++)
                for (int64_t h = 0; h < H; h++) {
                        (void) snprintf(name, sizeof name, "m.experts.%" PRId64 ".w2.weight", 1 + e);
                        assert_true(out[e * H + h] == value(&c, name, (int64_t[]) { h, 1 }));
                }
        checkpoint_blocks_free(b, n);
}

/* A plain Linear weight, row-sharded and column-sharded; an empty prefix; an empty slice. */
static void test_plain(void **state) {
        Checkpoint c = {};
        add(&c, "q_proj.weight", 2, (int64_t[]) { 6, 4 });
        CheckpointPart part = { "{prefix}.q_proj.weight", false };
        CheckpointSource src = { .parts = &part, .n_parts = 1 };
        int64_t shape[2] = { 6, 4 }, o[2] = { 3, 2 }, l[2] = { 3, 2 };
        ParameterLayout p = { .name = (char *) "wq", .shape = shape, .n_dims = 2 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 2 };
        CheckpointBlock *b = NULL;
        size_t n = 0;
        FamilyError err = FAMILY_ERROR_NULL;
        double out[6];

        assert_int_equal(checkpoint_plan_slice(&src, "", &p, &s, shape_of, &c, &b, &n, &err), 0);
        assert_int_equal(n, 1);
        assert_int_equal(b[0].src_offset[0], 3);
        assert_int_equal(b[0].src_offset[1], 2);
        assert_int_equal(b[0].src_extent[0], 3);
        assert_int_equal(b[0].src_extent[1], 2);
        execute(&c, b, n, &s, out);
        for (int64_t i = 0; i < 3; i++)
                for (int64_t j = 0; j < 2; j++)
                        assert_true(out[i * 2 + j] == (double) ((3 + i) * 4 + 2 + j));
        checkpoint_blocks_free(b, n);

        b = NULL, n = 0, l[0] = 0;
        assert_int_equal(checkpoint_plan_slice(&src, "", &p, &s, shape_of, &c, &b, &n, &err), 0);
        assert_int_equal(n, 0);
}

static void expect_refusal(const CheckpointSource *src, const char *prefix, int64_t *shape,
                           size_t n_dims, Checkpoint *c, FamilyStatus status, const char *reason,
                           const char *message) {
        int64_t o[4] = {}, l[4];
        memcpy(l, shape, n_dims * sizeof *shape);
        ParameterLayout p = { .name = (char *) "w", .shape = shape, .n_dims = n_dims };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = n_dims };
        CheckpointBlock *b = NULL;
        size_t n = 0;
        FamilyError err = FAMILY_ERROR_NULL;

        assert_int_equal(checkpoint_plan_slice(src, prefix, &p, &s, shape_of, c, &b, &n, &err),
                         -EINVAL);
        assert_int_equal(err.status, status);
        assert_string_equal(err.reason, reason);
        assert_string_equal(err.message, message);
        family_error_done(&err);
        checkpoint_blocks_free(b, n);
}

static void test_refusals(void **state) {
        Checkpoint c = mixtral();
        CheckpointPart plain = { "{prefix}.x", false }, t = { "m.experts.0.w2.weight", true };
        CheckpointSource one = { .parts = &plain, .n_parts = 1 },
                         tr = { .parts = &t, .n_parts = 1 }, gu = gate_up_source();

        expect_refusal(&one, "m", (int64_t[]) { 2 }, 1, &c, FAMILY_STATUS_NOT_FOUND,
                       "CHECKPOINT_TENSOR_MISSING",
                       "parameter 'w': the checkpoint has no tensor 'm.x'");
        /* w2 is [H, I]; transposed it is [I, H], not [H, I] */
        expect_refusal(&tr, "", (int64_t[]) { H, I }, 2, &c, FAMILY_STATUS_FAILED_PRECONDITION,
                       "CHECKPOINT_SHAPE",
                       "parameter 'w': checkpoint tensor 'm.experts.0.w2.weight' has shape [3, 2], "
                       "not [2, 3]");
        expect_refusal(&tr, "", (int64_t[]) { 2, 2, 3 }, 3, &c, FAMILY_STATUS_FAILED_PRECONDITION,
                       "CHECKPOINT_SHAPE",
                       "parameter 'w': checkpoint tensor 'm.experts.0.w2.weight' has shape [3, 2], "
                       "not [2, 3, 2]");
        /* parts of 2 + 2 columns, 5 wanted */
        expect_refusal(&gu, "m", (int64_t[]) { E, H, 5 }, 3, &c,
                       FAMILY_STATUS_FAILED_PRECONDITION, "CHECKPOINT_SHAPE",
                       "parameter 'w': its 2 checkpoint tensors joined along dimension 2 have 4, "
                       "not 5");
        /* more experts than the checkpoint has: the first missing one is named */
        expect_refusal(&gu, "m", (int64_t[]) { E + 1, H, 2 * I }, 3, &c,
                       FAMILY_STATUS_NOT_FOUND, "CHECKPOINT_TENSOR_MISSING",
                       "parameter 'w': the checkpoint has no tensor 'm.experts.4.w1.weight'");
}

/*
 * Concatenated sources whose concat dimension the mesh shards: sharded before they are joined.
 * The layouts come from layout_compute() over real meshes; the oracle builds the concat
 * dimension's map (logical index -> part, part row) by appending, group after group, each
 * part's k-th 1/g, and reads every element of the slice through it.
 */

/* A mesh of one device view, "tp=2" or "dp=2 tp=2" (row-major, first outermost). */
static Mesh *mesh_make(const char *device) {
        _cleanup_(mesh_spec_done) MeshSpec s = {};
        _cleanup_free_ char *copy = strdup(device);
        FamilyError e = FAMILY_ERROR_NULL;
        char *save = NULL;
        int64_t world = 1;
        Mesh *m = NULL;

        assert_non_null(copy);
        s.device.dims = calloc(FAMILYD_MAX_MESH_DIMS, sizeof(MeshDim));
        assert_non_null(s.device.dims);
        for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
                char *eq = strchr(tok, '=');
                assert_non_null(eq);
                *eq = 0;
                s.device.dims[s.device.n].name = strdup(tok);
                assert_non_null(s.device.dims[s.device.n].name);
                s.device.dims[s.device.n].size = strtoll(eq + 1, NULL, 10);
                world *= s.device.dims[s.device.n++].size;
        }
        if (mesh_new(&s, world, &m, &e) < 0)
                fail_msg("mesh_new: %s", strempty(e.message));
        return m;
}

static void layout_make(const char *device, const char *name, const int64_t *shape, size_t n_dims,
                        const Placement *placements, size_t n_placements, Layout *ret) {
        _cleanup_(mesh_unrefp) Mesh *m = mesh_make(device);
        LayoutParameter lp = { .name = name, .shape = shape, .n_dims = n_dims,
                               .placements = placements, .n_placements = n_placements };
        FamilyError e = FAMILY_ERROR_NULL;

        if (layout_compute(m, &lp, 1, DTYPE_FLOAT32, 64, ret, &e) < 0)
                fail_msg("layout_compute: %s", strempty(e.message));
}

#define SHARD(a, d) ((Placement) { .axis = (char *) (a), .kind = PLACEMENT_SHARD, .dim = (d) })
#define REPLICATE(a) ((Placement) { .axis = (char *) (a), .kind = PLACEMENT_REPLICATE })

/* Every element of the slice, from the element the rule names; g is the oracle's own count of
 * the concat dimension's shards (the test says it, the plan derives it from the layout). Each
 * local element is written exactly once. Returns the number of blocks. */
static size_t check_oracle(const Checkpoint *c, const CheckpointSource *src, const char *prefix,
                           const ParameterLayout *p, const ShardSlice *s, int64_t g) {
        CheckpointBlock *b = NULL;
        size_t n = 0, n_local = 1, rows = 0;
        FamilyError err = FAMILY_ERROR_NULL;
        int64_t cd = src->concat_dim, map_part[256], map_row[256];

        for (size_t d = 0; d < s->n_dims; d++)
                n_local *= (size_t) s->local_shape[d];
        double *out = malloc((n_local ? n_local : 1) * sizeof(double));
        assert_non_null(out);
        for (size_t i = 0; i < n_local; i++)
                out[i] = -1;

        /* The oracle's map of the concat dimension, for stack index 0 (every index alike). */
        if (src->concat) {
                int64_t ext[CHECKPOINT_PARTS_MAX];
                for (size_t i = 0; i < src->n_parts; i++) {
                        _cleanup_free_ char *name = NULL;
                        assert_int_equal(checkpoint_tensor_name(src->parts[i].tensor, prefix,
                                                                src->stack_key, 0, &name), 0);
                        const Tensor *t = find(c, name);
                        assert_non_null(t);
                        /* the concat dim's axis in the tensor: without the stacked one, swapped
                         * back if transposed */
                        size_t k = (size_t) cd - (src->stack && src->stack_dim < cd ? 1 : 0);
                        if (src->parts[i].transpose && k >= t->n_dims - 2)
                                k = k == t->n_dims - 2 ? t->n_dims - 1 : t->n_dims - 2;
                        ext[i] = t->shape[k];
                        assert_int_equal(ext[i] % g, 0);
                }
                for (int64_t k = 0; k < g; k++)
                        for (size_t i = 0; i < src->n_parts; i++)
                                for (int64_t r = 0; r < ext[i] / g; r++) {
                                        assert_true(rows < ELEMENTSOF(map_part));
                                        map_part[rows] = (int64_t) i;
                                        map_row[rows++] = k * (ext[i] / g) + r;
                                }
                assert_int_equal(rows, p->shape[cd]);
        }

        assert_int_equal(checkpoint_plan_slice(src, prefix, p, s, shape_of, (void *) c, &b, &n,
                                               &err), 0);
        assert_false(family_error_is_set(&err));
        /* the naive reader, refusing a second write to any element */
        for (size_t k = 0; k < n; k++) {
                int64_t idx[FAMILYD_MAX_SHAPE_RANK] = {}, total = 1;
                for (size_t j = 0; j < b[k].n_src_dims; j++) {
                        assert_true(b[k].src_extent[j] > 0);
                        total *= b[k].src_extent[j];
                }
                for (int64_t e = 0; e < total; e++) {
                        int64_t rem = e, at_src[FAMILYD_MAX_SHAPE_RANK], flat = 0;
                        for (size_t j = b[k].n_src_dims; j-- > 0;) {
                                idx[j] = rem % b[k].src_extent[j];
                                rem /= b[k].src_extent[j];
                                at_src[j] = b[k].src_offset[j] + idx[j];
                        }
                        for (size_t d = 0; d < s->n_dims; d++) {
                                size_t a = b[k].src_axis[d];
                                int64_t at = b[k].dst_offset[d] + (a == CHECKPOINT_NO_AXIS ? 0 : idx[a]);
                                assert_true(at >= 0 && at < s->local_shape[d]);
                                flat = flat * s->local_shape[d] + at;
                        }
                        assert_true(out[flat] < 0);
                        out[flat] = value(c, b[k].tensor, at_src);
                }
        }
        /* the oracle, element by element */
        for (size_t f = 0; f < n_local; f++) {
                int64_t at[FAMILYD_MAX_SHAPE_RANK], tidx[FAMILYD_MAX_SHAPE_RANK], index = 0;
                size_t rem = f, k = 0, part = 0;
                _cleanup_free_ char *name = NULL;
                for (size_t d = s->n_dims; d-- > 0;) {
                        at[d] = s->global_offset[d] + (int64_t) (rem % (size_t) s->local_shape[d]);
                        rem /= (size_t) s->local_shape[d];
                }
                for (size_t d = 0; d < s->n_dims; d++) {
                        if (src->stack && (int64_t) d == src->stack_dim) {
                                index = at[d];
                                continue;
                        }
                        tidx[k++] = at[d];
                        if (src->concat && (int64_t) d == cd) {
                                part = (size_t) map_part[at[d]];
                                tidx[k - 1] = map_row[at[d]];
                        }
                }
                if (src->parts[part].transpose) {
                        int64_t t = tidx[k - 2];
                        tidx[k - 2] = tidx[k - 1];
                        tidx[k - 1] = t;
                }
                assert_int_equal(checkpoint_tensor_name(src->parts[part].tensor, prefix,
                                                        src->stack_key, index, &name), 0);
                assert_true(out[f] == value(c, name, tidx));
        }
        free(out);
        checkpoint_blocks_free(b, n);
        return n;
}

/* Fused q/k/v rows of a Linear: q_proj [8, 3], k_proj and v_proj [4, 3]; the parameter [16, 3]. */
static Checkpoint qkv_checkpoint(int64_t q, int64_t kv) {
        Checkpoint c = {};
        add(&c, "a.q_proj.weight", 2, (int64_t[]) { q, 3 });
        add(&c, "a.k_proj.weight", 2, (int64_t[]) { kv, 3 });
        add(&c, "a.v_proj.weight", 2, (int64_t[]) { kv, 3 });
        return c;
}

static CheckpointSource qkv_source(void) {
        static CheckpointPart parts[3] = {
                { "{prefix}.q_proj.weight", false },
                { "{prefix}.k_proj.weight", false },
                { "{prefix}.v_proj.weight", false },
        };
        return (CheckpointSource) { .parts = parts, .n_parts = 3, .concat = true, .concat_dim = 0 };
}

static void expect_block(const CheckpointBlock *b, const char *tensor, int64_t src_row,
                         int64_t rows, int64_t dst_row) {
        assert_string_equal(b->tensor, tensor);
        assert_int_equal(b->n_src_dims, 2);
        assert_int_equal(b->src_offset[0], src_row);
        assert_int_equal(b->src_extent[0], rows);
        assert_int_equal(b->src_offset[1], 0);
        assert_int_equal(b->src_extent[1], 3);
        assert_int_equal(b->dst_offset[0], dst_row);
        assert_int_equal(b->dst_offset[1], 0);
}

static void plan(const CheckpointSource *src, const Checkpoint *c, const ParameterLayout *p,
                 const ShardSlice *s, CheckpointBlock **ret, size_t *ret_n) {
        FamilyError err = FAMILY_ERROR_NULL;

        *ret = NULL, *ret_n = 0;
        assert_int_equal(checkpoint_plan_slice(src, "a", p, s, shape_of, (void *) c, ret, ret_n,
                                               &err), 0);
}

static void test_concat_sharded_tp2(void **state) {
        Checkpoint c = qkv_checkpoint(8, 4);
        CheckpointSource src = qkv_source();
        _cleanup_(layout_done) Layout l = {};
        const Placement pl[] = { SHARD("tp", 0) };
        CheckpointBlock *b;
        size_t n;

        layout_make("tp=2", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 1, &l);
        /* rank 0 holds rows [0, 8): [q 0:4; k 0:2; v 0:2], not q 0:8 */
        plan(&src, &c, &l.parameters[0], &l.ranks[0].slices[0], &b, &n);
        assert_int_equal(n, 3);
        expect_block(&b[0], "a.q_proj.weight", 0, 4, 0);
        expect_block(&b[1], "a.k_proj.weight", 0, 2, 4);
        expect_block(&b[2], "a.v_proj.weight", 0, 2, 6);
        checkpoint_blocks_free(b, n);
        /* rank 1: [q 4:8; k 2:4; v 2:4] */
        plan(&src, &c, &l.parameters[0], &l.ranks[1].slices[0], &b, &n);
        assert_int_equal(n, 3);
        expect_block(&b[0], "a.q_proj.weight", 4, 4, 0);
        expect_block(&b[1], "a.k_proj.weight", 2, 2, 4);
        expect_block(&b[2], "a.v_proj.weight", 2, 2, 6);
        checkpoint_blocks_free(b, n);
        for (size_t k = 0; k < l.n_ranks; k++)
                assert_int_equal(check_oracle(&c, &src, "a", &l.parameters[0],
                                              &l.ranks[k].slices[0], 2), 3);
}

static void test_concat_sharded_tp4(void **state) {
        Checkpoint c = qkv_checkpoint(8, 4);
        CheckpointSource src = qkv_source();
        _cleanup_(layout_done) Layout l = {};
        const Placement pl[] = { SHARD("tp", -2), REPLICATE("dp") };
        CheckpointBlock *b;
        size_t n;

        layout_make("dp=2 tp=4", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 2, &l);
        /* rank (dp 1, tp 2) holds rows [8, 12): [q 4:6; k 2; v 2] */
        plan(&src, &c, &l.parameters[0], &l.ranks[6].slices[0], &b, &n);
        assert_int_equal(n, 3);
        expect_block(&b[0], "a.q_proj.weight", 4, 2, 0);
        expect_block(&b[1], "a.k_proj.weight", 2, 1, 2);
        expect_block(&b[2], "a.v_proj.weight", 2, 1, 3);
        checkpoint_blocks_free(b, n);
        for (size_t k = 0; k < l.n_ranks; k++)
                assert_int_equal(check_oracle(&c, &src, "a", &l.parameters[0],
                                              &l.ranks[k].slices[0], 4), 3);
}

/* Two axes shard the concat dimension: g is their product, and each rank still holds one group
 * (q 8 + k 4 + v 4 over dp=2 x tp=2: g = 4). */
static void test_concat_sharded_nested(void **state) {
        Checkpoint c = qkv_checkpoint(8, 4);
        CheckpointSource src = qkv_source();
        _cleanup_(layout_done) Layout l = {};
        const Placement pl[] = { SHARD("tp", 0), SHARD("dp", 0) };
        CheckpointBlock *b;
        size_t n;

        layout_make("dp=2 tp=2", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 2, &l);
        /* rank (dp 0, tp 1): rows [4, 8), the second group: [q 2:4; k 1; v 1] */
        plan(&src, &c, &l.parameters[0], &l.ranks[1].slices[0], &b, &n);
        assert_int_equal(n, 3);
        expect_block(&b[0], "a.q_proj.weight", 2, 2, 0);
        expect_block(&b[1], "a.k_proj.weight", 1, 1, 2);
        expect_block(&b[2], "a.v_proj.weight", 1, 1, 3);
        checkpoint_blocks_free(b, n);
        for (size_t k = 0; k < l.n_ranks; k++)
                assert_int_equal(check_oracle(&c, &src, "a", &l.parameters[0],
                                              &l.ranks[k].slices[0], 4), 3);
}

/* Not sharded along the concat dimension (another dimension, replicated, or an axis the mesh
 * lacks): g = 1, the plain join, a slice of the fused tensor. */
static void test_concat_unsharded(void **state) {
        Checkpoint c = qkv_checkpoint(8, 4);
        CheckpointSource src = qkv_source();
        CheckpointBlock *b;
        size_t n;

        {
                _cleanup_(layout_done) Layout l = {};
                const Placement pl[] = { SHARD("tp", 1) };
                layout_make("tp=3", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 1, &l);
                plan(&src, &c, &l.parameters[0], &l.ranks[2].slices[0], &b, &n);
                assert_int_equal(n, 3);
                assert_int_equal(b[1].src_offset[0], 0);
                assert_int_equal(b[1].src_extent[0], 4);
                assert_int_equal(b[1].dst_offset[0], 8);
                assert_int_equal(b[1].src_offset[1], 2);
                assert_int_equal(b[1].src_extent[1], 1);
                checkpoint_blocks_free(b, n);
                for (size_t k = 0; k < l.n_ranks; k++)
                        check_oracle(&c, &src, "a", &l.parameters[0], &l.ranks[k].slices[0], 1);
        }
        {
                /* "tp" is not a dimension of this mesh: its axis has size 1 */
                _cleanup_(layout_done) Layout l = {};
                const Placement pl[] = { SHARD("tp", 0), REPLICATE("dp") };
                layout_make("dp=2", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 2, &l);
                assert_int_equal(l.parameters[0].axis_size[0], 1);
                plan(&src, &c, &l.parameters[0], &l.ranks[1].slices[0], &b, &n);
                assert_int_equal(n, 3);
                expect_block(&b[0], "a.q_proj.weight", 0, 8, 0);
                expect_block(&b[1], "a.k_proj.weight", 0, 4, 8);
                expect_block(&b[2], "a.v_proj.weight", 0, 4, 12);
                checkpoint_blocks_free(b, n);
        }
        {
                /* a hand-made slice of the plain join: rows [6, 10) are q 6:8 and k 0:2 */
                _cleanup_(layout_done) Layout l = {};
                const Placement pl[] = { REPLICATE("tp") };
                int64_t o[2] = { 6, 0 }, ls[2] = { 4, 3 };
                ShardSlice s = { .local_shape = ls, .global_offset = o, .n_dims = 2 };
                layout_make("tp=2", "qkv", (int64_t[]) { 16, 3 }, 2, pl, 1, &l);
                plan(&src, &c, &l.parameters[0], &s, &b, &n);
                assert_int_equal(n, 2);
                expect_block(&b[0], "a.q_proj.weight", 6, 2, 0);
                expect_block(&b[1], "a.k_proj.weight", 0, 2, 2);
                checkpoint_blocks_free(b, n);
        }
}

/* Ranges that cross groups: a hand-made slice of the whole parameter is every group in turn,
 * and every range [lo, hi) of the concat dimension, for g = 1, 2, 4, 8, matches the oracle. */
static void test_concat_sharded_ranges(void **state) {
        Checkpoint c = qkv_checkpoint(8, 8);
        CheckpointSource src = qkv_source();
        static const int64_t tps[] = { 1, 2, 4, 8 };
        CheckpointBlock *b;
        size_t n;

        for (size_t t = 0; t < ELEMENTSOF(tps); t++) {
                _cleanup_(layout_done) Layout l = {};
                char mesh[32];
                const Placement pl[] = { SHARD("tp", 0) };
                (void) snprintf(mesh, sizeof mesh, "tp=%" PRId64, tps[t]);
                layout_make(mesh, "qkv", (int64_t[]) { 24, 3 }, 2, pl, 1, &l);
                for (int64_t lo = 0; lo < 24; lo++)
                        for (int64_t hi = lo + 1; hi <= 24; hi++)
                                for (int64_t col = 0; col < 3; col++) {
                                        int64_t o[2] = { lo, col }, ls[2] = { hi - lo, 3 - col };
                                        ShardSlice s = { .local_shape = ls, .global_offset = o,
                                                         .n_dims = 2 };
                                        check_oracle(&c, &src, "a", &l.parameters[0], &s, tps[t]);
                                }
                if (tps[t] != 2)
                        continue;
                /* g = 2, the whole parameter: [q 0:4; k 0:4; v 0:4; q 4:8; k 4:8; v 4:8] */
                int64_t o[2] = { 0, 0 }, ls[2] = { 24, 3 };
                ShardSlice s = { .local_shape = ls, .global_offset = o, .n_dims = 2 };
                plan(&src, &c, &l.parameters[0], &s, &b, &n);
                assert_int_equal(n, 6);
                expect_block(&b[0], "a.q_proj.weight", 0, 4, 0);
                expect_block(&b[1], "a.k_proj.weight", 0, 4, 4);
                expect_block(&b[2], "a.v_proj.weight", 0, 4, 8);
                expect_block(&b[3], "a.q_proj.weight", 4, 4, 12);
                expect_block(&b[4], "a.k_proj.weight", 4, 4, 16);
                expect_block(&b[5], "a.v_proj.weight", 4, 4, 20);
                checkpoint_blocks_free(b, n);
                /* rows [10, 14): the end of group 0 (v 2:4) and the start of group 1 (q 4:6) */
                o[0] = 10, ls[0] = 4;
                plan(&src, &c, &l.parameters[0], &s, &b, &n);
                assert_int_equal(n, 2);
                expect_block(&b[0], "a.v_proj.weight", 2, 2, 0);
                expect_block(&b[1], "a.q_proj.weight", 4, 2, 2);
                checkpoint_blocks_free(b, n);
        }
}

/* Mixtral's gate_up [E, H, 2I] (stack dim 0, concat dim 2 of w1 and w3 transposed) with experts
 * over ep and the fused dimension over tp: a rank's columns are [w1's share; w3's share]. */
static void test_concat_sharded_stack_transpose(void **state) {
        enum { XE = 4, XH = 3, XI = 4 };
        Checkpoint c = {};
        CheckpointSource src = gate_up_source();
        char name[96];

        for (int e = 0; e < XE; e++) {
                (void) snprintf(name, sizeof name, "m.experts.%d.w1.weight", e);
                add(&c, name, 2, (int64_t[]) { XI, XH });
                (void) snprintf(name, sizeof name, "m.experts.%d.w3.weight", e);
                add(&c, name, 2, (int64_t[]) { XI, XH });
        }
        for (int64_t tp = 1; tp <= 4; tp *= 2) {
                _cleanup_(layout_done) Layout l = {};
                const Placement pl[] = { SHARD("ep", 0), SHARD("tp", 2) };
                char mesh[32];
                (void) snprintf(mesh, sizeof mesh, "ep=2 tp=%" PRId64, tp);
                layout_make(mesh, "gate_up_proj", (int64_t[]) { XE, XH, 2 * XI }, 3, pl, 2, &l);
                for (size_t k = 0; k < l.n_ranks; k++)
                        /* 2 experts, 2 parts each */
                        assert_int_equal(check_oracle(&c, &src, "m", &l.parameters[0],
                                                      &l.ranks[k].slices[0], tp), 4);
                if (tp != 2)
                        continue;
                /* rank (ep 1, tp 1): experts 2 and 3, columns [4, 8) = [w1 rows 2:4; w3 rows
                 * 2:4], transposed */
                CheckpointBlock *b;
                size_t n;
                FamilyError err = FAMILY_ERROR_NULL;
                b = NULL, n = 0;
                assert_int_equal(checkpoint_plan_slice(&src, "m", &l.parameters[0],
                                                       &l.ranks[3].slices[0], shape_of, &c, &b,
                                                       &n, &err), 0);
                assert_int_equal(n, 4);
                assert_string_equal(b[0].tensor, "m.experts.2.w1.weight");
                assert_string_equal(b[1].tensor, "m.experts.2.w3.weight");
                assert_string_equal(b[3].tensor, "m.experts.3.w3.weight");
                assert_int_equal(b[1].src_axis[2], 0);
                assert_int_equal(b[1].src_offset[0], 2);
                assert_int_equal(b[1].src_extent[0], 2);
                assert_int_equal(b[1].src_offset[1], 0);
                assert_int_equal(b[1].src_extent[1], XH);
                assert_int_equal(b[1].dst_offset[0], 0);
                assert_int_equal(b[1].dst_offset[2], 2);
                assert_int_equal(b[3].dst_offset[0], 1);
                checkpoint_blocks_free(b, n);
                /* a hand-made slice of every expert and column: each expert's two groups */
                int64_t o[3] = { 0, 0, 0 }, ls[3] = { XE, XH, 2 * XI };
                ShardSlice s = { .local_shape = ls, .global_offset = o, .n_dims = 3 };
                assert_int_equal(check_oracle(&c, &src, "m", &l.parameters[0], &s, 2), XE * 4);
        }
}

/* Each part must split into g equal pieces. */
static void test_concat_sharded_refusal(void **state) {
        CheckpointSource src = qkv_source();
        struct {
                int64_t q, kv, tp;
                const char *message;
        } cases[] = {
                /* 8 + 6 + 6 = 20 rows over tp=4: 5 each, but k's 6 do not split in 4 */
                { 8, 6, 4, "parameter 'qkv': checkpoint tensor 'a.k_proj.weight' has 6 along the "
                           "concatenated dimension 0, which the mesh shards into 4 pieces; each "
                           "part must split evenly into them" },
                /* q's 7 do not split in 2 */
                { 7, 4, 2, "parameter 'qkv': checkpoint tensor 'a.q_proj.weight' has 7 along the "
                           "concatenated dimension 0, which the mesh shards into 2 pieces; each "
                           "part must split evenly into them" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                Checkpoint c = qkv_checkpoint(cases[i].q, cases[i].kv);
                _cleanup_(layout_done) Layout l = {};
                const Placement pl[] = { SHARD("tp", 0) };
                char mesh[32];
                int64_t rows = cases[i].q + 2 * cases[i].kv;
                (void) snprintf(mesh, sizeof mesh, "tp=%" PRId64, cases[i].tp);
                layout_make(mesh, "qkv", (int64_t[]) { rows, 3 }, 2, pl, 1, &l);
                /* every rank refuses, whether or not its rows touch the part */
                for (size_t k = 0; k < l.n_ranks; k++) {
                        CheckpointBlock *b = NULL;
                        size_t n = 0;
                        FamilyError err = FAMILY_ERROR_NULL;
                        assert_int_equal(checkpoint_plan_slice(&src, "a", &l.parameters[0],
                                                               &l.ranks[k].slices[0], shape_of,
                                                               &c, &b, &n, &err), -EINVAL);
                        assert_int_equal(err.status, FAMILY_STATUS_FAILED_PRECONDITION);
                        assert_string_equal(err.reason, "CHECKPOINT_SHAPE");
                        assert_string_equal(err.message, cases[i].message);
                        assert_int_equal(n, 0);
                        family_error_done(&err);
                        checkpoint_blocks_free(b, n);
                }
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_gate_up),
                cmocka_unit_test(test_down_transposed),
                cmocka_unit_test(test_plain),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_concat_sharded_tp2),
                cmocka_unit_test(test_concat_sharded_tp4),
                cmocka_unit_test(test_concat_sharded_nested),
                cmocka_unit_test(test_concat_unsharded),
                cmocka_unit_test(test_concat_sharded_ranges),
                cmocka_unit_test(test_concat_sharded_stack_transpose),
                cmocka_unit_test(test_concat_sharded_refusal),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
