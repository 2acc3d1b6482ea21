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
