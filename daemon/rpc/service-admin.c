/* service-admin.c: familyd.v1.AdminService: status and registry reload for operators. */
#include <inttypes.h>
#include <stdio.h>

#include "build-config.h"
#include "build/build.h"
#include "codec/codec.h"
#include "common/log.h"
#include "core/coordinator-status.h"
#include "rpc.h"

/* GetStatus's coordinator: set only in etcd mode. */
static int status_coordinator(Arena *arena, Familyd__V1__GetStatusResponse *reply) {
        Familyd__V1__CoordinatorStatus *co;
        CoordinatorStatus st;

        coordinator_status_get(&st);
        if (!st.configured)
                return 0;
        co = MSG_NEW(arena, Familyd__V1__CoordinatorStatus, familyd__v1__coordinator_status__init);
        if (!co)
                return -ENOMEM;
        co->endpoints = arena_strdup(arena, st.endpoints);
        co->cluster = arena_strdup(arena, st.cluster);
        co->last_error = arena_strdup(arena, st.last_error);
        if (!co->endpoints || !co->cluster || !co->last_error)
                return -ENOMEM;
        co->reachable = st.reachable;
        reply->coordinator = co;
        return 0;
}

/* GetStatusResponse.uid_use holds at most this many uids: those holding the most builds. */
#define STATUS_MAX_UIDS 1024u

static int by_builds_desc(const void *a, const void *b) {
        const BuildUidUse *x = a, *y = b;
        return x->builds > y->builds ? -1 : x->builds < y->builds;
}

static int by_uid(const void *a, const void *b) {
        uint32_t x = ((const BuildUidUse *) a)->uid, y = ((const BuildUidUse *) b)->uid;
        return x < y ? -1 : x > y;
}

