/* peer-ucx-internal.h: what peer-ucx.c, peer-handshake.c and peer-session.c share: the types and limits. */
#pragma once

/*
 * DESIGN: the peer transport is three files around one PeerUcx: peer-ucx.c (the worker, the
 * endpoints, receiving, dispatching and sending), peer-handshake.c (the bootstrap listener and
 * the handshakes, with their keyed proofs) and peer-session.c (the links' sessions and the
 * identity bound to them). Only they include this header; everyone else sees peer-ucx.h.
 */

#include <netdb.h>
#include <pthread.h>
#include <systemd/sd-event.h>
#include <ucp/api/ucp.h>

#include "peer-auth.h"
#include "peer-frame.h"
#include "peer-ucx.h"
#include "core/resource-limits.h"

#define PEER_AM_ID 7
/* Messages queued on one endpoint before sends are dropped (a stalled peer). */
#define PEER_MAX_INFLIGHT 64u
/* The bootstrap handshake: magic, then (answer only) a length and the worker address; with a
 * cluster key, another magic and the proofs first (DESIGN). */
#define PEER_MAGIC "FAMILYD1"
#define PEER_MAGIC_KEYED "FAMILYK1"
#define PEER_MAGIC_SIZE 8u
#define PEER_MAX_WORKER_ADDRESS 16384u
#define PEER_HANDSHAKE_MS 5000
/* The handshake timer fires within this of its deadline (not sd-event's default 250 ms). */
#define PEER_TIMER_ACCURACY_USEC 1000u
/* Handshakes in progress on the listening side; more are closed at once. One source address
 * holds at most PEER_MAX_HANDSHAKES_PER_SOURCE of them, so a flood from one host leaves room
 * for the others (a flood of 837k idle connections from one address once held all 64). */
#define PEER_MAX_HANDSHAKES 64u
#define PEER_MAX_HANDSHAKES_PER_SOURCE 8u
#define PEER_FLOOD_LOG_USEC (10u * 1000000u)
/* Sessions that others dialed, kept for their messages: room for two links from every member
 * (--max-nodes, peer_ucx_set_max_nodes(); this many by default); past it the least recently
 * used goes. */
#define PEER_MAX_SESSIONS (2u * FAMILYD_MAX_PEERS + PEER_MAX_HANDSHAKES)
#define PEER_REMOTE_MAX 80u

typedef enum HandshakeStage {
        HS_DIAL_HELLO_SENT,    /* writing the magic (keyed: and our nonce) */
        HS_DIAL_HEAD,          /* no key: reading the magic and the address length */
        HS_DIAL_PROOFS,        /* keyed: reading the magic, its nonce and its proofs */
        HS_DIAL_PROOF_SENT,    /* keyed: writing our proof */
        HS_DIAL_LENGTH,        /* keyed: reading the address length */
        HS_DIAL_ADDRESS,       /* reading the worker address */
        HS_LISTEN_MAGIC,       /* reading the magic */
        HS_LISTEN_NONCE,       /* keyed: reading the dialer's nonce */
        HS_LISTEN_PROOFS_SENT, /* keyed: writing the magic, our nonce and proofs */
        HS_LISTEN_PROOF,       /* keyed: reading the dialer's proof */
        HS_LISTEN_ANSWER_SENT, /* writing (the magic,) the length and the worker address */
} HandshakeStage;

/* An authenticated link: its keys, the next number we send, the numbers we received. */
typedef struct PeerSession {
        PeerSessionKeys keys;
        PeerRole role; /* ours on the link */
        uint64_t next_seq;
        PeerReplayWindow window;
        char *bound_name; /* who speaks on the link, once the caller believed it */
        uint64_t bound_boot;
        struct PeerSession *next;
} PeerSession;

typedef struct PeerHandshake {
        PeerUcx *ucx;
        int fd;
        sd_event_source *io;
        sd_event_source *timeout; /* PEER_HANDSHAKE_MS from the start */
        bool dialing;  /* ours: send the magic, read the answer */
        HandshakeStage stage;
        uint8_t *in;   /* the other side's part so far: have of want bytes */
        size_t have, want, in_size;
        uint8_t *out;  /* our part, while it is written: sent of out_size bytes */
        size_t out_size, sent;
        uint8_t nonces[2][PEER_NONCE_BYTES]; /* keyed: the dialer's, the listener's */
        bool proven; /* keyed: the other side proved the key; session holds the link's keys */
        PeerSessionKeys session;
        char remote[PEER_REMOTE_MAX]; /* the other side, for the log */
        char source[NI_MAXHOST];      /* listening: the other side's host, for its limit */
        struct PeerEndpoint *endpoint; /* dialing only */
        struct PeerHandshake *next;
} PeerHandshake;

