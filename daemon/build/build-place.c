/* build-place.c: where a build's ranks live and what memory they take. */
#include <fcntl.h>
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
                        .checkpoint = plan->parameters[i].has_checkpoint
                                              ? plan->parameters[i].checkpoint.text
                                              : NULL,
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

/* ---- replicas ------------------------------------------------------------------------- */

bool build_ranks_same_bytes(const Layout *l, size_t i, size_t j) {
        const RankLayout *a = &l->ranks[i], *b = &l->ranks[j];

        if (a->size_bytes != b->size_bytes || a->n_slices != b->n_slices)
                return false;
        for (size_t s = 0; s < a->n_slices; s++) {
                const ShardSlice *x = &a->slices[s], *y = &b->slices[s];
                if (x->parameter != y->parameter || x->n_dims != y->n_dims ||
                    x->byte_offset != y->byte_offset || x->byte_length != y->byte_length)
                        return false;
                if (x->n_dims > 0 &&
                    (memcmp(x->local_shape, y->local_shape, x->n_dims * sizeof(int64_t)) != 0 ||
                     memcmp(x->global_offset, y->global_offset, x->n_dims * sizeof(int64_t)) != 0))
                        return false;
        }
        return true;
}

/* 64-bit FNV-1a, eight bytes at a time. */
static uint64_t hash_mix(uint64_t h, uint64_t v) {
        for (unsigned i = 0; i < 8; i++) {
                h ^= (uint8_t) (v >> (8 * i));
                h *= UINT64_C(0x100000001b3);
        }
        return h;
}

/* What build_ranks_same_bytes() compares, hashed: ranks with the same bytes hash alike. */
static uint64_t rank_hash(const RankLayout *rl) {
        uint64_t h = hash_mix(UINT64_C(0xcbf29ce484222325), rl->size_bytes);

        for (size_t s = 0; s < rl->n_slices; s++) {
                const ShardSlice *sl = &rl->slices[s];
                h = hash_mix(h, sl->byte_offset);
                h = hash_mix(h, sl->byte_length);
                for (size_t d = 0; d < sl->n_dims; d++) {
                        h = hash_mix(h, (uint64_t) sl->local_shape[d]);
                        h = hash_mix(h, (uint64_t) sl->global_offset[d]);
                }
        }
        return h;
}

typedef struct RankKey {
        uint64_t hash;
        size_t index;
} RankKey;

/* By hash, then in layout order: a run of equal hashes starts with its earliest rank. */
static int rank_key_cmp(const void *a, const void *b) {
        const RankKey *x = a, *y = b;

        if (x->hash != y->hash)
                return x->hash < y->hash ? -1 : 1;
        return x->index < y->index ? -1 : x->index > y->index;
}

int build_group_replicas(BuildState *b) {
        _cleanup_free_ RankKey *keys = NULL;
        size_t n = 0;

        /* Every process mapping a writable build's bytes shares them: a replica's writes would
         * show in its primary's shard. */
        if (b->writable)
                return 0;
        keys = calloc(b->n_ranks ? b->n_ranks : 1, sizeof *keys);
        if (!keys)
                return -ENOMEM;
        /* A GPU allocation belongs to one GPU: only host ranks share. */
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !build_rank_on_gpu(&b->ranks[i]))
                        keys[n++] = (RankKey) { rank_hash(&b->layout.ranks[i]), i };
        if (n > 1)
                qsort(keys, n, sizeof *keys, rank_key_cmp);

        for (size_t start = 0, end; start < n; start = end) {
                for (end = start + 1; end < n && keys[end].hash == keys[start].hash; end++)
                        ;
                /* Each rank of the run shares the first earlier one it equals that has bytes of
                 * its own (the run's first, unless hashes collide). */
                for (size_t k = start + 1; k < end; k++) {
                        BuildRankState *rs = &b->ranks[keys[k].index];
                        for (size_t j = start; j < k && !rs->replica; j++) {
                                size_t p = keys[j].index;
                                if (b->ranks[p].replica ||
                                    !build_ranks_same_bytes(&b->layout, p, keys[k].index))
                                        continue;
                                rs->replica = true;
                                rs->primary = p;
                        }
                }
        }
        return 0;
}

int build_replica_segment(BuildState *b, size_t i) {
        BuildRankState *rs = &b->ranks[i];
        const ShardSegment *primary = b->ranks[rs->primary].segment;
        int fd, r;

        if (!primary)
                return -EINVAL;
        fd = fcntl(shard_segment_fd(primary), F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        r = shard_segment_adopt(fd, rs->local_device, &rs->segment);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        return 0;
}

/* ---- bytes ----------------------------------------------------------------------------- */

uint64_t build_host_bytes(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica &&
                    !build_rank_on_gpu(&b->ranks[i]))
                        /* What the segment takes: a hugetlb one is rounded up. */
                        total += b->ranks[i].allocation_bytes;
        return total;
}

uint64_t build_gpu_bytes(const BuildState *b) {
        uint64_t total = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && build_rank_on_gpu(&b->ranks[i]))
                        total += b->ranks[i].allocation_bytes;
        return total;
}

/* Each materialised rank keeps one descriptor open in the daemon until ReleaseBuild (a
 * replica its own, of its primary's memory): the shard table's size is the descriptor budget (--max-shards, fitted to RLIMIT_NOFILE). */
int build_check_shard_room(const BuildState *b, ShardTable *shards, FamilyError *ret_error) {
        size_t need = build_state_segments(b), held = shard_table_size(shards),
               max = shard_table_max(shards);

        if (need <= max && held <= max - need)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "SHARD_LIMIT", NULL,
                                "shard limit reached: build needs %zu shards, %zu of %zu held",
                                need, held, max);
}
