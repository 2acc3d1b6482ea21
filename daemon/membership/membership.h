/* membership.h: the cluster's members as this daemon knows them, their states, and the topology version. */
#pragma once

/*
 * DESIGN: pure and single-threaded (the membership protocol, membership/peer-protocol.h, owns it,
 * on the peer thread); time comes in as arguments, so the unit tests drive it with a fake
 * clock. A member's state is this daemon's own observation:
 * up while heard within suspect_ms, suspect until down_ms, then down; a down member keeps its
 * ranks until forgotten. Every change to the member set or a state takes the version to
 * max(every version seen) + 1; messages carry the version, so quiet daemons agree on it.
 * A member's registry digest is an attribute, like its last-heard time: a change to it moves
 * the revision (what the topology shows) but not the version (who is in, in which state). The
 * member's own messages are authoritative for it; another member's report only when it heard
 * the member more recently than we did.
 *
 * Rules that hold even against a member (a key holder by mistake, stale or compromised):
 * a version is taken only from a member (never from a refused, stale or unknown sender), and
 * only as far as the member table can explain (membership_version_plausible()); a restart
 * (a new start of a known name) is believed only from that node itself, and only once the
 * start we know is no longer up; another member's report never replaces a start; the table
 * holds at most max_nodes members (membership_set_max_nodes()), and a list that would take it
 * past that is refused whole (membership_can_take()).
 */

#include <stdint.h>

#include "core/error.h"
#include "core/topology.h"

/* A record's MAC under the cluster key (peer/peer-auth.h), made by the node itself. */
#define MEMBER_RECORD_MAC_BYTES 32

typedef struct MemberInfo {
        char *name;
        int64_t node_rank; /* -1: not configured */
        char *address;     /* its peer listener, "host:port" */
        uint64_t boot_id;  /* random per start */
        int64_t started_unix_ms;
        Device *devices;
        size_t n_devices;
        bool partial; /* devices left out (a heartbeat): identifies a known start only */
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* "": not known yet */
        /* With a cluster key: the node's own MAC over its record (name, rank, address, start,
         * devices; not the registry digest), relayed with it in other members' tables. */
        uint8_t record_mac[MEMBER_RECORD_MAC_BYTES];
        bool has_record_mac;
        bool proven; /* a relayed record whose MAC the caller verified (not kept, not sent) */
} MemberInfo;

void member_info_done(MemberInfo *m);
int member_info_copy(const MemberInfo *from, MemberInfo *ret);

typedef struct MembershipTimeouts {
        uint64_t suspect_ms;
        uint64_t down_ms;
        uint64_t forget_after_ms; /* after going down; 0: never */
} MembershipTimeouts;

/* Member records shared between tables (membership_set_records()): one immutable copy of each
 * distinct record (its registry digest and MAC included), counted by reference, so that N
 * simulated nodes holding the same N members keep N records, not N^2 (tests/sim). A daemon
 * holds one table and shares nothing: each of its members has a record of its own. */
typedef struct MemberRecords MemberRecords;
typedef struct MemberRecord MemberRecord;

