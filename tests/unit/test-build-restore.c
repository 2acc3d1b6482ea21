/* test-build-restore.c: build/build-restore.c and build-holders-keep.c: builds and what holds
 * them, kept in a state dir by one Builder and taken back by the next, as across a restart. */
#include <dirent.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <linux/magic.h>

#include "builder-fixture.h"

typedef struct Fixture {
        BuilderFixture b;
        char state_dir[64];
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);
        struct statfs sf;

        assert_non_null(f);
        builder_fixture_registry_make(&f->b);
        /* --state-dir takes a tmpfs only. */
        assert_int_equal(statfs("/dev/shm", &sf), 0);
        assert_int_equal((unsigned long) sf.f_type, TMPFS_MAGIC);
        snprintf(f->state_dir, sizeof f->state_dir, "/dev/shm/test-build-restore-XXXXXX");
        assert_non_null(mkdtemp(f->state_dir));
        *state = f;
        return 0;
}

/* How many entries the state dir holds (besides . and ..). */
static size_t state_files(const Fixture *f) {
        DIR *d = opendir(f->state_dir);
        struct dirent *de;
        size_t n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                n += !streq(de->d_name, ".") && !streq(de->d_name, "..");
        closedir(d);
        return n;
}

static int teardown(void **state) {
        Fixture *f = *state;
        DIR *d = opendir(f->state_dir);
        struct dirent *de;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        (void) unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        assert_int_equal(rmdir(f->state_dir), 0);
        builder_fixture_registry_remove(&f->b);
        free(f);
        return 0;
}

/* A build held by this process survives the restart: same id, token and bytes, still held by
 * us (our release frees it), and found again by its sharing key. */
static void test_build_and_holder_come_back(void **state) {
        Fixture *f = *state;
        BuildRequest req = builder_fixture_request(4, false);
        BuildDraft *d = NULL;
        Answer a, again;

        builder_fixture_start(&f->b, f->state_dir, 0);
        builder_fixture_build(&f->b, 4, getpid(), &a);
        builder_fixture_stop(&f->b);
        assert_true(state_files(f) >= 3); /* shard, record, holders' record (and the lock) */

        builder_fixture_start(&f->b, f->state_dir, 0);
        (void) build_sharing_expire(&f->b.builder); /* held by us: nothing to free */
        assert_int_equal(build_table_count(f->b.manager->builds), 1);
        builder_fixture_expect_filled(&f->b, a.token, 4);
        /* The same request finds it: its key came back with it. */
        assert_int_equal(builder_fixture_share(&f->b, &req, getpid(), &again, &d),
                         BUILD_SHARE_ANSWERED);
        assert_string_equal(again.id, a.id);
        assert_string_equal(again.token, a.token);
        /* Two references now (the kept one and this one): the second release frees it
         * (grace 0; with none, a build unheld at the start would have gone then). */
        builder_fixture_release(&f->b, a.id, false);
        builder_fixture_release(&f->b, a.id, true);
        assert_int_equal(build_table_count(f->b.manager->builds), 0);
        builder_fixture_stop(&f->b);
        value_map_done(&req.config);

        /* Nothing of it is left to restore. */
        builder_fixture_start(&f->b, f->state_dir, 0);
        assert_int_equal(build_table_count(f->b.manager->builds), 0);
        builder_fixture_stop(&f->b);
}

/* A holder that exited while no daemon ran is dropped at the start: its build, held by
 * nobody, waits its grace period like any other (0: freed at once). */
static void test_holder_gone_across_the_restart(void **state) {
        Fixture *f = *state;
        int pipe_fds[2];
        pid_t child;
        Answer a;

        assert_int_equal(pipe2(pipe_fds, O_CLOEXEC), 0);
        child = fork();
        assert_true(child >= 0);
        if (child == 0) {
                char c;
                (void) close(pipe_fds[1]);
                (void) read(pipe_fds[0], &c, 1);
                _exit(0);
        }
        safe_close(pipe_fds[0]);

        builder_fixture_start(&f->b, f->state_dir, 0);
        builder_fixture_build(&f->b, 3, child, &a);
        builder_fixture_stop(&f->b);
        safe_close(pipe_fds[1]);
        assert_int_equal(waitpid(child, NULL, 0), child);

        builder_fixture_start(&f->b, f->state_dir, 0);
        builder_fixture_wait_count(&f->b, 0);
        builder_fixture_stop(&f->b);
        /* Freed: its record and shard went too. */
        builder_fixture_start(&f->b, f->state_dir, 60000);
        assert_int_equal(build_table_count(f->b.manager->builds), 0);
        builder_fixture_stop(&f->b);
}

/* A pinned build with no holder is kept across the restart whatever the grace. */
static void test_pinned_build_stays(void **state) {
        Fixture *f = *state;
        BuildActor actor = { .uid = getuid() };
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *rec = NULL;
        Answer a;

        builder_fixture_start(&f->b, f->state_dir, 0);
        builder_fixture_build(&f->b, 2, getpid(), &a);
        assert_int_equal(build_pin(&f->b.builder, a.id, &actor, true, &rec, &e), 0);
        build_record_unref(rec);
        builder_fixture_release(&f->b, a.id, false);
        builder_fixture_stop(&f->b);

        builder_fixture_start(&f->b, f->state_dir, 0);
        (void) build_sharing_expire(&f->b.builder); /* pinned: nothing to free */
        assert_int_equal(build_table_count(f->b.manager->builds), 1);
        builder_fixture_expect_filled(&f->b, a.token, 2);
        assert_int_equal(build_pin(&f->b.builder, a.id, &actor, false, &rec, &e), 0);
        build_record_unref(rec);
        builder_fixture_wait_count(&f->b, 0); /* unpinned, unheld: grace 0 */
        builder_fixture_stop(&f->b);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_build_and_holder_come_back, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_holder_gone_across_the_restart, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_pinned_build_stays, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
