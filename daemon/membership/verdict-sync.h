/* verdict-sync.h: swim's pull of verdicts: when a daemon asks a member for them, and which it answers with. */
#pragma once

/*
 * DESIGN: gossip spreads one change well and ten thousand at once badly (a healed partition:
 * every member of each half refutes at once, and each refutation must reach every member of
 * the other half through queues of PROTOCOL_GOSSIP_PER_MESSAGE items). So every swim message
 * also carries the sender's verdict digest (membership_verdict_digest()); a daemon whose own
 * has differed from the digests it hears for VERDICT_SYNC_ROUNDS heartbeats asks the member
 * it hears for its verdicts: a who with its own verdict digest in 2^k buckets. The member
 * answers with its verdicts about every member of the buckets whose digests differ (but those
 * up at incarnation 0, which override nothing), and those
 * verdicts are taken as gossip is (the higher incarnation wins). Each pull merges two views,
 * so a mass change reaches everyone in about log2(members) rounds, and a small one costs a
 * bucket or two. At rest the digests agree and nothing is pulled.
 */

#include <stdbool.h>
#include <stdint.h>

#include "membership.h"
#include "peer-message.h"

/* When to pull: the difference seen, and the last pull. */
typedef struct VerdictPull {
        bool differs;
        int64_t differs_since_ms; /* first seen, since we last heard a digest equal to ours */
        int64_t pulled_at_ms;     /* 0: never */
        uint64_t pulled_digest;   /* ours then */
        unsigned fruitless;       /* pulls in a row after which ours had not moved */
        size_t taken;             /* verdicts answered since the last pull */
} VerdictPull;

/* A daemon answers at most this many pulls per heartbeat (each costs a pass over its table). */
#define VERDICT_SYNC_ANSWERS 8
/* A difference is pulled once it has lasted this many heartbeats (gossip in flight settles
 * most small ones first). */
#define VERDICT_SYNC_ROUNDS 1
/* Pulls are at most one per half heartbeat (a probe tick); while they change nothing the wait
 * doubles up to 2^VERDICT_SYNC_BACKOFF times. */
#define VERDICT_SYNC_BACKOFF 6
/* Nor more often than the verdicts answered allow at this many a heartbeat: a pull of 10,000
 * (about 350 KB) waits about 5 heartbeats for the next, so a change that lasts (a partition of
 * 10,000 members, each half marking the other down) costs each daemon at most about 70 KB a
 * second of answers; at up to 1,024 members the half heartbeat above is the bound. */
#define VERDICT_SYNC_PACE 2048

/*
 * A member's verdict digest `theirs` heard while ours is `ours`: true when the member is to be
 * asked for its verdicts now (the difference has lasted `rounds` heartbeats and the last pull
 * is far enough behind). theirs 0: it sent none.
 */
bool verdict_pull_due(VerdictPull *v, uint64_t ours, uint64_t theirs, int64_t now_ms,
                      unsigned heartbeat_ms, unsigned rounds);
/* An answer of n verdicts came: the next pull waits until n / VERDICT_SYNC_PACE heartbeats
 * after the last (at most the longest backoff's wait). */
void verdict_pull_took(VerdictPull *v, size_t n);

/* How many buckets a pull asks in, for a table of n members: the power of two nearest
 * 2 sqrt(n) (the request's size, 8 bytes a bucket, about the answer's for one difference), at
 * most PEER_MAX_VERDICT_BUCKETS. */
unsigned verdict_sync_buckets(size_t n_members);

/*
 * The verdicts to answer a pull with: this table's members (this node too) in every bucket whose digest differs from the asker's want[n_want], but
 * those up at incarnation 0 (the lowest verdict, which wins against nothing the asker holds).
 * The names are borrowed from m. Returns the count, or -ENOMEM.
 */
int verdict_sync_answer(const Membership *m, const uint64_t *want, size_t n_want,
                        PeerUpdate **ret, size_t *ret_n);

/* How many of list[n] go in one answer message, from `at`: at most PEER_MAX_VERDICTS and
 * about half the peer message limit. */
size_t verdict_sync_chunk(const PeerUpdate *list, size_t n, size_t at);
