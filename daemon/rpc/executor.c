/* executor.c: a bounded job queue served by its own threads. */
#include <pthread.h>
#include <stdatomic.h>

#include "executor.h"

typedef struct ExecutorItem {
        ExecutorJob job;
        void *data;
} ExecutorItem;

struct Executor {
        pthread_mutex_t lock;
        pthread_cond_t wake;
        ExecutorItem *queue; /* ring of max_queued */
        unsigned max_queued, head, n_queued;
        atomic_bool stopping;
        pthread_t *threads;
        unsigned n_threads;
};

static void *executor_thread(void *userdata) {
        Executor *e = userdata;

        for (;;) {
                ExecutorItem item;

                (void) pthread_mutex_lock(&e->lock);
                while (e->n_queued == 0 && !atomic_load(&e->stopping))
                        (void) pthread_cond_wait(&e->wake, &e->lock);
                if (e->n_queued == 0) {
                        (void) pthread_mutex_unlock(&e->lock);
                        return NULL;
                }
                item = e->queue[e->head];
                e->head = (e->head + 1) % e->max_queued;
                e->n_queued--;
                (void) pthread_mutex_unlock(&e->lock);

                item.job(item.data, atomic_load(&e->stopping));
        }
}

int executor_new(unsigned threads, unsigned max_queued, Executor **ret) {
        _cleanup_(executor_freep) Executor *e = NULL;

        if (threads == 0 || max_queued == 0)
                return -EINVAL;
        e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        (void) pthread_mutex_init(&e->lock, NULL);
        (void) pthread_cond_init(&e->wake, NULL);
        e->max_queued = max_queued;
        e->queue = calloc(max_queued, sizeof(ExecutorItem));
        e->threads = calloc(threads, sizeof(pthread_t));
        if (!e->queue || !e->threads)
                return -ENOMEM;
        for (unsigned i = 0; i < threads; i++) {
                int r = -pthread_create(&e->threads[i], NULL, executor_thread, e);
                if (r < 0)
                        return r;
                e->n_threads++;
        }
        *ret = TAKE_PTR(e);
        return 0;
}

int executor_submit(Executor *e, ExecutorJob job, void *data) {
        int r = 0;

        (void) pthread_mutex_lock(&e->lock);
        if (atomic_load(&e->stopping))
                r = -ESHUTDOWN;
        else if (e->n_queued >= e->max_queued)
                r = -EBUSY;
        else {
                e->queue[(e->head + e->n_queued) % e->max_queued] = (ExecutorItem) { job, data };
                e->n_queued++;
                (void) pthread_cond_signal(&e->wake);
        }
        (void) pthread_mutex_unlock(&e->lock);
        return r;
}

void executor_stop(Executor *e) {
        if (!e)
                return;
        (void) pthread_mutex_lock(&e->lock);
        atomic_store(&e->stopping, true);
        (void) pthread_cond_broadcast(&e->wake);
        (void) pthread_mutex_unlock(&e->lock);
}

bool executor_stopping(Executor *e) {
        return atomic_load(&e->stopping);
}

Executor *executor_free(Executor *e) {
        if (!e)
                return NULL;
        executor_stop(e);
        for (unsigned i = 0; i < e->n_threads; i++)
                (void) pthread_join(e->threads[i], NULL);
        /* Threads drain the queue before they return; none is left unanswered. */
        free(e->queue);
        free(e->threads);
        (void) pthread_cond_destroy(&e->wake);
        (void) pthread_mutex_destroy(&e->lock);
        return mfree(e);
}
