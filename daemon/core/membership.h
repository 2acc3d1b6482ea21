/* membership.h: the cluster's members as this daemon knows them, their states, and the topology version. */
#pragma once

/*
 * DESIGN: pure and single-threaded (the peer thread owns it); time comes in as arguments, so
 * the unit tests drive it with a fake clock. A member's state is this daemon's own observation:
 * up while heard within suspect_ms, suspect until down_ms, then down; a down member keeps its
 * ranks until forgotten. Every change to the member set or a state takes the version to
 * max(every version seen) + 1; messages carry the version, so quiet daemons agree on it.
 * A member's registry digest is an attribute, like its last-heard time: a change to it moves
 * the revision (what the topology shows) but not the version (who is in, in which state). The
 * member's own messages are authoritative for it; another member's report only when it heard
 * the member more recently than we did.
 */

#include <stdint.h>

#include "error.h"
#include "topology.h"

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
} MemberInfo;

void member_info_done(MemberInfo *m);
int member_info_copy(const MemberInfo *from, MemberInfo *ret);

typedef struct MembershipTimeouts {
        uint64_t suspect_ms;
        uint64_t down_ms;
        uint64_t forget_after_ms; /* after going down; 0: never */
} MembershipTimeouts;

typedef struct Member {
        MemberInfo info;
        int64_t last_heard_ms; /* the caller's monotonic clock */
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
        _MEMBER_VERDICT_MAX,
        _MEMBER_VERDICT_INVALID = -EINVAL,
} MemberVerdict;

typedef struct Membership Membership;

int membership_new(const MemberInfo *self, const MembershipTimeouts *timeouts, int64_t now_ms,
                   Membership **ret);
Membership *membership_free(Membership *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Membership *, membership_free);

/* A message came straight from `sender`, which knows `version`. On MEMBER_REFUSED,
 * *ret_refusal (malloc'd, may be NULL) says why, in words for the refused node's log. */
int membership_heard(Membership *m, const MemberInfo *sender, uint64_t version, int64_t now_ms,
                     MemberVerdict *ret, char **ret_refusal);
/* Another member says it heard from `info` age_ms ago. */
int membership_learn(Membership *m, const MemberInfo *info, uint64_t age_ms, int64_t now_ms,
                     MemberVerdict *ret);
/* Applies the timeouts; true when a state changed or a member was forgotten. */
bool membership_tick(Membership *m, int64_t now_ms);

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
/* Counts the other members by state. */
void membership_count_states(const Membership *m, unsigned counts[_NODE_STATE_MAX]);

int membership_topology(const Membership *m, int64_t now_ms, int64_t now_unix_ms,
                        Topology **ret);
