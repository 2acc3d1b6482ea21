/* placement-case.c: placements that depend on the job: which case decides an axis's placement. */
#include "placement-case.h"

static const char *const flag_names[] = { "sequence_parallel", "loss_parallel" };

/* "tp_size" -> AXIS_TP; _AXIS_INVALID for any other name. */
static Axis size_field_axis(const char *name) {
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                const char *axis = axis_to_string(a);
                size_t n = strlen(axis);

                if (strncmp(name, axis, n) == 0 && streq(name + n, "_size"))
                        return a;
        }
        return _AXIS_INVALID;
}

bool placement_job_has_field(const char *name) {
        if (!name)
                return false;
        if (size_field_axis(name) >= 0)
                return true;
        for (size_t i = 0; i < ELEMENTSOF(flag_names); i++)
                if (streq(name, flag_names[i]))
                        return true;
        return false;
}

static int job_lookup(const char *name, int64_t *ret, void *userdata) {
        const PlacementJob *job = userdata;
        Axis a = size_field_axis(name);

        if (a >= 0) {
                *ret = job->axis_size[a];
                return 0;
        }
        if (streq(name, "sequence_parallel")) {
                *ret = job->sequence_parallel;
                return 0;
        }
        if (streq(name, "loss_parallel")) {
                *ret = job->loss_parallel;
                return 0;
        }
        return -ENOENT;
}

void placement_cases_done(PlacementCases *c) {
        if (!c)
                return;
        for (size_t i = 0; i < c->n; i++)
                expr_free(c->items[i].when);
        free(c->items);
        *c = (PlacementCases) {};
}

int placement_cases_decide(const PlacementCases *c, const PlacementJob *job, size_t *ret_index,
                           ExprEvalError *ret_error) {
        int64_t v;
        int r;

        if (!c || !job || !ret_index)
                return -EINVAL;
        for (size_t i = 0; i < c->n; i++) {
                if (!c->items[i].when) {
                        *ret_index = i;
                        return 0;
                }
                r = expr_eval(c->items[i].when, job_lookup, (void *) job, &v, ret_error);
                if (r < 0) {
                        *ret_index = i;
                        return r;
                }
                if (v != 0) {
                        *ret_index = i;
                        return 0;
                }
        }
        *ret_index = c->n;
        return 0;
}

/* The cases of one activation placement, as placement_cases_decide() tries a parameter's. */
static int activation_case_decide(const ActivationPlacement *p, const PlacementJob *job, size_t *ret_index,
                                  ExprEvalError *ret_error) {
        int64_t v;
        int r;

        for (size_t i = 0; i < p->n_cases; i++) {
                if (!p->cases[i].when) {
                        *ret_index = i;
                        return 0;
                }
                r = expr_eval(p->cases[i].when, job_lookup, (void *) job, &v, ret_error);
                if (r < 0) {
                        *ret_index = i;
                        return r;
                }
                if (v != 0) {
                        *ret_index = i;
                        return 0;
                }
        }
        *ret_index = p->n_cases;
        return 0;
}

/* Frees placements [from, n) of a and keeps the first `keep` (an early return while deciding). */
static void activation_truncate(Activation *a, size_t keep, size_t from) {
        for (size_t j = from; j < a->n_placements; j++) {
                free(a->placements[j].axis);
                free(a->placements[j].kind);
        }
        a->n_placements = keep;
}

int activation_layout_decide(const ActivationLayout *declared, const PlacementJob *job,
                             ActivationLayout *ret, ActivationDecideError *ret_error) {
        _cleanup_(activation_layout_done) ActivationLayout l = {};
        int r;

        if (!declared || !job || !ret)
                return -EINVAL;
        r = activation_layout_copy(declared, &l);
        if (r < 0)
                return r;
        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++)
                for (size_t i = 0; i < l.n_lists[f]; i++) {
                        const Activation *from = &declared->lists[f][i];
                        Activation *to = &l.lists[f][i];
                        size_t keep = 0;

                        for (size_t j = 0; j < to->n_placements; j++) {
                                const ActivationPlacement *p = &from->placements[j];
                                ActivationPlacement q = to->placements[j];
                                ExprEvalError err = {};
                                char *kind;
                                size_t k;

                                if (p->n_cases > 0) {
                                        r = activation_case_decide(p, job, &k, &err);
                                        if (r == -EINVAL && ret_error)
                                                *ret_error = (ActivationDecideError) {
                                                        .field = f, .activation = i, .axis = p->axis,
                                                        .case_index = k, .when = p->cases[k].when, .eval = err,
                                                };
                                        if (r < 0) {
                                                activation_truncate(to, keep, j);
                                                return r;
                                        }
                                        if (k == p->n_cases || !p->cases[k].kind) {
                                                free(q.axis);
                                                free(q.kind);
                                                continue;
                                        }
                                        kind = strdup(p->cases[k].kind);
                                        if (!kind) {
                                                activation_truncate(to, keep, j);
                                                return -ENOMEM;
                                        }
                                        free(q.kind);
                                        q.kind = kind;
                                        q.dim = streq(kind, "shard") ? p->cases[k].dim : 0;
                                }
                                to->placements[keep++] = q;
                        }
                        to->n_placements = keep;
                }
        *ret = l;
        l = (ActivationLayout) {};
        return 0;
}
