/* service-build.c: Build, GetBuild, ListBuilds, ReleaseBuild: plan, layout, materialise, hand out. */

/*
 * DESIGN: a Build is checked completely (plan, dtype, layout, ranks) before it reserves its
 * bytes and a slot in the build table; then its segments are made and filled, and only a
 * finished build is committed and its tokens published. Any failure returns the reservation
 * and drops what was made: nothing is half-built. ReleaseBuild withdraws the tokens first, so
 * no new descriptor is handed out, then drops the daemon's hold; mappings trainers already
 * have stay valid (the kernel frees the memory when the last one goes).
 *
 * Where builds outlive the daemon (daemon/state/: the fd store, or --state-dir), a Build
 * draws its id before materialising (its segments are named after it), reserves room in the
 * fd store with its bytes, and is saved (segments, then its record) before it is committed:
 * a build anyone can see is a build a restart brings back. ReleaseBuild forgets it there.
 * Builds with shards in GPU memory are the exception: they are never kept (state.c says why).
 *
 * Devices: a rank goes to the device the topology assigns to it (its node, its local device
 * index), and its kind ("host" or "cuda") is that device's. Ranks materialised on this node
 * get their memory from the device's backend (shm/accel.h): host ranks a memfd (or a
 * --state-dir file) counted in --shm-budget, GPU ranks an allocation on that GPU counted in
 * the GPU's own budget, reserved (all GPUs at once) before anything is allocated, and given
 * back when the build goes. A GPU that cannot hold shards fails the Build before anything is
 * reserved.
 */

#include <inttypes.h>
#include <stdio.h>

#include "shm/accel.h"
#include "build-state.h"
#include "codec/codec.h"
#include "executor.h"
#include "common/log.h"
#include "shm/materialize.h"
#include "core/repr.h"
#include "core/resource-limits.h"
#include "rpc.h"
#include "shm/shard-table.h"
#include "state/state.h"

void build_state_free(void *p) {
        BuildState *b = p;

        if (!b)
                return;
        for (size_t i = 0; i < b->n_ranks; i++) {
                free(b->ranks[i].node);
                shard_segment_unref(b->ranks[i].segment);
        }
        free(b->ranks);
        accel_reservation_free(b->device_memory);
        layout_done(&b->layout);
        if (b->counted_mesh) {
                mesh_build_release(b->counted_mesh);
                mesh_unref(b->counted_mesh);
        }
        build_plan_done(&b->plan);
        free(b);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(BuildState *, build_state_free);

static int dtype_of(const BuildPlan *plan, Dtype *ret, FamilyError *ret_error) {
        const char *s = isempty(plan->materialize.dtype) ? "float32" : plan->materialize.dtype;
        Dtype d = dtype_from_string(s);

        if (d < 0) {
                _cleanup_free_ char *q = repr_string(s);
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "DTYPE",
                                        "materialize.dtype",
                                        "dtype %s is not supported; use float32, bfloat16 or "
                                        "float16",
                                        strempty(q));
        }
        *ret = d;
        return 0;
}

static int compute_layout(BuildState *b, FamilyError *ret_error) {
        _cleanup_free_ LayoutParameter *params = NULL;
        const BuildPlan *plan = &b->plan;

        params = calloc(plan->n_parameters ? plan->n_parameters : 1, sizeof(LayoutParameter));
        if (!params)
                return -ENOMEM;
        for (size_t i = 0; i < plan->n_parameters; i++)
                params[i] = (LayoutParameter) {
                        .name = plan->parameters[i].name,
                        .shape = plan->parameters[i].shape,
                        .n_dims = plan->parameters[i].n_dims,
                        .placements = plan->parameters[i].placements,
                        .n_placements = plan->parameters[i].n_placements,
                };
        return layout_compute(plan->mesh, params, plan->n_parameters, dtype_size(b->dtype),
                              LAYOUT_MIN_ALIGN, &b->layout, ret_error);
}

/* The kind of a node's device: "cuda" for a GPU, else "host" (static strings). */
static const char *device_kind_of(const Node *n, int32_t local_device) {
        if (!n)
                return SHARD_SEGMENT_DEVICE_KIND_HOST;
        for (size_t i = 0; i < n->n_devices; i++)
                if (n->devices[i].local_index == local_device)
                        return streq_ptr(n->devices[i].kind, SHARD_SEGMENT_DEVICE_KIND_CUDA)
                                       ? SHARD_SEGMENT_DEVICE_KIND_CUDA
                                       : SHARD_SEGMENT_DEVICE_KIND_HOST;
        return SHARD_SEGMENT_DEVICE_KIND_HOST;
}

