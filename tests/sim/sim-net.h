/* sim-net.h: simulated daemons running the real membership protocol over a simulated network. */
#pragma once

/*
 * DESIGN: a discrete-event simulation, single-threaded. Each simulated node is a real
 * Protocol (membership/peer-protocol.h) whose sink is this file: a message sent is encoded with the
 * real codec (codec/codec-peer.h, so the bytes counted are the wire's, plus the frame of an
 * authenticated link), dropped with the loss rate or across a partition, and otherwise
 * decoded and handed to the destination's protocol_on_message() after the latency and its
 * jitter. A dialed endpoint is one simulated connection; a reply travels back on it. A node
 * that crashes takes nothing; a message to it fails its link after a round trip, as UCX
 * reports a reset; a restart is a new Protocol at the same address with a new boot id.
 * Events (deliveries, each node's heartbeat tick, the flush an event loop does before it
 * sleeps) run in time order from one heap; time is in microseconds, the protocol sees ms.
 * Identical bytes a node sends in a row (a heartbeat or an announce to every link) share one
 * buffer, so in-flight memory stays per sender, not per link. The nodes' member tables share
 * one copy of each member record (membership_set_records()), so N nodes hold N records, not
 * N^2; --own-records measures the daemon's way, a copy per table.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "membership/peer-protocol.h"

typedef struct SimConfig {
        size_t max_nodes;          /* capacity: members plus joiners */
        unsigned heartbeat_ms, suspect_ms, down_ms;
        ProtocolMode mode;         /* --membership */
        unsigned latency_us, jitter_us; /* one way: latency + uniform [0, jitter) */
        unsigned flush_us;         /* an event loop's batch: a flush at most this long after */
        unsigned devices;          /* per node, as a GPU node reports them */
        double loss;               /* per message */
        uint64_t seed;
        bool own_records;          /* each node copies every member record, as daemons do */
} SimConfig;

typedef struct SimCounters {
        uint64_t messages, bytes; /* sent, including lost ones */
        uint64_t delivered, lost;
} SimCounters;

typedef struct SimNode {
        Protocol *protocol;
        char name[32], address[32];
        uint32_t incarnation; /* starts of this node; endpoints name the one they reached */
        bool up;
        int group;            /* partitions: messages cross only within a group */
        bool flush_pending;
        bool publish_pending; /* a flush when the change its publish gap holds is due */
        uint8_t *suspected;   /* per member index: 1 suspect, 2 down when last published */
        SimCounters sent;
        uint64_t last_buffer_hash;
        struct SimBuffer *last_buffer;
} SimNode;

/* What a node's published topologies show about one watched member. */
typedef struct SimWatch {
        int64_t node;            /* -1: none */
        int64_t first_suspect_us; /* -1: not yet */
        size_t down_seen;         /* live nodes that published it down */
        size_t expected;          /* live nodes when the watch began */
        int64_t all_down_us;      /* when down_seen reached expected; -1: not yet */
        uint8_t *seen_down;      /* per observer */
} SimWatch;

typedef struct Sim {
        SimConfig config;
        SimNode *nodes;
        size_t n_nodes; /* started at least once */
        int64_t now_us;
        SimCounters total;
        MemberRecords *records; /* shared between the nodes' tables; NULL with own_records */
        uint64_t false_suspicions; /* a live, reachable member newly suspect at some node */
        uint64_t false_downs;      /* ... newly down at some node */
        bool count_suspicions;
        SimWatch watch;
        uint64_t rng;
        struct SimEvent *heap;
        size_t n_heap, heap_allocated;
        uint64_t seq;
} Sim;

int sim_new(const SimConfig *config, Sim **ret);
Sim *sim_free(Sim *s);

/* Starts node i (a first start, or a restart with a new boot id), dialing seed (-1: none). */
int sim_start(Sim *s, size_t i, int64_t seed);
/* The node stops: its protocol is freed, and what is sent to it fails its link. */
void sim_crash(Sim *s, size_t i);
/* Runs every event up to the time `until_us`. */
void sim_run_until(Sim *s, int64_t until_us);
/* Runs until every live node agrees (same members, states and version) or until_us. Returns
 * the time of agreement, or -1. check_us: how often agreement is checked. */
int64_t sim_run_to_agreement(Sim *s, int64_t until_us, int64_t check_us);
/* Whether every live node holds the same members, states and version now. */
bool sim_agreed(const Sim *s);
/* Watches what the nodes publish about node i (crash detection): every node up now is
 * expected to see it down. */
void sim_watch(Sim *s, int64_t i);
/* Nodes up now. */
size_t sim_live(const Sim *s);

uint64_t sim_random(Sim *s);
