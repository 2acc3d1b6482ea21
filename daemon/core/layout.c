/* layout.c: step 5 of Build, the parameter layout over a mesh (torch.chunk pieces, packed bytes). */
#include <inttypes.h>
#include <stdio.h>

#include "layout.h"
#include "resource-limits.h"

#define SHAPE_ERROR(e, param, ...) \
        family_error_set((e), FAMILY_STATUS_INVALID_ARGUMENT, "SHAPE", (param), __VA_ARGS__)

static const char *const layout_view_table[_LAYOUT_VIEW_MAX] = {
        [LAYOUT_VIEW_DEVICE] = "device",
        [LAYOUT_VIEW_EXPERT] = "expert",
};

const char *layout_view_to_string(LayoutView v) {
        if (v < 0 || v >= _LAYOUT_VIEW_MAX)
                return NULL;
        return layout_view_table[v];
}

LayoutView layout_view_from_string(const char *s) {
        for (LayoutView v = 0; v < _LAYOUT_VIEW_MAX; v++)
                if (streq_ptr(s, layout_view_table[v]))
                        return v;
        return _LAYOUT_VIEW_INVALID;
}

static void parameter_layout_done(ParameterLayout *p) {
        free(p->name);
        free(p->checkpoint);
        free(p->shape);
        for (size_t i = 0; i < p->n_placements; i++)
                free(p->placements[i].axis);
        free(p->placements);
        free(p->axis_size);
        *p = (ParameterLayout) {};
}

void layout_done(Layout *l) {
        if (!l)
                return;
        free(l->mesh_id);
        for (size_t i = 0; i < l->n_parameters; i++)
                parameter_layout_done(&l->parameters[i]);
        free(l->parameters);
        for (size_t i = 0; i < l->n_ranks; i++)
                free(l->ranks[i].slices);
        free(l->ranks);
        free(l->_cells);
        *l = (Layout) {};
}

const RankLayout *layout_find_rank(const Layout *l, int64_t rank) {
        for (size_t i = 0; i < l->n_ranks; i++)
                if (l->ranks[i].rank == rank)
                        return &l->ranks[i];
        return NULL;
}

static bool view_has(const MeshView *v, const char *name) {
        return v && mesh_view_dim_size(v, name) > 0;
}

static uint64_t view_product(const MeshView *v) {
        uint64_t p = 1;

        for (size_t i = 0; i < v->n; i++) {
                if (v->dims[i].size <= 0 || __builtin_mul_overflow(p, (uint64_t) v->dims[i].size, &p))
                        return 0;
        }
        return p;
}

/* x rounded up to a multiple of align (a power of two), failing past INT64_MAX. */
static bool align_up(uint64_t x, uint64_t align, uint64_t *ret) {
        uint64_t y;

        if (__builtin_add_overflow(x, align - 1, &y))
                return false;
        y &= ~(align - 1);
        if (y > (uint64_t) INT64_MAX)
                return false;
        *ret = y;
        return true;
}

/*
 * The torch.chunk piece at coordinate c of n of a length len: chunk = ceil(len / n), the piece is
 * [min(len, c * chunk), min(len, (c + 1) * chunk)). Written so nothing overflows for any int64 len.
 */
static void chunk_piece(int64_t len, int64_t n, int64_t c, int64_t *ret_start, int64_t *ret_len) {
        int64_t chunk = len / n + (len % n != 0), s, e;

        if (__builtin_mul_overflow(c, chunk, &s) || s > len)
                s = len;
        if (__builtin_mul_overflow(c + 1, chunk, &e) || e > len)
                e = len;
        *ret_start = s;
        *ret_len = e - s;
}