static bool rank_on_gpu(const BuildRankState *rs) {
        return streq_ptr(rs->device_kind, SHARD_SEGMENT_DEVICE_KIND_CUDA);
}

/* Where each rank lives, and which ranks this Build materialises here. */
static int place_ranks(BuildState *b, const Topology *t, Accel *accel, FamilyError *ret_error) {
        const MaterializeOptions *m = &b->plan.materialize;
        const Node *local = topology_local_node(t);

        b->ranks = calloc(b->layout.n_ranks ? b->layout.n_ranks : 1, sizeof(BuildRankState));
        if (!b->ranks)
                return -ENOMEM;
        b->n_ranks = b->layout.n_ranks;

        for (size_t i = 0; i < b->n_ranks; i++) {
                const Node *n = topology_node_of_rank(t, b->layout.ranks[i].rank,
                                                      &b->ranks[i].local_device);
                /* Without a mesh the one rank is this node's first device. */
                if (!b->plan.mesh) {
                        n = local;
                        b->ranks[i].local_device = 0;
                }
                b->ranks[i].node = strdup(n ? n->name : "");
                if (!b->ranks[i].node)
                        return -ENOMEM;
                b->ranks[i].device_kind = device_kind_of(n, b->ranks[i].local_device);
        }

        if (!m->enabled)
                return 0;

        if (m->n_ranks > 0) {
                for (size_t j = 0; j < m->n_ranks; j++) {
                        const RankLayout *rl = layout_find_rank(&b->layout, m->ranks[j]);
                        size_t i = rl ? (size_t) (rl - b->layout.ranks) : 0;

                        if (!rl || !local || !streq(b->ranks[i].node, local->name))
                                return family_error_set(ret_error,
                                                        FAMILY_STATUS_INVALID_ARGUMENT,
                                                        "RANK_NOT_LOCAL", "materialize.ranks",
                                                        "rank %" PRId64
                                                        " is not local to this node",
                                                        m->ranks[j]);
                        b->ranks[i].materialized = rl->size_bytes > 0;
                }
        } else
                for (size_t i = 0; i < b->n_ranks; i++)
                        b->ranks[i].materialized = local &&
                                                   streq(b->ranks[i].node, local->name) &&
                                                   b->layout.ranks[i].size_bytes > 0;

        /* Local ranks by this node's own backends: what a GPU allocation will take. */
        for (size_t i = 0; i < b->n_ranks; i++) {
                BuildRankState *rs = &b->ranks[i];
                if (!rs->materialized)
                        continue;
                rs->device_kind = accel_device_kind(accel, rs->local_device);
                rs->allocation_bytes = accel_allocation_size(accel, rs->local_device,
                                                             b->layout.ranks[i].size_bytes);
        }
        return 0;
}

/* Every GPU this Build materialises on can hold shards; then their bytes, all at once. */
static int reserve_devices(BuildState *b, Accel *accel, FamilyError *ret_error) {
        _cleanup_free_ int32_t *devices = NULL;
        _cleanup_free_ uint64_t *bytes = NULL;
        size_t n = 0;
        int r;

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized || !rank_on_gpu(&b->ranks[i]))
                        continue;
                r = accel_check_device(accel, b->ranks[i].local_device, ret_error);
                if (r < 0)
                        return r;
                n++;
        }
        if (n == 0)
                return 0;
        devices = calloc(n, sizeof(int32_t));
        bytes = calloc(n, sizeof(uint64_t));
        if (!devices || !bytes)
                return -ENOMEM;
        n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && rank_on_gpu(&b->ranks[i])) {
                        devices[n] = b->ranks[i].local_device;
                        bytes[n++] = b->ranks[i].allocation_bytes;
                }
        return accel_reserve(accel, devices, bytes, n, &b->device_memory, ret_error);
}

/* Host bytes, the ones --shm-budget counts (GPU ranks count in their GPU's budget). */
static uint64_t bytes_to_materialize(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !rank_on_gpu(&b->ranks[i]))
                        total += b->layout.ranks[i].size_bytes;
        return total;
}

