/* layout.h: a build's parameter layout over a mesh: per-parameter view, per-rank slices and bytes. */
#pragma once

#include <stdint.h>

#include "error.h"
#include "fill.h"
#include "mesh.h"
#include "registry.h"

/*
 * Bounds on one layout's work and memory. A layout holds, per rank, its coordinates in both views
 * and one slice per parameter with two numbers per dimension: "entries" counts
 * n_ranks * (n_device_dims + n_expert_dims + sum over parameters of (1 + rank(p))), each entry
 * at most 56 bytes, so one layout stays under about 450 MiB.
 */
#define LAYOUT_MAX_PARAMETERS 65536u
#define LAYOUT_MAX_PLACEMENTS 64u
#define LAYOUT_MAX_ENTRIES    (1u << 23)
/* Smallest alignment of a slice's byte_offset; larger ones must be powers of two. */
#define LAYOUT_MIN_ALIGN      64u
/* The mesh dimension whose shards are experts: they must divide evenly over it. */
#define LAYOUT_EXPERT_AXIS    "ep"

typedef enum LayoutView {
        LAYOUT_VIEW_DEVICE,
        LAYOUT_VIEW_EXPERT,
        _LAYOUT_VIEW_MAX,
        _LAYOUT_VIEW_INVALID = -EINVAL,
} LayoutView;

const char *layout_view_to_string(LayoutView v); /* "device" | "expert" */
LayoutView layout_view_from_string(const char *s);

/* One parameter to lay out; borrowed by layout_compute(), nothing of it is kept. */
typedef struct LayoutParameter {
        const char *name;
        const int64_t *shape; /* logical shape, each dimension >= 0 */
        size_t n_dims;        /* at most FAMILYD_MAX_SHAPE_RANK */
        const Placement *placements; /* axis names unique; shard dims in [-n_dims, n_dims) */
        size_t n_placements;
        bool has_dtype; /* false: the layout's default dtype */
        Dtype dtype;
        const char *checkpoint; /* its checkpoint names' canonical text; NULL: none */
} LayoutParameter;

/* A parameter as laid out. */
typedef struct ParameterLayout {
        char *name;
        int64_t *shape;
        size_t n_dims;
        uint64_t n_elements; /* product of shape */
        Placement *placements; /* input order; shard dims normalised to [0, n_dims), replicate 0 */
        int64_t *axis_size;    /* per placement: its axis's size in the chosen view, 1 if absent */
        size_t n_placements;
        LayoutView view;
        Dtype dtype; /* its own element type: its slices hold dtype_size(dtype) bytes per element */
        char *checkpoint; /* the registry's checkpoint names (canonical text), or NULL */
} ParameterLayout;

/*
 * One rank's piece of one parameter: the box [global_offset, global_offset + local_shape) of the
 * logical tensor, stored row-major at byte_offset of the rank's segment. An empty piece (some
 * local_shape[i] == 0) has byte_offset 0 and byte_length 0 and occupies no bytes.
 */
typedef struct ShardSlice {
        size_t parameter;      /* index into Layout.parameters */
        const char *name;      /* borrowed: Layout.parameters[parameter].name */
        int64_t *local_shape;  /* n_dims entries, owned by the Layout */
        int64_t *global_offset;
        size_t n_dims;
        uint64_t byte_offset;  /* multiple of the layout's align */
        uint64_t byte_length;  /* product(local_shape) * dtype_size(the parameter's dtype) */
} ShardSlice;

/*
 * One rank of the mesh. Its non-empty slices are packed in parameter order: each starts at the
 * end of the previous non-empty one rounded up to align (the first at 0). size_bytes is the end
 * of the last non-empty slice rounded up to align, 0 when every slice is empty.
 */
typedef struct RankLayout {
        int64_t rank;           /* global rank id, mesh->spec.ranks[i] */
        int64_t *device_coords; /* position unravelled row-major over the device view */
        size_t n_device_coords;
        int64_t *expert_coords; /* over the expert view; none without one */
        size_t n_expert_coords;
        ShardSlice *slices;     /* one per parameter, in parameter order */
        size_t n_slices;
        uint64_t size_bytes;
} RankLayout;

typedef struct Layout {
        char *mesh_id; /* NULL without a mesh */
        size_t align;
        ParameterLayout *parameters;
        size_t n_parameters;
        RankLayout *ranks; /* in the mesh's rank-list order; one rank 0 without a mesh */
        size_t n_ranks;
        uint64_t total_bytes; /* sum of size_bytes over the ranks */
        /* private: backing store of every slice's local_shape and global_offset */
        int64_t *_cells;
} Layout;

/*
 * Makes l's ranks for the parameters l already has: one RankLayout per rank of spec (NULL: one
 * rank 0), its device and expert coordinates unravelled row-major over the views, one slice per
 * parameter with its index, name and dimensions, and room for its local shape and global offset
 * (zeros; byte offsets and sizes zero too). Used by layout_compute() and by the decoder of kept
 * build records. -E2BIG past LAYOUT_MAX_ENTRIES * 2 cells; -ENOMEM.
 */
int layout_ranks_new(Layout *l, const MeshSpec *spec);

/*
 * Step 5 of Build in docs/semantics.md. mesh NULL means no mesh: one rank 0 holding every tensor
 * whole (coordinates empty, every placement's axis of size 1). A parameter is laid out on the
 * expert view when one of its placement axes is a dimension of the expert view and not of the
 * device view, else on the device view; an axis that view lacks has size 1. shard(d) over an axis
 * of size n splits a piece of length L like torch.chunk: chunk = ceil(L / n), the piece at
 * coordinate c is [min(L, c * chunk), min(L, (c + 1) * chunk)); axes sharding the same dim nest
 * in the view's dimension order. The axis named LAYOUT_EXPERT_AXIS splits experts: every piece it
 * splits must be a multiple of its size (checked rank by rank, in rank order).
 *
 * Each parameter has its own dtype: its LayoutParameter's when has_dtype, else dtype (the build's);
 * its slices' byte lengths count that dtype's element size, and every slice of any size starts at
 * a multiple of align. Every dtype valid; align a power of two >= LAYOUT_MIN_ALIGN (else -EINVAL,
 * ret_error untouched).
 * User-facing failures fill ret_error and return -EINVAL: INVALID_ARGUMENT "SHAPE" (field: the
 * parameter) for a negative dimension, more than FAMILYD_MAX_SHAPE_RANK dimensions or
 * LAYOUT_MAX_PLACEMENTS placements, a shard dim out of range, an axis placed twice, or a size
 * that does not fit in int64 bytes (a parameter's tensor, or a rank's segment: field NULL);
 * INVALID_ARGUMENT "EXPERTS_UNEVEN" (field: the parameter) for experts that do not divide over ep;
 * RESOURCE_EXHAUSTED "LAYOUT_LIMIT" past LAYOUT_MAX_PARAMETERS or LAYOUT_MAX_ENTRIES.
 * On success *ret (previously uninitialised) holds the layout; release it with layout_done().
 */
int layout_compute(const Mesh *mesh, const LayoutParameter *parameters, size_t n_parameters,
                   Dtype dtype, size_t align, Layout *ret, FamilyError *ret_error);

void layout_done(Layout *l);

/* The rank with global id rank, or NULL. */
const RankLayout *layout_find_rank(const Layout *l, int64_t rank);