int member_records_new(MemberRecords **ret);
/* Every table that used it must be freed first. */
MemberRecords *member_records_free(MemberRecords *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(MemberRecords *, member_records_free);
/* Distinct records held, and bytes they take (names, addresses, devices). */
size_t member_records_count(const MemberRecords *r);
size_t member_records_bytes(const MemberRecords *r);

typedef struct Member {
        /* Its record (name, address, devices, registry digest, MAC): immutable, and shared
         * with other tables when they share records; a change (a new digest, a restart) puts
         * another record in its place. */
        const MemberInfo *info;
        int64_t last_heard_ms; /* the caller's monotonic clock */
        uint64_t claimed_version; /* the version its last message carried */
        uint64_t incarnation;     /* verdicts (swim): raised by the member to refute them */
        int64_t state_since_ms;   /* verdicts (swim): when the state last changed here */
        NodeState state;
        bool local;
} Member;

typedef enum MemberVerdict {
        MEMBER_KNOWN,     /* nothing new about its identity */
        MEMBER_JOINED,    /* a node not known before */
        MEMBER_RESTARTED, /* a newer start of a known node: its entry replaced */
        MEMBER_STALE,     /* an older start, ourselves, or a forgotten node: ignored */
        MEMBER_REFUSED,   /* its name or node rank is taken by another node */
        MEMBER_UNKNOWN,   /* a partial record of a start we do not know: ask for the whole */
        MEMBER_DEFERRED,  /* a new start of a node whose known start is still up: not yet */
        _MEMBER_VERDICT_MAX,
        _MEMBER_VERDICT_INVALID = -EINVAL,
} MemberVerdict;

typedef struct Membership Membership;

/* The most --max-nodes may say (membership_set_max_nodes()); the default stays
 * FAMILYD_MAX_PEERS. A table digest naming more members is not a daemon's. */
#define MEMBERSHIP_MAX_NODES_CEILING 65536u

int membership_new(const MemberInfo *self, const MembershipTimeouts *timeouts, int64_t now_ms,
                   Membership **ret);
Membership *membership_free(Membership *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Membership *, membership_free);

/* Keeps the table's other members in `records` (shared with other tables); call before any
 * member but this node is added. NULL: each member's record is its own copy (the default). */
void membership_set_records(Membership *m, MemberRecords *records);
/* The most members the table holds, this node included (--max-nodes; default
 * FAMILYD_MAX_PEERS, ceiling MEMBERSHIP_MAX_NODES_CEILING). */
void membership_set_max_nodes(Membership *m, size_t max_nodes);
/* Room for `n` members without growing (a simulator that knows its size: the table would
 * otherwise grow to the next power of two): -ENOMEM, the table unchanged. */
int membership_reserve(Membership *m, size_t n);
size_t membership_max_nodes(const Membership *m);
/* Whether `n` records (a hello's list) fit: false when the ones not known here would take the
 * table past max_nodes, and the whole list is to be refused. */
bool membership_can_take(const Membership *m, const MemberInfo *const *records, size_t n);

/* Changes a peer may be ahead of us per member it or we know: a heartbeat interval sees at
 * most a join, a restart and three state changes of each. */
#define MEMBERSHIP_VERSION_SLACK_PER_MEMBER 8u
/* Whether a member's `version` is one its message can explain: at most our version plus
 * MEMBERSHIP_VERSION_SLACK_PER_MEMBER times (our members + the n_listed its message names +
 * 1). A larger one is taken only as far as more than half of the other members that are up
 * claim it (a daemon that rejoins after a partition, or that knows only its seed, catches up;
 * one member alone among several cannot move it), and never to FAMILYD_MAX_TOPOLOGY_VERSION / 2
 * or beyond. */
bool membership_version_plausible(const Membership *m, uint64_t version, size_t n_listed);

/* A message came straight from `sender`, which knows `version`; n_listed: the members the
 * message names (a hello's). The version is taken only when the sender is (or now becomes) a
 * member and membership_version_plausible() holds; *ret_version_refused (may be NULL) says
 * when it did not. On MEMBER_REFUSED, *ret_refusal (malloc'd, may be NULL) says why, in
 * words for the refused node's log. */
int membership_heard_from(Membership *m, const MemberInfo *sender, uint64_t version,
                          size_t n_listed, int64_t now_ms, MemberVerdict *ret,
                          bool *ret_version_refused, char **ret_refusal);
/* membership_heard_from() with n_listed 0, not asking whether the version was refused. */
int membership_heard(Membership *m, const MemberInfo *sender, uint64_t version, int64_t now_ms,
                     MemberVerdict *ret, char **ret_refusal);
/* Another member says it heard from `info` age_ms ago. Never replaces a start we know (that
 * takes the node's own word: MEMBER_STALE), unless `info->proven`: the node's own MAC over the
 * record, verified by the caller, is its word, and the record replaces a start that is not up
 * here as the node's own message would (MEMBER_RESTARTED, or MEMBER_DEFERRED while it is). */
int membership_learn(Membership *m, const MemberInfo *info, uint64_t age_ms, int64_t now_ms,
                     MemberVerdict *ret);
/* Applies the timeouts; true when a state changed or a member was forgotten. */
bool membership_tick(Membership *m, int64_t now_ms);

/*
 * States by verdict (--membership swim) instead of by silence: a member stays in the state the
 * verdicts about it say (membership_verdict()), whenever we last heard from it; a suspect
 * member is down once the suspicion has lasted membership_suspicion_ms(), a down member is
 * forgotten forget_after_ms later (if set). heartbeat_ms: the probe period. Call before any
 * member but this node is added.
 */
void membership_set_verdicts(Membership *m, unsigned heartbeat_ms);
/* down_ms - suspect_ms, and at least ceil(log2(members + 1)) probe periods: time for the
 * suspect to hear of it and its refutation to spread. */
uint64_t membership_suspicion_ms(const Membership *m);
/* Only a member raises its incarnation, by one per refutation: a verdict further ahead of the
 * incarnation we hold is a lie (a member's, to freeze a node in a state it cannot refute). */
#define MEMBERSHIP_INCARNATION_SLACK 16u

/*
 * A verdict about one start of a member, from our probes or gossip: of two about one start the
 * higher incarnation wins; at equal incarnations suspect beats up and down beats both. Ignored
 * for this node, an unknown name, another start, and an incarnation more than
 * MEMBERSHIP_INCARNATION_SLACK ahead of ours (0). Returns 1 when it changed the member's
 * state (the version moves) and 2 when it raised only the incarnation (worth passing on).
 */
int membership_verdict(Membership *m, const char *name, uint64_t boot_id, uint64_t incarnation,
                       NodeState state, int64_t now_ms);

/* Forgets a node that is not up. boot_id 0 matches any start; from_peer: a peer's request,
 * ignored (returns 0) rather than refused when the node is up here or unknown. Returns 1 when
 * the node was forgotten. */
int membership_forget(Membership *m, const char *name, uint64_t boot_id, bool from_peer,
                      int64_t now_ms, FamilyError *ret_error);

size_t membership_count(const Membership *m);
const Member *membership_get(const Membership *m, size_t i); /* 0: this node */
const Member *membership_find(const Membership *m, const char *name);
uint64_t membership_version(const Membership *m);
/* Moves with every change membership_topology() would show but times: the version's changes
 * and the members' registry digests. */
uint64_t membership_revision(const Membership *m);
/* This node's registry digest (a reload here); true when it changed. */
bool membership_set_local_digest(Membership *m, const char *digest);
/* How many changes this daemon made itself (not versions taken from peers). */
uint64_t membership_changes(const Membership *m);
/* The table summarised for peers: the sum of membership_digest_member() over every member,
 * this node included, kept as members come and go. */
uint64_t membership_digest(const Membership *m);
uint64_t membership_digest_member(const char *name, uint64_t boot_id);
/*
 * The members' verdicts summarised (swim): the sum of membership_verdict_member() over every
 * member, this node included with its incarnation (membership_set_local_incarnation()), kept
 * as members, states and incarnations change. Equal tables of equal verdicts have equal sums.
 */
uint64_t membership_verdict_digest(const Membership *m);
uint64_t membership_verdict_member(const char *name, uint64_t boot_id, uint64_t incarnation,
                                   NodeState state);
/* A member's bucket of n_buckets (a power of two): the top bits of its start's digest. */
unsigned membership_verdict_bucket(const Member *e, unsigned n_buckets);
/* The verdict digest of each of n_buckets buckets into ret[n_buckets]: O(members). */
void membership_verdict_buckets(const Membership *m, unsigned n_buckets, uint64_t *ret);
/* This node's incarnation (raised to refute a suspicion of it), as the verdict digest counts it. */
void membership_set_local_incarnation(Membership *m, uint64_t incarnation);
/* Counts the other members by state. */
void membership_count_states(const Membership *m, unsigned counts[_NODE_STATE_MAX]);

int membership_topology(const Membership *m, int64_t now_ms, int64_t now_unix_ms,
                        Topology **ret);
