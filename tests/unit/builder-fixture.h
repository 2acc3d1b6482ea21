/* builder-fixture.h: a Builder in-process, as the daemon starts one, for the tests of build/. */
#pragma once

/*
 * A registry of one family ("lin": w of shape [n, n], every value 3), a Manager over it with
 * one host device on node "n0", a shard table, optionally a State in a state dir, and the
 * start the shell makes: the kept builds restored, then sharing started (the watcher thread,
 * the fill pool; holders put back). Stopping it as the daemon stops leaves the state dir as a
 * daemon's exit leaves it. Waiters are this process or a child, answered into an Answer.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "build/build-holders-keep.h"
#include "codec/codec-registry-digest.h"

static const char builder_fixture_registry[] =
        "families:\n"
        "  - name: lin\n"
        "    baseline: pkg.Lin\n"
        "    default_variant: v\n"
        "    variants:\n"
        "      v: {constructor: pkg.LinV, accepts: [config]}\n"
        "    parameters:\n"
        "      w: {shape: [n, n], init: {constant: {value: 3}}}\n";

typedef struct BuilderFixture {
        char registry_dir[64];
        Manager *manager;
        ShardTable *shards;
        State *state;
        CheckpointDeposits *deposits; /* the test's, or NULL: Builds from checkpoints find none */
        Builder builder;
} BuilderFixture;

/* The registry's folder (once per fixture, kept across its restarts). */
static inline void builder_fixture_registry_make(BuilderFixture *f) {
        char path[128];
        FILE *file;

        snprintf(f->registry_dir, sizeof f->registry_dir, "/tmp/test-builder-XXXXXX");
        assert_non_null(mkdtemp(f->registry_dir));
        snprintf(path, sizeof path, "%s/lin.yaml", f->registry_dir);
        file = fopen(path, "we");
        assert_non_null(file);
        assert_true(fputs(builder_fixture_registry, file) >= 0);
        assert_int_equal(fclose(file), 0);
}

static inline void builder_fixture_registry_remove(BuilderFixture *f) {
        char path[128];

        snprintf(path, sizeof path, "%s/lin.yaml", f->registry_dir);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(f->registry_dir), 0);
}

/* A daemon's start: state_dir NULL keeps nothing; grace_ms as --build-grace-ms. */
static inline void builder_fixture_start(BuilderFixture *f, const char *state_dir,
                                         uint64_t grace_ms) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        ManagerParams params = { .registry_path = f->registry_dir, .node_name = "n0",
                                 .node_rank = -1, .address = "", .host_devices = 1,
                                 .shm_budget_bytes = 64u << 20, .max_builds = 8,
                                 .boot_tag = 0xabcd,
                                 .registry_digest = codec_registry_digest };

        assert_int_equal(manager_new(&params, &f->manager, &diag), 0);
        assert_int_equal(shard_table_new(64, &f->shards), 0);
        f->state = NULL;
        if (state_dir)
                assert_int_equal(state_new(&(StateParams) { .state_dir = state_dir }, &f->state),
                                 0);
        f->builder = (Builder) { .manager = f->manager, .shards = f->shards, .state = f->state,
                                 .deposits = f->deposits };
        assert_int_equal(build_restore(&f->builder), 0);
        assert_int_equal(build_sharing_start(&f->builder, grace_ms), 0);
}

/* A daemon's stop: what is kept stays kept. */
static inline void builder_fixture_stop(BuilderFixture *f) {
        build_sharing_stop(&f->builder);
        build_fill_stop(&f->builder);
        f->manager = manager_free(f->manager);
        f->shards = shard_table_unref(f->shards);
        f->state = state_free(f->state);
}

/* What a waiter was answered. */
typedef struct Answer {
        bool done, shared;
        char id[BUILD_TABLE_ID_MAX];
        char token[SHARD_TOKEN_LENGTH + 1];
        char reason[64];
} Answer;

