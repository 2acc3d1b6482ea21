/* validate.c: the checks of Validate, every violation collected in request order. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "fill.h"
#include "repr.h"
#include "validate.h"

void model_boundary_done(ModelBoundary *b) {
        if (!b)
                return;
        for (size_t i = 0; i < b->n_fqns; i++)
                free(b->fqns[i]);
        free(b->fqns);
        free(b->build_id);
        free(b->layout.mesh_id);
        for (size_t i = 0; i < b->layout.n_parameters; i++) {
                ValidateParameter *p = &b->layout.parameters[i];
                free(p->name);
                free(p->shape);
                for (size_t j = 0; j < p->n_placements; j++)
                        free(p->placements[j].axis);
                free(p->placements);
                free(p->dtype);
        }
        free(b->layout.parameters);
        *b = (ModelBoundary) {};
}

void violation_list_done(ViolationList *l) {
        if (!l)
                return;
        for (size_t i = 0; i < l->n; i++) {
                for (size_t j = 0; j < l->items[i].n_fqns; j++)
                        free(l->items[i].fqns[j]);
                free(l->items[i].fqns);
                free(l->items[i].message);
        }
        free(l->items);
        *l = (ViolationList) {};
}

static int violation_add(ViolationList *l, const ModelBoundary *b, const char *reason,
                         const char *format, ...) _printf_(4, 5);

static int violation_add(ViolationList *l, const ModelBoundary *b, const char *reason,
                         const char *format, ...) {
        Violation v = { .reason = reason };
        va_list ap;

        va_start(ap, format);
        int k = vasprintf(&v.message, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;

        if (b->n_fqns > 0) {
                v.fqns = calloc(b->n_fqns, sizeof(char *));
                if (!v.fqns)
                        goto oom;
        }
        for (size_t i = 0; i < b->n_fqns; i++) {
                v.fqns[i] = strdup(b->fqns[i]);
                if (!v.fqns[i])
                        goto oom;
                v.n_fqns++;
        }
        if (!GREEDY_REALLOC(l->items, l->allocated, l->n + 1))
                goto oom;
        l->items[l->n++] = v;
        return 0;
oom:
        for (size_t i = 0; i < v.n_fqns; i++)
                free(v.fqns[i]);
        free(v.fqns);
        free(v.message);
        return -ENOMEM;
}

static const ValidateParameter *find_parameter(const ValidateParameter *p, size_t n,
                                               const char *name) {
        for (size_t i = 0; i < n; i++)
                if (streq(p[i].name, name))
                        return &p[i];
        return NULL;
}

static bool shapes_equal(const ValidateParameter *a, const ValidateParameter *b) {
        return a->n_dims == b->n_dims &&
               (a->n_dims == 0 || memcmp(a->shape, b->shape, a->n_dims * sizeof(int64_t)) == 0);
}

/* Placement i of p as (axis, kind, non-negative dim); replicate entries do not count. */
static int64_t placement_dim(const Placement *pl, size_t n_dims) {
        return pl->dim < 0 ? pl->dim + (int64_t) n_dims : pl->dim;
}

static bool placement_in(const Placement *pl, size_t pl_dims, const ValidateParameter *q) {
        for (size_t i = 0; i < q->n_placements; i++) {
                const Placement *x = &q->placements[i];
                if (x->kind == PLACEMENT_REPLICATE || !streq(x->axis, pl->axis))
                        continue;
                if (placement_dim(x, q->n_dims) == placement_dim(pl, pl_dims))
                        return true;
        }
        return false;
}

static size_t count_shards(const ValidateParameter *p) {
        size_t n = 0;
        for (size_t i = 0; i < p->n_placements; i++)
                n += p->placements[i].kind == PLACEMENT_SHARD;
        return n;
}

/* Compared as sets of (axis, kind, dim): every shard of one is in the other, same count
 * (duplicates are refused where layouts are made). */
