/* fill-pool.h: threads started once that run the chunks of every fill, fairly, cancellably. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A pool of fill threads, started once (the daemon's, for its whole life) and shared by every
 * fill that runs through it: the chunks of the fills under way are handed out round robin, one
 * chunk at a time, so concurrent Builds progress together whatever their sizes. Threads may be
 * split in groups, each bound to a set of CPUs (a NUMA node, chosen by daemon/hw/): a fill that
 * names a group is written by that group's threads only, so first touch places its pages on
 * that node. Pure pthreads; the pool knows nothing of what a chunk is.
 */

typedef struct FillPool FillPool;

/* The most threads a pool starts, and the most groups. */
#define FILL_POOL_THREADS_MAX 1024u
#define FILL_POOL_GROUPS_MAX 64u
/* How often a waiting caller asks whether its fill is cancelled. */
#define FILL_POOL_POLL_MS 5u

/* Threads bound to these CPUs (by the kernel's numbers); cpus borrowed for fill_pool_new(). */
typedef struct FillPoolGroup {
        const int *cpus;
        size_t n_cpus;
} FillPoolGroup;

/*
 * Starts n_threads threads (0: one per online CPU; at most FILL_POOL_THREADS_MAX). With groups
 * (n_groups > 1), the threads are spread over them in proportion to their CPUs, at least one
 * each, and each is bound to its group's CPUs; with one group or none they are not bound.
 * -EINVAL (a group without CPUs, too many groups), -ENOMEM, or pthread_create's error.
 */
int fill_pool_new(unsigned n_threads, const FillPoolGroup *groups, size_t n_groups,
                  FillPool **ret);
/* Stops the threads once the chunks they run have returned, and frees the pool; accepts NULL.
 * No fill may be running through it (its callers returned). */
FillPool *fill_pool_free(FillPool *p);

unsigned fill_pool_threads(const FillPool *p);
/* Groups of bound threads; 0 when the threads are not bound. */
size_t fill_pool_groups(const FillPool *p);

/* One fill as the pool sees it: chunks 0 .. n_chunks - 1, each run once by run(). */
typedef struct FillPoolWork {
        void (*run)(void *userdata, uint64_t chunk); /* on a pool thread */
        void *userdata;
        uint64_t n_chunks;
        int group; /* the group whose threads run it; -1 (or one the pool lacks): any thread */
        /* The calling thread runs chunks too (not for a group: it is not bound to one): a
         * small fill then costs no wake-up, and a busy pool never stalls it. */
        bool caller_runs;
} FillPoolWork;

/*
 * Runs w's chunks on the pool's threads (and on the calling thread, with caller_runs) while
 * the calling thread waits, asking cancelled (NULL: never) on the calling thread after each
 * chunk it runs and every FILL_POOL_POLL_MS it waits. Returns 0 when every chunk ran;
 * -ECANCELED when cancelled said so before: no chunk is handed out after that, and it returns
 * once the chunks already running have returned (so at most one chunk per thread more).
 */
int fill_pool_run(FillPool *p, const FillPoolWork *w, bool (*cancelled)(void *userdata),
                  void *userdata);
