/* peer.h: the peer thread: membership with the familyd of every other node, over UCX. */
#pragma once

#include <stdint.h>

#include "core/error.h"
#include "core/manager.h"
#include "membership/membership.h"
#include "membership/peer-protocol.h"
#include "peer-key.h"

typedef struct PeerParams {
        const char *listen_address; /* "host:port" of our UCX listener */
        const char *advertise_address; /* what others dial; default: listen_address */
        const char *peers;          /* "host:port[,host:port...]": a full list or one seed */
        const MemberInfo *self;     /* name, node rank, devices (address and boot are set here) */
        unsigned heartbeat_ms;
        ProtocolMode mode; /* --membership */
        MembershipTimeouts timeouts;
        Manager *manager; /* receives each new topology */
        const PeerKeys *keys; /* NULL or none: peers are not authenticated */
        unsigned max_nodes;   /* --max-nodes, this node included; 0: FAMILYD_MAX_PEERS */
} PeerParams;

typedef struct Peer Peer;

/* Starts listening and the thread; the first topology is published before it returns. */
int peer_new(const PeerParams *params, Peer **ret);
Peer *peer_free(Peer *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(Peer *, peer_free);

/* From any thread: new handshakes use these keys from now on (a reload of --cluster-key);
 * links already authenticated stay up. Only for a Peer started with keys. */
void peer_set_keys(Peer *p, const PeerKeys *keys);

/* From any thread: forgets a down node here and asks every peer to do the same. 1: forgotten. */
int peer_forget(Peer *p, const char *node, FamilyError *ret_error);
