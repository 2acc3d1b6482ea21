/* peer-message.h: the daemons' membership messages, decoded: what the protocol reads and writes. */
#pragma once

/*
 * DESIGN: the protocol (peer-protocol.h) speaks these structs; codec/codec-peer.h turns them
 * into familyd.v1.PeerMessage bytes and back, so the protocol never sees the wire.
 */

#include <stddef.h>
#include <stdint.h>

#include "membership.h"

typedef enum PeerBody {
        PEER_HEARTBEAT,
        PEER_HELLO,    /* first message on a new link: the sender, and its table when asked */
        PEER_ANNOUNCE, /* members that joined or restarted */
        PEER_FORGET,
        PEER_REFUSE,
        PEER_WHO,      /* the sender does not know the receiver's start (or, with want_table,
                        * its table): answer with a hello */
        PEER_PING,     /* swim: are you alive? (probe: the receiver as the sender knows it) */
        PEER_ACK,      /* swim: the member probe names answered probe.seq */
        PEER_PING_REQ, /* swim: ping probe's member for the sender */
        PEER_VERDICTS, /* swim: verdicts asked for by a who with buckets, in updates */
        _PEER_BODY_MAX,
        _PEER_BODY_INVALID = -EINVAL,
} PeerBody;

/* Gossip carries at most this many verdicts per message (swim). */
#define PEER_MAX_GOSSIP 256
/* An answer to a who with buckets carries at most this many (a longer one is split). */
#define PEER_MAX_VERDICTS 4096
/* A who asks for verdicts in at most this many buckets (a power of two). */
#define PEER_MAX_VERDICT_BUCKETS 1024

typedef struct PeerKnown {
        MemberInfo info;
        uint64_t age_ms;
        NodeState state; /* swim: the sender's verdict */
        uint64_t incarnation;
} PeerKnown;

/* A verdict about one start of a member (swim); forgotten: an operator forgot it. */
typedef struct PeerUpdate {
        char *name;
        uint64_t boot_id;
        uint64_t incarnation;
        NodeState state;
        bool forgotten;
} PeerUpdate;

typedef struct PeerProbe {
        char *name;
        uint64_t boot_id;
        uint32_t seq;
        NodeState state;
        uint64_t incarnation;
} PeerProbe;

typedef struct PeerMessage {
        PeerBody body;
        MemberInfo sender;
        uint64_t version;
        PeerKnown *members; /* hello, announce */
        size_t n_members;
        PeerProbe probe;    /* ping, ack, ping_req */
        PeerUpdate *updates; /* swim probes: gossiped verdicts; verdicts: those asked for */
        size_t n_updates;
        uint64_t incarnation; /* swim: the sender's */
        char *forget_name; /* forget */
        uint64_t forget_boot_id;
        char *reason; /* refuse */
        bool want_table; /* who: send the whole table in the hello */
        /* who (swim): send verdicts where they differ from these, the asker's verdict digest of
         * each of n_want_verdicts buckets (membership_verdict_buckets()); 0: none asked. */
        uint64_t *want_verdicts;
        size_t n_want_verdicts;
        /* The sender's table summarised (membership_digest()); has_table: the sender sent it
         * (daemons before it did not). */
        bool has_table;
        uint64_t table_digest;
        uint32_t table_members;
        uint64_t verdict_digest; /* swim: membership_verdict_digest(); 0: not sent */
} PeerMessage;

/* Frees what a decoded message owns. */
void peer_message_done(PeerMessage *m);
/* A decoded message's updates: from[n] and their names copied into one allocation, which
 * peer_message_done() frees (an answer of thousands of verdicts costs one malloc, not one a
 * name). *ret NULL when n is 0. */
int peer_updates_copy(const PeerUpdate *from, size_t n, PeerUpdate **ret);
