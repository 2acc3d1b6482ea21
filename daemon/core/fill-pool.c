/* fill-pool.c: the fill threads, started once, and the round robin over the fills under way. */

/*
 * DESIGN
 *
 * One mutex guards the list of fills under way (jobs) and every job's counters; workers sleep
 * on one condition variable while no job has a chunk for them. A worker takes one chunk at a
 * time from the job after the one it served last (a cursor over the list), so n concurrent
 * fills each get about 1/n of the threads whatever their sizes; it runs the chunk outside the
 * lock. A chunk is 64 Ki elements (core/fill.c), hundreds of microseconds of work, so a lock per
 * chunk costs nothing measurable.
 *
 * The caller of fill_pool_run() owns its job (on its stack): it links it in, takes chunks of
 * it itself when it may (caller_runs), and otherwise waits on the job's own condition
 * variable, waking every FILL_POOL_POLL_MS; it asks its cancelled() outside the lock (that
 * callback takes other locks: a Build's waiters). Cancelling stops the hand-out; the job is
 * unlinked only once no thread runs one of its chunks, so nothing touches it after the caller
 * returns.
 *
 * Groups: a job with a group is taken only by that group's workers (bound to its CPUs); a job
 * without one by any worker. Stopping the pool: workers finish their chunk and return; callers
 * are gone by contract (the daemon stops its Build threads first).
 */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "fill-pool.h"

typedef struct PoolJob {
        const FillPoolWork *w;
        uint64_t next;    /* the next chunk to hand out */
        unsigned running; /* chunks being run now */
        bool stop;        /* cancelled: nothing more is handed out */
        pthread_cond_t idle; /* signalled when the last running chunk of a finished job ends */
        struct PoolJob *prev, *next_job;
} PoolJob;

typedef struct PoolWorker {
        FillPool *pool;
        pthread_t thread;
        int group; /* -1: unbound */
} PoolWorker;

struct FillPool {
        pthread_mutex_t lock;
        pthread_cond_t work; /* a job was added, or the pool stops */
        PoolJob *jobs;
        PoolJob *cursor; /* where the next worker starts looking: round robin */
        bool stopping;
        unsigned n_threads;
        unsigned n_started;
        size_t n_groups;
        unsigned group_threads[FILL_POOL_GROUPS_MAX];
        PoolWorker *workers;
};

static bool job_open(const PoolJob *j) {
        return !j->stop && j->next < j->w->n_chunks;
}

static bool job_for(const FillPool *p, const PoolJob *j, int group) {
        int g = j->w->group;

        if (g < 0 || (size_t) g >= p->n_groups || p->group_threads[g] == 0)
                return true;
        return g == group;
}

/* Under the lock: the first open job from the cursor on that this worker may take. */
static PoolJob *pool_pick(FillPool *p, int group) {
        PoolJob *start = p->cursor ? p->cursor : p->jobs;

        for (PoolJob *j = start; j; j = j->next_job)
                if (job_open(j) && job_for(p, j, group))
                        return j;
        for (PoolJob *j = p->jobs; j && j != start; j = j->next_job)
                if (job_open(j) && job_for(p, j, group))
                        return j;
        return NULL;
}

static void *pool_worker(void *userdata) {
        PoolWorker *me = userdata;
        FillPool *p = me->pool;

        (void) pthread_mutex_lock(&p->lock);
        while (!p->stopping) {
                PoolJob *j = pool_pick(p, me->group);
                if (!j) {
                        (void) pthread_cond_wait(&p->work, &p->lock);
                        continue;
                }
                uint64_t chunk = j->next++;
                j->running++;
                p->cursor = j->next_job; /* the next worker serves the next fill */
                (void) pthread_mutex_unlock(&p->lock);

                j->w->run(j->w->userdata, chunk);

                (void) pthread_mutex_lock(&p->lock);
                if (--j->running == 0 && !job_open(j))
                        (void) pthread_cond_signal(&j->idle);
        }
        (void) pthread_mutex_unlock(&p->lock);
        return NULL;
}

static int bind_to(pthread_t t, const FillPoolGroup *g) {
        cpu_set_t set;

        CPU_ZERO(&set);
        for (size_t i = 0; i < g->n_cpus; i++)
                if (g->cpus[i] >= 0 && g->cpus[i] < CPU_SETSIZE)
                        CPU_SET(g->cpus[i], &set);
        if (CPU_COUNT(&set) == 0)
                return -EINVAL;
        return -pthread_setaffinity_np(t, sizeof set, &set);
}

/* Threads per group, in proportion to its CPUs, at least one each. */
static void pool_split(FillPool *p, const FillPoolGroup *groups) {
        size_t total = 0;
        unsigned given = 0;

        for (size_t g = 0; g < p->n_groups; g++)
                total += groups[g].n_cpus;
        for (size_t g = 0; g < p->n_groups; g++) {
                uint64_t share = (uint64_t) p->n_threads * groups[g].n_cpus / total;
                p->group_threads[g] = (unsigned) MAX(share, (uint64_t) 1);
                given += p->group_threads[g];
        }
        /* Rounding down leaves a few: to the groups in order. */
        for (size_t g = 0; given < p->n_threads; g = (g + 1) % p->n_groups, given++)
                p->group_threads[g]++;
        p->n_threads = given;
}

