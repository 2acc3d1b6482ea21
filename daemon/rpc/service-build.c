/* service-build.c: Build, GetBuild, ListBuilds, WatchBuild, ReleaseBuild: decode, call build/,
 * encode. */

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
#include "codec/codec-build-holders.h"
#include "core/repr.h"
#include "core/resource-limits.h"
#include "executor.h"
#include "rpc.h"

/* The Build use-case as the shell set it up, or one of host memory that keeps nothing. */
static Builder builder_of(const RpcContext *ctx) {
        if (ctx->hooks && ctx->hooks->builder)
                return *ctx->hooks->builder;
        return (Builder) { .manager = ctx->manager, .shards = ctx->shards };
}

/* Who calls, for the per-uid limits and the pin and release rules: the connection's uid and
 * whether it is an admin; a caller that cannot be told counts as uid 4294967295, no admin. */
static BuildActor actor_of(void) {
        RpcCaller caller;

        if (rpc_call_caller(&caller) < 0)
                return (BuildActor) { .uid = UINT32_MAX, .admin = false };
        return (BuildActor) { .uid = caller.uid, .admin = caller.admin };
}

/* Whether the calling process is the one a training handout is bound to: the same pid and
 * start time (build-caller.c names it as it names a holder). */
static bool caller_is_process(const BuildBinding *binding) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        BuildCaller caller;
        int32_t pid = 0;
        uint32_t uid = 0;
        int pidfd = -1;

        if (rpc_call_peer(&pid, &uid, &pidfd) < 0)
                return false;
        if (build_caller_identify(pid, uid, pidfd, &caller, &pidfd, &e) < 0)
                return false;
        safe_close(pidfd);
        return caller.pid == binding->pid && caller.start_time == binding->start_time;
}

/* Whether the caller may see rec's tokens: a training handout's only its own process (its
 * binding, held by the record from its commit on and by the holding from its flight's landing
 * or a restart on); any other build's its owner's uid, an admin, or everyone for a build
 * without a known owner (made without a caller, or kept by an older familyd). */
static bool caller_sees_tokens(const BuildRecord *rec, const BuildHolding *h) {
        const BuildState *b = rec->payload;
        RpcCaller caller;

        if (h->binding.bound)
                return caller_is_process(&h->binding);
        if (b && b->binding.bound)
                return caller_is_process(&b->binding);
        if (!h->has_owner)
                return true;
        if (rpc_call_caller(&caller) < 0)
                return false;
        return caller.admin || caller.uid == h->owner_uid;
}

/* A Build reply of a committed build; without its tokens for a caller that may not see them.
 * to_owner: the answer to a Build, whose caller is the owner (the owner's uid is part of the
 * sharing key), maybe answered on another thread than the call's. */
static int build_reply_for(RpcContext *ctx, Arena *arena, const BuildRecord *rec, bool to_owner,
                           Familyd__V1__Build **ret) {
        CodecBuild view;
        int r;

        _cleanup_(build_holding_done) BuildHolding h = {};
        Familyd__V1__Build *pb;

        r = build_state_describe(rec->payload, arena, &view);
        if (r < 0)
                return r;
        r = codec_build_encode(arena, rec->id, &view, ctx->shard_socket, &pb);
        if (r < 0)
                return r;
        r = build_table_holding(ctx->manager->builds, rec, &h);
        if (r < 0)
                return r;
        r = codec_build_holding_encode(arena, &h, pb);
        if (r < 0)
                return r;
        if (!to_owner && !caller_sees_tokens(rec, &h))
                for (size_t i = 0; i < pb->n_shards; i++)
                        pb->shards[i]->token = (char *) "";
        *ret = pb;
        return 0;
}

