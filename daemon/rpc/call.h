/* call.h: one gRPC call on the server and its state machine, per method kind. */
#pragma once

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "caller.h"
#include "rpc.h"

/* Every completion-queue tag is one of these; its owner finds itself with container_of. */
typedef struct RpcTag {
        void (*complete)(struct RpcTag *tag, bool ok);
} RpcTag;

/* Every live Call, armed or answering, and the open watches among them. The server waits for
 * live to reach zero before destroying itself: gRPC's shutdown tag fires once its channels are
 * gone, not once our handlers have stopped starting batches. */
typedef struct CallCounter {
        pthread_mutex_t lock;
        pthread_cond_t drained;
        unsigned live;
        unsigned watches;
        unsigned max_watches;
        unsigned max_watches_per_process;
        struct WatchOwner *owners; /* open watches by process, at most max_watches entries */
        size_t n_owners, allocated_owners;
        struct Call *pushed; /* open watches of methods that push changes */
} CallCounter;

void call_counter_init(CallCounter *c, unsigned max_watches, unsigned max_watches_per_process);
void call_counter_done(CallCounter *c);
/* Blocks until no Call is alive. */
void call_counter_wait_drained(CallCounter *c);
/* From any thread: every open watch that pushes changes sends its handler's reply anew (at
 * once, or after the send in flight; a burst of changes costs at most one more send). */
void call_counter_notify_watches(CallCounter *c);
/* The same for the watches of one method path only. */
void call_counter_notify_watches_of(CallCounter *c, const char *path);

typedef struct CallSite {
        grpc_server *server;
        grpc_completion_queue *cq;
        RpcContext context;
        const RpcMethod *method; /* NULL: the catch-all for unknown methods */
        void *registered;        /* grpc_server_register_method's handle */
        atomic_bool *shutting_down;
        CallCounter *counter;
        CallerTable *callers; /* the server's: the credentials of each connection */
        struct Executor *closer; /* closes refused connections once answered; NULL: at once */
} CallSite;

/* Asks gRPC for the next call at this site; a new call re-arms its site at once. */
int call_arm(const CallSite *site);
