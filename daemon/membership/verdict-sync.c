/* verdict-sync.c: swim's pull of verdicts: when a daemon asks a member for them, and which it answers with. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "verdict-sync.h"
#include "core/resource-limits.h"

bool verdict_pull_due(VerdictPull *v, uint64_t ours, uint64_t theirs, int64_t now_ms,
                      unsigned heartbeat_ms, unsigned rounds) {
        int64_t wait, paced, longest;
        bool fruitless;

        if (theirs == 0)
                return false;
        if (theirs == ours) {
                v->differs = false;
                return false;
        }
        if (!v->differs) {
                v->differs = true;
                v->differs_since_ms = now_ms;
        }
        if (now_ms - v->differs_since_ms < (int64_t) heartbeat_ms * rounds)
                return false;
        fruitless = v->pulled_at_ms != 0 && v->pulled_digest == ours;
        wait = ((int64_t) heartbeat_ms / 2) << (fruitless ? v->fruitless : 0);
        /* Paced by what was answered, never past the longest backoff (answers nobody asked
         * for count too). */
        longest = ((int64_t) heartbeat_ms / 2) << VERDICT_SYNC_BACKOFF;
        paced = v->taken >= (size_t) INT32_MAX ? longest :
                                                 (int64_t) v->taken * heartbeat_ms / VERDICT_SYNC_PACE;
        wait = MAX(wait, MIN(paced, longest));
        if (v->pulled_at_ms != 0 && now_ms - v->pulled_at_ms < wait)
                return false;
        v->fruitless = fruitless ? MIN(v->fruitless + 1, (unsigned) VERDICT_SYNC_BACKOFF) : 0;
        v->pulled_at_ms = now_ms;
        v->pulled_digest = ours;
        v->taken = 0;
        return true;
}

void verdict_pull_took(VerdictPull *v, size_t n) {
        v->taken = n > SIZE_MAX - v->taken ? SIZE_MAX : v->taken + n;
}

unsigned verdict_sync_buckets(size_t n_members) {
        unsigned n = 1;

        while (n < PEER_MAX_VERDICT_BUCKETS && (uint64_t) n * n < 4 * (uint64_t) n_members)
                n *= 2;
        return n;
}

int verdict_sync_answer(const Membership *m, const uint64_t *want, size_t n_want,
                        PeerUpdate **ret, size_t *ret_n) {
        _cleanup_free_ uint64_t *ours = calloc(n_want, sizeof(uint64_t));
        size_t n = membership_count(m), k = 0;
        _cleanup_free_ PeerUpdate *list = NULL;

        if (!ours)
                return -ENOMEM;
        membership_verdict_buckets(m, (unsigned) n_want, ours);
        for (size_t i = 0; i < n; i++) {
                const Member *e = membership_get(m, i);
                unsigned b = membership_verdict_bucket(e, (unsigned) n_want);

                /* Up at incarnation 0 is the lowest verdict there is: it wins nothing. */
                if (ours[b] == want[b] || (e->state == NODE_UP && e->incarnation == 0))
                        continue;
                if (!list) {
                        list = calloc(n, sizeof(PeerUpdate));
                        if (!list)
                                return -ENOMEM;
                }
                list[k++] = (PeerUpdate) {
                        .name = e->info->name, /* borrowed */
                        .boot_id = e->info->boot_id,
                        .incarnation = e->incarnation,
                        .state = e->state,
                };
        }
        *ret = TAKE_PTR(list);
        *ret_n = k;
        return (int) MIN(k, (size_t) INT32_MAX);
}

size_t verdict_sync_chunk(const PeerUpdate *list, size_t n, size_t at) {
        size_t bytes = 0, k = 0;

        /* An update costs its name and at most 32 bytes more on the wire. */
        while (at + k < n && k < PEER_MAX_VERDICTS) {
                bytes += strlen(list[at + k].name) + 32;
                if (k > 0 && bytes > FAMILYD_MAX_PEER_MESSAGE_BYTES / 2)
                        break;
                k++;
        }
        return k;
}