static bool placements_equal(const ValidateParameter *applied, const ValidateParameter *built) {
        if (count_shards(applied) != count_shards(built))
                return false;
        for (size_t i = 0; i < applied->n_placements; i++) {
                const Placement *pl = &applied->placements[i];
                if (pl->kind == PLACEMENT_REPLICATE)
                        continue;
                if (!placement_in(pl, applied->n_dims, built))
                        return false;
        }
        return true;
}

/* A parameter's applied dtype against that parameter's own dtype in the build (a build's
 * parameters need not share one), compared by canonical name when both state one. */
static bool dtypes_equal(const ValidateParameter *applied, const ValidateParameter *built) {
        if (isempty(applied->dtype) || isempty(built->dtype))
                return true;
        return dtype_from_string(applied->dtype) == dtype_from_string(built->dtype);
}

static bool layout_conflicts(const AppliedLayout *applied, const BuiltFamily *built) {
        for (size_t i = 0; i < applied->n_parameters; i++) {
                const ValidateParameter *a = &applied->parameters[i];
                const ValidateParameter *b = find_parameter(built->parameters,
                                                            built->n_parameters, a->name);
                if (!b || !placements_equal(a, b) || !dtypes_equal(a, b))
                        return true;
        }
        return false;
}

/* One applied parameter of one boundary, for finding shared parameters by sorting. */
typedef struct SharedRef {
        const char *build_id;
        const ValidateParameter *parameter;
        size_t boundary;
        size_t flat; /* index into the conflict flags */
} SharedRef;

static int shared_ref_cmp(const void *x, const void *y) {
        const SharedRef *a = x, *b = y;
        int c = strcmp(a->build_id, b->build_id);
        if (c == 0)
                c = strcmp(a->parameter->name, b->parameter->name);
        if (c == 0)
                c = a->boundary < b->boundary ? -1 : a->boundary > b->boundary;
        return c;
}

/*
 * One build listed in several boundaries shares its parameters: a parameter whose applied
 * shape differs from the first one seen for that build is flagged (at the later boundary).
 * Sorting keeps this O(n log n) in the boundaries; *ret_flags is indexed like the boundaries'
 * applied parameters laid end to end.
 */
static int shared_conflicts(const ModelBoundary *all, size_t n, bool **ret_flags) {
        _cleanup_free_ SharedRef *refs = NULL;
        _cleanup_free_ bool *flags = NULL;
        size_t total = 0, k = 0;

        for (size_t i = 0; i < n; i++)
                if (all[i].has_layout)
                        total += all[i].layout.n_parameters;
        flags = calloc(total ? total : 1, sizeof(bool));
        refs = calloc(total ? total : 1, sizeof(SharedRef));
        if (!flags || !refs)
                return -ENOMEM;

        for (size_t i = 0, flat = 0; i < n; i++) {
                if (!all[i].has_layout)
                        continue;
                for (size_t j = 0; j < all[i].layout.n_parameters; j++, flat++)
                        refs[k++] = (SharedRef) {
                                .build_id = strempty(all[i].build_id),
                                .parameter = &all[i].layout.parameters[j],
                                .boundary = i,
                                .flat = flat,
                        };
        }
        qsort(refs, total, sizeof(SharedRef), shared_ref_cmp);

        for (size_t i = 0; i < total;) {
                size_t j = i + 1;
                while (j < total && streq(refs[j].build_id, refs[i].build_id) &&
                       streq(refs[j].parameter->name, refs[i].parameter->name)) {
                        if (refs[j].boundary != refs[i].boundary &&
                            !shapes_equal(refs[j].parameter, refs[i].parameter))
                                flags[refs[j].flat] = true;
                        j++;
                }
                i = j;
        }

        *ret_flags = TAKE_PTR(flags);
        return 0;
}

