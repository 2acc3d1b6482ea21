/* peer-ucx.h: one UCX worker in wakeup mode, its listener, and message endpoints to other daemons. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "common/macro.h"
#include "peer-key.h"

typedef struct PeerUcx PeerUcx;
typedef struct PeerEndpoint PeerEndpoint;

typedef struct PeerUcxCallbacks {
        /* A whole message; `reply` can answer it with peer_ucx_reply() during this call. */
        void (*on_message)(void *userdata, const uint8_t *data, size_t size, void *reply);
        /* An endpoint this side dialed failed (refused, reset, timed out); it is closed after
         * the call. cause: UCX's words for it. */
        void (*on_failure)(void *userdata, PeerEndpoint *ep, const char *cause);
        /* A message (a frame, with keys) of `size` bytes left this worker: UCX completed its
         * send. Messages dropped or failed are never counted. May be NULL. */
        void (*on_sent)(void *userdata, size_t size);
        void *userdata;
} PeerUcxCallbacks;

/* Listens on listen_address ("host:port"); the listener and the handshakes are sources of
 * event, the loop of the calling thread: the one thread that may call the functions below on
 * the result, free included (any other aborts: UCX's worker belongs to the thread that made
 * it). keys: NULL or none: peers are not authenticated; else every link proves one of them
 * at its handshake and every message carries a MAC and a sequence number (peer-frame.h). */
int peer_ucx_new(sd_event *event, const char *listen_address, const PeerKeys *keys,
                 const PeerUcxCallbacks *callbacks, PeerUcx **ret);
/* New handshakes use these keys (a rotation); links already authenticated keep their
 * sessions. Both the old and the new set must hold at least one key. */
void peer_ucx_set_keys(PeerUcx *u, const PeerKeys *keys);
/* Room for the sessions of two links from each of max_nodes members (0: FAMILYD_MAX_PEERS). */
void peer_ucx_set_max_nodes(PeerUcx *u, unsigned max_nodes);
PeerUcx *peer_ucx_free(PeerUcx *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(PeerUcx *, peer_ucx_free);

/* The worker's wakeup descriptor, for the caller's loop to watch. */
int peer_ucx_fd(PeerUcx *u);
/* Progresses the worker, delivers the callbacks, and re-arms the wakeup: the last thing before
 * the loop sleeps, after anything that may have sent. */
void peer_ucx_dispatch(PeerUcx *u);

/* Dials a daemon at "host:port". The connection completes in the background. */
int peer_ucx_connect(PeerUcx *u, const char *address, void *userdata, PeerEndpoint **ret);
/* Closes (forcibly) and forgets the endpoint; its userdata is not touched again. */
void peer_ucx_close(PeerUcx *u, PeerEndpoint *ep);

/* Sends a message, taking over buf (malloc'd); with keys, as a frame of the link's session. Returns -EBUSY, and drops the message, when
 * this endpoint already has too many messages in flight. */
int peer_ucx_send(PeerUcx *u, PeerEndpoint *ep, uint8_t *buf, size_t size);
int peer_ucx_reply(PeerUcx *u, void *reply, uint8_t *buf, size_t size);
/* The endpoint this side dialed that the message of `reply` came back on (an answer to what
 * we sent on it: a refusal, a request for our hello), or NULL when it came on a link another
 * daemon dialed. With keys the frame's session names it; without, UCX's reply endpoint. */
PeerEndpoint *peer_ucx_reply_endpoint(PeerUcx *u, void *reply);

/* With keys, the link a message came on (its session) carries the identity of the daemon that
 * speaks on it, bound by the caller once it believed that daemon: a real daemon speaks for one
 * start of one node per link, so a message in another name or start on a bound link is a lie.
 * _bound: the name the link is bound to (*ret_boot_id its start), NULL when unbound. _bind:
 * binds an unbound link. Without keys there is no link identity: NULL, and 0. */
const char *peer_ucx_reply_bound(PeerUcx *u, void *reply, uint64_t *ret_boot_id);
int peer_ucx_reply_bind(PeerUcx *u, void *reply, const char *name, uint64_t boot_id);

/* For tests/rogue only: sends buf as a frame numbered seq (a replay or a reordering), or as
 * is when the link has no session. Takes over buf. */
int peer_ucx_send_numbered(PeerUcx *u, PeerEndpoint *ep, uint8_t *buf, size_t size, uint64_t seq);
/* Whether the endpoint's handshake is done (its UCX endpoint exists). */
bool peer_ucx_endpoint_ready(PeerEndpoint *ep);

/* Splits "host:port" ("[v6]:port" too); 0 or -EINVAL. */
int peer_address_split(const char *address, char **ret_host, char **ret_port);
/* Whether every address "host:port" resolves to is a loopback one (127.0.0.0/8, ::1). */
bool peer_address_is_loopback(const char *address);
