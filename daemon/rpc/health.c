/* health.c: grpc.health.v1.Health: SERVING for the whole server and for each familyd service. */
#include "codec/codec.h"
#include "core/coordinator-status.h"
#include "core/resource-limits.h"
#include "rpc.h"

/* The cluster's membership: NOT_SERVING while the coordinator (etcd) does not answer; the
 * daemon itself (and "") still serves. */
#define HEALTH_CLUSTER "familyd.cluster"

static const char *const served[] = {
        "",
        "familyd.v1.FamilyService",
        "familyd.v1.MeshService",
        "familyd.v1.AdminService",
        HEALTH_CLUSTER,
};

static bool health_serving(const char *service) {
        CoordinatorStatus st;

        if (!streq(service, HEALTH_CLUSTER))
                return true;
        coordinator_status_get(&st);
        return !st.configured || st.reachable;
}

static int health_answer(Arena *arena, const ProtobufCMessage *request, bool watch,
                         ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Grpc__Health__V1__HealthCheckRequest *req =
                (const Grpc__Health__V1__HealthCheckRequest *) request;
        Grpc__Health__V1__HealthCheckResponse *reply;
        bool known = false;

        for (size_t i = 0; i < ELEMENTSOF(served); i++)
                if (streq(served[i], req->service))
                        known = true;
        /* The health protocol: Check answers NOT_FOUND, Watch reports SERVICE_UNKNOWN and stays
         * open (a service may appear later). */
        if (!known && !watch)
                return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "UNKNOWN_SERVICE",
                                        "service", "unknown service '%.*s'",
                                        (int) FAMILYD_MAX_NAME_LENGTH, req->service);

        reply = MSG_NEW(arena, Grpc__Health__V1__HealthCheckResponse,
                        grpc__health__v1__health_check_response__init);
        if (!reply)
                return -ENOMEM;
        /* Calls are answered only once the daemon is fully up, so an answer means SERVING. */
        reply->status = !known ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
                        : health_serving(req->service)
                                ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
        *ret_reply = &reply->base;
        return 0;
}

static int check(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                 ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        return health_answer(arena, request, false, ret_reply, ret_error);
}

static int watch(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                 ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        return health_answer(arena, request, true, ret_reply, ret_error);
}

static const RpcMethod methods[] = {
        { "/grpc.health.v1.Health/Check", RPC_UNARY,
          &grpc__health__v1__health_check_request__descriptor, check, NULL },
        /* The status, then the status anew after each change (the health protocol asks a
         * message per change: the same status twice is not sent, see call.c). */
        { RPC_WATCH_HEALTH_PATH, RPC_WATCH,
          &grpc__health__v1__health_check_request__descriptor, watch, NULL,
          .pushes_changes = true, .skips_repeats = true },
};

const RpcService service_health = {
        .name = "grpc.health.v1.Health",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};