static uint64_t gpu_bytes(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && rank_on_gpu(&b->ranks[i]))
                        total += b->ranks[i].allocation_bytes;
        return total;
}

static size_t segments_to_materialize(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized;
        return n;
}

/* Each materialised rank keeps one descriptor open in the daemon until ReleaseBuild: the shard
 * table's size is the descriptor budget (--max-shards, fitted to RLIMIT_NOFILE). */
static int check_shard_room(const BuildState *b, ShardTable *shards, FamilyError *ret_error) {
        size_t need = segments_to_materialize(b), held = shard_table_size(shards),
               max = shard_table_max(shards);

        if (need <= max && held <= max - need)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "SHARD_LIMIT", NULL,
                                "shard limit reached: build needs %zu shards, %zu of %zu held",
                                need, held, max);
}

static int materialize_all(BuildState *b, State *state, Accel *accel, const char *id,
                           bool (*expired)(void *userdata), void *userdata,
                           FamilyError *ret_error) {
        for (size_t i = 0; i < b->n_ranks; i++) {
                const RankLayout *rl = &b->layout.ranks[i];
                BuildRankState *rs = &b->ranks[i];
                int r;

                if (!rs->materialized)
                        continue;
                /* Nobody would learn this build's id: stop, and keep nothing. */
                if (expired(userdata))
                        return -ETIMEDOUT;
                if (rank_on_gpu(rs)) {
                        char name[96];
                        (void) snprintf(name, sizeof name, "shard-%s-%" PRId64, id, rl->rank);
                        r = accel_segment_new(accel, rs->local_device, name, rl->size_bytes,
                                              &rs->segment, ret_error);
                } else
                        r = state_segment_new(state, id, rl->rank, rl->size_bytes,
                                              rs->local_device, &rs->segment);
                if (r < 0)
                        return r;
                rs->allocation_bytes = shard_segment_size(rs->segment);
                r = accel_fill(accel, rs->segment, &b->plan, &b->layout, rl, b->dtype, b->seed,
                               ret_error);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int publish_tokens(BuildState *b, ShardTable *shards, FamilyError *ret_error) {
        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                int r = shard_table_add(shards, b->group.hex, b->ranks[i].segment,
                                        &b->ranks[i].token);
                if (r == SHARD_TABLE_FULL)
                        return check_shard_room(b, shards, ret_error) < 0
                                       ? -EINVAL
                                       : family_error_set(ret_error,
                                                          FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                          "SHARD_LIMIT", NULL,
                                                          "shard limit reached");
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The reply is known in full before anything is materialised (tokens and ids have fixed
 * lengths): a Build whose reply no client could receive is refused before it costs anything. */
static int check_reply_size(BuildState *b, const char *shard_socket, FamilyError *ret_error) {
        Arena a;
        Familyd__V1__Build *pb = NULL;
        int r;

        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized)
                        memset(b->ranks[i].token.hex, '0', SHARD_TOKEN_LENGTH);
        arena_init(&a);
        r = codec_build_encode(&a, "bld-00000000-00000000000000000000", b, shard_socket, &pb);
        size_t size = r >= 0 ? protobuf_c_message_get_packed_size(&pb->base) + 16 : 0;
        arena_done(&a);
        for (size_t i = 0; i < b->n_ranks; i++)
                b->ranks[i].token = (ShardToken) {};
        if (r < 0)
                return r;
        if (size <= FAMILYD_MAX_REPLY_BYTES)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "REPLY_LIMIT", NULL,
                                "the Build reply would be %zu bytes, more than the limit of %u "
                                "bytes (%zu ranks)",
                                size, FAMILYD_MAX_REPLY_BYTES, b->n_ranks);
}

/* Gives back everything a Build took before its commit: tokens, the segments it made where
 * they outlive the daemon, its fd store room, its reservation; then frees it. */
static void build_abandon(RpcContext *ctx, BuildState *b, const char *id, uint64_t bytes) {
        State *state = ctx->manager->state;

        (void) shard_table_remove_group(ctx->shards, b->group.hex);
        state_build_discard(state, id, b);
        state_build_unreserve(state, b);
        build_table_cancel(ctx->manager->builds, bytes);
        build_state_free(b);
}

/* The part of a Build after its reservation: materialise, publish, save, commit, encode. A
 * failure returns the reservation and drops what was made. expired: the caller has given up
 * (deadline, or the daemon is stopping): nobody would learn the build's id, so nothing is
 * kept. */
static int build_finish(RpcContext *ctx, BuildState *b, uint64_t bytes, Arena *arena,
                        bool (*expired)(void *userdata), void *userdata,
                        ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        Manager *m = ctx->manager;
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Familyd__V1__BuildResponse *reply;
        char id[BUILD_TABLE_ID_MAX];
        int r;

        build_table_next_id(m->builds, id);
        r = materialize_all(b, m->state, m->accel, id, expired, userdata, ret_error);
        if (r >= 0 && expired(userdata))
                r = -ETIMEDOUT;
        if (r < 0) {
                build_abandon(ctx, b, id, bytes);
                if (family_error_is_set(ret_error))
                        return r; /* a backend's own answer (GPU memory, the CUDA driver) */
                if (r == -ETIMEDOUT)
                        return family_error_set(ret_error, FAMILY_STATUS_DEADLINE_EXCEEDED,
                                                "DEADLINE", NULL,
                                                "the call ended (deadline or shutdown) while "
                                                "materialising; nothing was kept");
                if (r == -EMFILE || r == -ENFILE)
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "FD_LIMIT", NULL,
                                                "out of file descriptors for shard memory");
                if ((r == -ENOSPC || r == -EDQUOT) && state_mode(m->state) == STATE_MODE_DIR)
                        return state_dir_full_error(m->state, bytes, ret_error);
                if (r == -ENOMEM || r == -ENOSPC)
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "SHM_EXHAUSTED", NULL,
                                                "out of shared memory for %" PRIu64 " bytes",
                                                bytes);
                return r;
        }
        r = publish_tokens(b, ctx->shards, ret_error);
        if (r >= 0)
                r = state_build_save(m->state, id, b, ret_error);
        if (r < 0) {
                build_abandon(ctx, b, id, bytes);
                return r;
        }

        r = build_table_commit_id(m->builds, id, bytes, b, build_state_free, &rec);
        if (r < 0) {
                /* Saved: its fd store room is in use now, and forgetting gives it back. */
                (void) shard_table_remove_group(ctx->shards, b->group.hex);
                state_build_forget(m->state, id, b);
                build_table_cancel(m->builds, bytes);
                build_state_free(b);
                return r;
        }
        /* b lives on as rec's payload. */
        char gpu_bytes_text[64] = "";
        if (b->device_memory)
                (void) snprintf(gpu_bytes_text, sizeof gpu_bytes_text,
                                "%" PRIu64 " bytes in GPU memory", gpu_bytes(b));
        log_struct(LOG_INFO, 0,
                   LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id),
                              LOG_FIELD(LOG_FIELD_FAMILY, b->plan.resolved.family),
                              LOG_FIELD(LOG_FIELD_MESH_ID, b->plan.mesh ? b->plan.mesh->id : NULL)),
                   "Build %s created: %s as %s, %zu ranks, %" PRIu64 " bytes of shards held%s%s.",
                   rec->id, b->plan.resolved.family, b->plan.resolved.variant, b->n_ranks, bytes,
                   b->device_memory ? ", " : "", b->device_memory ? gpu_bytes_text : "");

        reply = MSG_NEW(arena, Familyd__V1__BuildResponse, familyd__v1__build_response__init);
        if (!reply)
                return -ENOMEM;
        r = codec_build_encode(arena, rec->id, rec->payload, ctx->shard_socket, &reply->build);
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
        BuildState *state;
        uint64_t bytes;
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
        int r = build_finish(j->ctx, j->state, j->bytes, rpc_pending_arena(j->pending),
                             job_expired, j, &reply, &e);
        if (r < 0 && !family_error_is_set(&e))
                (void) family_error_set(&e, FAMILY_STATUS_INTERNAL, "INTERNAL", NULL,
                                        "internal error: %s", strerror(-r));
        rpc_pending_finish(j->pending, r < 0 ? NULL : reply, &e);
        free(j);
}

