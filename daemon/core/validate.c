/* validate.c: the checks of Validate, every violation collected in request order. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "fill.h"
#include "resource-limits.h"
#include "repr.h"
#include "validate.h"

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

/* The fqns a violation names: a boundary's, or the two uses of a shared parameter compared. */
typedef struct FqnList {
        char *const *items;
        size_t n;
} FqnList;

static FqnList boundary_fqns(const ModelBoundary *b) {
        return (FqnList) { .items = b->fqns, .n = b->n_fqns };
}

static int violation_add(ViolationList *l, FqnList fqns, const char *reason, const char *format,
                         ...) _printf_(4, 5);

static int violation_add(ViolationList *l, FqnList fqns, const char *reason, const char *format,
                         ...) {
        Violation v = { .reason = reason };
        va_list ap;

        va_start(ap, format);
        int k = vasprintf(&v.message, format, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;

        if (fqns.n > 0) {
                v.fqns = calloc(fqns.n, sizeof(char *));
                if (!v.fqns)
                        goto oom;
        }
        for (size_t i = 0; i < fqns.n; i++) {
                v.fqns[i] = strdup(fqns.items[i]);
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

/* A build's parameter by name; by bisection when sorted, as a model may name each of a large
 * build's parameters (65,536 at most) many times. */
static const ValidateParameter *find_parameter(const BuiltFamily *built, const char *name) {
        const ValidateParameter *p = built->parameters;

        if (!built->sorted) {
                for (size_t i = 0; i < built->n_parameters; i++)
                        if (streq(p[i].name, name))
                                return &p[i];
                return NULL;
        }
        size_t lo = 0, hi = built->n_parameters;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = strcmp(name, p[mid].name);
                if (c == 0)
                        return &p[mid];
                if (c < 0)
                        hi = mid;
                else
                        lo = mid + 1;
        }
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
                const ValidateParameter *b = find_parameter(built, a->name);
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
        FqnList f = boundary_fqns(b);
        BuiltFamily built;
        int r;

        r = lookup(strempty(b->build_id), &built, userdata);
        if (r < 0)
                return r;
        if (r > 0) {
                _cleanup_free_ char *q = repr_string(strempty(b->build_id));
                if (!q)
                        return -ENOMEM;
                return violation_add(l, f, "UNKNOWN_BUILD", "build %s not found", q);
        }

        if (built.mesh_id) {
                if (!isempty(job->mesh_id) && !streq(job->mesh_id, built.mesh_id)) {
                        r = violation_add(l, f, "MESH_MISMATCH",
                                          "context and mesh belong to different jobs");
                        if (r < 0)
                                return r;
                }
                for (Axis a = 0; a < _AXIS_MAX; a++)
                        if (job->has_size[a] && job->context_size[a] != built.mesh_axis_size[a]) {
                                r = violation_add(l, f, "CONTEXT_MESH_DISAGREE",
                                                  "context and mesh disagree on %s_size",
                                                  axis_to_string(a));
                                if (r < 0)
                                        return r;
                        }
                if (b->has_layout && !isempty(b->layout.mesh_id) &&
                    !streq(b->layout.mesh_id, built.mesh_id)) {
                        r = violation_add(l, f, "LAYOUT_MESH_MISMATCH",
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
                r = violation_add(l, f, "AXIS_SIZE_MISMATCH",
                                  "family at %s was constructed with %s=%" PRId64
                                  ", job requires %" PRId64
                                  "; build it again on the job's mesh "
                                  "(familyd.torch.build_module with mesh=)",
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
                r = violation_add(l, f, "SHARED_PARAMETER_SHAPE",
                                  "shared family parameter %s has conflicting logical shapes", q);
                if (r < 0)
                        return r;
        }

        if (layout_conflicts(&b->layout, &built)) {
                _cleanup_free_ char *q = repr_string(b->n_fqns > 0 ? b->fqns[0] : "");
                if (!q)
                        return -ENOMEM;
                r = violation_add(l, f, "LAYOUT_CONFLICT",
                                  "layout at %s conflicts with its constructed family layout", q);
                if (r < 0)
                        return r;
        }

        /* The activation layout the model applies, field by field, against the constructed one
         * (none declared: empty). */
        if (b->layout.has_activations) {
                static const ActivationLayout none = {};
                const ActivationLayout *built_act = built.activations ?: &none;

                for (ActivationField a = 0; a < _ACTIVATION_FIELD_MAX; a++) {
                        if (activation_layout_field_equal(&b->layout.activations, built_act, a))
                                continue;
                        _cleanup_free_ char *q = repr_string(b->n_fqns > 0 ? b->fqns[0] : "");
                        if (!q)
                                return -ENOMEM;
                        r = violation_add(l, f, "ACTIVATION_LAYOUT_CONFLICT",
                                          "%s at %s conflicts with its constructed family layout",
                                          activation_field_to_string(a), q);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

/* Shared parameters: the request's list well formed (INVALID_ARGUMENT for the whole call). */
static int shared_field_check(const char *value, const char *field, size_t max,
                              FamilyError *ret_error) {
        if (isempty(value))
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                        field, "%s is required", field);
        if (strnlen(value, max + 1) > max)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", field,
                                        "%s is longer than %zu bytes", field, max);
        return 0;
}

int validate_shared_check(const SharedParameter *shared, size_t n, FamilyError *ret_error) {
        int r;

        if (n > FAMILYD_MAX_SHARED_PARAMETERS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "shared_parameters",
                                        "shared_parameters has more than %u entries",
                                        FAMILYD_MAX_SHARED_PARAMETERS);
        for (size_t i = 0; i < n; i++) {
                const SharedParameter *s = &shared[i];
                if (s->n_uses > FAMILYD_MAX_SHARED_PARAMETER_USES)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                                "shared_parameters.uses",
                                                "a shared parameter has more than %u uses",
                                                FAMILYD_MAX_SHARED_PARAMETER_USES);
                if (s->n_uses < 2)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "BAD_REQUEST", "shared_parameters.uses",
                                                "a shared parameter has fewer than two uses");
                for (size_t j = 0; j < s->n_uses; j++) {
                        const SharedParameterUse *u = &s->uses[j];
                        r = shared_field_check(u->fqn, "shared_parameters.uses.fqn",
                                               FAMILYD_MAX_NAME_LENGTH * 4, ret_error);
                        if (r < 0)
                                return r;
                        r = shared_field_check(u->build_id, "shared_parameters.uses.build_id",
                                               FAMILYD_MAX_NAME_LENGTH, ret_error);
                        if (r < 0)
                                return r;
                        r = shared_field_check(u->parameter, "shared_parameters.uses.parameter",
                                               FAMILYD_MAX_NAME_LENGTH, ret_error);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

/* A build's shard placements as (axis, dim) tuples in its order: [('tp', 0)], [] replicated. */
static char *repr_shards(const ValidateParameter *p) {
        _cleanup_free_ char *out = strdup("[");
        bool first = true;

        if (!out)
                return NULL;
        for (size_t i = 0; i < p->n_placements; i++) {
                const Placement *pl = &p->placements[i];
                if (pl->kind == PLACEMENT_REPLICATE)
                        continue;
                _cleanup_free_ char *axis = repr_string(strempty(pl->axis));
                char *next = NULL;
                if (!axis || asprintf(&next, "%s%s(%s, %" PRId64 ")", out, first ? "" : ", ",
                                      axis, placement_dim(pl, p->n_dims)) < 0)
                        return NULL;
                free(out);
                out = next;
                first = false;
        }
        char *done = NULL;
        if (asprintf(&done, "%s]", out) < 0)
                return NULL;
        return done;
}

/*
 * The build's parameter of one use: 1 and *ret when found, 0 when the build is unknown or has
 * no parameter of that name (a violation naming the first use and, unless it is the first, this
 * one), negative errno for OOM.
 */
static int shared_use_find(const SharedParameterUse *first, const SharedParameterUse *use,
                           ValidateLookup lookup, void *userdata, ViolationList *l,
                           const ValidateParameter **ret) {
        char *items[] = { first->fqn, use->fqn };
        FqnList f = { .items = items, .n = use == first ? 1 : 2 };
        BuiltFamily built;
        int r;

        r = lookup(use->build_id, &built, userdata);
        if (r < 0)
                return r;
        _cleanup_free_ char *q = repr_string(use->fqn), *id = repr_string(use->build_id);
        if (!q || !id)
                return -ENOMEM;
        if (r > 0) {
                r = violation_add(l, f, "SHARED_PARAMETER_CONFLICT",
                                  "shared parameter %s is in build %s, which is not found", q, id);
                return r < 0 ? r : 0;
        }
        const ValidateParameter *p = find_parameter(&built, use->parameter);
        if (!p) {
                _cleanup_free_ char *name = repr_string(use->parameter);
                if (!name)
                        return -ENOMEM;
                r = violation_add(l, f, "SHARED_PARAMETER_CONFLICT",
                                  "shared parameter %s is not a parameter %s of build %s", q,
                                  name, id);
                return r < 0 ? r : 0;
        }
        *ret = p;
        return 1;
}

/* One later use against the first: shape, placements, then dtype, each its own violation. */
static int shared_use_compare(const SharedParameterUse *first, const ValidateParameter *a,
                              const SharedParameterUse *use, const ValidateParameter *b,
                              ViolationList *l) {
        char *items[] = { first->fqn, use->fqn };
        FqnList f = { .items = items, .n = 2 };
        _cleanup_free_ char *q = repr_string(use->fqn), *q0 = repr_string(first->fqn);
        int r;

        if (!q || !q0)
                return -ENOMEM;
        if (!shapes_equal(a, b)) {
                _cleanup_free_ char *s = repr_int_list(b->shape, b->n_dims),
                                    *s0 = repr_int_list(a->shape, a->n_dims);
                if (!s || !s0)
                        return -ENOMEM;
                r = violation_add(l, f, "SHARED_PARAMETER_CONFLICT",
                                  "shared parameter %s has shape %s but %s has %s", q, s, q0, s0);
                if (r < 0)
                        return r;
        }
        if (!placements_equal(b, a)) {
                _cleanup_free_ char *s = repr_shards(b), *s0 = repr_shards(a);
                if (!s || !s0)
                        return -ENOMEM;
                r = violation_add(l, f, "SHARED_PARAMETER_CONFLICT",
                                  "shared parameter %s has placements %s but %s has %s", q, s,
                                  q0, s0);
                if (r < 0)
                        return r;
        }
        if (!dtypes_equal(b, a)) {
                _cleanup_free_ char *s = repr_string(b->dtype), *s0 = repr_string(a->dtype);
                if (!s || !s0)
                        return -ENOMEM;
                r = violation_add(l, f, "SHARED_PARAMETER_CONFLICT",
                                  "shared parameter %s has dtype %s but %s has %s", q, s, q0, s0);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Step 6: each use of a shared parameter against its first use; an unknown first use is
 * reported once and the rest of that shared parameter is skipped. */
static int validate_shared(const SharedParameter *s, ValidateLookup lookup, void *userdata,
                           ViolationList *l) {
        const SharedParameterUse *first = &s->uses[0];
        const ValidateParameter *a = NULL;
        int r;

        r = shared_use_find(first, first, lookup, userdata, l, &a);
        if (r <= 0)
                return r;
        for (size_t i = 1; i < s->n_uses; i++) {
                const ValidateParameter *b = NULL;
                r = shared_use_find(first, &s->uses[i], lookup, userdata, l, &b);
                if (r < 0)
                        return r;
                if (r == 0)
                        continue;
                r = shared_use_compare(first, a, &s->uses[i], b, l);
                if (r < 0)
                        return r;
        }
        return 0;
}

int validate_model(const ModelBoundary *boundaries, size_t n, const SharedParameter *shared,
                   size_t n_shared, const ValidateJob *job, ValidateLookup lookup, void *userdata,
                   ViolationList *ret) {
        _cleanup_(violation_list_done) ViolationList l = {};
        _cleanup_free_ bool *shapes = NULL;
        size_t flat = 0;
        int r;

        r = shared_conflicts(boundaries, n, &shapes);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                r = validate_boundary(boundaries, i, shapes + flat, job, lookup, userdata, &l);
                if (r < 0)
                        return r;
                if (boundaries[i].has_layout)
                        flat += boundaries[i].layout.n_parameters;
        }
        for (size_t i = 0; i < n_shared; i++) {
                r = validate_shared(&shared[i], lookup, userdata, &l);
                if (r < 0)
                        return r;
        }
        *ret = l;
        l = (ViolationList) {};
        return 0;
}
