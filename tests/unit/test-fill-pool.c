/* test-fill-pool.c: the fill pool: same bytes as per-call threads, fair, cancellable, bound. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/fill.h"
#include "core/fill-pool.h"

static unsigned threads_of_process(void) {
        DIR *d = opendir("/proc/self/task");
        unsigned n = 0;

        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));)
                n += e->d_name[0] != '.';
        closedir(d);
        return n;
}

/* A whole tensor through the pool equals the same through threads started per call. */
static void test_pool_same_bytes(void **state) {
        const int64_t shape[2] = { 300, 1001 }; /* several chunks */
        const int64_t halves[2][2] = { { 150, 1001 }, { 150, 1001 } };
        const int64_t offsets[2][2] = { { 0, 0 }, { 150, 0 } };
        size_t n = 300 * 1001;
        FillPool *pool = NULL;

        assert_int_equal(fill_pool_new(3, NULL, 0, &pool), 0);
        assert_int_equal(fill_pool_threads(pool), 3);
        assert_int_equal(fill_pool_groups(pool), 0);
        for (InitKind kind = INIT_NORMAL; kind <= INIT_UNIFORM; kind++)
                for (Dtype d = 0; d < _DTYPE_MAX; d++) {
                        FillSpec spec;
                        size_t size = dtype_size(d);
                        uint8_t *a = malloc(n * size), *b = malloc(n * size);
                        assert_non_null(a);
                        assert_non_null(b);
                        assert_int_equal(fill_spec_init(&spec, kind, 0.0, 1.0, 77, "w", d), 0);
                        FillSlice s[2];
                        for (size_t k = 0; k < 2; k++)
                                s[k] = (FillSlice) { .spec = &spec, .rank = 2, .shape = shape,
                                                     .local_shape = halves[k],
                                                     .global_offset = offsets[k],
                                                     .dst = a + k * (n / 2) * size };
                        assert_int_equal(fill_run(s, 2, 0), 0);
                        fill_context_bind(&(FillContext) { .pool = pool, .group = -1 });
                        for (size_t k = 0; k < 2; k++)
                                s[k].dst = b + k * (n / 2) * size;
                        memset(b, 0x5a, n * size);
                        assert_int_equal(fill_run(s, 2, 0), 0);
                        fill_context_bind(NULL);
                        assert_memory_equal(a, b, n * size);
                        free(a);
                        free(b);
                }
        fill_pool_free(pool);
}

/* ---- fairness and cancelling on the pool itself, with chunks that take a known time ---- */

typedef struct Trace {
        pthread_mutex_t lock;
        char order[256];
        size_t n;
} Trace;

typedef struct Job {
        Trace *trace;
        char tag;
        unsigned sleep_us;
        _Atomic unsigned started;
        _Atomic int cpu; /* the last CPU a chunk ran on */
        /* cancelling: cancelled() says so once this many chunks started */
        unsigned cancel_after;
        _Atomic unsigned started_at_cancel;
        _Atomic bool said;
} Job;

static void job_run(void *userdata, uint64_t chunk) {
        Job *j = userdata;

        j->started++;
        j->cpu = sched_getcpu();
        if (j->trace) {
                pthread_mutex_lock(&j->trace->lock);
                if (j->trace->n < sizeof j->trace->order - 1)
                        j->trace->order[j->trace->n++] = j->tag;
                pthread_mutex_unlock(&j->trace->lock);
        }
        (void) usleep(j->sleep_us);
}

static void *run_thread(void *userdata) {
        FillPool **pool = ((void **) userdata)[0];
        FillPoolWork *w = ((void **) userdata)[1];
        intptr_t r = fill_pool_run(*pool, w, NULL, NULL);
        return (void *) r;
}

/* One thread, two fills: the second, started while the first runs, is served in turn, one chunk
 * each, and finishes long before the first. */
