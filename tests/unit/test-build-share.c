/* test-build-share.c: build/build-share.c over a real Builder: one build per request, its
 * references, releases and pins, the shards filled (build.c), a process's exit (build-watch.c). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "build/build-holders-keep.h"
#include "codec/codec-registry-digest.h"

static const char registry_yaml[] =
        "families:\n"
        "  - name: lin\n"
        "    baseline: pkg.Lin\n"
        "    default_variant: v\n"
        "    variants:\n"
        "      v: {constructor: pkg.LinV, accepts: [config]}\n"
        "    parameters:\n"
        "      w: {shape: [n, n], init: {constant: {value: 3}}}\n";

typedef struct Fixture {
        char dir[64];
        Manager *manager;
        ShardTable *shards;
        Builder builder;
} Fixture;

static int setup(void **state) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        Fixture *f = calloc(1, sizeof *f);
        char path[128];
        FILE *file;

        assert_non_null(f);
        snprintf(f->dir, sizeof f->dir, "/tmp/test-build-share-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(path, sizeof path, "%s/lin.yaml", f->dir);
        file = fopen(path, "we");
        assert_non_null(file);
        assert_true(fputs(registry_yaml, file) >= 0);
        assert_int_equal(fclose(file), 0);
        ManagerParams params = { .registry_path = f->dir, .node_name = "n0", .node_rank = -1,
                                 .address = "", .host_devices = 1,
                                 .shm_budget_bytes = 1u << 20, .max_builds = 8,
                                 .boot_tag = 0xabcd,
                                 .registry_digest = codec_registry_digest };
        assert_int_equal(manager_new(&params, &f->manager, &diag), 0);
        assert_int_equal(shard_table_new(64, &f->shards), 0);
        f->builder = (Builder) { .manager = f->manager, .shards = f->shards };
        assert_int_equal(build_sharing_start(&f->builder, 0), 0); /* grace 0: freed at once */
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char path[128];

        build_sharing_stop(&f->builder);
        build_fill_stop(&f->builder);
        shard_table_unref(f->shards);
        manager_free(f->manager);
        snprintf(path, sizeof path, "%s/lin.yaml", f->dir);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(f->dir), 0);
        free(f);
        return 0;
}

/* What a waiter was answered. */
typedef struct Answer {
        bool done, shared;
        char id[BUILD_TABLE_ID_MAX];
        char token[SHARD_TOKEN_LENGTH + 1];
        char reason[64];
} Answer;

static void answered(void *userdata, BuildRecord *rec, bool shared, FamilyError *error) {
        Answer *a = userdata;

        assert_false(a->done); /* exactly once */
        a->done = true;
        a->shared = shared;
        if (!rec) {
                snprintf(a->reason, sizeof a->reason, "%s", strempty(error->reason));
                return;
        }
        const BuildState *b = rec->payload;
        snprintf(a->id, sizeof a->id, "%s", rec->id);
        assert_int_equal(b->n_ranks, 1);
        snprintf(a->token, sizeof a->token, "%s", b->ranks[0].token.hex);
}

static bool never(void *userdata) {
        (void) userdata;
        return false;
}

/* A waiter for process pid (this one, or a child), answered into a. */
static BuildWaiter waiter_of(pid_t pid, Answer *a) {
        FamilyError e = FAMILY_ERROR_NULL;
        BuildWaiter w = { .expired = never, .done = answered, .userdata = a };

        *a = (Answer) {};
        assert_int_equal(build_caller_identify(pid, getuid(), -1, &w.caller, &w.pidfd, &e), 0);
        return w;
}

static BuildRequest request(int64_t n, bool private_build) {
        BuildRequest r = { .family = (char *) "lin", .has_config = true,
                           .materialize = { .enabled = true }, .private_build = private_build };
        Value v = { .kind = VALUE_INT, .i = n };

        assert_int_equal(value_map_put(&r.config, "n", &v), 0);
        return r;
}

/* A Build by pid: answered at once (a live build), joined (one in flight), or a new draft,
 * which is run here. */
static int share(Fixture *f, const BuildRequest *req, pid_t pid, Answer *a, BuildDraft **ret) {
        BuildWaiter w = waiter_of(pid, a);
        FamilyError e = FAMILY_ERROR_NULL;
        BuildDraft *d = NULL;
        int r = build_draft_share(&f->builder, req, "/run/familyd/shard.sock", &w, &d, &e);

        if (r < 0)
                fail_msg("build_draft_share: %d %s", r, strempty(e.message));
        assert_int_equal(r == BUILD_SHARE_NEW, d != NULL);
        *ret = d;
        return r;
}

/* The shard behind token holds n x n float32 threes (the init). */
static void expect_filled(Fixture *f, const char *token, int64_t n) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        size_t size = (size_t) (n * n) * sizeof(float);
        _cleanup_close_ int fd = -1;
        float *v;

        assert_int_equal(shard_table_lookup(f->shards, token, &s), 0);
        assert_true(shard_segment_size(s) >= size);
        /* A segment on huge pages (when the host has some reserved) maps by whole pages. */
        uint64_t page = shard_segment_huge_page_size(s);
        size_t map_size = page > 0 ? (size_t) ((size + page - 1) / page * page) : size;
        assert_int_equal(shard_segment_open(s, false, &fd), 0);
        v = mmap(NULL, map_size, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(v != MAP_FAILED);
        for (int64_t i = 0; i < n * n; i++)
                assert_true(v[i] == 3.0f);
        assert_int_equal(munmap(v, map_size), 0);
}

