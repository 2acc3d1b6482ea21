/* executor.h: a few threads for long work that must not hold a gRPC worker (materialising). */
#pragma once

#include <stdbool.h>

#include "common/macro.h"

typedef struct Executor Executor;

/* A job runs once, on an executor thread; cancelled is true when the executor is stopping, and
 * the job should then answer at once (it still must release what it holds). */
typedef void (*ExecutorJob)(void *data, bool cancelled);

int executor_new(unsigned threads, unsigned max_queued, Executor **ret);
/* -EBUSY when max_queued jobs wait already. */
int executor_submit(Executor *e, ExecutorJob job, void *data);
/* Jobs queued or running from now on see cancelled; nothing new is accepted. */
void executor_stop(Executor *e);
bool executor_stopping(Executor *e);
/* Stops, runs what is queued (cancelled), joins the threads. Accepts NULL. */
Executor *executor_free(Executor *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(Executor *, executor_free);