static void test_pool_round_robin(void **state) {
        Trace trace = { .lock = PTHREAD_MUTEX_INITIALIZER };
        Job a = { .trace = &trace, .tag = 'a', .sleep_us = 2000 };
        Job b = { .trace = &trace, .tag = 'b', .sleep_us = 2000 };
        FillPoolWork wa = { .run = job_run, .userdata = &a, .n_chunks = 60, .group = -1 };
        FillPoolWork wb = { .run = job_run, .userdata = &b, .n_chunks = 10, .group = -1 };
        FillPool *pool = NULL;
        pthread_t ta, tb;
        void *args_a[2] = { &pool, &wa }, *args_b[2] = { &pool, &wb }, *ret;

        assert_int_equal(fill_pool_new(1, NULL, 0, &pool), 0);
        assert_int_equal(pthread_create(&ta, NULL, run_thread, args_a), 0);
        while (a.started < 3)
                (void) usleep(500);
        assert_int_equal(pthread_create(&tb, NULL, run_thread, args_b), 0);
        assert_int_equal(pthread_join(tb, &ret), 0);
        assert_int_equal((intptr_t) ret, 0);
        assert_int_equal(b.started, 10);
        assert_true(a.started < 40); /* b did not wait for a */
        assert_int_equal(pthread_join(ta, &ret), 0);
        assert_int_equal((intptr_t) ret, 0);
        assert_int_equal(a.started, 60);

        /* From b's first chunk to its last, the one thread alternated. */
        const char *first = strchr(trace.order, 'b'), *last = strrchr(trace.order, 'b');
        for (const char *p = first; p < last; p++)
                assert_true(p[0] != p[1]);
        fill_pool_free(pool);
}

static pthread_t caller_thread;
static _Atomic unsigned on_caller;

static void job_run_where(void *userdata, uint64_t chunk) {
        on_caller += pthread_equal(pthread_self(), caller_thread) != 0;
        job_run(userdata, chunk);
}

/* caller_runs: the calling thread fills chunks of its own job, so a busy pool never stalls it. */
static void test_pool_caller_runs(void **state) {
        Job a = { .sleep_us = 2000 }, b = { .sleep_us = 1000 };
        FillPoolWork wa = { .run = job_run, .userdata = &a, .n_chunks = 300, .group = -1 };
        FillPoolWork wb = { .run = job_run_where, .userdata = &b, .n_chunks = 20, .group = -1,
                            .caller_runs = true };
        FillPool *pool = NULL;
        pthread_t ta;
        void *args_a[2] = { &pool, &wa }, *ret;

        assert_int_equal(fill_pool_new(1, NULL, 0, &pool), 0);
        assert_int_equal(pthread_create(&ta, NULL, run_thread, args_a), 0);
        while (a.started < 2)
                (void) usleep(500);
        caller_thread = pthread_self();
        on_caller = 0;
        assert_int_equal(fill_pool_run(pool, &wb, NULL, NULL), 0);
        assert_int_equal(b.started, 20);
        /* The one pool thread alternates between a and b; the caller ran the rest of b. */
        assert_true(on_caller >= 10);
        assert_true(a.started < 300);
        assert_int_equal(pthread_join(ta, &ret), 0);
        assert_int_equal((intptr_t) ret, 0);
        fill_pool_free(pool);
}

static bool job_cancelled(void *userdata) {
        Job *j = userdata;

        if (j->started < j->cancel_after)
                return false;
        if (!j->said) {
                j->started_at_cancel = j->started;
                j->said = true;
        }
        return true;
}

/* Cancelled: no chunk starts after the caller learnt it, but the ones running (one a thread). */
static void test_pool_cancel(void **state) {
        Job j = { .sleep_us = 3000, .cancel_after = 12 };
        FillPoolWork w = { .run = job_run, .userdata = &j, .n_chunks = 100000, .group = -1 };
        FillPool *pool = NULL;

        assert_int_equal(fill_pool_new(4, NULL, 0, &pool), 0);
        assert_int_equal(fill_pool_run(pool, &w, job_cancelled, &j), -ECANCELED);
        assert_true(j.said);
        assert_true(j.started <= j.started_at_cancel + fill_pool_threads(pool));
        assert_true(j.started < 1000);

        /* Not cancelled: every chunk; and a fill with none returns at once. */
        Job k = { .cancel_after = UINT32_MAX };
        FillPoolWork wk = { .run = job_run, .userdata = &k, .n_chunks = 500, .group = -1 };
        assert_int_equal(fill_pool_run(pool, &wk, job_cancelled, &k), 0);
        assert_int_equal(k.started, 500);
        wk.n_chunks = 0;
        assert_int_equal(fill_pool_run(pool, &wk, NULL, NULL), 0);
        assert_int_equal(fill_pool_run(NULL, &wk, NULL, NULL), -EINVAL);
        fill_pool_free(pool);
}

static bool fill_cancelled(void *userdata) {
        return *(_Atomic uint_fast64_t *) userdata > 0;
}

/* fill_run() through the pool: cancelled once it has written anything, it stops within a chunk
 * per thread (64 Ki elements each) and says -ECANCELED. */
