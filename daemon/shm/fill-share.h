/* fill-share.h: equal host fills computed once: a fill that finds an equal one under way copies it. */
#pragma once

/*
 * DESIGN: a fill's bytes are a pure function of its slices (core/fill.h: init, seed, name hash,
 * dtype, shape, the slice's place in it, and where each slice goes in the segment), so two
 * fills with equal slices write equal bytes. That happens whenever ranks hold the same shards:
 * the dp replicas of a job whose processes each ask for a training handout of their own rank
 * (private builds), at about the same time. The first such fill (the leader) registers its
 * slices and fills as before; a fill with equal slices that arrives while the leader runs (a
 * follower) waits for it and copies the leader's slices into its own segment, which costs a
 * copy instead of the generator's arithmetic. The leader keeps its mapping and does not return
 * before every follower has copied: its segment goes to no client before that, so the bytes
 * copied are the fill's. A leader that fails (cancelled) sets its followers filling
 * themselves. A fill that arrives after the leader returned fills on its own: nothing is kept
 * once a fill is done, so this costs no memory.
 *
 * Only host segments (the caller's choice); slices are compared field by field, never by a
 * digest. Thread safety: any thread; one mutex and one condition variable.
 */

#include "materialize.h"

typedef struct FillShare FillShare;

int fill_share_new(FillShare **ret);
/* No fill may be running through it. Accepts NULL. */
FillShare *fill_share_free(FillShare *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(FillShare *, fill_share_free);

/* What fill_share_host_fill() did, on success. */
typedef enum FillShareOutcome {
        FILL_SHARE_FILLED,
        FILL_SHARE_COPIED,
        _FILL_SHARE_OUTCOME_MAX,
        _FILL_SHARE_OUTCOME_INVALID = -EINVAL,
} FillShareOutcome;

/*
 * materialize_host_fill(seg, slices, n), or a copy of an equal fill under way (the progress of
 * the calling thread's fill binding grows by the bytes copied; its cancelled() is asked while
 * waiting: -ECANCELED). s NULL: a plain fill. Returns a FillShareOutcome, or
 * materialize_host_fill()'s errors.
 */
int fill_share_host_fill(FillShare *s, ShardSegment *seg, const MaterializeSlice *slices, size_t n);

/* Followers waiting for a leader now (for tests: a leader holds its fill until one waits). */
unsigned fill_share_waiting(FillShare *s);