/* Copies and checks one parameter, choosing its view. */
static int parameter_prepare(const Mesh *mesh, const LayoutParameter *in, Dtype dtype,
                             ParameterLayout *ret, FamilyError *ret_error) {
        _cleanup_(parameter_layout_done) ParameterLayout p = {};
        const char *name = strempty(in->name);
        const MeshView *device = mesh ? &mesh->spec.device : NULL;
        const MeshView *expert = mesh && mesh->spec.expert.n > 0 ? &mesh->spec.expert : NULL;
        const MeshView *view;
        bool zero = false;
        uint64_t n = 1;
        int64_t bytes;

        if (in->has_dtype)
                dtype = in->dtype;
        size_t elem_size = dtype_size(dtype);
        if (elem_size == 0)
                return -EINVAL;

        if (in->n_dims > FAMILYD_MAX_SHAPE_RANK)
                return SHAPE_ERROR(ret_error, name, "parameter '%s' has %zu dimensions, at most %u are supported",
                                   name, in->n_dims, FAMILYD_MAX_SHAPE_RANK);
        for (size_t i = 0; i < in->n_dims; i++) {
                if (in->shape[i] < 0)
                        return SHAPE_ERROR(ret_error, name, "parameter '%s': dimension %zu must not be negative, got %" PRId64,
                                           name, i, in->shape[i]);
                if (in->shape[i] == 0)
                        zero = true;
        }
        for (size_t i = 0; !zero && i < in->n_dims; i++)
                if (__builtin_mul_overflow(n, (uint64_t) in->shape[i], &n) || n > (uint64_t) INT64_MAX)
                        return SHAPE_ERROR(ret_error, name, "parameter '%s' has more than %" PRId64 " elements",
                                           name, INT64_MAX);
        if (zero)
                n = 0;
        if (__builtin_mul_overflow((int64_t) n, (int64_t) elem_size, &bytes))
                return SHAPE_ERROR(ret_error, name, "parameter '%s' needs more than %" PRId64 " bytes",
                                   name, INT64_MAX);

        if (in->n_placements > LAYOUT_MAX_PLACEMENTS)
                return SHAPE_ERROR(ret_error, name, "parameter '%s' has %zu placements, at most %u are supported",
                                   name, in->n_placements, LAYOUT_MAX_PLACEMENTS);
        for (size_t i = 0; i < in->n_placements; i++) {
                const Placement *pl = &in->placements[i];

                if (pl->kind == PLACEMENT_SHARD &&
                    (pl->dim < -(int64_t) in->n_dims || pl->dim >= (int64_t) in->n_dims))
                        return SHAPE_ERROR(ret_error, name,
                                           "parameter '%s': shard(%" PRId64 ") on '%s' is out of range for %zu dimensions",
                                           name, pl->dim, strempty(pl->axis), in->n_dims);
                if (pl->kind != PLACEMENT_SHARD && pl->kind != PLACEMENT_REPLICATE)
                        return -EINVAL;
                for (size_t j = 0; j < i; j++)
                        if (streq(strempty(pl->axis), strempty(in->placements[j].axis)))
                                return SHAPE_ERROR(ret_error, name, "parameter '%s' places axis '%s' twice",
                                                   name, strempty(pl->axis));
        }

        p.dtype = dtype;
        p.view = LAYOUT_VIEW_DEVICE;
        for (size_t i = 0; expert && i < in->n_placements; i++) {
                const char *axis = strempty(in->placements[i].axis);

                if (view_has(expert, axis) && !view_has(device, axis))
                        p.view = LAYOUT_VIEW_EXPERT;
        }
        view = p.view == LAYOUT_VIEW_EXPERT ? expert : device;

        p.name = strdup(name);
        if (in->checkpoint && !(p.checkpoint = strdup(in->checkpoint)))
                return -ENOMEM;
        if (!p.name)
                return -ENOMEM;
        p.shape = calloc(in->n_dims + 1, sizeof(int64_t));
        p.placements = calloc(in->n_placements + 1, sizeof(Placement));
        p.axis_size = calloc(in->n_placements + 1, sizeof(int64_t));
        if (!p.shape || !p.placements || !p.axis_size)
                return -ENOMEM;
        if (in->n_dims > 0)
                memcpy(p.shape, in->shape, in->n_dims * sizeof(int64_t));
        p.n_dims = in->n_dims;
        p.n_elements = n;
        for (size_t i = 0; i < in->n_placements; i++) {
                const Placement *pl = &in->placements[i];
                int64_t size = view ? mesh_view_dim_size(view, strempty(pl->axis)) : 0;

                p.placements[i].axis = strdup(strempty(pl->axis));
                if (!p.placements[i].axis)
                        return -ENOMEM;
                p.n_placements++;
                p.placements[i].kind = pl->kind;
                p.placements[i].dim = pl->kind != PLACEMENT_SHARD ? 0 :
                                      pl->dim < 0 ? pl->dim + (int64_t) in->n_dims : pl->dim;
                p.axis_size[i] = size > 0 ? size : 1;
        }

        *ret = p;
        p = (ParameterLayout) {};
        return 0;
}

/*
 * For each dimension of the parameter's view, the tensor dim it shards, or -1: the nesting plan.
 * View dimension names are unique (CreateMesh) and placement axes are unique, so each view
 * dimension matches at most one placement.
 */