static int validate_boundary(const ModelBoundary *all, size_t index, const bool *shared_flags,
                             const ValidateJob *job, ValidateLookup lookup, void *userdata,
                             ViolationList *l) {
        const ModelBoundary *b = &all[index];
        BuiltFamily built;
        int r;

        r = lookup(strempty(b->build_id), &built, userdata);
        if (r < 0)
                return r;
        if (r > 0) {
                _cleanup_free_ char *q = repr_string(strempty(b->build_id));
                if (!q)
                        return -ENOMEM;
                return violation_add(l, b, "UNKNOWN_BUILD", "build %s not found", q);
        }

        if (built.mesh_id) {
                if (!isempty(job->mesh_id) && !streq(job->mesh_id, built.mesh_id)) {
                        r = violation_add(l, b, "MESH_MISMATCH",
                                          "context and mesh belong to different jobs");
                        if (r < 0)
                                return r;
                }
                for (Axis a = 0; a < _AXIS_MAX; a++)
                        if (job->has_size[a] && job->context_size[a] != built.mesh_axis_size[a]) {
                                r = violation_add(l, b, "CONTEXT_MESH_DISAGREE",
                                                  "context and mesh disagree on %s_size",
                                                  axis_to_string(a));
                                if (r < 0)
                                        return r;
                        }
                if (b->has_layout && !isempty(b->layout.mesh_id) &&
                    !streq(b->layout.mesh_id, built.mesh_id)) {
                        r = violation_add(l, b, "LAYOUT_MESH_MISMATCH",
                                          "constructed families cannot be applied with a "
                                          "different job mesh");
                        if (r < 0)
                                return r;
                }
        }

        static const Axis checked[] = { AXIS_CP, AXIS_EP };
        for (size_t i = 0; i < ELEMENTSOF(checked); i++) {
                Axis a = checked[i];
                if (built.axis_size[a] == job->size[a])
                        continue;
                _cleanup_free_ char *t = repr_string_tuple(b->fqns, b->n_fqns);
                if (!t)
                        return -ENOMEM;
                r = violation_add(l, b, "AXIS_SIZE_MISMATCH",
                                  "family at %s was constructed with %s=%" PRId64
                                  ", job requires %" PRId64
                                  "; call prepare_model_components with the job context "
                                  "before layout",
                                  t, axis_to_string(a), built.axis_size[a], job->size[a]);
                if (r < 0)
                        return r;
        }

        if (!b->has_layout)
                return 0;

        for (size_t i = 0; i < b->layout.n_parameters; i++) {
                const ValidateParameter *p = &b->layout.parameters[i];
                if (!shared_flags[i])
                        continue;
                _cleanup_free_ char *q = repr_string(p->name);
                if (!q)
                        return -ENOMEM;
                r = violation_add(l, b, "SHARED_PARAMETER_SHAPE",
                                  "shared family parameter %s has conflicting logical shapes", q);
                if (r < 0)
                        return r;
        }

        if (layout_conflicts(&b->layout, &built)) {
                _cleanup_free_ char *q = repr_string(b->n_fqns > 0 ? b->fqns[0] : "");
                if (!q)
                        return -ENOMEM;
                r = violation_add(l, b, "LAYOUT_CONFLICT",
                                  "layout at %s conflicts with its constructed family layout", q);
                if (r < 0)
                        return r;
        }
        return 0;
}

int validate_model(const ModelBoundary *boundaries, size_t n, const ValidateJob *job,
                   ValidateLookup lookup, void *userdata, ViolationList *ret) {
        _cleanup_(violation_list_done) ViolationList l = {};
        _cleanup_free_ bool *shared = NULL;
        size_t flat = 0;
        int r;

        r = shared_conflicts(boundaries, n, &shared);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                r = validate_boundary(boundaries, i, shared + flat, job, lookup, userdata, &l);
                if (r < 0)
                        return r;
                if (boundaries[i].has_layout)
                        flat += boundaries[i].layout.n_parameters;
        }
        *ret = l;
        l = (ViolationList) {};
        return 0;
}
