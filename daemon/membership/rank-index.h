/* rank-index.h: configured node rank -> a member's position in the table, for ranks below a bound. */
#pragma once

/*
 * DESIGN: a newcomer's rank is checked against every member's (two nodes never hold one rank),
 * and a scan of the table per newcomer made a cold start of N nodes O(N^2) per daemon. So the
 * table keeps a slot per rank below --max-nodes (grown as ranks come, at most that bound):
 * position + 1 of a member holding it, 0 for none. The index does not own the table: it reads
 * ranks through a callback (as name-index.h reads names), and the table tells it of every
 * member that comes, goes or moves. A rank at or past the bound is found by the caller's scan.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The configured rank (-1: none) of the member at `position`. */
typedef int64_t (*RankAt)(const void *userdata, size_t position);

typedef struct RankIndex {
        uint32_t *slots; /* [rank]: position + 1, 0: none */
        size_t n;        /* ranks covered: 0 to n - 1 */
        RankAt rank_at;
        const void *userdata;
} RankIndex;

void rank_index_init(RankIndex *x, RankAt rank_at, const void *userdata);
void rank_index_done(RankIndex *x);

/* Whether rank has a slot (a rank outside is found by a scan). */
bool rank_index_covers(const RankIndex *x, int64_t rank);
/* The position holding a covered rank; false when none does. */
bool rank_index_find(const RankIndex *x, int64_t rank, size_t *ret_position);

/* The member at `position` (of n_members) holds its rank now (it came, or took a record). The
 * index grows to cover it if it is below `bound`, refilled from the table; with no memory the
 * rank stays uncovered (found by a scan). */
void rank_index_put(RankIndex *x, size_t position, size_t n_members, size_t bound);
/* The member at `position` no longer holds its rank (it leaves, or takes another record):
 * another member holding the same rank, if any, takes the slot. */
void rank_index_drop(RankIndex *x, size_t position, size_t n_members);
/* The member holding `rank` moved from one position to another (the table shifted). */
void rank_index_moved(RankIndex *x, int64_t rank, size_t from, size_t to);
