/* peer-protocol.h: the membership protocol: what a daemon sends its peers when, and what it believes. */
#pragma once

/*
 * DESIGN: transport-free and single-threaded. The protocol owns the Membership and the links
 * this daemon dials (which addresses, the backoff after failures and refusals); it is driven by
 * the caller's monotonic clock (every call takes `now`) and speaks through a ProtocolSink:
 * dial, send, reply, bind, close, published, and notes for the caller's log (membership/ never
 * logs). peer/peer.c maps the sink onto UCX and sd-event; the unit tests and the fuzzer wire
 * it to memory, so they run the very code the daemon runs.
 *
 * Every daemon dials every member it knows (one outgoing link per address) and sends only on
 * its own links; what arrives on the links others dialed is read, and a refusal and a who are
 * the things answered on them. A link's first message is a hello with this daemon's record.
 * Every message carries a digest of the sender's member table (names and starts): a receiver
 * whose table differs asks the sender for its table (a who with want_table, answered by a hello
 * with every member), at once when the sender knows more nodes, else when the difference lasts
 * PROTOCOL_TABLE_ROUNDS heartbeats; so one seed teaches a joining node the whole cluster, and
 * tables travel only where they differ (a join costs O(N) records, not O(N^2)). A join heard
 * directly from a node that knows less than half of our table is announced once to the other
 * links; a node that knows the table dials every member itself. After that each interval costs
 * one small heartbeat per link. A change made here goes out eagerly (at most every quarter
 * interval) to PROTOCOL_EAGER_FANOUT links, so they take its version within a round trip.
 *
 * A restart, once believed, makes our link to the node's address anew only when that link is
 * older than the last news of the previous start: a link made since (after the old one failed)
 * reaches the new start already, and closing it would also cut the new start's own link to us,
 * which UCX may carry on the same connection (it pairs two workers' endpoints to each other).
 *
 * With PROTOCOL_SWIM (--membership swim) the heartbeats to every link give way to SWIM's
 * probes (Das, Gupta, Motivala 2002): every heartbeat interval a daemon pings one member chosen
 * at random; without an ack within half an interval it asks PROTOCOL_SWIM_HELPERS others to
 * ping it (ping_req) and passes their acks on; still without one at the end of the interval it
 * holds the member suspect (membership_verdict()). States are verdicts, shared by gossip
 * (membership/gossip.h): each probe message carries up to PROTOCOL_GOSSIP_PER_MESSAGE of the newest
 * verdicts, each told PROTOCOL_GOSSIP_TELL log2 N times, and a ping names the state its sender
 * holds for the receiver; a member that hears itself suspected or down raises its incarnation,
 * which refutes it. A suspicion that lasts membership_suspicion_ms() is down. So a quiet
 * cluster costs each daemon about one ping and one ack per interval whatever N, and a verdict
 * reaches everyone in O(log N) intervals. Links are made when a message is to go out, and past
 * PROTOCOL_SWIM_LINKS closed after PROTOCOL_SWIM_LINK_IDLE_PERIODS quiet intervals; a link's
 * first message is a hello only to a seed, and a who is answered on the link it came on. Joins
 * and restarts are believed only from the node itself, as with all-to-all: a seed answers a
 * newcomer's hello with its table, and the newcomer, once it knows a table, says hello to
 * every member (one message each); a member that still holds an older start of it up probes
 * that start next, so it is suspected within a period and the new start believed on its next
 * word. Tables still meet by digest, and verdicts by theirs: a daemon whose verdict digest has
 * differed from those it hears pulls the member's verdicts where they differ (a who with its
 * digest in buckets, answered with PEER_VERDICTS; membership/verdict-sync.h), so a mass change such
 * as a healed partition spreads in about log2 N pulls instead of waiting for gossip. On a
 * restart a swim daemon also makes anew every link to the node that the new start has not
 * answered on: it hears most members only through others, so the last news of the previous
 * start says little about when its link was made.
 *
 * Rules against a member that errs (the membership's own are in membership.h):
 * - a refusal counts only when it comes back on a link this daemon dialed (the origin names
 *   it) and closes that link alone, which is dialed again after PROTOCOL_REFUSED_BACKOFF_MIN_MS,
 *   doubling to PROTOCOL_REFUSED_BACKOFF_MAX_MS (the other side's configuration may change);
 * - with keys, a link speaks for the one start of one node first believed on it (the sink's
 *   bind()): a message in another name or start on it is dropped, so a restart comes only on
 *   the node's own new link;
 * - a hello or announce whose list would take the table past --max-nodes is refused whole;
 * - a version the member table cannot explain is noted once per sender and
 *   PROTOCOL_VERSION_NOTE_MS.
 */

#include <stdbool.h>
#include <stdint.h>

#include "membership.h"
#include "peer-message.h"

