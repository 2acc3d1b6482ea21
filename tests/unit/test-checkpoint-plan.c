/* test-checkpoint-plan.c: core/checkpoint-plan.c: the boxes that fill a slice, executed here by
 * a naive reader and compared with the parameter assembled directly from its tensors. */
#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/checkpoint-plan.h"

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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_gate_up),
                cmocka_unit_test(test_down_transposed),
                cmocka_unit_test(test_plain),
                cmocka_unit_test(test_refusals),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
