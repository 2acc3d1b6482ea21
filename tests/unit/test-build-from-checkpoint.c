/* test-build-from-checkpoint.c: build/build-from-checkpoint.c over a real Builder: a Build's
 * values read from a deposited safetensors file, and the checkpoints that cannot fill it. */
#include <inttypes.h>
#include <sys/stat.h>

#include "builder-fixture.h"

typedef struct Fixture {
        BuilderFixture b;
        CheckpointDeposits *deposits;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);

        assert_non_null(f);
        assert_int_equal(checkpoint_deposits_new(&f->deposits), 0);
        builder_fixture_registry_make(&f->b);
        f->b.deposits = f->deposits;
        builder_fixture_start(&f->b, NULL, 0);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        builder_fixture_stop(&f->b);
        builder_fixture_registry_remove(&f->b);
        checkpoint_deposits_free(f->deposits);
        free(f);
        return 0;
}

/* A safetensors file (a memfd) of one float32 tensor name of rows x cols, element i = base + i. */
static int safetensors_file(const char *name, int64_t rows, int64_t cols, float base) {
        char header[256];
        uint64_t bytes = (uint64_t) (rows * cols) * sizeof(float), len;
        int fd = memfd_create("ckpt", MFD_CLOEXEC), n;

        assert_true(fd >= 0);
        n = snprintf(header, sizeof header,
                     "{\"%s\":{\"dtype\":\"F32\",\"shape\":[%" PRId64 ",%" PRId64 "],"
                     "\"data_offsets\":[0,%" PRIu64 "]}}",
                     name, rows, cols, bytes);
        assert_true(n > 0 && (size_t) n < sizeof header);
        len = (uint64_t) n; /* little-endian, as the hosts we run on */
        assert_int_equal(write(fd, &len, sizeof len), (ssize_t) sizeof len);
        assert_int_equal(write(fd, header, (size_t) n), n);
        for (int64_t i = 0; i < rows * cols; i++) {
                float v = base + (float) i;
                assert_int_equal(write(fd, &v, sizeof v), (ssize_t) sizeof v);
        }
        return fd;
}

/* Deposits fd (taken) as model.safetensors for this uid, as the shard socket does. */
static ShardToken deposit(Fixture *f, int fd) {
        CheckpointFiles files = { .fds = calloc(1, sizeof(int)), .names = calloc(1, sizeof(char *)),
                                  .n = 1 };
        ShardToken token;

        assert_non_null(files.fds);
        assert_non_null(files.names);
        files.fds[0] = fd;
        files.names[0] = strdup("model.safetensors");
        assert_non_null(files.names[0]);
        assert_int_equal(checkpoint_deposits_add(f->deposits, getuid(), &files, &token), 0);
        return token;
}

/* lin with n = 4, its w from the deposit token (tensors named as the parameters). */
static BuildRequest checkpoint_request(const ShardToken *token) {
        BuildRequest r = builder_fixture_request(4, false);

        r.has_checkpoint = true;
        r.checkpoint_token = (char *) token->hex;
        r.checkpoint_prefix = (char *) "";
        r.checkpoint_by_parameter = true;
        return r;
}

static void test_values_from_the_checkpoint(void **state) {
        Fixture *f = *state;
        ShardToken token = deposit(f, safetensors_file("w", 4, 4, 100));
        BuildRequest req = checkpoint_request(&token);
        BuildDraft *d = NULL;
        BuildCounters c = {};
        float v[16];
        Answer a, again;

        assert_int_equal(builder_fixture_share(&f->b, &req, getpid(), &a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_true(a.done);
        assert_true(a.id[0] != 0);
        builder_fixture_read_shard(&f->b, a.token, 16, v);
        for (int i = 0; i < 16; i++)
                assert_true(v[i] == 100.0f + (float) i);
        build_counters(&f->b.builder, &c);
        assert_int_equal(c.checkpoint_ranks, 1);
        assert_int_equal(c.checkpoint_bytes_read, 16 * sizeof(float));

        /* The same checkpoint is the same build; the inits' build of the same member is not. */
        assert_int_equal(builder_fixture_share(&f->b, &req, getpid(), &again, &d),
                         BUILD_SHARE_ANSWERED);
        assert_string_equal(again.id, a.id);
        BuildRequest inits = builder_fixture_request(4, false);
        assert_int_equal(builder_fixture_share(&f->b, &inits, getpid(), &again, &d),
                         BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_string_not_equal(again.id, a.id);
        builder_fixture_expect_filled(&f->b, again.token, 4);
        builder_fixture_release(&f->b, again.id, true);
        builder_fixture_release(&f->b, a.id, false);
        builder_fixture_release(&f->b, a.id, true);
        value_map_done(&inits.config);
        value_map_done(&req.config);
}

/* Refused before anything is reserved, the waiter not answered: the reason says why. */
static void expect_refused(Fixture *f, const BuildRequest *req, FamilyStatus status,
                           const char *reason, const char *text) {
        BuildWaiter w = { .expired = builder_fixture_never, .done = builder_fixture_answered };
        FamilyError e = FAMILY_ERROR_NULL;
        BuildDraft *d = NULL;
        Answer a = {};

        w.userdata = &a;
        assert_int_equal(build_caller_identify(getpid(), getuid(), -1, &w.caller, &w.pidfd, &e),
                         0);
        assert_true(build_draft_share(&f->b.builder, req, "/run/familyd/shard.sock", &w, &d,
                                      &e) < 0);
        assert_null(d);
        assert_false(a.done);
        assert_int_equal(e.status, status);
        assert_string_equal(e.reason, reason);
        if (!strstr(strempty(e.message), text))
                fail_msg("%s: %s", reason, strempty(e.message));
        family_error_done(&e);
        assert_int_equal(build_table_count(f->b.manager->builds), 0);
}

static void test_checkpoints_that_cannot_fill_it(void **state) {
        Fixture *f = *state;
        ShardToken wrong_shape = deposit(f, safetensors_file("w", 4, 3, 0));
        ShardToken wrong_name = deposit(f, safetensors_file("v", 4, 4, 0));
        ShardToken unknown = {};
        BuildRequest req;

        req = checkpoint_request(&wrong_shape);
        expect_refused(f, &req, FAMILY_STATUS_FAILED_PRECONDITION, "CHECKPOINT_SHAPE",
                       "parameter 'w'");
        value_map_done(&req.config);
        req = checkpoint_request(&wrong_name);
        expect_refused(f, &req, FAMILY_STATUS_NOT_FOUND, "CHECKPOINT_TENSOR_MISSING",
                       "the checkpoint has no tensor 'w'");
        value_map_done(&req.config);
        memset(unknown.hex, 'a', SHARD_TOKEN_LENGTH);
        req = checkpoint_request(&unknown);
        expect_refused(f, &req, FAMILY_STATUS_NOT_FOUND, "CHECKPOINT_TOKEN", "");
        value_map_done(&req.config);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_values_from_the_checkpoint, setup, teardown),
                cmocka_unit_test_setup_teardown(test_checkpoints_that_cannot_fill_it, setup,
                                                teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