static int build_reply(RpcContext *ctx, Arena *arena, const BuildRecord *rec,
                       Familyd__V1__Build **ret) {
        return build_reply_for(ctx, arena, rec, false, ret);
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
        r = build_reply_for(ctx, arena, rec, true, &reply->build);
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

/* ---- a materialising Build: shared, held by the calling process ------------------------- */

typedef struct SharedCall {
        RpcContext *ctx;
        RpcPending *pending;
} SharedCall;

static bool shared_expired(void *userdata) {
        SharedCall *c = userdata;
        return rpc_pending_expired(c->pending);
}

static void shared_done(void *userdata, BuildRecord *rec, bool shared, FamilyError *error) {
        SharedCall *c = userdata;
        FamilyError e = FAMILY_ERROR_NULL;
        Familyd__V1__BuildResponse *reply = NULL;
        Arena *arena = rpc_pending_arena(c->pending);
        int r = -EINVAL;

        if (rec) {
                reply = MSG_NEW(arena, Familyd__V1__BuildResponse,
                                familyd__v1__build_response__init);
                r = reply ? build_reply_for(c->ctx, arena, rec, true, &reply->build) : -ENOMEM;
                if (r >= 0)
                        reply->shared = shared;
                else
                        (void) family_error_set(&e, FAMILY_STATUS_INTERNAL, "INTERNAL", NULL,
                                                "internal error: %s", strerror(-r));
        } else if (error)
                (void) build_error_copy(error, &e);
        rpc_pending_finish(c->pending, r < 0 ? NULL : &reply->base, &e);
        free(c);
}

static bool never_stopping(void *userdata) {
        return false;
}

typedef struct SharedJob {
        BuildDraft *draft;
        RpcContext *ctx;
        bool cancelled;
} SharedJob;

static bool job_stopping(void *userdata) {
        SharedJob *j = userdata;
        return j->cancelled || executor_stopping(j->ctx->executor);
}

static void shared_job(void *data, bool cancelled) {
        SharedJob *j = data;
        j->cancelled = cancelled;
        build_draft_run(j->draft, job_stopping, j);
        free(j);
}

/* Who is calling: UNAVAILABLE CALLER_UNKNOWN when the connection does not say (DESIGN of
 * build-caller.c); *ret_pidfd is then -1. */
static int caller_of(BuildCaller *ret, int *ret_pidfd, FamilyError *ret_error) {
        int32_t pid = 0;
        uint32_t uid = 0;
        int pidfd = -1;

        *ret_pidfd = -1;
        if (rpc_call_peer(&pid, &uid, &pidfd) < 0)
                pid = 0;
        return build_caller_identify(pid, uid, pidfd, ret, ret_pidfd, ret_error);
}

static int build_shared(RpcContext *ctx, const Builder *builder, const BuildRequest *req,
                        bool share_group, const char *progress_tag, FamilyError *ret_error) {
        SharedCall *call;
        BuildDraft *draft = NULL;
        BuildWaiter w = { .share_group = share_group, .admin = actor_of().admin };
        int r;

        r = caller_of(&w.caller, &w.pidfd, ret_error);
        if (r < 0)
                return r;
        call = calloc(1, sizeof *call);
        if (!call) {
                safe_close(w.pidfd);
                return -ENOMEM;
        }
        call->ctx = ctx;
        call->pending = rpc_call_defer();
        w.expired = shared_expired;
        w.done = shared_done;
        w.userdata = call;

        FamilyError e = FAMILY_ERROR_NULL;
        r = build_draft_share(builder, req, ctx->shard_socket, &w, &draft, &e);
        if (r < 0) {
                if (!family_error_is_set(&e))
                        (void) family_error_set(&e, r == -ENOMEM
                                                            ? FAMILY_STATUS_RESOURCE_EXHAUSTED
                                                            : FAMILY_STATUS_INTERNAL,
                                                r == -ENOMEM ? "OUT_OF_MEMORY" : "INTERNAL",
                                                NULL, "%s",
                                                r == -ENOMEM ? "familyd is out of memory"
                                                             : strerror(-r));
                rpc_pending_finish(call->pending, NULL, &e);
                free(call);
                return RPC_PENDING;
        }
        if (r != BUILD_SHARE_NEW)
                return RPC_PENDING; /* answered, or answered when its flight lands */
        /* Without memory for the tag the Build goes on, followed by its id only. */
        (void) build_draft_set_progress_tag(draft, progress_tag);

        /* Nothing to fill here: finish on this worker. Else the fill runs on the executor. */
        if (!build_draft_fills(draft) || !ctx->executor) {
                build_draft_run(draft, never_stopping, NULL);
                return RPC_PENDING;
        }
        SharedJob *job = calloc(1, sizeof *job);
        if (job)
                *job = (SharedJob) { .draft = draft, .ctx = ctx };
        r = job ? executor_submit(ctx->executor, shared_job, job) : -ENOMEM;
        if (r >= 0)
                return RPC_PENDING;
        free(job);
        (void) family_error_set(&e, r == -EBUSY ? FAMILY_STATUS_RESOURCE_EXHAUSTED
                                                : FAMILY_STATUS_UNAVAILABLE,
                                r == -EBUSY ? "BUILD_QUEUE" : "SHUTTING_DOWN", NULL,
                                r == -EBUSY ? "build queue full: too many Builds are "
                                              "materialising; retry"
                                            : "familyd is stopping");
        build_draft_fail(draft, &e);
        family_error_done(&e);
        return RPC_PENDING;
}

/* BuildRequest.share: "" or "owner" (false), "group" (true). */
static int share_parse(const char *share, bool *ret, FamilyError *ret_error) {
        int r;

        r = codec_check_length(share, FAMILYD_MAX_NAME_LENGTH, "share", ret_error);
        if (r < 0)
                return r;
        if (isempty(share) || streq(share, "owner") || streq(share, "group")) {
                *ret = streq_ptr(share, "group");
                return 0;
        }
        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST", "share",
                                "share must be \"owner\" or \"group\", not '%s'", share);
}

