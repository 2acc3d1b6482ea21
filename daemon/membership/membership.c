/* membership.c: who is in the cluster, in which state, and the agreed topology version. */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member-records.h"
#include "membership.h"
#include "name-index.h"
#include "rank-index.h"
#include "core/resource-limits.h"

/* A forgotten start is remembered for a while, so that a peer's older table does not bring it
 * back; a live node that speaks to us directly always can. */
#define MEMBERSHIP_TOMBSTONES 256u

typedef struct Tombstone {
        char *name;
        uint64_t boot_id;
} Tombstone;

struct Membership {
        Member *members; /* [0] is this node */
        size_t n_members;
        size_t allocated;
        NameIndex by_name; /* name -> position in members, kept in step with it */
        /* node rank -> position, for ranks below max_nodes; a larger rank is looked up by a
         * scan. Kept in step with members. */
        RankIndex by_rank;
        MembershipTimeouts timeouts;
        uint64_t version;
        uint64_t changes;
        uint64_t revision;
        Tombstone tombstones[MEMBERSHIP_TOMBSTONES];
        size_t next_tombstone;
        size_t max_nodes;
        uint64_t digest; /* membership_digest() */
        uint64_t verdicts; /* membership_verdict_digest() */
        MemberRecords *records; /* NULL: members own their records */
        unsigned verdict_period_ms; /* 0: states by silence; else by verdict (swim) */
};

uint64_t membership_digest_member(const char *name, uint64_t boot_id) {
        uint64_t h = UINT64_C(14695981039346656037);

        for (const char *c = name; *c; c++)
                h = (h ^ (unsigned char) *c) * UINT64_C(1099511628211);
        for (unsigned i = 0; i < 8; i++)
                h = (h ^ ((boot_id >> (8 * i)) & 0xff)) * UINT64_C(1099511628211);
        /* FNV-1a spreads its last bytes poorly across the word: one multiply-xorshift more. */
        h ^= h >> 32;
        h *= UINT64_C(0x9E3779B97F4A7C15);
        return h ^ (h >> 29);
}

static uint64_t member_digest(const Member *e); /* kept in the record */

uint64_t membership_digest(const Membership *m) {
        return m->digest;
}

