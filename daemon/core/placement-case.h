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