#define PROTOCOL_BACKOFF_MIN_MS 200
#define PROTOCOL_BACKOFF_MAX_MS 5000
/* A daemon that refused us is asked again after 1 s, doubling up to 30 s. */
#define PROTOCOL_REFUSED_BACKOFF_MIN_MS 1000
#define PROTOCOL_REFUSED_BACKOFF_MAX_MS 30000
/* A member whose table digest differs from ours (and knows no more nodes) is asked for its
 * table after this many heartbeats of difference. */
#define PROTOCOL_TABLE_ROUNDS 3
/* Tables are asked for at most once per half heartbeat; while they change nothing here, the
 * wait doubles up to 2^PROTOCOL_TABLE_BACKOFF times (32 s at the default 1 s heartbeat). */
#define PROTOCOL_TABLE_BACKOFF 6
/* A change made here goes out at once to about this many links chosen at random (all of them
 * in a cluster this small or smaller); the others hear it with the next heartbeat. */
#define PROTOCOL_EAGER_FANOUT 8
/* A refused version or a lying link is noted at most once per sender in this long. */
#define PROTOCOL_VERSION_NOTE_MS 10000
/* swim: members asked to ping a member that did not answer us directly. */
#define PROTOCOL_SWIM_HELPERS 3
/* swim: ping_reqs being answered for others at once (older ones are forgotten). */
#define PROTOCOL_SWIM_RELAYS 16
/* swim: news items per probe message, and each told this many times log2(members). */
#define PROTOCOL_GOSSIP_PER_MESSAGE PEER_MAX_GOSSIP
#define PROTOCOL_GOSSIP_TELL 3
/* swim: past this many links, one not sent on for PROTOCOL_SWIM_LINK_IDLE_PERIODS probe
 * periods is closed (seeds excepted). */
#define PROTOCOL_SWIM_LINKS 256
#define PROTOCOL_SWIM_LINK_IDLE_PERIODS 30

typedef struct Protocol Protocol;

/* What the caller's log should say (the core does not log); fields as each kind says. */
typedef enum ProtocolNoteKind {
        PROTOCOL_NOTE_DIAL_FAILED,      /* address, error: first failure in a row */
        PROTOCOL_NOTE_LINK_FAILED,      /* address, text: the cause, flag: it had been reached */
        PROTOCOL_NOTE_LINK_BACK,        /* address, flag: it had refused us */
        PROTOCOL_NOTE_ASKING_AGAIN,     /* address: dialing one that refused us */
        PROTOCOL_NOTE_REFUSED_US,       /* member: the sender, address, text, number: s to retry */
        PROTOCOL_NOTE_REFUSAL_IGNORED,  /* member: a refusal on no link this node dialed */
        PROTOCOL_NOTE_REFUSING,         /* member, text: why */
        PROTOCOL_NOTE_JOINED,           /* member, flag: restarted */
        PROTOCOL_NOTE_LEARNED,          /* member, name: from whom */
        PROTOCOL_NOTE_FORGOT,           /* name, text: who asked (NULL: an operator) */
        PROTOCOL_NOTE_VERSION_REFUSED,  /* member, number: its version, number2: ours */
        PROTOCOL_NOTE_LINK_LIE,         /* member, name: the node the link is bound to */
        PROTOCOL_NOTE_DIGEST,           /* text: this node's new digest */
        PROTOCOL_NOTE_NO_MEMORY,
        _PROTOCOL_NOTE_MAX,
        _PROTOCOL_NOTE_INVALID = -EINVAL,
} ProtocolNoteKind;

typedef struct ProtocolNote {
        ProtocolNoteKind kind;
        const char *address;
        const char *name;
        const char *text;
        const MemberInfo *member;
        uint64_t number, number2;
        int error;
        bool flag;
} ProtocolNote;

/* Where a message came from, as the transport knows it. */
typedef struct ProtocolOrigin {
        void *reply;            /* the transport's handle for reply() and bind() */
        void *dialed;           /* the endpoint this node dialed that it came back on, or NULL */
        const char *bound_name; /* with keys: the node its link speaks for, NULL: unbound */
        uint64_t bound_boot_id;
} ProtocolOrigin;

