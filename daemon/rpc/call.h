/* call.h: one gRPC call on the server and its state machine, per method kind. */
#pragma once

#include <grpc/grpc.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "rpc.h"

/* Every completion-queue tag is one of these; its owner finds itself with container_of. */
typedef struct RpcTag {
        void (*complete)(struct RpcTag *tag, bool ok);
} RpcTag;

typedef struct CallSite {
        grpc_server *server;
        grpc_completion_queue *cq;
        RpcContext context;
        const RpcMethod *method; /* NULL: the catch-all for unknown methods */
        void *registered;        /* grpc_server_register_method's handle */
        atomic_bool *shutting_down;
} CallSite;

/* Asks gRPC for the next call at this site; a new call re-arms its site at once. */
int call_arm(const CallSite *site);