static void test_fill_run_cancel(void **state) {
        const int64_t n = INT64_C(1) << 24; /* 256 chunks */
        float *v = malloc((size_t) n * sizeof(float));
        FillProgress progress = {};
        FillPool *pool = NULL;
        FillSpec spec;
        int64_t off = 0;

        assert_non_null(v);
        assert_int_equal(fill_spec_init(&spec, INIT_NORMAL, 0.0, 1.0, 1, "w", DTYPE_FLOAT32), 0);
        FillSlice s = { .spec = &spec, .rank = 1, .shape = &n, .local_shape = &n,
                        .global_offset = &off, .dst = v };
        assert_int_equal(fill_pool_new(2, NULL, 0, &pool), 0);
        fill_context_bind(&(FillContext) { .pool = pool, .group = -1, .progress = &progress,
                                           .cancelled = fill_cancelled,
                                           .userdata = &progress.bytes });
        assert_int_equal(fill_run(&s, 1, 0), -ECANCELED);
        /* Polled every FILL_POOL_POLL_MS: a few chunks, far from all of them. */
        assert_true(progress.bytes > 0);
        assert_true(progress.bytes < (uint64_t) n * sizeof(float) / 4);

        /* Threads per call: the calling thread asks between its chunks. */
        fill_context_bind(&(FillContext) { .group = -1, .progress = &progress,
                                           .cancelled = fill_cancelled,
                                           .userdata = &progress.bytes });
        assert_int_equal(fill_run(&s, 1, 2), -ECANCELED);
        fill_context_bind(NULL);
        assert_int_equal(fill_run(&s, 1, 0), 0);
        fill_pool_free(pool);
        free(v);
}

/* The pool's threads are started once: a thousand fills start none; freeing joins them. */
static void test_pool_threads_constant(void **state) {
        float buf[1000];
        int64_t n = 1000, off = 0;
        FillPool *pool = NULL;
        FillSpec spec;
        unsigned before = threads_of_process();

        assert_int_equal(fill_spec_init(&spec, INIT_UNIFORM, -1, 1, 3, "b", DTYPE_FLOAT32), 0);
        FillSlice s = { .spec = &spec, .rank = 1, .shape = &n, .local_shape = &n,
                        .global_offset = &off, .dst = buf };
        assert_int_equal(fill_pool_new(4, NULL, 0, &pool), 0);
        assert_int_equal(threads_of_process(), before + 4);
        fill_context_bind(&(FillContext) { .pool = pool, .group = -1 });
        for (unsigned i = 0; i < 1000; i++)
                assert_int_equal(fill_run(&s, 1, 0), 0);
        fill_context_bind(NULL);
        assert_int_equal(threads_of_process(), before + 4);
        fill_pool_free(pool);
        assert_int_equal(threads_of_process(), before);
}

/* Groups: threads bound to their CPUs, a fill of a group run by that group's threads only. */
static void test_pool_groups(void **state) {
        static const int cpus0[] = { 0 }, cpus1[] = { 1 };
        FillPoolGroup groups[2] = { { cpus0, 1 }, { cpus1, 1 } };
        FillPool *pool = NULL;

        assert_int_equal(fill_pool_new(2, groups, 2, NULL), -EINVAL);
        assert_int_equal(fill_pool_new(2, (FillPoolGroup[]) { { cpus0, 0 }, { cpus1, 1 } }, 2, &pool),
                         -EINVAL);
        assert_null(pool);
        if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
                skip();
                return;
        }
        /* 3 threads over 2 groups of one CPU: 2 and 1. */
        assert_int_equal(fill_pool_new(3, groups, 2, &pool), 0);
        assert_int_equal(fill_pool_groups(pool), 2);
        assert_int_equal(fill_pool_threads(pool), 3);
        for (int g = 0; g < 2; g++) {
                Job j = { .cpu = -1 };
                FillPoolWork w = { .run = job_run, .userdata = &j, .n_chunks = 50, .group = g };
                assert_int_equal(fill_pool_run(pool, &w, NULL, NULL), 0);
                assert_int_equal(j.started, 50);
                assert_int_equal(j.cpu, g);
        }
        fill_pool_free(pool);

        /* One group is no choice: unbound, as without NUMA. */
        assert_int_equal(fill_pool_new(2, groups, 1, &pool), 0);
        assert_int_equal(fill_pool_groups(pool), 0);
        fill_pool_free(pool);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pool_same_bytes),
                cmocka_unit_test(test_pool_round_robin),
                cmocka_unit_test(test_pool_caller_runs),
                cmocka_unit_test(test_pool_cancel),
                cmocka_unit_test(test_fill_run_cancel),
                cmocka_unit_test(test_pool_threads_constant),
                cmocka_unit_test(test_pool_groups),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
