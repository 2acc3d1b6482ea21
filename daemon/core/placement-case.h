/* placement-case.h: placements that depend on the job: conditions over axis sizes and flags. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "axis.h"
#include "expr.h"
#include "registry.h"

/* What a placement's conditions may name: the job's axis sizes and its two flags. */
typedef struct PlacementJob {
        int64_t axis_size[_AXIS_MAX]; /* Resolve's sizes (ep from the expert view) */
        bool sequence_parallel;
        bool loss_parallel;
} PlacementJob;

/* True for the names a condition may use: tp_size, cp_size, ep_size, pp_size (ints),
 * sequence_parallel, loss_parallel (1 or 0). */
bool placement_job_has_field(const char *name);

void placement_cases_done(PlacementCases *c);

/*
 * The case that decides: the first whose `when` is absent or evaluates to non-zero over job.
 * *ret_index is its position (from 0), or c->n when none holds (the axis is then not placed,
 * as a case `placement: none` says too). A condition that cannot be evaluated (division by
 * zero, an inexact division, overflow) returns -EINVAL with *ret_index the failing case and
 * *ret_error filled.
 */
int placement_cases_decide(const PlacementCases *c, const PlacementJob *job, size_t *ret_index,
                           ExprEvalError *ret_error);

/* Where activation_layout_decide() failed: the field, the activation, the axis and the case. */
typedef struct ActivationDecideError {
        ActivationField field;
        size_t activation;    /* from 0 */
        const char *axis;     /* borrowed from the declared layout */
        size_t case_index;    /* from 0 */
        const Expr *when;     /* the condition that failed, borrowed */
        ExprEvalError eval;
} ActivationDecideError;

/*
 * The activation layout a Build answers: a copy of the declared one with each placement that
 * depends on the job decided by its first case that holds over job (none holding, or `none`,
 * leaves the axis out of that activation). A condition that cannot be evaluated returns
 * -EINVAL with *ret_error filled.
 */
int activation_layout_decide(const ActivationLayout *declared, const PlacementJob *job,
                             ActivationLayout *ret, ActivationDecideError *ret_error);
