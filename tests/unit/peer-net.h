/* peer-net.h: daemons' membership protocols wired through memory, with a clock the test moves. */
#pragma once

/*
 * The seed of the simulator (tests/sim): each node is a real Protocol (membership/peer-protocol.h);
 * its sink queues copies of what it sends, and the test delivers them in order, as UCX would,
 * between ticks of a clock the test moves (at protocol_tick_interval_ms(): a heartbeat with
 * all-to-all, half of one with swim). An endpoint is one link a node dialed; a reply travels
 * back on it, naming it as the dialed link (as peer-ucx does). A crashed node takes nothing
 * and its links fail, as UCX reports them; a cut loses what one node sends another while the
 * link stays up (loss, or a one-way partition).
 */

#include <stdbool.h>
#include <stdint.h>

#include "membership/peer-protocol.h"

#define MAX_NODES 8
#define MAX_QUEUE 4096
#define HEARTBEAT_MS 100

typedef struct Endpoint {
        int from, to;
        bool open;
        int64_t made;    /* net.now when dialed */
        unsigned to_start; /* the start of `to` it reaches */
        unsigned closes; /* by the node that dialed it (sink_close) */
} Endpoint;

typedef struct Delivery {
        int to;
        Endpoint *ep;
        bool is_reply; /* travels back on ep, to the node that dialed it */
        PeerMessage m;
} Delivery;

typedef struct SimNode {
        Protocol *protocol;
        char name[16], address[32];
        bool crashed;
        unsigned start; /* 1: the first */
        unsigned dials, refused_us, asked_again, refusals_ignored, refusing, learned;
        unsigned sent[_PEER_BODY_MAX]; /* messages this node sent (and replied), by body */
        uint64_t last_retry_s;
        uint64_t published_version;
} SimNode;

typedef struct PeerNet {
        ProtocolMode mode; /* of the nodes started from now on */
        SimNode nodes[MAX_NODES];
        size_t n_nodes;
        Endpoint *eps[1024];
        size_t n_eps;
        Delivery queue[MAX_QUEUE];
        size_t head, tail;
        int64_t now;
        unsigned tables, table_asks, announces; /* hellos with members, who(table), announces */
        bool cut[MAX_NODES][MAX_NODES]; /* [from][to]: messages lost (the link stays up) */
        bool no_gossip; /* probes lose their gossip in transit (a pull's answer does not) */
        /* Links fail only when used: a message to a start that is gone fails its link then
         * (a transport without keepalives), as in tests/sim. */
        bool lazy_failures;
        unsigned verdict_asks; /* whos with verdict buckets */
        /* Nodes started from now on MAC their records, and every node checks relayed ones: a
         * stand-in for the cluster key (record_mac = 0xaa, the boot id's low byte). */
        bool macs;
} PeerNet;

extern PeerNet net;
extern Device host_devices[1];


int node_of(void *userdata);
/* A node named `name` at 127.0.0.1:7000+i, joining through `seed` (may be NULL). */
SimNode *add_node(const char *name, int64_t rank, const char *seed);
/* A crashed (or hung) node starts again at the same address: a new start (`start`, 1: the
 * first), its old links closed as the kernel closes a dead process's connections. */
void restart(SimNode *n, int64_t rank, unsigned start, const char *seed);
/* Delivers everything queued (and what that sends), each receiver flushing after. */
void deliver(void);
/* Drops everything queued. */
void drop_queued(void);
/* `intervals` heartbeat intervals for every node that runs. */
void run(unsigned intervals);
/* A node crashes: it hears nothing, and the links to it fail as UCX says. */
void crash(SimNode *c);
/* A node crashes and nothing says so: its links stay open (see lazy_failures). */
void crash_silently(SimNode *c);
NodeState state_of(const SimNode *at, const SimNode *of);
int setup(void **state);
int teardown(void **state);