static int pool_start(FillPool *p, const FillPoolGroup *groups) {
        size_t g = 0;
        unsigned in_group = 0;
        int r;

        for (unsigned i = 0; i < p->n_threads; i++) {
                PoolWorker *w = &p->workers[i];

                if (p->n_groups > 0 && in_group == p->group_threads[g]) {
                        g++;
                        in_group = 0;
                }
                *w = (PoolWorker) { .pool = p, .group = p->n_groups > 0 ? (int) g : -1 };
                r = -pthread_create(&w->thread, NULL, pool_worker, w);
                if (r < 0)
                        return r;
                p->n_started++;
                in_group++;
                if (p->n_groups > 0) {
                        r = bind_to(w->thread, &groups[g]);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

int fill_pool_new(unsigned n_threads, const FillPoolGroup *groups, size_t n_groups,
                  FillPool **ret) {
        FillPool *p;
        pthread_condattr_t attr;
        int r;

        if (n_groups > FILL_POOL_GROUPS_MAX || (n_groups > 0 && !groups) || !ret)
                return -EINVAL;
        for (size_t g = 0; g < n_groups; g++)
                if (groups[g].n_cpus == 0 || !groups[g].cpus)
                        return -EINVAL;
        if (n_threads == 0) {
                long n = sysconf(_SC_NPROCESSORS_ONLN);
                n_threads = n > 0 ? (unsigned) n : 1;
        }
        n_threads = MIN(n_threads, FILL_POOL_THREADS_MAX);

        p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        (void) pthread_mutex_init(&p->lock, NULL);
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&p->work, &attr);
        (void) pthread_condattr_destroy(&attr);
        p->n_threads = n_threads;
        /* One group is no choice: its threads run unbound, as on a machine without NUMA. */
        p->n_groups = n_groups > 1 ? n_groups : 0;
        if (p->n_groups > 0)
                pool_split(p, groups);
        p->workers = calloc(p->n_threads, sizeof(PoolWorker));
        if (!p->workers) {
                fill_pool_free(p);
                return -ENOMEM;
        }
        r = pool_start(p, groups);
        if (r < 0) {
                fill_pool_free(p);
                return r;
        }
        *ret = p;
        return 0;
}

FillPool *fill_pool_free(FillPool *p) {
        if (!p)
                return NULL;
        (void) pthread_mutex_lock(&p->lock);
        p->stopping = true;
        (void) pthread_cond_broadcast(&p->work);
        (void) pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < p->n_started; i++)
                (void) pthread_join(p->workers[i].thread, NULL);
        free(p->workers);
        (void) pthread_cond_destroy(&p->work);
        (void) pthread_mutex_destroy(&p->lock);
        return mfree(p);
}

unsigned fill_pool_threads(const FillPool *p) {
        return p ? p->n_threads : 0;
}

size_t fill_pool_groups(const FillPool *p) {
        return p ? p->n_groups : 0;
}

static void pool_link(FillPool *p, PoolJob *j) {
        PoolJob **tail = &p->jobs;

        while (*tail) {
                j->prev = *tail;
                tail = &(*tail)->next_job;
        }
        *tail = j;
}

static void pool_unlink(FillPool *p, PoolJob *j) {
        if (j->prev)
                j->prev->next_job = j->next_job;
        else
                p->jobs = j->next_job;
        if (j->next_job)
                j->next_job->prev = j->prev;
        if (p->cursor == j)
                p->cursor = j->next_job;
}

static struct timespec deadline_after_ms(unsigned ms) {
        struct timespec t;

        (void) clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += (long) ms * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L;
        t.tv_nsec %= 1000000000L;
        return t;
}

int fill_pool_run(FillPool *p, const FillPoolWork *w, bool (*cancelled)(void *userdata),
                  void *userdata) {
        PoolJob j = { .w = w };
        pthread_condattr_t attr;
        bool stopped = false;

        if (!p || !w || !w->run)
                return -EINVAL;
        if (w->n_chunks == 0)
                return 0;
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&j.idle, &attr);
        (void) pthread_condattr_destroy(&attr);

        (void) pthread_mutex_lock(&p->lock);
        pool_link(p, &j);
        (void) pthread_cond_broadcast(&p->work);
        for (;;) {
                if (!job_open(&j) && j.running == 0)
                        break;
                if (w->caller_runs && job_open(&j)) {
                        uint64_t chunk = j.next++;
                        j.running++;
                        (void) pthread_mutex_unlock(&p->lock);
                        w->run(w->userdata, chunk);
                        stopped = cancelled && cancelled(userdata);
                        (void) pthread_mutex_lock(&p->lock);
                        j.running--;
                        j.stop = j.stop || (stopped && job_open(&j));
                        continue;
                }
                struct timespec until = deadline_after_ms(FILL_POOL_POLL_MS);
                (void) pthread_cond_timedwait(&j.idle, &p->lock, &until);
                if (!job_open(&j) || !cancelled)
                        continue;
                (void) pthread_mutex_unlock(&p->lock);
                stopped = cancelled(userdata);
                (void) pthread_mutex_lock(&p->lock);
                j.stop = j.stop || (stopped && job_open(&j));
        }
        pool_unlink(p, &j);
        (void) pthread_mutex_unlock(&p->lock);
        (void) pthread_cond_destroy(&j.idle);
        return j.stop ? -ECANCELED : 0;
}
