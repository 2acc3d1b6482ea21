/* materialize.c: a rank's slices from its layout and the parameters' inits. */
#include "materialize.h"

int materialize_slices(const BuildPlan *plan, const Layout *layout, const RankLayout *rank,
                       uint64_t seed, MaterializeSlice **ret, size_t *ret_n) {
        _cleanup_free_ MaterializeSlice *slices = NULL;
        size_t n = 0;
        int r;

        /* Allocated once: fill.spec points into the array. */
        slices = calloc(rank->n_slices ? rank->n_slices : 1, sizeof(MaterializeSlice));
        if (!slices)
                return -ENOMEM;

        for (size_t i = 0; i < rank->n_slices; i++) {
                const ShardSlice *s = &rank->slices[i];
                const PlanParameter *p = &plan->parameters[s->parameter];
                MaterializeSlice *m = &slices[n];

                if (s->byte_length == 0)
                        continue;
                /* Each parameter in its own dtype: its slice's bytes were laid out for it. */
                /* init: module: zeros here; a client runs the module's own init into the
                 * writable build and publishes it (build-publish.c). */
                r = fill_spec_init4(&m->spec, p->init.kind == INIT_MODULE ? INIT_ZEROS : p->init.kind,
                                    (const double[4]) { p->init.a, p->init.b, p->init.c, p->init.d }, seed,
                                    p->name, layout->parameters[s->parameter].dtype);
                if (r < 0)
                        return r;
                m->fill = (FillSlice) {
                        .spec = &m->spec,
                        .rank = s->n_dims,
                        .shape = layout->parameters[s->parameter].shape,
                        .local_shape = s->local_shape,
                        .global_offset = s->global_offset,
                };
                m->byte_offset = s->byte_offset;
                m->byte_length = s->byte_length;
                n++;
        }

        *ret = TAKE_PTR(slices);
        *ret_n = n;
        return 0;
}

int materialize_host_write(ShardSegment *seg, const MaterializeSlice *slices, size_t n) {
        _cleanup_free_ FillSlice *fills = NULL;
        uint8_t *base = shard_segment_data(seg);

        if (!base)
                return -EINVAL;
        fills = calloc(n ? n : 1, sizeof(FillSlice));
        if (!fills)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                if (slices[i].byte_length > shard_segment_size(seg) ||
                    slices[i].byte_offset > shard_segment_size(seg) - slices[i].byte_length)
                        return -EINVAL;
                fills[i] = slices[i].fill;
                fills[i].dst = base + slices[i].byte_offset;
                fills[i].populate = true;
        }

        return fill_run(fills, n, 0);
}

int materialize_host_fill(ShardSegment *seg, const MaterializeSlice *slices, size_t n) {
        int r;

        r = materialize_host_write(seg, slices, n);
        if (r < 0)
                return r;
        shard_segment_unmap(seg);
        return 0;
}