static void parameter_plan(const ParameterLayout *p, const MeshView *view, int64_t *ret_target) {
        for (size_t k = 0; view && k < view->n; k++) {
                ret_target[k] = -1;
                for (size_t i = 0; i < p->n_placements; i++)
                        if (p->placements[i].kind == PLACEMENT_SHARD &&
                            streq(p->placements[i].axis, strempty(view->dims[k].name)))
                                ret_target[k] = p->placements[i].dim;
        }
}

static void unravel(const MeshView *v, uint64_t index, int64_t *ret_coords) {
        for (size_t k = v->n; k > 0; k--) {
                uint64_t size = (uint64_t) v->dims[k - 1].size;

                ret_coords[k - 1] = (int64_t) (index % size);
                index /= size;
        }
}

int layout_ranks_new(Layout *l, const MeshSpec *spec) {
        const MeshView *device = spec ? &spec->device : NULL;
        const MeshView *expert = spec && spec->expert.n > 0 ? &spec->expert : NULL;
        size_t n_device = device ? device->n : 0, n_expert = expert ? expert->n : 0;
        size_t n_ranks = spec ? spec->n_ranks : 1, cells_per_rank = n_device + n_expert, n_cells;
        int64_t *cell;

        for (size_t i = 0; i < l->n_parameters; i++)
                cells_per_rank += 2 * l->parameters[i].n_dims;
        if (__builtin_mul_overflow(cells_per_rank, n_ranks, &n_cells) ||
            n_cells > LAYOUT_MAX_ENTRIES * 2u)
                return -E2BIG;
        l->_cells = calloc(n_cells + 1, sizeof(int64_t));
        l->ranks = calloc(n_ranks + 1, sizeof(RankLayout));
        if (!l->_cells || !l->ranks)
                return -ENOMEM;

        cell = l->_cells;
        for (size_t k = 0; k < n_ranks; k++) {
                RankLayout *rl = &l->ranks[k];

                rl->slices = calloc(l->n_parameters + 1, sizeof(ShardSlice));
                if (!rl->slices)
                        return -ENOMEM;
                l->n_ranks++;
                rl->rank = spec ? spec->ranks[k] : 0;
                rl->n_slices = l->n_parameters;
                rl->device_coords = cell;
                rl->n_device_coords = n_device;
                cell += n_device;
                rl->expert_coords = cell;
                rl->n_expert_coords = n_expert;
                cell += n_expert;
                if (device)
                        unravel(device, k, rl->device_coords);
                if (expert)
                        unravel(expert, k, rl->expert_coords);
                for (size_t i = 0; i < l->n_parameters; i++) {
                        ShardSlice *s = &rl->slices[i];

                        s->parameter = i;
                        s->name = l->parameters[i].name;
                        s->n_dims = l->parameters[i].n_dims;
                        s->local_shape = cell;
                        cell += s->n_dims;
                        s->global_offset = cell;
                        cell += s->n_dims;
                }
        }
        return 0;
}

/*
 * Fills one slice's box from the rank's coordinates in the parameter's view. The ep axis splits
 * experts: the piece it splits must divide evenly over its size, else a sentence (EXPERTS_UNEVEN).
 */
static int slice_box(const ParameterLayout *p, const MeshView *view, const int64_t *target,
                     const int64_t *coords, ShardSlice *s, FamilyError *ret_error) {
        for (size_t d = 0; d < p->n_dims; d++) {
                s->global_offset[d] = 0;
                s->local_shape[d] = p->shape[d];
        }
        for (size_t k = 0; view && k < view->n; k++) {
                int64_t d = target[k], start, len;

                if (d < 0)
                        continue;
                if (streq(strempty(view->dims[k].name), LAYOUT_EXPERT_AXIS) &&
                    s->local_shape[d] % view->dims[k].size != 0)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "EXPERTS_UNEVEN", p->name,
                                                "parameter '%s': %" PRId64 " experts (dimension %" PRId64 ") do not "
                                                "divide over ep=%" PRId64 "; each ep rank must hold the same number of experts",
                                                p->name, s->local_shape[d], d, view->dims[k].size);
                chunk_piece(s->local_shape[d], view->dims[k].size, coords[k], &start, &len);
                s->global_offset[d] += start;
                s->local_shape[d] = len;
        }
        return 0;
}