static int build(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                 ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        Manager *m = ctx->manager;
        _cleanup_(build_request_done) BuildRequest req = {};
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        _cleanup_(topology_unrefp) Topology *topo = manager_topology(m);
        _cleanup_(build_state_freep) BuildState *b = NULL;
        uint64_t bytes;
        int r;

        r = codec_build_request_decode((const Familyd__V1__BuildRequest *) request, &req,
                                       ret_error);
        if (r < 0)
                return r;

        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        r = build_plan(reg, m->meshes, &req, &b->plan, ret_error);
        if (r < 0)
                return r;
        r = dtype_of(&b->plan, &b->dtype, ret_error);
        if (r < 0)
                return r;
        b->seed = b->plan.materialize.has_seed ? b->plan.materialize.seed : 0;
        r = compute_layout(b, ret_error);
        if (r < 0)
                return r;
        r = place_ranks(b, topo, m->accel, ret_error);
        if (r < 0)
                return r;
        r = check_reply_size(b, ctx->shard_socket, ret_error);
        if (r < 0)
                return r;
        r = shard_token_new(&b->group);
        if (r < 0)
                return r;

        /* Counted on its mesh now, so a DeleteMesh racing this Build is refused. */
        if (b->plan.mesh) {
                r = mesh_table_acquire(m->meshes, b->plan.mesh->id, &b->counted_mesh, ret_error);
                if (r < 0)
                        return r;
        }

        r = check_shard_room(b, ctx->shards, ret_error);
        if (r < 0)
                return r;
        r = reserve_devices(b, m->accel, ret_error);
        if (r < 0)
                return r;
        r = state_build_reserve(m->state, b, ret_error);
        if (r < 0)
                return r;

        bytes = bytes_to_materialize(b);
        r = build_table_reserve(m->builds, bytes, ret_error);
        if (r < 0) {
                state_build_unreserve(m->state, b);
                return r;
        }

        /* Nothing to fill: finish here. Else the fill runs on the executor, so gRPC's workers
         * keep answering (Health, Resolve) while shards are written. */
        if (segments_to_materialize(b) == 0 || !ctx->executor)
                return build_finish(ctx, TAKE_PTR(b), bytes, arena, handler_expired, NULL,
                                    ret_reply, ret_error);

        BuildJob *job = calloc(1, sizeof *job);
        if (!job) {
                state_build_unreserve(m->state, b);
                build_table_cancel(m->builds, bytes);
                return -ENOMEM;
        }
        *job = (BuildJob) { .ctx = ctx, .state = b, .bytes = bytes };
        job->pending = rpc_call_defer();
        r = executor_submit(ctx->executor, build_job, job);
        if (r < 0) {
                FamilyError none = FAMILY_ERROR_NULL;
                /* Not queued: answer on this worker, through the same pending handle. */
                state_build_unreserve(m->state, b);
                build_table_cancel(m->builds, bytes);
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
        TAKE_PTR(b);
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
        r = codec_build_encode(arena, rec->id, rec->payload, ctx->shard_socket, &reply);
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
                        r = codec_build_encode(arena, list[i]->id, list[i]->payload,
                                               ctx->shard_socket, &reply->builds[i]);
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
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        Familyd__V1__ReleaseBuildResponse *reply;
        int r;

        r = codec_check_length(req->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id", ret_error);
        if (r < 0)
                return r;
        r = build_table_get(ctx->manager->builds, req->build_id, &rec, ret_error);
        if (r < 0)
                return r;

        /* Tokens first: from here on no new descriptor of this build is handed out. */
        (void) shard_table_remove_group(ctx->shards, ((BuildState *) rec->payload)->group.hex);
        r = build_table_remove(ctx->manager->builds, req->build_id, ret_error);
        if (r < 0)
                return r;
        /* Only the caller whose remove succeeded gets here: forgotten once. */
        state_build_forget(ctx->manager->state, rec->id, rec->payload);
        const BuildState *state = rec->payload;
        log_struct(LOG_INFO, 0,
                   LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id),
                              LOG_FIELD(LOG_FIELD_FAMILY, state->plan.resolved.family),
                              LOG_FIELD(LOG_FIELD_MESH_ID,
                                        state->plan.mesh ? state->plan.mesh->id : NULL)),
                   "Build %s released: %" PRIu64 " bytes of shards let go.", rec->id,
                   rec->bytes);

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
