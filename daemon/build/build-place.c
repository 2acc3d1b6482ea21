/* build-place.c: where a build's ranks live and what memory they take. */
#include <inttypes.h>

#include "build-private.h"
#include "core/repr.h"

int build_dtype_of(const BuildPlan *plan, Dtype *ret, FamilyError *ret_error) {
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
        /* Step 7 goes on with each parameter's own dtype. */
        int r = build_plan_check_dtypes(plan, ret_error);
        if (r < 0)
                return r;
        *ret = d;
        return 0;
}

int build_compute_layout(BuildState *b, FamilyError *ret_error) {
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
                        .has_dtype = true,
                        .dtype = build_plan_parameter_dtype(plan, i, b->dtype),
                };
        return layout_compute(plan->mesh, params, plan->n_parameters, b->dtype,
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

int build_place_ranks(BuildState *b, const Topology *t, Accel *accel, FamilyError *ret_error) {
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

int build_reserve_devices(BuildState *b, Accel *accel, FamilyError *ret_error) {
        _cleanup_free_ int32_t *devices = NULL;
        _cleanup_free_ uint64_t *bytes = NULL;
        size_t n = 0;
        int r;

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized || !build_rank_on_gpu(&b->ranks[i]))
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
                if (b->ranks[i].materialized && build_rank_on_gpu(&b->ranks[i])) {
                        devices[n] = b->ranks[i].local_device;
                        bytes[n++] = b->ranks[i].allocation_bytes;
                }
        return accel_reserve(accel, devices, bytes, n, &b->device_memory, ret_error);
}

uint64_t build_host_bytes(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !build_rank_on_gpu(&b->ranks[i]))
                        total += b->layout.ranks[i].size_bytes;
        return total;
}

uint64_t build_gpu_bytes(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && build_rank_on_gpu(&b->ranks[i]))
                        total += b->ranks[i].allocation_bytes;
        return total;
}

/* Each materialised rank keeps one descriptor open in the daemon until ReleaseBuild: the shard
 * table's size is the descriptor budget (--max-shards, fitted to RLIMIT_NOFILE). */
int build_check_shard_room(const BuildState *b, ShardTable *shards, FamilyError *ret_error) {
        size_t need = build_state_segments(b), held = shard_table_size(shards),
               max = shard_table_max(shards);

        if (need <= max && held <= max - need)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "SHARD_LIMIT", NULL,
                                "shard limit reached: build needs %zu shards, %zu of %zu held",
                                need, held, max);
}