int layout_compute(const Mesh *mesh, const LayoutParameter *parameters, size_t n_parameters,
                   Dtype dtype, size_t align, Layout *ret, FamilyError *ret_error) {
        _cleanup_(layout_done) Layout l = {};
        _cleanup_free_ int64_t *plan = NULL;
        const MeshView *device = mesh ? &mesh->spec.device : NULL;
        const MeshView *expert = mesh && mesh->spec.expert.n > 0 ? &mesh->spec.expert : NULL;
        size_t n_device = device ? device->n : 0, n_expert = expert ? expert->n : 0;
        uint64_t entries = 0, per_rank = 0;
        size_t n_ranks;
        int r;

        if (dtype_size(dtype) == 0 || align < LAYOUT_MIN_ALIGN || (align & (align - 1)) != 0 ||
            align > (uint64_t) INT64_MAX || (n_parameters > 0 && !parameters))
                return -EINVAL;
        n_ranks = mesh ? mesh->spec.n_ranks : 1;
        if (mesh && (n_ranks == 0 || !mesh->spec.ranks || n_device == 0 || view_product(device) != n_ranks ||
                     (expert && view_product(expert) != n_ranks)))
                return -EINVAL;
        if (n_parameters > LAYOUT_MAX_PARAMETERS)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "LAYOUT_LIMIT", NULL,
                                        "layout limit reached: %zu parameters, at most %u", n_parameters,
                                        LAYOUT_MAX_PARAMETERS);

        l.align = align;
        if (mesh) {
                l.mesh_id = strdup(strempty(mesh->id));
                if (!l.mesh_id)
                        return -ENOMEM;
        }

        l.parameters = calloc(n_parameters + 1, sizeof(ParameterLayout));
        if (!l.parameters)
                return -ENOMEM;
        per_rank = n_device + n_expert;
        for (size_t i = 0; i < n_parameters; i++) {
                r = parameter_prepare(mesh, &parameters[i], dtype, &l.parameters[i], ret_error);
                if (r < 0)
                        return r;
                l.n_parameters++;
                per_rank += 1 + l.parameters[i].n_dims;
        }
        if (__builtin_mul_overflow(per_rank, (uint64_t) n_ranks, &entries) || entries > LAYOUT_MAX_ENTRIES)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "LAYOUT_LIMIT", NULL,
                                        "layout limit reached: %zu ranks by %zu parameters exceed %u entries",
                                        n_ranks, n_parameters, LAYOUT_MAX_ENTRIES);

        /* Every number below is bounded by entries, so no product here overflows. */
        r = layout_ranks_new(&l, mesh ? &mesh->spec : NULL);
        if (r < 0)
                return r;
        plan = calloc(l.n_parameters * (n_device > n_expert ? n_device : n_expert) + 1, sizeof(int64_t));
        if (!plan)
                return -ENOMEM;
        for (size_t i = 0; i < l.n_parameters; i++) {
                const ParameterLayout *p = &l.parameters[i];

                parameter_plan(p, p->view == LAYOUT_VIEW_EXPERT ? expert : device,
                               plan + i * (n_device > n_expert ? n_device : n_expert));
        }

        for (size_t k = 0; k < n_ranks; k++) {
                RankLayout *rl = &l.ranks[k];
                uint64_t cursor = 0;
                bool any = false;

                for (size_t i = 0; i < l.n_parameters; i++) {
                        const ParameterLayout *p = &l.parameters[i];
                        bool on_expert = p->view == LAYOUT_VIEW_EXPERT;
                        ShardSlice *s = &rl->slices[i];
                        uint64_t n = 1;

                        r = slice_box(p, on_expert ? expert : device,
                                      plan + i * (n_device > n_expert ? n_device : n_expert),
                                      on_expert ? rl->expert_coords : rl->device_coords, s, ret_error);
                        if (r < 0)
                                return r;

                        /* A piece is no larger than its tensor, whose byte size fits in int64. */
                        for (size_t d = 0; d < p->n_dims; d++)
                                n *= (uint64_t) s->local_shape[d];
                        if (n == 0)
                                continue;
                        s->byte_length = n * dtype_size(p->dtype);
                        if (!align_up(cursor, align, &s->byte_offset) ||
                            __builtin_add_overflow(s->byte_offset, s->byte_length, &cursor) ||
                            cursor > (uint64_t) INT64_MAX)
                                return SHAPE_ERROR(ret_error, NULL, "rank %" PRId64 " needs more than %" PRId64 " bytes",
                                                   rl->rank, INT64_MAX);
                        any = true;
                }
                if (any && !align_up(cursor, align, &rl->size_bytes))
                        return SHAPE_ERROR(ret_error, NULL, "rank %" PRId64 " needs more than %" PRId64 " bytes",
                                           rl->rank, INT64_MAX);
                if (__builtin_add_overflow(l.total_bytes, rl->size_bytes, &l.total_bytes))
                        return SHAPE_ERROR(ret_error, NULL, "layout needs more than %" PRIu64 " bytes", UINT64_MAX);
        }

        *ret = l;
        l = (Layout) {};
        return 0;
}