/* A start's verdict hash from its digest (membership_digest_member()). */
static uint64_t verdict_hash(uint64_t h, uint64_t incarnation, NodeState state) {
        /* splitmix64's finaliser over the start's hash, the incarnation and the state. */
        h ^= incarnation * UINT64_C(0xD6E8FEB86659FD93) + (uint64_t) state + 1;
        h = (h ^ (h >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        h = (h ^ (h >> 27)) * UINT64_C(0x94D049BB133111EB);
        return h ^ (h >> 31);
}

uint64_t membership_verdict_member(const char *name, uint64_t boot_id, uint64_t incarnation,
                                   NodeState state) {
        return verdict_hash(membership_digest_member(name, boot_id), incarnation, state);
}

static uint64_t member_verdict(const Member *e) {
        return verdict_hash(member_digest(e), e->incarnation, e->state);
}

/* A member's state and incarnation, the verdict digest kept in step. */
static void member_set_verdict(Membership *m, Member *e, NodeState state, uint64_t incarnation) {
        m->verdicts -= member_verdict(e);
        e->state = state;
        e->incarnation = incarnation;
        m->verdicts += member_verdict(e);
}

uint64_t membership_verdict_digest(const Membership *m) {
        return m->verdicts;
}

unsigned membership_verdict_bucket(const Member *e, unsigned n_buckets) {
        unsigned bits = 0;

        while ((1u << bits) < n_buckets)
                bits++;
        return bits == 0 ? 0 : (unsigned) (member_digest(e) >> (64 - bits));
}

void membership_verdict_buckets(const Membership *m, unsigned n_buckets, uint64_t *ret) {
        memset(ret, 0, n_buckets * sizeof(uint64_t));
        for (size_t i = 0; i < m->n_members; i++)
                ret[membership_verdict_bucket(&m->members[i], n_buckets)] +=
                        member_verdict(&m->members[i]);
}

void membership_set_local_incarnation(Membership *m, uint64_t incarnation) {
        member_set_verdict(m, &m->members[0], NODE_UP, incarnation);
}

void member_info_done(MemberInfo *m) {
        if (!m)
                return;
        free(m->name);
        free(m->address);
        for (size_t i = 0; i < m->n_devices; i++)
                device_done(&m->devices[i]);
        free(m->devices);
        *m = (MemberInfo) {};
}

int member_info_copy(const MemberInfo *from, MemberInfo *ret) {
        _cleanup_(member_info_done) MemberInfo c = {
                .node_rank = from->node_rank,
                .boot_id = from->boot_id,
                .started_unix_ms = from->started_unix_ms,
                .name = strdup(strempty(from->name)),
                .address = strdup(strempty(from->address)),
        };

        memcpy(c.registry_digest, from->registry_digest, sizeof c.registry_digest);
        c.registry_digest[REGISTRY_DIGEST_LENGTH] = 0;
        memcpy(c.record_mac, from->record_mac, sizeof c.record_mac);
        c.has_record_mac = from->has_record_mac;

        if (!c.name || !c.address)
                return -ENOMEM;
        if (from->n_devices > 0) {
                c.devices = calloc(from->n_devices, sizeof(Device));
                if (!c.devices)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < from->n_devices; i++) {
                int r = device_copy(&from->devices[i], &c.devices[i]);
                if (r < 0)
                        return r;
                c.n_devices++;
        }
        *ret = c;
        c = (MemberInfo) {};
        return 0;
}

/* --- records (member-records.c) --- */

static MemberRecord *record_of(const Member *e) {
        return (MemberRecord *) e->info;
}

/* Kept in the record (immutable): the table digest and every verdict bucket read it, and
 * rehashing names for each pull's buckets took a fifth of a 10,000-member simulation (perf). */
static uint64_t member_digest(const Member *e) {
        return ((const MemberRecord *) e->info)->start_digest;
}

/* Sets e's record to one equal to `info` (shared when the table shares records). */
static int member_store(Membership *m, Member *e, const MemberInfo *info) {
        MemberRecord *rec;
        int r = member_records_take(m->records, info, &rec);

        if (r < 0)
                return r;
        e->info = &rec->info;
        return 0;
}

static void member_drop(Member *e) {
        if (e->info)
                member_records_release(record_of(e));
        e->info = NULL;
}

void membership_set_records(Membership *m, MemberRecords *records) {
        assert(m->n_members == 1);
        m->records = records; /* this node's record stays its own */
}

/* --- the rank index (rank-index.h) --- */

static int64_t member_rank_at(const void *userdata, size_t position) {
        const Membership *m = userdata;

        return m->members[position].info->node_rank;
}

/* Member i holds its rank now (added, or moved to position i). */
static void ranks_put(Membership *m, size_t i) {
        rank_index_put(&m->by_rank, i, m->n_members, m->max_nodes);
}

/* Member i no longer holds its rank (it leaves, or takes another record). */
static void ranks_drop(Membership *m, size_t i) {
        rank_index_drop(&m->by_rank, i, m->n_members);
}

int membership_new(const MemberInfo *self, const MembershipTimeouts *timeouts, int64_t now_ms,
                   Membership **ret) {
        _cleanup_(membership_freep) Membership *m = calloc(1, sizeof(Membership));
        int r;

        if (!m)
                return -ENOMEM;
        rank_index_init(&m->by_rank, member_rank_at, m);
        m->timeouts = *timeouts;
        m->version = 1;
        m->max_nodes = FAMILYD_MAX_PEERS;
        m->members = calloc(4, sizeof(Member));
        if (!m->members)
                return -ENOMEM;
        m->allocated = 4;
        r = member_store(m, &m->members[0], self); /* its own: no shared records yet */
        if (r < 0)
                return r;
        m->members[0].local = true;
        m->members[0].state = NODE_UP;
        m->members[0].last_heard_ms = now_ms;
        m->n_members = 1;
        m->digest = member_digest(&m->members[0]);
        m->verdicts = member_verdict(&m->members[0]);
        r = name_index_put(&m->by_name, m->members[0].info->name, 0);
        if (r < 0)
                return r;
        ranks_put(m, 0);

        *ret = TAKE_PTR(m);
        return 0;
}

Membership *membership_free(Membership *m) {
        if (!m)
                return NULL;
        for (size_t i = 0; i < m->n_members; i++)
                member_drop(&m->members[i]);
        free(m->members);
        rank_index_done(&m->by_rank);
        name_index_done(&m->by_name);
        for (size_t i = 0; i < MEMBERSHIP_TOMBSTONES; i++)
                free(m->tombstones[i].name);
        return mfree(m);
}

static const char *member_name_at(const void *userdata, uintptr_t i) {
        const Membership *m = userdata;

        return m->members[i].info->name;
}

static Member *membership_lookup(Membership *m, const char *name) {
        uintptr_t i;

        if (!name_index_find(&m->by_name, name, member_name_at, m, &i))
                return NULL;
        return &m->members[i];
}

const Member *membership_find(const Membership *m, const char *name) {
        return membership_lookup((Membership *) m, name);
}

/* The version never wraps: it stops at the limit (peers cannot tell a larger one). */
static void membership_changed(Membership *m) {
        if (m->version < FAMILYD_MAX_TOPOLOGY_VERSION)
                m->version++;
        m->changes++;
        m->revision++;
}

/* A member's digest as `digest` says: its record replaced by one with that digest. True when
 * that changed it; with no memory the old record stays (the digest is heard again). */
static bool member_set_digest(Membership *m, Member *e, const char *digest) {
        MemberRecord *rec = record_of(e);
        MemberInfo with = *e->info; /* borrowed but for the digest */

        if (strncmp(e->info->registry_digest, digest, sizeof with.registry_digest) == 0)
                return false;
        (void) snprintf(with.registry_digest, sizeof with.registry_digest, "%s", digest);
        if (member_records_take(rec->owner, &with, &rec) < 0)
                return false;
        member_drop(e);
        e->info = &rec->info;
        m->revision++;
        return true;
}

bool membership_set_local_digest(Membership *m, const char *digest) {
        return member_set_digest(m, &m->members[0], strempty(digest));
}

void membership_set_max_nodes(Membership *m, size_t max_nodes) {
        m->max_nodes = max_nodes == 0 ? FAMILYD_MAX_PEERS :
                                        MIN(max_nodes, (size_t) MEMBERSHIP_MAX_NODES_CEILING);
}

int membership_reserve(Membership *m, size_t n) {
        if (n > m->allocated) {
                Member *grown = reallocarray(m->members, n, sizeof(Member));
                if (!grown)
                        return -ENOMEM;
                m->members = grown;
                m->allocated = n;
        }
        return name_index_reserve(&m->by_name, n);
}

size_t membership_max_nodes(const Membership *m) {
        return m->max_nodes;
}

bool membership_can_take(const Membership *m, const MemberInfo *const *records, size_t n) {
        size_t unknown = 0;

        if (n > m->max_nodes)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!membership_find(m, records[i]->name))
                        unknown++;
        return m->n_members + unknown <= m->max_nodes;
}

/* No version a daemon believes comes near the limit: one change a millisecond for 142,000
 * years. */
#define MEMBERSHIP_VERSION_CEILING (FAMILYD_MAX_TOPOLOGY_VERSION / 2)

bool membership_version_plausible(const Membership *m, uint64_t version, size_t n_listed) {
        uint64_t slack = (uint64_t) MEMBERSHIP_VERSION_SLACK_PER_MEMBER *
                         ((uint64_t) m->n_members + MIN(n_listed, (size_t) FAMILYD_MAX_PEERS) + 1);

        if (version <= m->version)
                return true;
        return version < MEMBERSHIP_VERSION_CEILING && version - m->version <= slack;
}

static void membership_see_version(Membership *m, uint64_t version) {
        if (version > m->version && version <= FAMILYD_MAX_TOPOLOGY_VERSION)
                m->version = version;
}

static int cmp_u64_desc(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? 1 : x > y ? -1 : 0;
}

/* The highest version that more than half of the other members that are up claim (0: none). */
static uint64_t membership_quorum_version(const Membership *m) {
        _cleanup_free_ uint64_t *claims = calloc(m->n_members, sizeof(uint64_t));
        size_t n = 0;

        if (!claims)
                return 0;
        for (size_t i = 1; i < m->n_members; i++)
                if (m->members[i].state == NODE_UP)
                        claims[n++] = m->members[i].claimed_version;
        if (n == 0)
                return 0;
        qsort(claims, n, sizeof(uint64_t), cmp_u64_desc);
        /* Sorted high to low, claims[n / 2] is claimed (at least) by n / 2 + 1 members. */
        return claims[n / 2] < MEMBERSHIP_VERSION_CEILING ? claims[n / 2] : 0;
}

/* Takes a member's version: all of it when plausible, else what a majority backs. True when
 * some of it was refused. */
static bool membership_take_version(Membership *m, Member *e, uint64_t version, bool plausible) {
        e->claimed_version = version;
        if (plausible) {
                membership_see_version(m, version);
                return false;
        }
        membership_see_version(m, membership_quorum_version(m));
        return version > m->version;
}

static NodeState state_for_age(const MembershipTimeouts *t, int64_t age_ms) {
        if (age_ms < (int64_t) t->suspect_ms)
                return NODE_UP;
        if (age_ms < (int64_t) t->down_ms)
                return NODE_SUSPECT;
        return NODE_DOWN;
}

static bool is_tombstoned(const Membership *m, const char *name, uint64_t boot_id) {
        for (size_t i = 0; i < MEMBERSHIP_TOMBSTONES; i++)
                if (m->tombstones[i].name && m->tombstones[i].boot_id == boot_id &&
                    streq(m->tombstones[i].name, name))
                        return true;
        return false;
}

static void tombstone_drop(Membership *m, const char *name) {
        for (size_t i = 0; i < MEMBERSHIP_TOMBSTONES; i++)
                if (m->tombstones[i].name && streq(m->tombstones[i].name, name))
                        m->tombstones[i].name = mfree(m->tombstones[i].name);
}

/* The other member (not `name`) holding a configured node rank, if any. */
static const Member *rank_holder(const Membership *m, int64_t node_rank, const char *name) {
        if (node_rank < 0)
                return NULL;
        if (rank_index_covers(&m->by_rank, node_rank)) {
                size_t at;
                if (!rank_index_find(&m->by_rank, node_rank, &at))
                        return NULL;
                if (!streq(m->members[at].info->name, name))
                        return &m->members[at];
                /* `name` holds it: only a scan finds another holder (none, but for a bug). */
        }
        for (size_t i = 0; i < m->n_members; i++)
                if (m->members[i].info->node_rank == node_rank &&
                    !streq(m->members[i].info->name, name))
                        return &m->members[i];
        return NULL;
}

static int membership_add(Membership *m, const MemberInfo *info, int64_t last_heard_ms,
                          int64_t now_ms) {
        if (m->n_members == m->allocated) {
                size_t n = m->allocated * 2;
                Member *grown = reallocarray(m->members, n, sizeof(Member));
                if (!grown)
                        return -ENOMEM;
                m->members = grown;
                m->allocated = n;
        }
        Member *e = &m->members[m->n_members];
        *e = (Member) { .last_heard_ms = last_heard_ms };
        int r = member_store(m, e, info);
        if (r < 0)
                return r;
        r = name_index_put(&m->by_name, e->info->name, m->n_members);
        if (r < 0) {
                member_drop(e);
                return r;
        }
        e->state = m->verdict_period_ms ? NODE_UP
                                        : state_for_age(&m->timeouts, now_ms - last_heard_ms);
        e->state_since_ms = now_ms;
        m->n_members++;
        m->digest += member_digest(e);
        m->verdicts += member_verdict(e);
        ranks_put(m, m->n_members - 1);
        return 0;
}

static int member_replace(Membership *m, Member *e, const MemberInfo *info) {
        Member copy = {};
        int r = member_store(m, &copy, info);
        if (r < 0)
                return r;
        m->digest -= member_digest(e);
        m->verdicts -= member_verdict(e);
        ranks_drop(m, (size_t) (e - m->members));
        member_drop(e);
        e->info = copy.info;
        m->digest += member_digest(e);
        m->verdicts += member_verdict(e);
        ranks_put(m, (size_t) (e - m->members));
        return 0;
}

/* Why a new or restarted `info` cannot take its place, or NULL when it can (ret: -ENOMEM). */
static int membership_check_identity(const Membership *m, const MemberInfo *info,
                                     const Member *existing, char **ret_reason) {
        const Member *holder = rank_holder(m, info->node_rank, info->name);
        int r = 0;

        *ret_reason = NULL;
        if (existing && existing->state == NODE_UP && !streq(existing->info->address, info->address))
                r = asprintf(ret_reason,
                             "node name '%s' is already in use by the live node at %s",
                             info->name, existing->info->address);
        else if (holder)
                r = asprintf(ret_reason,
                             "node rank %" PRId64 " is already taken by node '%s' (%s); "
                             "forget that node first if it is gone",
                             info->node_rank, holder->info->name,
                             node_state_to_string(holder->state));
        else if (!existing && m->n_members >= m->max_nodes)
                r = asprintf(ret_reason, "the cluster already has %zu members, the limit "
                             "(--max-nodes)", m->max_nodes);
        if (r < 0) {
                *ret_reason = NULL;
                return -ENOMEM;
        }
        return 0;
}

/* Our own name from another start: a second daemon configured with it. */
static int membership_heard_self(Membership *m, const MemberInfo *sender, MemberVerdict *ret,
                                 char **ret_refusal) {
        if (sender->boot_id == m->members[0].info->boot_id) {
                *ret = MEMBER_STALE; /* a link to our own address */
                return 0;
        }
        if (ret_refusal &&
            asprintf(ret_refusal, "node name '%s' is already in use by the live node at %s",
                     sender->name, m->members[0].info->address) < 0)
                *ret_refusal = NULL;
        *ret = MEMBER_REFUSED;
        return 0;
}

/* A start we do not know yet, of a new node or of a known name: joined, restarted, or not. */
static int membership_heard_start(Membership *m, const MemberInfo *sender, Member *e,
                                  int64_t now_ms, MemberVerdict *ret, char **ret_refusal) {
        _cleanup_free_ char *reason = NULL;
        int r;

        if (e && sender->started_unix_ms < e->info->started_unix_ms &&
            streq(e->info->address, sender->address)) {
                *ret = MEMBER_STALE;
                return 0;
        }
        r = membership_check_identity(m, sender, e, &reason);
        if (r < 0)
                return r;
        if (reason) {
                if (ret_refusal)
                        *ret_refusal = TAKE_PTR(reason);
                *ret = MEMBER_REFUSED;
                return 0;
        }
        /* The start we know still speaks to us: a live node is not replaced on anyone's word,
         * its own next start included, until that one falls silent. */
        if (e && e->state == NODE_UP) {
                *ret = MEMBER_DEFERRED;
                return 0;
        }

        /* Speaking to us proves it lives, even if we had forgotten it. */
        tombstone_drop(m, sender->name);
        if (e) {
                r = member_replace(m, e, sender);
                if (r < 0)
                        return r;
                e->last_heard_ms = now_ms;
                member_set_verdict(m, e, NODE_UP, 0);
                e->state_since_ms = now_ms;
                *ret = MEMBER_RESTARTED;
        } else {
                r = membership_add(m, sender, now_ms, now_ms);
                if (r < 0)
                        return r;
                *ret = MEMBER_JOINED;
        }
        return 0;
}

int membership_heard_from(Membership *m, const MemberInfo *sender, uint64_t version,
                          size_t n_listed, int64_t now_ms, MemberVerdict *ret,
                          bool *ret_version_refused, char **ret_refusal) {
        bool plausible = membership_version_plausible(m, version, n_listed), changed = false;
        bool refused = false;
        Member *e;
        int r;

        if (ret_version_refused)
                *ret_version_refused = false;
        if (streq(sender->name, m->members[0].info->name))
                return membership_heard_self(m, sender, ret, ret_refusal);

        e = membership_lookup(m, sender->name);
        if (e && e->info->boot_id == sender->boot_id) {
                (void) member_set_digest(m, e, sender->registry_digest);
                e->last_heard_ms = MAX(e->last_heard_ms, now_ms);
                /* By verdict, only a higher incarnation lifts a suspicion (the caller's). */
                if (!m->verdict_period_ms) {
                        changed = e->state != NODE_UP;
                        member_set_verdict(m, e, NODE_UP, e->incarnation);
                }
                *ret = MEMBER_KNOWN;
        } else if (sender->partial) {
                /* Asking a start whose name or rank is taken for its record would tell it ours
                 * (a who names us): it is refused as its hello would be. */
                _cleanup_free_ char *reason = NULL;
                r = membership_check_identity(m, sender, e, &reason);
                if (r < 0)
                        return r;
                *ret = reason ? MEMBER_REFUSED : MEMBER_UNKNOWN;
                if (reason && ret_refusal)
                        *ret_refusal = TAKE_PTR(reason);
                return 0;
        } else {
                r = membership_heard_start(m, sender, e, now_ms, ret, ret_refusal);
                if (r < 0 || (*ret != MEMBER_JOINED && *ret != MEMBER_RESTARTED))
                        return r;
                e = membership_lookup(m, sender->name);
                changed = true;
        }

        /* A member now: its version counts, as far as the table explains it. */
        refused = membership_take_version(m, e, version, plausible);
        if (ret_version_refused)
                *ret_version_refused = refused;
        if (changed)
                membership_changed(m);
        return 0;
}

int membership_heard(Membership *m, const MemberInfo *sender, uint64_t version, int64_t now_ms,
                     MemberVerdict *ret, char **ret_refusal) {
        return membership_heard_from(m, sender, version, 0, now_ms, ret, NULL, ret_refusal);
}

int membership_learn(Membership *m, const MemberInfo *info, uint64_t age_ms, int64_t now_ms,
                     MemberVerdict *ret) {
        _cleanup_free_ char *reason = NULL;
        int64_t heard = now_ms - (int64_t) MIN(age_ms, (uint64_t) INT32_MAX);
        Member *e;
        int r;

        if (info->partial || streq(info->name, m->members[0].info->name) ||
            is_tombstoned(m, info->name, info->boot_id)) {
                *ret = MEMBER_STALE;
                return 0;
        }

        e = membership_lookup(m, info->name);
        if (e && e->info->boot_id == info->boot_id) {
                /* Fresher news moves last_heard (the next tick turns it into a state) and
                 * brings the digest the member had then. */
                if (heard > e->last_heard_ms && !isempty(info->registry_digest))
                        (void) member_set_digest(m, e, info->registry_digest);
                e->last_heard_ms = MAX(e->last_heard_ms, heard);
                *ret = MEMBER_KNOWN;
                return 0;
        }
        /* Another start of a known node: only the node itself says so (membership_heard), or
         * its own MAC over the record. */
        if (e && !info->proven) {
                *ret = MEMBER_STALE;
                return 0;
        }
        if (e) {
                r = membership_heard_start(m, info, e, heard, ret, NULL);
                if (r >= 0 && *ret == MEMBER_RESTARTED)
                        membership_changed(m);
                return r;
        }

        r = membership_check_identity(m, info, NULL, &reason);
        if (r < 0)
                return r;
        if (reason) {
                *ret = MEMBER_REFUSED;
                return 0;
        }

        r = membership_add(m, info, heard, now_ms);
        if (r < 0)
                return r;
        *ret = MEMBER_JOINED;
        membership_changed(m);
        return 0;
}

static void membership_remove(Membership *m, size_t i) {
        Tombstone *t = &m->tombstones[m->next_tombstone];

        m->digest -= member_digest(&m->members[i]);
        m->verdicts -= member_verdict(&m->members[i]);
        free(t->name);
        t->name = strdup(m->members[i].info->name); /* NULL: this one not remembered */
        t->boot_id = m->members[i].info->boot_id;
        m->next_tombstone = (m->next_tombstone + 1) % MEMBERSHIP_TOMBSTONES;

        (void) name_index_remove(&m->by_name, m->members[i].info->name, i);
        ranks_drop(m, i);
        member_drop(&m->members[i]);
        memmove(&m->members[i], &m->members[i + 1], (m->n_members - i - 1) * sizeof(Member));
        m->n_members--;
        /* The order is the topology's: the rest shift down, and their positions with them. */
        for (size_t j = i; j < m->n_members; j++) {
                (void) name_index_move(&m->by_name, m->members[j].info->name, j + 1, j);
                rank_index_moved(&m->by_rank, m->members[j].info->node_rank, j + 1, j);
        }
}

void membership_set_verdicts(Membership *m, unsigned heartbeat_ms) {
        assert(m->n_members == 1);
        m->verdict_period_ms = MAX(heartbeat_ms, 1u);
}

uint64_t membership_suspicion_ms(const Membership *m) {
        uint64_t periods = 0;

        while (periods < 64 && (UINT64_C(1) << periods) < (uint64_t) m->n_members + 1)
                periods++;
        return MAX(m->timeouts.down_ms - MIN(m->timeouts.suspect_ms, m->timeouts.down_ms),
                   periods * m->verdict_period_ms);
}

static bool membership_tick_verdicts(Membership *m, int64_t now_ms) {
        int64_t suspicion = (int64_t) membership_suspicion_ms(m);
        bool changed = false;

        for (size_t i = 1; i < m->n_members;) {
                Member *e = &m->members[i];
                int64_t since = now_ms - e->state_since_ms;

                if (e->state == NODE_DOWN && m->timeouts.forget_after_ms > 0 &&
                    since >= (int64_t) m->timeouts.forget_after_ms) {
                        membership_remove(m, i);
                        changed = true;
                        continue;
                }
                if (e->state == NODE_SUSPECT && since >= suspicion) {
                        member_set_verdict(m, e, NODE_DOWN, e->incarnation);
                        e->state_since_ms = now_ms;
                        changed = true;
                }
                i++;
        }
        if (changed)
                membership_changed(m);
        return changed;
}

/* Whether a verdict (state, incarnation) overrides what we hold: the higher incarnation, and
 * at equal ones the graver state. */
static bool verdict_wins(const Member *e, NodeState state, uint64_t incarnation) {
        if (incarnation != e->incarnation)
                return incarnation > e->incarnation;
        return state > e->state;
}

int membership_verdict(Membership *m, const char *name, uint64_t boot_id, uint64_t incarnation,
                       NodeState state, int64_t now_ms) {
        Member *e = membership_lookup(m, name);

        if (!e || e->local || e->info->boot_id != boot_id || state < 0 ||
            state >= _NODE_STATE_MAX || incarnation > e->incarnation + MEMBERSHIP_INCARNATION_SLACK ||
            !verdict_wins(e, state, incarnation))
                return 0;
        if (e->state == state) {
                member_set_verdict(m, e, state, incarnation);
                return 2;
        }
        member_set_verdict(m, e, state, incarnation);
        e->state_since_ms = now_ms;
        membership_changed(m);
        return 1;
}

bool membership_tick(Membership *m, int64_t now_ms) {
        bool changed = false;

        if (m->verdict_period_ms)
                return membership_tick_verdicts(m, now_ms);

        for (size_t i = 1; i < m->n_members;) {
                Member *e = &m->members[i];
                int64_t age = now_ms - e->last_heard_ms;
                NodeState s = state_for_age(&m->timeouts, age);

                if (s == NODE_DOWN && m->timeouts.forget_after_ms > 0 &&
                    age >= (int64_t) (m->timeouts.down_ms + m->timeouts.forget_after_ms)) {
                        membership_remove(m, i);
                        changed = true;
                        continue;
                }
                if (s != e->state) {
                        member_set_verdict(m, e, s, e->incarnation);
                        changed = true;
                }
                i++;
        }
        if (changed)
                membership_changed(m);
        return changed;
}

int membership_forget(Membership *m, const char *name, uint64_t boot_id, bool from_peer,
                      int64_t now_ms, FamilyError *ret_error) {
        Member *e = membership_lookup(m, name);

        (void) now_ms;
        if (e) {
                size_t i = (size_t) (e - m->members);

                if (from_peer && (e->local || e->state == NODE_UP ||
                                  (boot_id != 0 && boot_id != e->info->boot_id)))
                        return 0;
                if (e->local)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "NODE_IS_LOCAL", "node",
                                                "node '%s' is this daemon's own node", name);
                if (e->state != NODE_DOWN)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "NODE_NOT_DOWN", "node",
                                                "node '%s' is %s; only a down node can be "
                                                "forgotten",
                                                name, node_state_to_string(e->state));
                membership_remove(m, i);
                membership_changed(m);
                return 1;
        }
        if (from_peer)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "NODE_NOT_FOUND", "node",
                                "node '%s' is not in the topology", name);
}

