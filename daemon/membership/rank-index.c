/* rank-index.c: configured node rank -> a member's position in the table, for ranks below a bound. */

#include <stdlib.h>

#include "common/macro.h"
#include "rank-index.h"

void rank_index_init(RankIndex *x, RankAt rank_at, const void *userdata) {
        *x = (RankIndex) { .rank_at = rank_at, .userdata = userdata };
}

void rank_index_done(RankIndex *x) {
        free(x->slots);
        x->slots = NULL;
        x->n = 0;
}

bool rank_index_covers(const RankIndex *x, int64_t rank) {
        return rank >= 0 && (uint64_t) rank < x->n;
}

bool rank_index_find(const RankIndex *x, int64_t rank, size_t *ret_position) {
        if (!rank_index_covers(x, rank) || x->slots[rank] == 0)
                return false;
        *ret_position = x->slots[rank] - 1;
        return true;
}

void rank_index_put(RankIndex *x, size_t position, size_t n_members, size_t bound) {
        int64_t rank = x->rank_at(x->userdata, position);

        if (rank < 0)
                return;
        if ((uint64_t) rank >= x->n && (uint64_t) rank < bound) {
                /* Grown, then filled from the table: every rank below n is indexed. */
                size_t n = MIN(MAX((size_t) rank + 1, 2 * x->n), bound);
                uint32_t *grown = calloc(n, sizeof(uint32_t));
                if (!grown)
                        return;
                free(x->slots);
                x->slots = grown;
                x->n = n;
                for (size_t j = 0; j < n_members; j++) {
                        int64_t r = x->rank_at(x->userdata, j);
                        if (rank_index_covers(x, r) && !x->slots[r])
                                x->slots[r] = (uint32_t) j + 1;
                }
        }
        if (rank_index_covers(x, rank) && !x->slots[rank])
                x->slots[rank] = (uint32_t) position + 1;
}

void rank_index_drop(RankIndex *x, size_t position, size_t n_members) {
        int64_t rank = x->rank_at(x->userdata, position);

        if (!rank_index_covers(x, rank) || x->slots[rank] != position + 1)
                return;
        x->slots[rank] = 0;
        for (size_t j = 0; j < n_members; j++)
                if (j != position && x->rank_at(x->userdata, j) == rank) {
                        x->slots[rank] = (uint32_t) j + 1;
                        break;
                }
}

void rank_index_moved(RankIndex *x, int64_t rank, size_t from, size_t to) {
        if (rank_index_covers(x, rank) && x->slots[rank] == from + 1)
                x->slots[rank] = (uint32_t) to + 1;
}
