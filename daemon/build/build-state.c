/* build-state.c: a live build's state: freeing it, and describing it to the codecs. */
#include "build-state.h"

_Static_assert(SHARD_TOKEN_LENGTH == CODEC_TOKEN_LENGTH, "a token is a token");

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

int build_state_describe(const BuildState *b, Arena *a, CodecBuild *ret) {
        CodecBuildRank *ranks = arena_alloc_array(a, b->n_ranks ? b->n_ranks : 1,
                                                  sizeof(CodecBuildRank));

        if (!ranks)
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++) {
                const BuildRankState *rs = &b->ranks[i];
                ranks[i] = (CodecBuildRank) {
                        .node = rs->node,
                        .local_device = rs->local_device,
                        .device_kind = rs->device_kind,
                        .allocation_bytes = rs->materialized ? rs->allocation_bytes : 0,
                        .token = rs->materialized ? rs->token.hex : NULL,
                };
        }
        *ret = (CodecBuild) {
                .plan = &b->plan,
                .layout = &b->layout,
                .dtype = b->dtype,
                .seed = b->seed,
                .group = b->group.hex,
                .ranks = ranks,
                .n_ranks = b->n_ranks,
                .writable = b->writable,
                .registry_digest = b->registry_digest,
        };
        return 0;
}

size_t build_state_segments(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized;
        return n;
}

size_t build_state_own_segments(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized && !b->ranks[i].replica;
        return n;
}

size_t build_state_replicas(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized && b->ranks[i].replica;
        return n;
}

bool build_rank_on_gpu(const BuildRankState *rs) {
        return streq_ptr(rs->device_kind, SHARD_SEGMENT_DEVICE_KIND_CUDA);
}

bool build_state_has_gpu_shards(const BuildState *b) {
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && build_rank_on_gpu(&b->ranks[i]))
                        return true;
        return false;
}
