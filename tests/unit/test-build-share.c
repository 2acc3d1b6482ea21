/* test-build-share.c: build/build-share.c over a real Builder: one build per request, its
 * references, releases and pins, the shards filled (build.c), a process's exit (build-watch.c). */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "builder-fixture.h"

typedef BuilderFixture Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);

        assert_non_null(f);
        builder_fixture_registry_make(f);
        builder_fixture_start(f, NULL, 0); /* grace 0: freed at once */
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        builder_fixture_stop(f);
        builder_fixture_registry_remove(f);
        free(f);
        return 0;
}

static void test_one_build_per_request(void **state) {
        Fixture *f = *state;
        BuildRequest req = builder_fixture_request(4, false);
        BuildRequest other = builder_fixture_request(5, false);
        Answer a1, a2, a3, a4;
        BuildDraft *d = NULL, *d2 = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        bool freed = false;

        /* The first makes the build; the second, while it is in flight, joins it. */
        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a1, &d), BUILD_SHARE_NEW);
        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a2, &d2), BUILD_SHARE_JOINED);
        assert_false(a1.done || a2.done);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_true(a1.done && a2.done);
        assert_false(a1.shared);
        assert_true(a2.shared);
        assert_string_equal(a1.id, a2.id);
        assert_string_equal(a1.token, a2.token);
        assert_int_equal(build_table_count(f->manager->builds), 1);
        builder_fixture_expect_filled(f, a1.token, 4);

        /* Once it lives, the same request is answered at once; another one is another build. */
        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a3, &d2), BUILD_SHARE_ANSWERED);
        assert_true(a3.done && a3.shared);
        assert_string_equal(a3.id, a1.id);
        assert_int_equal(builder_fixture_share(f, &other, getpid(), &a4, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_true(a4.done);
        assert_false(a4.shared);
        assert_string_not_equal(a4.id, a1.id);
        builder_fixture_expect_filled(f, a4.token, 5);

        BuildCounters c = {};
        build_counters(&f->builder, &c);
        assert_int_equal(c.fills_started, 2);
        /* Each shard whole: 4 x 4 floats, and 5 x 5 up to LAYOUT_MIN_ALIGN. */
        assert_int_equal(c.bytes_filled, 4 * 4 * sizeof(float) + 2 * LAYOUT_MIN_ALIGN);

        /* Three answers, three references: the third release frees it (grace 0). */
        builder_fixture_release(f, a1.id, false);
        builder_fixture_release(f, a1.id, false);
        assert_int_equal(build_table_count(f->manager->builds), 2);
        builder_fixture_release(f, a1.id, true);
        assert_int_equal(build_table_count(f->manager->builds), 1);
        BuildCaller self = {};
        int pidfd = -1;
        assert_int_equal(build_caller_identify(getpid(), getuid(), -1, &self, &pidfd, &e), 0);
        safe_close(pidfd);
        assert_true(build_release_held(&f->builder, a1.id, &self, NULL, false, &freed, &e) < 0);
        assert_string_equal(e.reason, "BUILD_NOT_FOUND");
        family_error_done(&e);
        /* Its tokens went with it. */
        ShardSegment *gone = NULL;
        assert_int_equal(shard_table_lookup(f->shards, a1.token, &gone), SHARD_TABLE_NOT_FOUND);

        /* The other build: its one reference. */
        builder_fixture_release(f, a4.id, true);
        value_map_done(&req.config);
        value_map_done(&other.config);
}

/* A private Build is never shared, nor found by another. */
static void test_private_builds(void **state) {
        Fixture *f = *state;
        BuildRequest req = builder_fixture_request(3, true);
        Answer a1, a2;
        BuildDraft *d = NULL;

        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a1, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a2, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_false(a1.shared || a2.shared);
        assert_string_not_equal(a1.id, a2.id);
        assert_int_equal(build_table_count(f->manager->builds), 2);
        builder_fixture_release(f, a1.id, true);
        builder_fixture_release(f, a2.id, true);
        value_map_done(&req.config);
}

/* A pinned build outlives its last holder; unpinned, nothing holds it. */
static void test_pin(void **state) {
        Fixture *f = *state;
        BuildRequest req = builder_fixture_request(2, false);
        BuildActor actor = { .uid = getuid() };
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *rec = NULL;
        BuildDraft *d = NULL;
        Answer a;

        assert_int_equal(builder_fixture_share(f, &req, getpid(), &a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_int_equal(build_pin(&f->builder, a.id, &actor, true, &rec, &e), 0);
        build_record_unref(rec);
        builder_fixture_release(f, a.id, false); /* pinned: stays */
        assert_int_equal(build_table_count(f->manager->builds), 1);
        assert_int_equal(build_pin(&f->builder, a.id, &actor, false, &rec, &e), 0);
        build_record_unref(rec);
        /* Unheld and unpinned, with grace 0 it is freed at the watcher's next expiry. */
        builder_fixture_wait_count(f, 0);
        value_map_done(&req.config);
}

/* A holder's process exits: the watcher drops its reference, and the build goes (grace 0). */
static void test_holder_exits(void **state) {
        Fixture *f = *state;
        BuildRequest req = builder_fixture_request(2, false);
        BuildDraft *d = NULL;
        int pipe_fds[2];
        pid_t child;
        Answer a;

        assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
        child = fork();
        assert_true(child >= 0);
        if (child == 0) {
                char c;
                (void) close(pipe_fds[1]);
                (void) read(pipe_fds[0], &c, 1); /* until the test closes its end */
                _exit(0);
        }
        safe_close(pipe_fds[0]);
        assert_int_equal(builder_fixture_share(f, &req, child, &a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_true(a.done);
        assert_int_equal(build_table_count(f->manager->builds), 1);

        safe_close(pipe_fds[1]);
        assert_int_equal(waitpid(child, NULL, 0), child);
        builder_fixture_wait_count(f, 0);
        value_map_done(&req.config);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_one_build_per_request, setup, teardown),
                cmocka_unit_test_setup_teardown(test_private_builds, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pin, setup, teardown),
                cmocka_unit_test_setup_teardown(test_holder_exits, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