typedef struct PeerPending {
        uint8_t *buf;
        size_t size;
        struct PeerPending *next;
} PeerPending;

struct PeerEndpoint {
        ucp_ep_h ep;              /* NULL while the handshake runs */
        PeerHandshake *handshake; /* the dialing handshake, until the endpoint exists */
        PeerPending *pending, **pending_tail; /* sends made before it existed */
        unsigned n_pending;
        PeerUcx *ucx;
        PeerSession *session; /* keyed: from the handshake on */
        void *userdata;
        unsigned inflight;
        bool failed;
        bool closed;
        char *failure; /* UCX's cause, until dispatched */
        PeerEndpoint *next;
};

typedef struct PeerInbox {
        uint8_t *data;
        size_t size;
        ucp_ep_h reply;
        struct PeerInbox *next;
} PeerInbox;

struct PeerUcx {
        ucp_context_h context;
        ucp_worker_h worker;
        pthread_t owner; /* the thread that made the worker: the only one that may touch it */
        int worker_fd;
        ucp_address_t *address;
        size_t address_size;
        int listen_fd;
        sd_event *event;
        sd_event_source *listener;
        PeerUcxCallbacks callbacks;
        PeerEndpoint *endpoints;
        PeerInbox *inbox, **inbox_tail;
        PeerHandshake *handshakes;
        unsigned n_accepted; /* listening handshakes in progress */
        unsigned dropped; /* undecodable or oversized messages, for one log line now and then */
        PeerKeys keys;    /* n == 0: peers are not authenticated */
        PeerSession *sessions; /* most recently used first */
        unsigned n_listener_sessions;
        unsigned max_listener_sessions; /* PEER_MAX_SESSIONS, or sized by --max-nodes */
        unsigned unauthenticated; /* messages of no session, or with a bad MAC, dropped */
        unsigned replayed;        /* messages seen before or too old, dropped */
        unsigned refused;         /* handshakes that did not prove the key */
        unsigned flooded;         /* connections closed at once: too many handshakes */
        uint64_t flood_logged_usec; /* a flood is logged once every PEER_FLOOD_LOG_USEC */
        char *refused_last;       /* the last of them: "host:port: why" */
};

/* What peer_ucx_reply() answers on: the endpoint and session a message came in on. */
typedef struct PeerReplyTo {
        ucp_ep_h ep;
        PeerSession *session;
} PeerReplyTo;

/* peer-ucx.c */
/* Aborts, naming the caller, unless this is the thread that made u's worker (DESIGN in
 * peer-ucx.c). In every build: UCX 1.13 does not check this and 1.18 only where its own
 * assertions are built in. */
#define peer_ucx_assert_owner(u) peer_ucx_check_owner((u), __func__)
void peer_ucx_check_owner(const PeerUcx *u, const char *caller);
int peer_errno_from_ucs(ucs_status_t s);
int peer_resolve_address(const char *address, bool passive, struct sockaddr_storage *ret,
                         socklen_t *ret_len);
void peer_endpoint_free_if_done(PeerEndpoint *e);
void peer_endpoint_close(PeerUcx *u, PeerEndpoint *e);
void peer_endpoint_fail(PeerEndpoint *e, const char *cause);
void peer_on_endpoint_error(void *arg, ucp_ep_h ep, ucs_status_t status);
int peer_send_on(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *s, uint8_t *buf,
                 size_t size);

/* peer-session.c */
PeerSession *peer_session_new(PeerUcx *u, const PeerSessionKeys *keys, PeerRole role);
void peer_session_free(PeerUcx *u, PeerSession *s);
PeerSession *peer_session_find(PeerUcx *u, const uint8_t *id);
const uint8_t *peer_session_send_key(const PeerSession *s);
const uint8_t *peer_session_receive_key(const PeerSession *s);

/* peer-handshake.c */
int peer_handshake_new(PeerUcx *u, int fd, bool dialing, PeerEndpoint *endpoint,
                       const char *remote, const char *source);
void peer_handshake_free(PeerUcx *u, PeerHandshake *h);
int peer_on_listener_io(sd_event_source *source, int listen_fd, uint32_t revents,
                        void *userdata);
int peer_listener_open(const char *address, int *ret);
