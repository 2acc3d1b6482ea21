/* peer-protocol-internal.h: what peer-protocol.c and its SWIM mode (peer-protocol-swim.c) share. */
#pragma once

/*
 * DESIGN: one Protocol, two files: peer-protocol.c has what both modes do (links, hellos,
 * tables, refusals, publishing) and all-to-all's heartbeats; peer-protocol-swim.c has SWIM's
 * probes, gossiped verdicts and verdict pulls. Both see the whole struct; nothing outside them
 * includes this header (peer-protocol.h is the protocol's interface).
 */

#include "gossip.h"
#include "name-index.h"
#include "peer-protocol.h"
#include "verdict-sync.h"

#define PROTOCOL_VERSION_NOTE_SLOTS 64u

typedef struct ProtocolLink {
        char *address;
        void *endpoint;    /* NULL while waiting to dial again */
        bool seed;         /* from --peers: dialed even when no member lives there */
        bool refused;      /* that daemon refused us: dialed again at retry_at_ms */
        unsigned refusals; /* in a row, for the backoff */
        bool failing;      /* a failure was noted; the next success is noted too */
        bool reached;      /* heard from since the last failure */
        unsigned failures;
        int64_t retry_at_ms;
        int64_t dialed_at_ms;    /* when the endpoint was made */
        bool differs;            /* the member's table digest is not ours */
        int64_t differs_since_ms; /* since then, or since we last asked it for its table */
        int64_t used_at_ms;       /* swim: last sent on */
        uint64_t answered_boot_id; /* the start that last answered on it (0: none) */
        struct ProtocolLink *next;
} ProtocolLink;

/* swim: where this daemon's probe of the period stands. */
typedef enum SwimPhase {
        SWIM_IDLE,     /* answered, or none */
        SWIM_DIRECT,   /* pinged, waiting for its ack */
        SWIM_INDIRECT, /* others asked to ping it */
} SwimPhase;

/* swim: a ping_req being answered: the ack of our ping goes back to the requester. */
typedef struct SwimRelay {
        char *requester; /* its address; NULL: the slot is free */
        char *target;
        uint64_t target_boot_id;
        uint32_t their_seq, our_seq;
} SwimRelay;

struct Protocol {
        ProtocolSink sink;
        Membership *membership;
        MemberInfo self;
        ProtocolMode mode;
        unsigned heartbeat_ms;
        ProtocolLink *links;
        size_t n_links;
        NameIndex links_by_address; /* address -> (uintptr_t) ProtocolLink * */
        uint64_t published_version;
        uint64_t published_revision; /* membership_revision(): digests change it, not versions */
        unsigned publish_gap_ms;
        int64_t published_at_ms; /* INT64_MIN: never */
        bool publish_held;       /* a change waits for the gap to pass */
        uint64_t sent_changes; /* membership_changes() when heartbeats last went out eagerly */
        int64_t eager_at_ms;
        bool dirty; /* the members changed in a way the version may not show */
        int64_t pulled_at_ms; /* a table was last asked for; 0: never */
        uint64_t pulled_digest; /* ours then */
        unsigned fruitless;     /* tables asked for in a row that did not change ours */
        uint64_t random;
        int64_t version_noted_ms[PROTOCOL_VERSION_NOTE_SLOTS];
        int64_t link_lie_noted_ms;

        /* swim */
        uint32_t seq;
        unsigned ticks;
        SwimPhase phase;
        char *probe_name; /* the member probed this period */
        uint64_t probe_boot_id;
        uint32_t probe_seq;
        char *probe_next; /* a member to probe next period (it may have restarted) */
        SwimRelay relays[PROTOCOL_SWIM_RELAYS];
        size_t next_relay;
        Gossip gossip;
        bool differs; /* a member's table digest differs from ours (links are few) */
        int64_t differs_since_ms;
        bool greeted; /* said hello to every member of the first table we got */
        VerdictPull verdict_pull;
        int64_t answers_at_ms; /* the heartbeat in which pulls were last answered */
        unsigned answers;      /* how many in it */
};

/* swim: ours, raised to refute a suspicion of us (kept in the table's own entry, which the
 * verdict digest counts). */
static inline uint64_t own_incarnation(const Protocol *p) {
        return membership_get(p->membership, 0)->incarnation;
}

static inline void note(Protocol *p, ProtocolNote n) {
        if (p->sink.note)
                p->sink.note(p->sink.userdata, &n);
}

static inline void note_no_memory(Protocol *p) {
        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_NO_MEMORY });
}

/* peer-protocol.c: links and messages, for both modes. */
uint64_t protocol_random(Protocol *p);
void protocol_reply(Protocol *p, const ProtocolOrigin *o, PeerMessage *m);
void protocol_send_or_reply(Protocol *p, ProtocolLink *l, const ProtocolOrigin *o, PeerMessage *m);
void protocol_send_hello(Protocol *p, ProtocolLink *l, const ProtocolOrigin *o, bool table,
                         int64_t now);
ProtocolLink *protocol_link_find(Protocol *p, const char *address);
ProtocolLink *protocol_link_add(Protocol *p, const char *address, bool seed, int64_t now);
void protocol_link_dial(Protocol *p, ProtocolLink *l, int64_t now);
void protocol_link_free(Protocol *p, ProtocolLink *l);
void protocol_links_prune(Protocol *p);
void protocol_tick_members(Protocol *p, int64_t now);

/* peer-protocol-swim.c: the SWIM mode. */
void protocol_swim_news(Protocol *p, const char *name, uint64_t boot_id, bool forgotten);
void protocol_swim_verdict_take(Protocol *p, const char *name, uint64_t boot_id,
                                uint64_t incarnation, NodeState state, int64_t now);
void protocol_swim_take_gossip(Protocol *p, const PeerMessage *m, int64_t now);
void protocol_swim_answer(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m, int64_t now);
void protocol_swim_acked(Protocol *p, const PeerMessage *m, int64_t now);
void protocol_swim_relay(Protocol *p, const PeerMessage *m, int64_t now);
void protocol_swim_verdict_check(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                                 int64_t now);
void protocol_swim_verdicts_answer(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                                   int64_t now);
void protocol_swim_tick(Protocol *p, int64_t now);
void protocol_swim_greet(Protocol *p, int64_t now);