static inline void builder_fixture_answered(void *userdata, BuildRecord *rec, bool shared,
                                            FamilyError *error) {
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

static inline bool builder_fixture_never(void *userdata) {
        (void) userdata;
        return false;
}

/* A Build of lin with config n (private or not). */
static inline BuildRequest builder_fixture_request(int64_t n, bool private_build) {
        BuildRequest r = { .family = (char *) "lin", .has_config = true,
                           .materialize = { .enabled = true }, .private_build = private_build };
        Value v = { .kind = VALUE_INT, .i = n };

        assert_int_equal(value_map_put(&r.config, "n", &v), 0);
        return r;
}

/* A Build by process pid (this one, or a child), answered into a: at once (a live build),
 * joined (one in flight), or a new draft in *ret, for the caller to run. */
static inline int builder_fixture_share(BuilderFixture *f, const BuildRequest *req, pid_t pid,
                                        Answer *a, BuildDraft **ret) {
        BuildWaiter w = { .expired = builder_fixture_never, .done = builder_fixture_answered,
                          .userdata = a };
        FamilyError e = FAMILY_ERROR_NULL;
        BuildDraft *d = NULL;
        int r;

        *a = (Answer) {};
        assert_int_equal(build_caller_identify(pid, getuid(), -1, &w.caller, &w.pidfd, &e), 0);
        r = build_draft_share(&f->builder, req, "/run/familyd/shard.sock", &w, &d, &e);
        if (r < 0)
                fail_msg("build_draft_share: %d %s", r, strempty(e.message));
        assert_int_equal(r == BUILD_SHARE_NEW, d != NULL);
        *ret = d;
        return r;
}

/* A new build of lin with config n by pid, made and answered. */
static inline void builder_fixture_build(BuilderFixture *f, int64_t n, pid_t pid, Answer *a) {
        BuildRequest req = builder_fixture_request(n, false);
        BuildDraft *d = NULL;

        assert_int_equal(builder_fixture_share(f, &req, pid, a, &d), BUILD_SHARE_NEW);
        build_draft_run(d, builder_fixture_never, NULL);
        assert_true(a->done);
        assert_true(a->id[0] != 0);
        value_map_done(&req.config);
}

/* The first count float32 values of the shard behind token, into ret. */
static inline void builder_fixture_read_shard(BuilderFixture *f, const char *token, size_t count,
                                              float *ret) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        size_t size = count * sizeof(float);
        _cleanup_close_ int fd = -1;
        void *v;

        assert_int_equal(shard_table_lookup(f->shards, token, &s), 0);
        assert_true(shard_segment_size(s) >= size);
        /* A segment on huge pages (when the host has some reserved) maps by whole pages. */
        uint64_t page = shard_segment_huge_page_size(s);
        size_t map_size = page > 0 ? (size_t) ((size + page - 1) / page * page) : size;
        assert_int_equal(shard_segment_open(s, false, &fd), 0);
        v = mmap(NULL, map_size, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(v != MAP_FAILED);
        memcpy(ret, v, size);
        assert_int_equal(munmap(v, map_size), 0);
}

/* The shard behind token holds n x n float32 threes (the init). */
static inline void builder_fixture_expect_filled(BuilderFixture *f, const char *token,
                                                 int64_t n) {
        float v[64];

        assert_true(n * n <= 64);
        builder_fixture_read_shard(f, token, (size_t) (n * n), v);
        for (int64_t i = 0; i < n * n; i++)
                assert_true(v[i] == 3.0f);
}

/* This process's reference to build id goes; freed: whether that freed it. */
static inline void builder_fixture_release(BuilderFixture *f, const char *id,
                                           bool expect_freed) {
        BuildCaller self = {};
        FamilyError e = FAMILY_ERROR_NULL;
        BuildActor actor = { .uid = getuid() };
        bool freed = !expect_freed;
        int pidfd = -1;

        assert_int_equal(build_caller_identify(getpid(), getuid(), -1, &self, &pidfd, &e), 0);
        safe_close(pidfd);
        if (build_release_held(&f->builder, id, &self, &actor, false, &freed, &e) < 0)
                fail_msg("build_release_held(%s): %s", id, strempty(e.message));
        assert_int_equal(freed, expect_freed);
}

/* The build table comes to hold n builds within 5 s (the watcher frees builds whose grace
 * ended on its own thread). */
static inline void builder_fixture_wait_count(BuilderFixture *f, unsigned n) {
        for (int i = 0; i < 500 && build_table_count(f->manager->builds) != n; i++)
                nanosleep(&(struct timespec) { .tv_nsec = 10000000 }, NULL);
        assert_int_equal(build_table_count(f->manager->builds), n);
}
