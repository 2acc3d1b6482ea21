/* materialize.c: a rank's segment from its layout and the parameters' inits. */
#include <inttypes.h>
#include <stdio.h>

#include "materialize.h"

int materialize_rank(const BuildPlan *plan, const Layout *layout, const RankLayout *rank,
                     Dtype dtype, uint64_t seed, int device, ShardSegment **ret) {
        _cleanup_(shard_segment_unrefp) ShardSegment *seg = NULL;
        _cleanup_free_ FillSpec *specs = NULL;
        _cleanup_free_ FillSlice *slices = NULL;
        size_t n = 0;
        char name[64];
        int r;

        (void) snprintf(name, sizeof name, "familyd-rank-%" PRId64, rank->rank);
        r = shard_segment_new_host(name, rank->size_bytes, device, &seg);
        if (r < 0)
                return r;

        specs = calloc(rank->n_slices ? rank->n_slices : 1, sizeof(FillSpec));
        slices = calloc(rank->n_slices ? rank->n_slices : 1, sizeof(FillSlice));
        if (!specs || !slices)
                return -ENOMEM;

        uint8_t *base = shard_segment_data(seg);
        for (size_t i = 0; i < rank->n_slices; i++) {
                const ShardSlice *s = &rank->slices[i];
                const PlanParameter *p = &plan->parameters[s->parameter];

                if (s->byte_length == 0)
                        continue;
                r = fill_spec_init(&specs[n], p->init.kind, p->init.a, p->init.b, seed, p->name,
                                   dtype);
                if (r < 0)
                        return r;
                slices[n] = (FillSlice) {
                        .spec = &specs[n],
                        .rank = s->n_dims,
                        .shape = layout->parameters[s->parameter].shape,
                        .local_shape = s->local_shape,
                        .global_offset = s->global_offset,
                        .dst = base + s->byte_offset,
                };
                n++;
        }

        r = fill_run(slices, n, 0);
        if (r < 0)
                return r;
        shard_segment_unmap(seg);

        *ret = TAKE_PTR(seg);
        return 0;
}