/* What each uid holds, the per-uid limits, and freed shards still held. */
static int status_uids(RpcContext *ctx, Arena *arena, Familyd__V1__GetStatusResponse *reply) {
        _cleanup_free_ BuildUidUse *use = NULL;
        BuildUidLimits limits;
        BuildReleasedUse released;
        size_t n = 0;
        int r;

        build_table_uid_limits(ctx->manager->builds, &limits);
        reply->max_builds_per_uid = limits.builds;
        reply->max_pins_per_uid = limits.pins;
        reply->shm_budget_per_uid_bytes = limits.bytes;
        build_released_use(ctx->hooks ? ctx->hooks->builder : NULL, &released);
        reply->shm_released_bytes_held = released.bytes;
        reply->shm_released_segments_held = released.segments;

        r = build_table_uid_use(ctx->manager->builds, &use, &n);
        if (r < 0)
                return r;
        if (n > STATUS_MAX_UIDS) {
                qsort(use, n, sizeof *use, by_builds_desc);
                n = STATUS_MAX_UIDS;
                qsort(use, n, sizeof *use, by_uid);
                reply->uid_use_truncated = true;
        }
        if (n == 0)
                return 0;
        if (!ARRAY_NEW(arena, reply->uid_use, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                Familyd__V1__UidUse *u = MSG_NEW(arena, Familyd__V1__UidUse,
                                                 familyd__v1__uid_use__init);
                if (!u)
                        return -ENOMEM;
                u->uid = use[i].uid;
                u->builds = use[i].builds;
                u->pins = use[i].pins;
                u->shm_bytes = use[i].bytes;
                reply->uid_use[i] = u;
        }
        reply->n_uid_use = n;
        return 0;
}

static int get_status(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                      ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        Manager *m = ctx->manager;
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        _cleanup_(topology_unrefp) Topology *t = manager_topology(m);
        Familyd__V1__GetStatusResponse *reply;

        reply = MSG_NEW(arena, Familyd__V1__GetStatusResponse, familyd__v1__get_status_response__init);
        if (!reply)
                return -ENOMEM;

        reply->version = arena_strdup(arena, FAMILYD_VERSION);
        reply->registry_path = arena_strdup(arena, m->registry_path);
        reply->node = arena_strdup(arena, m->node_name);
        if (!reply->version || !reply->registry_path || !reply->node)
                return -ENOMEM;
        reply->uptime_ms = manager_uptime_ms(m);
        reply->registry_generation = reg->generation;
        reply->families = (uint32_t) reg->n_families;
        reply->meshes = (uint32_t) mesh_table_size(m->meshes);
        reply->shm_budget_bytes = build_table_budget(m->builds);
        reply->shm_bytes_in_use = build_table_bytes_in_use(m->builds);
        reply->builds = build_table_count(m->builds);
        reply->topology_version = t->version;
        BuildCounters counters;
        build_counters(ctx->hooks ? ctx->hooks->builder : NULL, &counters);
        reply->fills_started = counters.fills_started;
        reply->bytes_filled = counters.bytes_filled;
        reply->builds_in_grace = counters.builds_in_grace;
        reply->checkpoint_bytes_read = counters.checkpoint_bytes_read;
        reply->shard_socket = arena_strdup(arena, strempty(ctx->shard_socket));
        if (!reply->shard_socket)
                return -ENOMEM;
        reply->api = arena_strdup(arena, familyd__v1__get_status_response__descriptor.package_name);
        if (!reply->api)
                return -ENOMEM;
        reply->api_revision = FAMILYD__V1__API_REVISION__API_REVISION_CURRENT;
        if (ctx->hooks && ctx->hooks->builder && ctx->hooks->builder->progress) {
                CodecBuildProgress *flying = NULL;
                size_t n = 0;
                int r = build_progress_list(ctx->hooks->builder->progress, arena, &flying, &n);
                if (r >= 0)
                        r = codec_build_progress_list_encode(arena, flying, n,
                                                             &reply->builds_in_flight);
                if (r < 0)
                        return r;
                reply->n_builds_in_flight = n;
        }
        int r = status_coordinator(arena, reply);
        if (r < 0)
                return r;
        r = status_uids(ctx, arena, reply);
        if (r < 0)
                return r;
        reply->peer_messages_sent = atomic_load_explicit(&m->peer_messages_sent,
                                                         memory_order_relaxed);
        reply->peer_bytes_sent = atomic_load_explicit(&m->peer_bytes_sent, memory_order_relaxed);
        for (size_t i = 0; i < t->n_nodes; i++) {
                if (t->nodes[i].local)
                        continue;
                switch (t->nodes[i].state) {
                case NODE_UP:
                        reply->peers_up++;
                        break;
                case NODE_SUSPECT:
                        reply->peers_suspect++;
                        break;
                default:
                        reply->peers_down++;
                        break;
                }
        }

        *ret_reply = &reply->base;
        return 0;
}

static int reload(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request, ProtobufCMessage **ret_reply,
                  FamilyError *ret_error) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        Familyd__V1__ReloadResponse *reply;
        int r;

        r = rpc_require_admin("Reload", ret_error);
        if (r < 0)
                return r;
        if (ctx->hooks && ctx->hooks->reload_begin)
                ctx->hooks->reload_begin(ctx->hooks->userdata);
        r = manager_reload(ctx->manager, &reg, &diag);
        if (ctx->hooks && ctx->hooks->reload_end)
                ctx->hooks->reload_end(ctx->hooks->userdata, r);
        if (r < 0) {
                _cleanup_free_ char *text = load_diagnostics_join(&diag);
                log_warning("Registry reload failed, keeping the previous registry:\n%s",
                            strempty(text));
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "RELOAD_FAILED", NULL, "registry reload failed: %s",
                                        text ? text : strerror(-r));
        }
        char generation[32];
        (void) snprintf(generation, sizeof generation, "%" PRIu64, reg->generation);
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD("REGISTRY_GENERATION", generation)),
                   "Registry reloaded: generation %" PRIu64 ", %zu families.", reg->generation,
                   reg->n_families);

        reply = MSG_NEW(arena, Familyd__V1__ReloadResponse, familyd__v1__reload_response__init);
        if (!reply)
                return -ENOMEM;
        reply->registry_generation = reg->generation;
        reply->families = (uint32_t) reg->n_families;
        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.AdminService/GetStatus", RPC_UNARY,
          &familyd__v1__get_status_request__descriptor, get_status, NULL },
        { "/familyd.v1.AdminService/Reload", RPC_UNARY, &familyd__v1__reload_request__descriptor,
          reload, NULL,
          .audited = true },
};

const RpcService service_admin = {
        .name = "familyd.v1.AdminService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};