static int build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                 ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__BuildRequest *pb = (const Familyd__V1__BuildRequest *) request;
        _cleanup_(build_request_done) BuildRequest req = {};
        Builder builder = builder_of(ctx);
        BuildDraft *draft = NULL;
        bool share_group = false;
        int r;

        r = share_parse(pb->share, &share_group, ret_error);
        if (r < 0)
                return r;
        r = codec_check_length(pb->progress_tag, FAMILYD_MAX_NAME_LENGTH, "progress_tag",
                               ret_error);
        if (r < 0)
                return r;
        r = codec_build_request_decode(pb, &req, ret_error);
        if (r < 0)
                return r;
        /* A materialising Build is shared and held by its caller; a layout is neither. */
        if (req.materialize.enabled && builder.sharing)
                return build_shared(ctx, &builder, &req, share_group, pb->progress_tag,
                                    ret_error);
        BuildActor actor = actor_of();
        r = build_draft(&builder, &req, ctx->shard_socket, &actor, &draft, ret_error);
        if (r < 0)
                return r;
        (void) build_draft_set_progress_tag(draft, pb->progress_tag); /* as in build_shared() */

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
        Builder builder = builder_of(ctx);
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
        if (builder.progress) {
                CodecBuildProgress *flying = NULL;
                r = build_progress_list(builder.progress, arena, &flying, &n);
                if (r >= 0)
                        r = codec_build_progress_list_encode(arena, flying, n, &reply->in_flight);
                if (r < 0)
                        return r;
                reply->n_in_flight = n;
        }
        *ret_reply = &reply->base;
        return 0;
}


/* The build named by id or tag: NOT_FOUND BUILD_NOT_FOUND unless the progress table knows it. */
static int progress_not_found(const char *id, const char *tag, FamilyError *ret_error) {
        _cleanup_free_ char *q = repr_string(isempty(id) ? tag : id);

        if (!q)
                return -ENOMEM;
        if (isempty(id))
                return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "BUILD_NOT_FOUND",
                                        "progress_tag",
                                        "no build in flight with progress tag %s", q);
        return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "BUILD_NOT_FOUND",
                                "build_id", "no build in flight with id %s", q);
}

/* WatchBuild: the progress now; sent anew while the build fills, and last its end. */
static int watch_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__WatchBuildRequest *req =
                (const Familyd__V1__WatchBuildRequest *) request;
        Builder builder = builder_of(ctx);
        Familyd__V1__BuildProgress *reply;
        CodecBuildProgress view;
        int r;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = codec_check_length(req->progress_tag, FAMILYD_MAX_NAME_LENGTH, "progress_tag",
                               ret_error);
        if (r < 0)
                return r;
        if (isempty(req->build_id) == isempty(req->progress_tag))
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                        NULL, "give exactly one of build_id and progress_tag");
        r = builder.progress ? build_progress_find(builder.progress, req->build_id,
                                                   req->progress_tag, arena, &view)
                             : -ENOENT;
        if (r == -ENOENT)
                return progress_not_found(req->build_id, req->progress_tag, ret_error);
        if (r < 0)
                return r;
        r = codec_build_progress_encode(arena, &view, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return view.state == CODEC_BUILD_PROGRESS_FILLING ? 0 : RPC_WATCH_LAST;
}