static void release(Fixture *f, const char *id, bool expect_freed) {
        BuildCaller self = {};
        FamilyError e = FAMILY_ERROR_NULL;
        BuildActor actor = { .uid = getuid() };
        bool freed = !expect_freed;
        int pidfd = -1;

        assert_int_equal(build_caller_identify(getpid(), getuid(), -1, &self, &pidfd, &e), 0);
        safe_close(pidfd);
        assert_int_equal(build_release_held(&f->builder, id, &self, &actor, false, &freed, &e),
                         0);
        assert_int_equal(freed, expect_freed);
}

static void test_one_build_per_request(void **state) {
        Fixture *f = *state;
        BuildRequest req = request(4, false), other = request(5, false);
        Answer a1, a2, a3, a4;
        BuildDraft *d = NULL, *d2 = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        bool freed = false;

        /* The first makes the build; the second, while it is in flight, joins it. */
        assert_int_equal(share(f, &req, getpid(), &a1, &d), BUILD_SHARE_NEW);
        assert_int_equal(share(f, &req, getpid(), &a2, &d2), BUILD_SHARE_JOINED);
        assert_false(a1.done || a2.done);
        build_draft_run(d, never, NULL);
        assert_true(a1.done && a2.done);
        assert_false(a1.shared);
        assert_true(a2.shared);
        assert_string_equal(a1.id, a2.id);
        assert_string_equal(a1.token, a2.token);
        assert_int_equal(build_table_count(f->manager->builds), 1);
        expect_filled(f, a1.token, 4);

        /* Once it lives, the same request is answered at once; another one is another build. */
        assert_int_equal(share(f, &req, getpid(), &a3, &d2), BUILD_SHARE_ANSWERED);
        assert_true(a3.done && a3.shared);
        assert_string_equal(a3.id, a1.id);
        assert_int_equal(share(f, &other, getpid(), &a4, &d), BUILD_SHARE_NEW);
        build_draft_run(d, never, NULL);
        assert_true(a4.done);
        assert_false(a4.shared);
        assert_string_not_equal(a4.id, a1.id);
        expect_filled(f, a4.token, 5);

        BuildCounters c = {};
        build_counters(&f->builder, &c);
        assert_int_equal(c.fills_started, 2);
        /* Each shard whole: 4 x 4 floats, and 5 x 5 up to LAYOUT_MIN_ALIGN. */
        assert_int_equal(c.bytes_filled, 4 * 4 * sizeof(float) + 2 * LAYOUT_MIN_ALIGN);

        /* Three answers, three references: the third release frees it (grace 0). */
        release(f, a1.id, false);
        release(f, a1.id, false);
        assert_int_equal(build_table_count(f->manager->builds), 2);
        release(f, a1.id, true);
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
        release(f, a4.id, true);
        value_map_done(&req.config);
        value_map_done(&other.config);
}

/* A private Build is never shared, nor found by another. */
static void test_private_builds(void **state) {
        Fixture *f = *state;
        BuildRequest req = request(3, true);
        Answer a1, a2;
        BuildDraft *d = NULL;

        assert_int_equal(share(f, &req, getpid(), &a1, &d), BUILD_SHARE_NEW);
        build_draft_run(d, never, NULL);
        assert_int_equal(share(f, &req, getpid(), &a2, &d), BUILD_SHARE_NEW);
        build_draft_run(d, never, NULL);
        assert_false(a1.shared || a2.shared);
        assert_string_not_equal(a1.id, a2.id);
        assert_int_equal(build_table_count(f->manager->builds), 2);
        release(f, a1.id, true);
        release(f, a2.id, true);
        value_map_done(&req.config);
}

/* A pinned build outlives its last holder; unpinned, nothing holds it. */
static void test_pin(void **state) {
        Fixture *f = *state;
        BuildRequest req = request(2, false);
        BuildActor actor = { .uid = getuid() };
        FamilyError e = FAMILY_ERROR_NULL;
        BuildRecord *rec = NULL;
        BuildDraft *d = NULL;
        Answer a;

        assert_int_equal(share(f, &req, getpid(), &a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, never, NULL);
        assert_int_equal(build_pin(&f->builder, a.id, &actor, true, &rec, &e), 0);
        build_record_unref(rec);
        release(f, a.id, false); /* pinned: stays */
        assert_int_equal(build_table_count(f->manager->builds), 1);
        assert_int_equal(build_pin(&f->builder, a.id, &actor, false, &rec, &e), 0);
        build_record_unref(rec);
        /* Unheld and unpinned, with grace 0 it is freed at the watcher's next expiry. */
        for (int i = 0; i < 200 && build_table_count(f->manager->builds) > 0; i++) {
                (void) build_sharing_expire(&f->builder);
                nanosleep(&(struct timespec) { .tv_nsec = 10000000 }, NULL);
        }
        assert_int_equal(build_table_count(f->manager->builds), 0);
        value_map_done(&req.config);
}

/* A holder's process exits: the watcher drops its reference, and the build goes (grace 0). */
static void test_holder_exits(void **state) {
        Fixture *f = *state;
        BuildRequest req = request(2, false);
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
        assert_int_equal(share(f, &req, child, &a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, never, NULL);
        assert_true(a.done);
        assert_int_equal(build_table_count(f->manager->builds), 1);

        safe_close(pipe_fds[1]);
        assert_int_equal(waitpid(child, NULL, 0), child);
        for (int i = 0; i < 500 && build_table_count(f->manager->builds) > 0; i++)
                nanosleep(&(struct timespec) { .tv_nsec = 10000000 }, NULL);
        assert_int_equal(build_table_count(f->manager->builds), 0);
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