typedef struct ProtocolSink {
        /* Dials address; *ret_endpoint is the transport's handle for send(), close() and
         * protocol_on_link_failed(). A negative errno: not dialed, tried again with backoff. */
        int (*dial)(void *userdata, const char *address, void **ret_endpoint);
        /* Sends on an endpoint from dial(); the message is borrowed for the call. */
        void (*send)(void *userdata, void *endpoint, const char *address, const PeerMessage *m);
        /* Answers on the link a message came in on, during protocol_on_message(). */
        void (*reply)(void *userdata, void *reply, const PeerMessage *m);
        /* Binds the link a message came on to one start of one node (with keys; else 0). */
        int (*bind)(void *userdata, void *reply, const char *name, uint64_t boot_id);
        /* Closes an endpoint from dial(); it is not named again. */
        void (*close)(void *userdata, void *endpoint);
        /* A new topology snapshot; the callee takes the reference. NULL: changed() instead. */
        void (*published)(void *userdata, Topology *t);
        /* With no published(): the members changed; the callee reads them from the table (a
         * simulator of thousands of nodes, where a snapshot each would copy N records). */
        void (*changed)(void *userdata, const Membership *m);
        /* Whether a relayed record's record_mac is its node's own under the cluster key. NULL:
         * no key, no record is proven. */
        bool (*verify)(void *userdata, const MemberInfo *record);
        /* May be NULL. */
        void (*note)(void *userdata, const ProtocolNote *n);
        void *userdata;
} ProtocolSink;

/* How members watch each other (--membership). */
typedef enum ProtocolMode {
        PROTOCOL_ALL_TO_ALL, /* a heartbeat on every link each interval; states are our own */
        PROTOCOL_SWIM,       /* probes, indirect probes and gossiped verdicts (SWIM) */
        _PROTOCOL_MODE_MAX,
        _PROTOCOL_MODE_INVALID = -EINVAL,
} ProtocolMode;

const char *protocol_mode_to_string(ProtocolMode mode); /* "all-to-all" | "swim" */
ProtocolMode protocol_mode_from_string(const char *s);  /* _PROTOCOL_MODE_INVALID if neither */

typedef struct ProtocolParams {
        const MemberInfo *self; /* with its address and boot id */
        ProtocolMode mode;
        MembershipTimeouts timeouts;
        size_t max_nodes;
        unsigned heartbeat_ms;
        MemberRecords *records; /* shared member records (tests/sim); NULL: the table's own */
        size_t reserve;         /* room for this many members from the start (tests/sim); 0:
                                 * the table grows as they come */
        /* A topology is published at most once per this many ms (protocol_flush()); 0: on
         * every flush that finds a change. */
        unsigned publish_gap_ms;
} ProtocolParams;

/* A daemon's publish_gap_ms: a burst of changes (a cold start of 10,000 members: a join each,
 * a copy of every record each) publishes at most 50 topologies a second. */
#define PROTOCOL_PUBLISH_GAP_MS 20

int protocol_new(const ProtocolParams *params, const ProtocolSink *sink, int64_t now_ms,
                 Protocol **ret);
/* Closes every endpoint through the sink. */
Protocol *protocol_free(Protocol *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(Protocol *, protocol_free);

/* A --peers address: dialed even when no member lives there. */
int protocol_add_seed(Protocol *p, const char *address, int64_t now_ms);
/* A decoded message from a peer. */
void protocol_on_message(Protocol *p, const ProtocolOrigin *origin, const PeerMessage *m,
                         int64_t now_ms);
/* An endpoint from dial() failed; the transport closes it itself. */
void protocol_on_link_failed(Protocol *p, void *endpoint, const char *cause, int64_t now_ms);
/* Every protocol_tick_interval_ms(): the timeouts, the links due to be dialed again, the
 * heartbeats (all-to-all) or the probes (swim). */
void protocol_tick(Protocol *p, int64_t now_ms);
/* How often protocol_tick() wants calling: the heartbeat interval (all-to-all), half of it
 * (swim: a probe's direct and indirect halves). */
unsigned protocol_tick_interval_ms(const Protocol *p);
/* This node's MAC over its own record (a new cluster key): its hellos carry it from now on. */
void protocol_set_record_mac(Protocol *p, const uint8_t mac[MEMBER_RECORD_MAC_BYTES]);
/* This node's registry digest (a reload): every message names it from now on. */
void protocol_set_local_digest(Protocol *p, const char *digest);
/* An operator forgets a node that is not up: told to every link. 1 forgotten, or a negative
 * errno with *ret_error set. */
int protocol_forget(Protocol *p, const char *node, int64_t now_ms, FamilyError *ret_error);
/* Sends the eager heartbeats a change made here is due, and publishes a new topology when the
 * members changed, unless one was published less than publish_gap_ms ago: then
 * protocol_publish_due_ms() says when to flush again. The last thing before the caller
 * sleeps. */
void protocol_flush(Protocol *p, int64_t now_ms, int64_t now_unix_ms);
/* protocol_flush() publishing a change whatever the gap (the caller answers with the topology
 * next: ForgetNode). */
void protocol_flush_now(Protocol *p, int64_t now_ms, int64_t now_unix_ms);
/* When a change held back by the gap is due to be published (flush then); -1: none held. */
int64_t protocol_publish_due_ms(const Protocol *p);

const Membership *protocol_membership(const Protocol *p);
/* How many links this node dials, and how many of them are connected now. */
size_t protocol_links(const Protocol *p, size_t *ret_connected);
