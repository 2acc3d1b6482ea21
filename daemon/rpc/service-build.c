/* service-build.c: Build, GetBuild, ListBuilds, ReleaseBuild: decode, call build/, encode. */

/*
 * DESIGN: the Build use-case is daemon/build/'s (build.h); what is the gRPC adapter's is when
 * the slow part runs and when the call is over. A Build with shards to fill runs its fill on
 * the executor (the build threads), so gRPC's workers keep answering (Health, Resolve) while
 * shards are written; it answers through a pending call, and stops, keeping nothing, when the
 * call's deadline passes, its client goes, or the daemon stops. The use-case's collaborators
 * (the state store, the accelerators) come from the shell through the server's hooks; without
 * them builds live in host memory and are not kept across restarts.
 */

#include "build/build.h"
#include "codec/codec.h"
#include "core/resource-limits.h"
#include "executor.h"
#include "rpc.h"

/* The Build use-case as the shell set it up, or one of host memory that keeps nothing. */
static Builder builder_of(const RpcContext *ctx) {
        if (ctx->hooks && ctx->hooks->builder)
                return *ctx->hooks->builder;
        return (Builder) { .manager = ctx->manager, .shards = ctx->shards };
}

/* A Build reply of a committed build. */
static int build_reply(RpcContext *ctx, Arena *arena, const BuildRecord *rec,
                       Familyd__V1__Build **ret) {
        CodecBuild view;
        int r;

        r = build_state_describe(rec->payload, arena, &view);
        if (r < 0)
                return r;
        return codec_build_encode(arena, rec->id, &view, ctx->shard_socket, ret);
}

static int build_finish(RpcContext *ctx, BuildDraft *draft, Arena *arena,
                        bool (*expired)(void *userdata), void *userdata,
                        ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Familyd__V1__BuildResponse *reply;
        int r;

        r = build_draft_finish(draft, expired, userdata, &rec, ret_error);
        if (r < 0)
                return r;
        reply = MSG_NEW(arena, Familyd__V1__BuildResponse, familyd__v1__build_response__init);
        if (!reply)
                return -ENOMEM;
        r = build_reply(ctx, arena, rec, &reply->build);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static bool handler_expired(void *userdata) {
        return rpc_call_expired();
}

typedef struct BuildJob {
        RpcContext *ctx;
        BuildDraft *draft;
        RpcPending *pending;
        bool cancelled;
} BuildJob;

static bool job_expired(void *userdata) {
        BuildJob *j = userdata;
        return j->cancelled || executor_stopping(j->ctx->executor) ||
               rpc_pending_expired(j->pending);
}

static void build_job(void *data, bool cancelled) {
        BuildJob *j = data;
        FamilyError e = FAMILY_ERROR_NULL;
        ProtobufCMessage *reply = NULL;

        j->cancelled = cancelled;
        int r = build_finish(j->ctx, j->draft, rpc_pending_arena(j->pending), job_expired, j,
                             &reply, &e);
        if (r < 0 && !family_error_is_set(&e))
                (void) family_error_set(&e, FAMILY_STATUS_INTERNAL, "INTERNAL", NULL,
                                        "internal error: %s", strerror(-r));
        rpc_pending_finish(j->pending, r < 0 ? NULL : reply, &e);
        free(j);
}

static int build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                 ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        _cleanup_(build_request_done) BuildRequest req = {};
        Builder builder = builder_of(ctx);
        BuildDraft *draft = NULL;
        int r;

        r = codec_build_request_decode((const Familyd__V1__BuildRequest *) request, &req,
                                       ret_error);
        if (r < 0)
                return r;
        r = build_draft(&builder, &req, ctx->shard_socket, &draft, ret_error);
        if (r < 0)
                return r;

        /* Nothing to fill: finish here. Else the fill runs on the executor. */
        if (!build_draft_fills(draft) || !ctx->executor)
                return build_finish(ctx, draft, arena, handler_expired, NULL, ret_reply,
                                    ret_error);

        BuildJob *job = calloc(1, sizeof *job);
        if (!job) {
                build_draft_abandon(draft);
                return -ENOMEM;
        }
        *job = (BuildJob) { .ctx = ctx, .draft = draft };
        job->pending = rpc_call_defer();
        r = executor_submit(ctx->executor, build_job, job);
        if (r < 0) {
                FamilyError none = FAMILY_ERROR_NULL;
                /* Not queued: answer on this worker, through the same pending handle. */
                build_draft_abandon(draft);
                (void) family_error_set(&none, r == -EBUSY ? FAMILY_STATUS_RESOURCE_EXHAUSTED
                                                           : FAMILY_STATUS_UNAVAILABLE,
                                        r == -EBUSY ? "BUILD_QUEUE" : "SHUTTING_DOWN", NULL,
                                        r == -EBUSY ? "build queue full: too many Builds are "
                                                      "materialising; retry"
                                                    : "familyd is stopping");
                rpc_pending_finish(job->pending, NULL, &none);
                free(job);
                return RPC_PENDING;
        }
        return RPC_PENDING;
}

static int get_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                     ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__GetBuildRequest *req = (const Familyd__V1__GetBuildRequest *) request;
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Familyd__V1__Build *reply;
        int r;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = build_table_get(ctx->manager->builds, req->build_id, &rec, ret_error);
        if (r < 0)
                return r;
        r = build_reply(ctx, arena, rec, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static int list_builds(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        Familyd__V1__ListBuildsResponse *reply;
        BuildRecord **list = NULL;
        size_t n = 0;
        int r;

        r = build_table_list(ctx->manager->builds, &list, &n);
        if (r < 0)
                return r;
        reply = MSG_NEW(arena, Familyd__V1__ListBuildsResponse,
                        familyd__v1__list_builds_response__init);
        r = -ENOMEM;
        if (reply && ARRAY_NEW(arena, reply->builds, n)) {
                r = 0;
                for (size_t i = 0; i < n && r >= 0; i++)
                        r = build_reply(ctx, arena, list[i], &reply->builds[i]);
        }
        build_list_free(list, n);
        if (r < 0)
                return r;
        reply->n_builds = n;
        *ret_reply = &reply->base;
        return 0;
}

static int release_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                         ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__ReleaseBuildRequest *req =
                (const Familyd__V1__ReleaseBuildRequest *) request;
        Builder builder = builder_of(ctx);
        Familyd__V1__ReleaseBuildResponse *reply;
        int r;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = build_release(&builder, req->build_id, ret_error);
        if (r < 0)
                return r;

        reply = MSG_NEW(arena, Familyd__V1__ReleaseBuildResponse,
                        familyd__v1__release_build_response__init);
        if (!reply)
                return -ENOMEM;
        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.FamilyService/Build", RPC_UNARY, &familyd__v1__build_request__descriptor,
          build, NULL },
        { "/familyd.v1.FamilyService/GetBuild", RPC_UNARY,
          &familyd__v1__get_build_request__descriptor, get_build, NULL },
        { "/familyd.v1.FamilyService/ListBuilds", RPC_UNARY,
          &familyd__v1__list_builds_request__descriptor, list_builds, NULL },
        { "/familyd.v1.FamilyService/ReleaseBuild", RPC_UNARY,
          &familyd__v1__release_build_request__descriptor, release_build, NULL },
};

/* The same gRPC service as service_family; a second table keeps Build apart. */
const RpcService service_build = {
        .name = "familyd.v1.FamilyService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};