static int release_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                         ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__ReleaseBuildRequest *req =
                (const Familyd__V1__ReleaseBuildRequest *) request;
        _cleanup_(family_error_done) FamilyError unknown = FAMILY_ERROR_NULL;
        Builder builder = builder_of(ctx);
        Familyd__V1__ReleaseBuildResponse *reply;
        BuildActor actor = actor_of();
        BuildCaller caller;
        bool known = false, freed = false;
        int r, pidfd = -1;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        if (req->force) {
                r = rpc_require_admin("ReleaseBuild with force", ret_error);
                if (r < 0)
                        return r;
        } else {
                known = caller_of(&caller, &pidfd, &unknown) >= 0;
                safe_close(pidfd);
        }
        r = build_release_held(&builder, req->build_id, known ? &caller : NULL, &actor,
                               req->force, &freed, ret_error);
        if (r == -ENOTCONN) {
                *ret_error = unknown;
                unknown = FAMILY_ERROR_NULL;
                return -EINVAL;
        }
        if (r < 0)
                return r;

        reply = MSG_NEW(arena, Familyd__V1__ReleaseBuildResponse,
                        familyd__v1__release_build_response__init);
        if (!reply)
                return -ENOMEM;
        reply->freed = freed;
        *ret_reply = &reply->base;
        return 0;
}

static int pin_or_unpin(RpcContext *ctx, Arena *arena, const char *id, bool pin,
                        ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Builder builder = builder_of(ctx);
        BuildActor actor = actor_of();
        Familyd__V1__Build *reply;
        int r;

        r = codec_check_length(id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = build_pin(&builder, id, &actor, pin, &rec, ret_error);
        if (r < 0)
                return r;
        r = build_reply(ctx, arena, rec, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static int pin_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                     ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__PinBuildRequest *req = (const Familyd__V1__PinBuildRequest *) request;
        return pin_or_unpin(ctx, arena, req->build_id, true, ret_reply, ret_error);
}

static int unpin_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__UnpinBuildRequest *req =
                (const Familyd__V1__UnpinBuildRequest *) request;
        return pin_or_unpin(ctx, arena, req->build_id, false, ret_reply, ret_error);
}

static int publish_build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                         ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__PublishBuildRequest *req =
                (const Familyd__V1__PublishBuildRequest *) request;
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Builder builder = builder_of(ctx);
        BuildActor actor = actor_of();
        Familyd__V1__Build *reply;
        int r;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = build_publish(&builder, req->build_id, &actor, &rec, ret_error);
        if (r < 0)
                return r;
        r = build_reply(ctx, arena, rec, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.FamilyService/Build", RPC_UNARY, &familyd__v1__build_request__descriptor,
          build, NULL,
          .audited = true },
        { "/familyd.v1.FamilyService/GetBuild", RPC_UNARY,
          &familyd__v1__get_build_request__descriptor, get_build, NULL },
        { "/familyd.v1.FamilyService/ListBuilds", RPC_UNARY,
          &familyd__v1__list_builds_request__descriptor, list_builds, NULL },
        /* The progress now, then anew on each rpc_notify_build_watches(); ends after DONE or
         * FAILED. */
        { RPC_WATCH_BUILD_PATH, RPC_WATCH,
          &familyd__v1__watch_build_request__descriptor, watch_build, NULL,
          .pushes_changes = true },
        { "/familyd.v1.FamilyService/ReleaseBuild", RPC_UNARY,
          &familyd__v1__release_build_request__descriptor, release_build, NULL,
          .audited = true },
        { "/familyd.v1.FamilyService/PinBuild", RPC_UNARY,
          &familyd__v1__pin_build_request__descriptor, pin_build, NULL,
          .audited = true },
        { "/familyd.v1.FamilyService/UnpinBuild", RPC_UNARY,
          &familyd__v1__unpin_build_request__descriptor, unpin_build, NULL,
          .audited = true },
        { "/familyd.v1.FamilyService/PublishBuild", RPC_UNARY,
          &familyd__v1__publish_build_request__descriptor, publish_build, NULL,
          .audited = true },
};

/* The same gRPC service as service_family; a second table keeps Build apart. */
const RpcService service_build = {
        .name = "familyd.v1.FamilyService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};