size_t membership_count(const Membership *m) {
        return m->n_members;
}

const Member *membership_get(const Membership *m, size_t i) {
        return i < m->n_members ? &m->members[i] : NULL;
}

uint64_t membership_version(const Membership *m) {
        return m->version;
}

uint64_t membership_revision(const Membership *m) {
        return m->revision;
}

uint64_t membership_changes(const Membership *m) {
        return m->changes;
}

void membership_count_states(const Membership *m, unsigned counts[_NODE_STATE_MAX]) {
        for (size_t s = 0; s < _NODE_STATE_MAX; s++)
                counts[s] = 0;
        for (size_t i = 1; i < m->n_members; i++)
                counts[m->members[i].state]++;
}

/* The nodes borrow the members' strings and devices: topology_new_copy() copies them into the
 * topology's one block, so a change costs a few allocations, not several per member. */
int membership_topology(const Membership *m, int64_t now_ms, int64_t now_unix_ms,
                        Topology **ret) {
        _cleanup_free_ Node *nodes = reallocarray(NULL, MAX(m->n_members, (size_t) 1),
                                                  sizeof(Node));

        if (!nodes)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_members; i++) {
                const Member *e = &m->members[i];

                nodes[i] = (Node) {
                        .name = e->info->name,
                        .address = e->info->address,
                        .node_rank = e->info->node_rank,
                        .devices = e->info->devices,
                        .n_devices = e->info->n_devices,
                        .state = e->local ? NODE_UP : e->state,
                        .last_seen_unix_ms = now_unix_ms - (now_ms - e->last_heard_ms),
                };
                memcpy(nodes[i].registry_digest, e->info->registry_digest,
                       sizeof nodes[i].registry_digest);
        }
        return topology_new_copy(nodes, m->n_members, m->members[0].info->name, m->version, ret);
}
