/* peer-ucx.c: the UCX worker, the bootstrap listener and the endpoints of the peer thread. */

/*
 * DESIGN: used by the peer thread only (UCS_THREAD_MODE_SINGLE), on that thread's sd-event
 * loop: the listener and each handshake are sources of it, a handshake with a timer for its
 * deadline; the worker's wakeup descriptor is the caller's to watch.
 *
 * Connections start with our own handshake on --listen, not UCX's sockaddr connection
 * manager: UCX 1.13's tcp_sockcm aborts the whole process on a malformed header from any
 * client that reaches the port (an assertion, seen with 64 bytes of 0xff), and a node's peer
 * port must survive whatever the network sends it. The dialer connects over TCP and sends an
 * 8-byte magic; the listener answers with the magic, a 4-byte length and its UCX worker
 * address, and closes. The dialer then creates its endpoint from that worker address (UCX's
 * own wireup runs on the tcp transport's ports, which take garbage without harm). Anything
 * else on the bootstrap port (wrong magic, silence past PEER_HANDSHAKE_MS, an oversized
 * answer) closes that TCP connection only. At most PEER_MAX_HANDSHAKES listening handshakes
 * run at once, PEER_MAX_HANDSHAKES_PER_SOURCE of them from one address: a flood of idle
 * connections from one host cannot keep a restarted node out.
 *
 * With a cluster key (--cluster-key) the handshake proves it both ways before the address is
 * handed out: the dialer sends "FAMILYK1" and its nonce; the listener its nonce and a proof
 * per key it holds (peer-auth.c); the dialer its proof under the first of its keys that the
 * listener proved; then the listener the length and the address. Each side keeps the link's
 * session (its keys, the next number to send, the replay window of what it received): the
 * dialer's with its endpoint, the listener's in a table bounded by PEER_MAX_SESSIONS, least
 * recently used out first, since UCX does not say which endpoint an active message came from.
 * Every message is then sealed into a frame on sending and opened on dispatch (peer-frame.c):
 * a frame that names no session or fails its MAC or sequence check is dropped before the
 * callback, so nothing unauthenticated reaches the membership. A session also carries the
 * identity the caller bound to it (peer_ucx_reply_bind()), and names the endpoint a reply came
 * back on (peer_ucx_reply_endpoint()): the link, not the message's words, says who speaks.
 * A message counts as sent (on_sent) when UCX completes its send, not when it is queued.
 *
 * UCX callbacks run inside
 * ucp_worker_progress(), where the UCX documentation forbids progressing again and where
 * creating or closing endpoints is best avoided; so the callbacks only record what happened
 * (a copied message, a connection request, a failed endpoint) and peer_ucx_dispatch() acts on
 * the records once progress has returned. Requests are freed in their callbacks (after
 * ucp_request_free() on a request in flight its callback never fires). An endpoint is freed
 * only when it is closed and no send on it is in flight, so a late send callback never touches
 * freed memory.
 */

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "common/log.h"
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
 * for the others (issue 16: 837k idle connections from one address held all 64). */
#define PEER_MAX_HANDSHAKES 64u
#define PEER_MAX_HANDSHAKES_PER_SOURCE 8u
#define PEER_FLOOD_LOG_USEC (10u * 1000000u)
/* Sessions that others dialed, kept for their messages: room for two links from every member;
 * past it the least recently used goes. */
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

static void session_free(PeerUcx *u, PeerSession *s);

static int errno_from_ucs(ucs_status_t s) {
        switch (s) {
        case UCS_OK:
                return 0;
        case UCS_ERR_NO_MEMORY:
                return -ENOMEM;
        case UCS_ERR_INVALID_PARAM:
        case UCS_ERR_INVALID_ADDR:
                return -EINVAL;
        case UCS_ERR_UNREACHABLE:
                return -EHOSTUNREACH;
        case UCS_ERR_BUSY:
                return -EBUSY;
        case UCS_ERR_CONNECTION_RESET:
                return -ECONNRESET;
        case UCS_ERR_REJECTED:
                return -ECONNREFUSED;
        case UCS_ERR_TIMED_OUT:
        case UCS_ERR_ENDPOINT_TIMEOUT:
                return -ETIMEDOUT;
        default:
                return -EIO;
        }
}

int peer_address_split(const char *address, char **ret_host, char **ret_port) {
        const char *colon, *host = address;
        size_t host_len;

        if (isempty(address))
                return -EINVAL;
        if (address[0] == '[') {
                const char *end = strchr(address, ']');
                if (!end || end[1] != ':')
                        return -EINVAL;
                host = address + 1;
                host_len = (size_t) (end - host);
                colon = end + 1;
        } else {
                colon = strrchr(address, ':');
                if (!colon)
                        return -EINVAL;
                host_len = (size_t) (colon - address);
        }
        if (host_len == 0 || isempty(colon + 1) || strspn(colon + 1, "0123456789") != strlen(colon + 1))
                return -EINVAL;
        char *h = strndup(host, host_len), *p = strdup(colon + 1);
        if (!h || !p) {
                free(h);
                free(p);
                return -ENOMEM;
        }
        *ret_host = h;
        *ret_port = p;
        return 0;
}

static bool sockaddr_is_loopback(const struct sockaddr *sa) {
        if (sa->sa_family == AF_INET)
                return (ntohl(((const struct sockaddr_in *) sa)->sin_addr.s_addr) >> 24) == 127;
        if (sa->sa_family != AF_INET6)
                return false;
        const struct in6_addr *a = &((const struct sockaddr_in6 *) sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool peer_address_is_loopback(const char *address) {
        _cleanup_free_ char *host = NULL, *port = NULL;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        struct addrinfo *res = NULL;
        bool loopback = true;

        if (peer_address_split(address, &host, &port) < 0 ||
            getaddrinfo(host, port, &hints, &res) != 0 || !res)
                return false;
        for (struct addrinfo *a = res; a; a = a->ai_next)
                loopback = loopback && sockaddr_is_loopback(a->ai_addr);
        freeaddrinfo(res);
        return loopback;
}

static int resolve_address(const char *address, bool passive, struct sockaddr_storage *ret,
                           socklen_t *ret_len) {
        _cleanup_free_ char *host = NULL, *port = NULL;
        struct addrinfo hints = {
                .ai_family = AF_UNSPEC,
                .ai_socktype = SOCK_STREAM,
                .ai_flags = passive ? AI_PASSIVE : 0,
        };
        struct addrinfo *res = NULL;
        int r;

        r = peer_address_split(address, &host, &port);
        if (r < 0)
                return r;
        r = getaddrinfo(host, port, &hints, &res);
        if (r != 0)
                return r == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
        if (!res || res->ai_addrlen > sizeof *ret) {
                freeaddrinfo(res);
                return -EADDRNOTAVAIL;
        }
        memcpy(ret, res->ai_addr, res->ai_addrlen);
        *ret_len = res->ai_addrlen;
        freeaddrinfo(res);
        return 0;
}

/* --- endpoints --- */

static void endpoint_free_if_done(PeerEndpoint *e) {
        if (!e->closed || e->inflight > 0)
                return;
        for (PeerPending *q = e->pending, *n; q; q = n) {
                n = q->next;
                free(q->buf);
                free(q);
        }
        free(e->failure);
        free(e);
}

static void on_close_done(void *request, ucs_status_t status, void *user_data) {
        ucp_request_free(request);
}

static void handshake_free(PeerUcx *u, PeerHandshake *h);

static void endpoint_close(PeerUcx *u, PeerEndpoint *e) {
        ucp_request_param_t p = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
                .flags = UCP_EP_CLOSE_FLAG_FORCE,
                .cb.send = on_close_done,
        };

        for (PeerEndpoint **p_e = &u->endpoints; *p_e; p_e = &(*p_e)->next)
                if (*p_e == e) {
                        *p_e = e->next;
                        break;
                }
        if (e->handshake)
                handshake_free(u, e->handshake);
        if (e->ep) {
                void *req = ucp_ep_close_nbx(e->ep, &p);
                if (UCS_PTR_IS_ERR(req))
                        log_debug("Closing a peer endpoint failed: %s, ignoring.",
                                  ucs_status_string(UCS_PTR_STATUS(req)));
                e->ep = NULL;
        }
        session_free(u, e->session);
        e->session = NULL;
        e->closed = true;
        endpoint_free_if_done(e);
}

static void endpoint_fail(PeerEndpoint *e, const char *cause) {
        if (e->failed)
                return;
        e->failed = true;
        e->failure = strdup(cause);
}

static void on_endpoint_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
        endpoint_fail(arg, ucs_status_string(status));
}

/* --- receiving --- */

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param) {
        PeerUcx *u = arg;
        PeerInbox *m;

        /* Peers send eagerly; a rendezvous offer is someone else's (or a hostile) message:
         * returning UCS_OK drops it without receiving its data. */
        if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
            length > FAMILYD_MAX_PEER_MESSAGE_BYTES) {
                u->dropped++;
                return UCS_OK;
        }
        m = calloc(1, sizeof *m);
        if (!m || !(m->data = malloc(length ? length : 1))) {
                free(m);
                u->dropped++;
                return UCS_OK;
        }
        memcpy(m->data, data, length);
        m->size = length;
        m->reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
        *u->inbox_tail = m;
        u->inbox_tail = &m->next;
        return UCS_OK;
}

/* --- sessions --- */

/* A session begins when a handshake proves the key; the dialer's lives with its endpoint, the
 * listener's until PEER_MAX_SESSIONS newer or more recently used ones push it out. */
static PeerSession *session_new(PeerUcx *u, const PeerSessionKeys *keys, PeerRole role) {
        PeerSession *s = calloc(1, sizeof *s);

        if (!s)
                return NULL;
        s->keys = *keys;
        s->role = role;
        s->next_seq = 1;
        if (role == PEER_ROLE_LISTENER && u->n_listener_sessions >= PEER_MAX_SESSIONS) {
                PeerSession **oldest = NULL;
                for (PeerSession **p = &u->sessions; *p; p = &(*p)->next)
                        if ((*p)->role == PEER_ROLE_LISTENER)
                                oldest = p;
                if (oldest)
                        session_free(u, *oldest);
        }
        if (role == PEER_ROLE_LISTENER)
                u->n_listener_sessions++;
        s->next = u->sessions;
        u->sessions = s;
        return s;
}

static void session_free(PeerUcx *u, PeerSession *s) {
        if (!s)
                return;
        for (PeerSession **p = &u->sessions; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        break;
                }
        if (s->role == PEER_ROLE_LISTENER)
                u->n_listener_sessions--;
        free(s->bound_name);
        sodium_memzero(s, sizeof *s);
        free(s);
}

/* The session a frame names, moved to the front (most recently used). */
static PeerSession *session_find(PeerUcx *u, const uint8_t *id) {
        for (PeerSession **p = &u->sessions; *p; p = &(*p)->next) {
                PeerSession *s = *p;
                /* The id names the session, it proves nothing: the MAC does. */
                if (memcmp(s->keys.id, id, PEER_SESSION_ID_BYTES) != 0)
                        continue;
                *p = s->next;
                s->next = u->sessions;
                u->sessions = s;
                return s;
        }
        return NULL;
}

static const uint8_t *session_send_key(const PeerSession *s) {
        return s->role == PEER_ROLE_DIALER ? s->keys.dialer_to_listener : s->keys.listener_to_dialer;
}

static const uint8_t *session_receive_key(const PeerSession *s) {
        return s->role == PEER_ROLE_DIALER ? s->keys.listener_to_dialer : s->keys.dialer_to_listener;
}

/* --- the bootstrap handshake --- */

static void handshake_free(PeerUcx *u, PeerHandshake *h) {
        for (PeerHandshake **p = &u->handshakes; *p; p = &(*p)->next)
                if (*p == h) {
                        *p = h->next;
                        break;
                }
        if (h->endpoint)
                h->endpoint->handshake = NULL;
        else
                u->n_accepted--;
        sd_event_source_disable_unref(h->io);
        sd_event_source_disable_unref(h->timeout);
        safe_close(h->fd);
        free(h->in);
        free(h->out);
        sodium_memzero(h->nonces, sizeof h->nonces);
        sodium_memzero(&h->session, sizeof h->session);
        free(h);
}

/* Ends a handshake that failed; a dialing one fails its endpoint with `cause`. */
static void handshake_fail(PeerUcx *u, PeerHandshake *h, const char *cause) {
        if (h->endpoint)
                endpoint_fail(h->endpoint, cause);
        handshake_free(u, h);
}

/* A listening handshake that did not prove the key: counted, logged now and then. */
static void handshake_refuse(PeerUcx *u, PeerHandshake *h, const char *why) {
        u->refused++;
        free(u->refused_last);
        u->refused_last = NULL;
        if (asprintf(&u->refused_last, "%s: %s", h->remote, why) < 0)
                u->refused_last = NULL;
        handshake_free(u, h);
}

/* Queues our next part (taking over data) and waits to write. */
static int handshake_send(PeerHandshake *h, uint8_t *data, size_t size, HandshakeStage next) {
        if (!data)
                return -ENOMEM;
        free(h->out);
        h->out = data;
        h->out_size = size;
        h->sent = 0;
        h->stage = next;
        return sd_event_source_set_io_events(h->io, EPOLLOUT);
}

/* Waits for size bytes of the other side's next part. */
static int handshake_expect(PeerHandshake *h, size_t size, HandshakeStage next) {
        if (size > h->in_size)
                return -EPROTO;
        h->have = 0;
        h->want = size;
        h->stage = next;
        return sd_event_source_set_io_events(h->io, EPOLLIN);
}

static uint8_t *concat(const void *a, size_t na, const void *b, size_t nb, size_t *ret_size) {
        uint8_t *d = malloc(na + nb);

        if (!d)
                return NULL;
        memcpy(d, a, na);
        if (nb > 0)
                memcpy(d + na, b, nb);
        *ret_size = na + nb;
        return d;
}

static uint32_t read_le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
               (uint32_t) p[3] << 24;
}

static int send_on(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *s, uint8_t *buf,
                   size_t size);

/* The dialer has the worker address: the endpoint comes to life and sends what waited. */
static void handshake_finish_dial(PeerUcx *u, PeerHandshake *h, const uint8_t *address) {
        PeerEndpoint *e = h->endpoint;
        ucp_ep_params_t p = {
                .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                .address = (const ucp_address_t *) address,
                .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                .err_handler = { .cb = on_endpoint_error, .arg = e },
        };

        if (h->proven) {
                e->session = session_new(u, &h->session, PEER_ROLE_DIALER);
                if (!e->session) {
                        handshake_fail(u, h, strerror(ENOMEM));
                        return;
                }
        }
        ucs_status_t s = ucp_ep_create(u->worker, &p, &e->ep);
        if (s != UCS_OK) {
                e->ep = NULL;
                handshake_fail(u, h, ucs_status_string(s));
                return;
        }
        handshake_free(u, h);
        while (e->pending) {
                PeerPending *q = e->pending;
                e->pending = q->next;
                e->n_pending--;
                (void) send_on(u, e->ep, e, e->session, q->buf, q->size);
                free(q);
        }
        e->pending_tail = &e->pending;
}

/* Keyed dialer: the listener's nonce and proofs (one per key it holds). Ours follows, made
 * with the first of our keys that one of its proofs shows it holds too. */
static int handshake_dial_proofs(PeerUcx *u, PeerHandshake *h) {
        const uint8_t *in = h->in + PEER_MAGIC_SIZE;
        uint8_t proof[PEER_PROOF_BYTES];
        int best = -1;

        if (memcmp(h->in, PEER_MAGIC_KEYED, PEER_MAGIC_SIZE) != 0)
                return -EPROTO;
        memcpy(h->nonces[1], in, PEER_NONCE_BYTES);
        for (unsigned j = 0; j < PEER_KEYS_MAX; j++) {
                int k = peer_auth_verify(&u->keys, PEER_ROLE_LISTENER, h->nonces[0], h->nonces[1],
                                         in + PEER_NONCE_BYTES + j * PEER_PROOF_BYTES);
                if (k >= 0 && (best < 0 || k < best))
                        best = k;
        }
        if (best < 0)
                return -EACCES;
        /* The session now: a reload may change the keys before the handshake ends. */
        h->proven = true;
        peer_auth_session(u->keys.keys[best], h->nonces[0], h->nonces[1], &h->session);
        peer_auth_proof(u->keys.keys[best], PEER_ROLE_DIALER, h->nonces[0], h->nonces[1], proof);
        size_t size = 0;
        uint8_t *out = concat(proof, sizeof proof, NULL, 0, &size);
        return handshake_send(h, out, size, HS_DIAL_PROOF_SENT);
}

/* The dialer read a whole part of the answer. */
static void handshake_dial_received(PeerUcx *u, PeerHandshake *h) {
        int r = 0;

        switch (h->stage) {
        case HS_DIAL_HEAD:
        case HS_DIAL_LENGTH: {
                /* No key: the magic, then the length; keyed: the length alone. */
                if (h->stage == HS_DIAL_HEAD && memcmp(h->in, PEER_MAGIC, PEER_MAGIC_SIZE) != 0) {
                        handshake_fail(u, h, "the handshake answer is not familyd's");
                        return;
                }
                uint32_t len = read_le32(h->in + h->want - 4);
                if (len == 0 || len > PEER_MAX_WORKER_ADDRESS) {
                        handshake_fail(u, h, "the handshake answer has a bad length");
                        return;
                }
                r = handshake_expect(h, len, HS_DIAL_ADDRESS);
                break;
        }
        case HS_DIAL_PROOFS:
                r = handshake_dial_proofs(u, h);
                if (r == -EPROTO) {
                        handshake_fail(u, h, "the handshake answer is not that of a familyd "
                                             "with a cluster key");
                        return;
                }
                if (r == -EACCES) {
                        handshake_fail(u, h, "the peer does not hold this cluster's key");
                        return;
                }
                break;
        case HS_DIAL_ADDRESS:
                handshake_finish_dial(u, h, h->in);
                return;
        default:
                r = -EPROTO;
        }
        if (r < 0)
                handshake_fail(u, h, strerror(-r));
}

/* Keyed listener: our nonce and a proof with each of our keys (the first twice when we hold
 * one), so a dialer that holds either of them knows us during a rotation. */
static int handshake_listen_proofs(PeerUcx *u, PeerHandshake *h) {
        uint8_t out[PEER_MAGIC_SIZE + PEER_NONCE_BYTES + PEER_KEYS_MAX * PEER_PROOF_BYTES];
        size_t size = 0;

        memcpy(h->nonces[0], h->in, PEER_NONCE_BYTES);
        peer_auth_nonce(h->nonces[1]);
        memcpy(out, PEER_MAGIC_KEYED, PEER_MAGIC_SIZE);
        memcpy(out + PEER_MAGIC_SIZE, h->nonces[1], PEER_NONCE_BYTES);
        for (unsigned j = 0; j < PEER_KEYS_MAX; j++)
                peer_auth_proof(u->keys.keys[j < u->keys.n ? j : 0], PEER_ROLE_LISTENER,
                                h->nonces[0], h->nonces[1],
                                out + PEER_MAGIC_SIZE + PEER_NONCE_BYTES + j * PEER_PROOF_BYTES);
        uint8_t *data = concat(out, sizeof out, NULL, 0, &size);
        return handshake_send(h, data, size, HS_LISTEN_PROOFS_SENT);
}

/* Our worker address, preceded by the magic when no key is in use (keyed: it went first). */
static int handshake_listen_answer(PeerUcx *u, PeerHandshake *h, bool magic) {
        uint8_t head[PEER_MAGIC_SIZE + 4];
        size_t at = 0, size;

        if (magic) {
                memcpy(head, PEER_MAGIC, PEER_MAGIC_SIZE);
                at = PEER_MAGIC_SIZE;
        }
        for (unsigned i = 0; i < 4; i++)
                head[at + i] = (uint8_t) (u->address_size >> (8 * i));
        uint8_t *data = concat(head, at + 4, u->address, u->address_size, &size);
        return handshake_send(h, data, size, HS_LISTEN_ANSWER_SENT);
}

/* The listener read a whole part of the dialer's. */
static void handshake_listen_received(PeerUcx *u, PeerHandshake *h) {
        bool keyed = u->keys.n > 0;
        int r = 0;

        switch (h->stage) {
        case HS_LISTEN_MAGIC:
                if (memcmp(h->in, keyed ? PEER_MAGIC_KEYED : PEER_MAGIC, PEER_MAGIC_SIZE) == 0)
                        r = keyed ? handshake_expect(h, PEER_NONCE_BYTES, HS_LISTEN_NONCE)
                                  : handshake_listen_answer(u, h, true);
                else if (keyed && memcmp(h->in, PEER_MAGIC, PEER_MAGIC_SIZE) == 0) {
                        handshake_refuse(u, h, "a familyd without a cluster key");
                        return;
                } else {
                        log_debug("Closed a peer-port connection from %s that is not a familyd%s.",
                                  h->remote, keyed ? "" : " without a cluster key");
                        handshake_free(u, h);
                        return;
                }
                break;
        case HS_LISTEN_NONCE:
                r = handshake_listen_proofs(u, h);
                break;
        case HS_LISTEN_PROOF: {
                int k = peer_auth_verify(&u->keys, PEER_ROLE_DIALER, h->nonces[0], h->nonces[1],
                                         h->in);
                if (k < 0) {
                        handshake_refuse(u, h, "a wrong proof");
                        return;
                }
                peer_auth_session(u->keys.keys[k], h->nonces[0], h->nonces[1], &h->session);
                if (!session_new(u, &h->session, PEER_ROLE_LISTENER))
                        r = -ENOMEM;
                else
                        r = handshake_listen_answer(u, h, false);
                break;
        }
        default:
                r = -EPROTO;
        }
        if (r < 0)
                handshake_free(u, h);
}

/* Our part is written: what comes next. */
static void handshake_sent(PeerUcx *u, PeerHandshake *h) {
        bool keyed = u->keys.n > 0;
        int r;

        switch (h->stage) {
        case HS_DIAL_HELLO_SENT:
                r = keyed ? handshake_expect(h, PEER_MAGIC_SIZE + PEER_NONCE_BYTES +
                                                        PEER_KEYS_MAX * PEER_PROOF_BYTES,
                                             HS_DIAL_PROOFS)
                          : handshake_expect(h, PEER_MAGIC_SIZE + 4, HS_DIAL_HEAD);
                break;
        case HS_DIAL_PROOF_SENT:
                r = handshake_expect(h, 4, HS_DIAL_LENGTH);
                break;
        case HS_LISTEN_PROOFS_SENT:
                r = handshake_expect(h, PEER_PROOF_BYTES, HS_LISTEN_PROOF);
                break;
        default: /* HS_LISTEN_ANSWER_SENT: done */
                handshake_free(u, h);
                return;
        }
        if (r < 0)
                handshake_fail(u, h, strerror(-r));
}

static bool io_would_block(ssize_t n) {
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/* Writes what is queued; true once all of it is out. */
static bool handshake_write(PeerUcx *u, PeerHandshake *h) {
        if (h->dialing && h->stage == HS_DIAL_HELLO_SENT && h->sent == 0) {
                int err = 0;
                socklen_t len = sizeof err;
                if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                        err = errno;
                if (err != 0) {
                        handshake_fail(u, h, strerror(err));
                        return false;
                }
        }
        ssize_t n = send(h->fd, h->out + h->sent, h->out_size - h->sent, MSG_NOSIGNAL);
        if (io_would_block(n))
                return false;
        if (n <= 0) {
                handshake_fail(u, h, strerror(n < 0 ? errno : EPIPE));
                return false;
        }
        h->sent += (size_t) n;
        return h->sent == h->out_size;
}

static int on_handshake_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        PeerHandshake *h = userdata;
        PeerUcx *u = h->ucx;

        if (h->out) {
                if (handshake_write(u, h)) {
                        free(h->out);
                        h->out = NULL;
                        handshake_sent(u, h);
                }
                return 0;
        }
        ssize_t n = recv(h->fd, h->in + h->have, h->want - h->have, 0);
        if (io_would_block(n))
                return 0;
        if (n <= 0 && !h->dialing && h->stage == HS_LISTEN_PROOF) {
                /* A dialer that cannot check our proofs (another key) hangs up here. */
                handshake_refuse(u, h, "it hung up before its proof");
                return 0;
        }
        if (n < 0 && errno != ECONNRESET) {
                handshake_fail(u, h, strerror(errno));
                return 0;
        }
        if (n <= 0) {
                handshake_fail(u, h, u->keys.n > 0 ? "closed during the handshake (not a familyd "
                                                     "with a cluster key?)"
                                                   : "closed during the handshake (not a familyd, "
                                                     "or one that requires a cluster key?)");
                return 0;
        }
        h->have += (size_t) n;
        if (h->have < h->want)
                return 0;
        if (h->dialing)
                handshake_dial_received(u, h);
        else
                handshake_listen_received(u, h);
        return 0;
}

static int on_handshake_timeout(sd_event_source *source, uint64_t usec, void *userdata) {
        PeerHandshake *h = userdata;

        handshake_fail(h->ucx, h, "no handshake answer in time");
        return 0;
}

/* The dialer's first part: the magic, and with a key our nonce. */
static int handshake_dial_hello(PeerUcx *u, PeerHandshake *h) {
        uint8_t *data;
        size_t size = 0;

        if (u->keys.n == 0)
                data = concat(PEER_MAGIC, PEER_MAGIC_SIZE, NULL, 0, &size);
        else {
                peer_auth_nonce(h->nonces[0]);
                data = concat(PEER_MAGIC_KEYED, PEER_MAGIC_SIZE, h->nonces[0], PEER_NONCE_BYTES,
                              &size);
        }
        return handshake_send(h, data, size, HS_DIAL_HELLO_SENT);
}

static int handshake_new(PeerUcx *u, int fd, bool dialing, PeerEndpoint *e, const char *remote,
                         const char *source) {
        PeerHandshake *h = calloc(1, sizeof *h);
        int r;

        if (!h) {
                safe_close(fd);
                return -ENOMEM;
        }
        h->ucx = u;
        h->fd = fd;
        h->dialing = dialing;
        h->endpoint = e;
        (void) snprintf(h->remote, sizeof h->remote, "%s", remote);
        (void) snprintf(h->source, sizeof h->source, "%s", strempty(source));
        h->next = u->handshakes;
        u->handshakes = h;
        if (dialing)
                e->handshake = h;
        else
                u->n_accepted++;
        /* Dialing: at most the worker address (the largest part); listening: a nonce or a
         * proof, so 64 connections that only say hello cost little. */
        h->in_size = dialing ? PEER_MAX_WORKER_ADDRESS + PEER_MAGIC_SIZE + 4
                             : MAX(PEER_NONCE_BYTES, PEER_PROOF_BYTES);
        h->in = malloc(h->in_size);
        r = h->in ? sd_event_add_io(u->event, &h->io, fd, EPOLLIN, on_handshake_io, h) : -ENOMEM;
        if (r >= 0)
                r = sd_event_add_time_relative(u->event, &h->timeout, CLOCK_MONOTONIC,
                                               PEER_HANDSHAKE_MS * 1000u,
                                               PEER_TIMER_ACCURACY_USEC, on_handshake_timeout, h);
        if (r >= 0)
                r = dialing ? handshake_dial_hello(u, h)
                            : handshake_expect(h, PEER_MAGIC_SIZE, HS_LISTEN_MAGIC);
        if (r < 0)
                handshake_free(u, h);
        return r < 0 ? r : 0;
}

/* "host:port" of an accepted connection, for the log, and its host alone. */
static void remote_name(const struct sockaddr_storage *sa, socklen_t len, char *ret, size_t size,
                        char ret_host[static NI_MAXHOST]) {
        char port[NI_MAXSERV];

        if (getnameinfo((const struct sockaddr *) sa, len, ret_host, NI_MAXHOST, port,
                        sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
                (void) snprintf(ret, size, "an unknown address");
                ret_host[0] = 0;
        } else
                (void) snprintf(ret, size, sa->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s",
                                ret_host, port);
}

/* Listening handshakes in progress from this host. */
static unsigned handshakes_from(PeerUcx *u, const char *host) {
        unsigned n = 0;

        for (PeerHandshake *h = u->handshakes; h; h = h->next)
                if (!h->dialing && streq(h->source, host))
                        n++;
        return n;
}

static int on_listener_io(sd_event_source *source, int listen_fd, uint32_t revents,
                          void *userdata) {
        PeerUcx *u = userdata;

        for (;;) {
                struct sockaddr_storage sa;
                socklen_t sa_len = sizeof sa;
                char remote[PEER_REMOTE_MAX];
                int fd = accept4(listen_fd, (struct sockaddr *) &sa, &sa_len,
                                 SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                            errno != ECONNABORTED)
                                log_debug("Accepting on the peer port failed: %m");
                        return 0;
                }
                char host[NI_MAXHOST];
                if (u->n_accepted >= PEER_MAX_HANDSHAKES) {
                        safe_close(fd);
                        u->flooded++;
                        continue;
                }
                remote_name(&sa, sa_len, remote, sizeof remote, host);
                if (handshakes_from(u, host) >= PEER_MAX_HANDSHAKES_PER_SOURCE) {
                        safe_close(fd);
                        u->flooded++;
                        continue;
                }
                (void) handshake_new(u, fd, false, NULL, remote, host);
        }
}

static int listener_open(const char *address, int *ret) {
        struct sockaddr_storage sa;
        socklen_t sa_len;
        int fd, one = 1, r;

        r = resolve_address(address, true, &sa, &sa_len);
        if (r < 0)
                return log_error_errno(r, "Failed to resolve --listen %s: %m", address);
        fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to create the peer socket: %m");
        /* A restarted daemon takes its port back at once, despite connections in TIME_WAIT. */
        (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *) &sa, sa_len) < 0 || listen(fd, 128) < 0) {
                r = -errno;
                safe_close(fd);
                return log_error_errno(r, "Failed to listen for peers on %s: %m", address);
        }
        *ret = fd;
        return 0;
}

/* --- the worker --- */

int peer_ucx_new(sd_event *event, const char *listen_address, const PeerKeys *keys,
                 const PeerUcxCallbacks *callbacks, PeerUcx **ret) {
        _cleanup_(peer_ucx_freep) PeerUcx *u = calloc(1, sizeof(PeerUcx));
        ucp_config_t *config = NULL;
        ucs_status_t s;
        int r;

        if (!u)
                return -ENOMEM;
        u->worker_fd = u->listen_fd = -1;
        u->event = sd_event_ref(event);
        u->callbacks = *callbacks;
        u->inbox_tail = &u->inbox;
        if (keys)
                u->keys = *keys;
        if (u->keys.n > 0 && sodium_init() < 0)
                return log_error_errno(-EIO, "Failed to initialise libsodium.");

        r = listener_open(listen_address, &u->listen_fd);
        if (r < 0)
                return r;

        s = ucp_config_read(NULL, NULL, &config);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to read the UCX configuration: %s",
                                       ucs_status_string(s));
        ucp_params_t params = {
                .field_mask = UCP_PARAM_FIELD_FEATURES,
                .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        };
        s = ucp_init(&params, config, &u->context);
        ucp_config_release(config);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to initialise UCX: %s",
                                       ucs_status_string(s));

        ucp_worker_params_t wp = {
                .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                .thread_mode = UCS_THREAD_MODE_SINGLE,
        };
        s = ucp_worker_create(u->context, &wp, &u->worker);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to create a UCX worker: %s",
                                       ucs_status_string(s));
        s = ucp_worker_get_efd(u->worker, &u->worker_fd);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to get the UCX wakeup fd: %s",
                                       ucs_status_string(s));
        s = ucp_worker_get_address(u->worker, &u->address, &u->address_size);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to get the UCX worker address: %s",
                                       ucs_status_string(s));
        if (u->address_size > PEER_MAX_WORKER_ADDRESS)
                return log_error_errno(-E2BIG, "The UCX worker address is %zu bytes, more than "
                                               "the %u the handshake carries.",
                                       u->address_size, PEER_MAX_WORKER_ADDRESS);

        ucp_am_handler_param_t ap = {
                .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                              UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                .id = PEER_AM_ID,
                .flags = UCP_AM_FLAG_WHOLE_MSG,
                .cb = on_am,
                .arg = u,
        };
        s = ucp_worker_set_am_recv_handler(u->worker, &ap);
        if (s != UCS_OK)
                return log_error_errno(errno_from_ucs(s), "Failed to set the UCX message handler: %s",
                                       ucs_status_string(s));

        r = sd_event_add_io(event, &u->listener, u->listen_fd, EPOLLIN, on_listener_io, u);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the peer socket: %m");

        *ret = TAKE_PTR(u);
        return 0;
}

PeerUcx *peer_ucx_free(PeerUcx *u) {
        if (!u)
                return NULL;
        while (u->endpoints)
                endpoint_close(u, u->endpoints);
        while (u->handshakes)
                handshake_free(u, u->handshakes);
        if (u->worker) {
                if (u->address)
                        ucp_worker_release_address(u->worker, u->address);
                /* Lets the close requests finish and their callbacks free them. Progress may
                 * still deliver messages (on_am): the inbox is freed after it, not before. */
                for (unsigned i = 0; i < 100 && ucp_worker_progress(u->worker); i++)
                        ;
                ucp_worker_destroy(u->worker);
        }
        for (PeerInbox *m = u->inbox, *n; m; m = n) {
                n = m->next;
                free(m->data);
                free(m);
        }
        while (u->sessions)
                session_free(u, u->sessions);
        peer_keys_wipe(&u->keys);
        free(u->refused_last);
        if (u->context)
                ucp_cleanup(u->context);
        sd_event_source_disable_unref(u->listener);
        safe_close(u->listen_fd);
        sd_event_unref(u->event);
        return mfree(u);
}

int peer_ucx_fd(PeerUcx *u) {
        return u->worker_fd;
}

/* With a key, only a frame of a known session with a good MAC and a new sequence number
 * reaches the handler, as the message inside it; without one, every message does. */
static void dispatch_one(PeerUcx *u, const PeerInbox *m) {
        PeerReplyTo reply = { .ep = m->reply };
        const uint8_t *id, *message = m->data;
        size_t size = m->size;

        if (u->keys.n > 0) {
                if (!peer_frame_session(m->data, m->size, &id) ||
                    !(reply.session = session_find(u, id))) {
                        u->unauthenticated++;
                        return;
                }
                int r = peer_frame_open(session_receive_key(reply.session), &reply.session->window,
                                        m->data, m->size, &message, &size);
                if (r == -EALREADY)
                        u->replayed++;
                else if (r < 0)
                        u->unauthenticated++;
                if (r < 0)
                        return;
        }
        u->callbacks.on_message(u->callbacks.userdata, message, size, &reply);
}

static void dispatch_messages(PeerUcx *u) {
        while (u->inbox) {
                PeerInbox *m = u->inbox;

                u->inbox = m->next;
                if (!u->inbox)
                        u->inbox_tail = &u->inbox;
                dispatch_one(u, m);
                free(m->data);
                free(m);
        }
}

/* One line now and then for what was dropped or refused since the last. */
static void dispatch_log_drops(PeerUcx *u) {
        if (u->dropped > 0) {
                log_warning("Dropped %u peer message%s that were too large or not "
                            "sent eagerly.",
                            u->dropped, u->dropped == 1 ? "" : "s");
                u->dropped = 0;
        }
        if (u->unauthenticated > 0 || u->replayed > 0) {
                log_warning("Dropped %u peer message%s of no authenticated link or with a bad "
                            "MAC, and %u seen before or out of the replay window.",
                            u->unauthenticated, u->unauthenticated == 1 ? "" : "s", u->replayed);
                u->unauthenticated = u->replayed = 0;
        }
        uint64_t now = 0;
        if (u->flooded > 0 && sd_event_now(u->event, CLOCK_MONOTONIC, &now) >= 0 &&
            (u->flood_logged_usec == 0 || now - u->flood_logged_usec >= PEER_FLOOD_LOG_USEC)) {
                u->flood_logged_usec = now;
                log_warning("Closed %u peer connection%s at once: %u handshakes in progress "
                            "at most, %u from one address.",
                            u->flooded, u->flooded == 1 ? "" : "s", PEER_MAX_HANDSHAKES,
                            PEER_MAX_HANDSHAKES_PER_SOURCE);
                u->flooded = 0;
        }
        if (u->refused > 0) {
                log_warning("Refused %u peer connection%s that did not prove the cluster key "
                            "(the last from %s).",
                            u->refused, u->refused == 1 ? "" : "s", strempty(u->refused_last));
                u->refused = 0;
        }
}

static void dispatch_failures(PeerUcx *u) {
        for (PeerEndpoint *e = u->endpoints, *n; e; e = n) {
                n = e->next;
                if (!e->failed)
                        continue;
                u->callbacks.on_failure(u->callbacks.userdata, e, strempty(e->failure));
                endpoint_close(u, e);
                /* The callback may have closed others: start over. */
                n = u->endpoints;
        }
}

void peer_ucx_dispatch(PeerUcx *u) {
        for (;;) {
                while (ucp_worker_progress(u->worker) > 0)
                        ;
                dispatch_messages(u);
                dispatch_failures(u);
                dispatch_log_drops(u);
                ucs_status_t s = ucp_worker_arm(u->worker);
                if (s == UCS_ERR_BUSY)
                        continue;
                if (s != UCS_OK)
                        log_warning("Failed to arm the UCX worker: %s, ignoring.",
                                    ucs_status_string(s));
                return;
        }
}

int peer_ucx_connect(PeerUcx *u, const char *address, void *userdata, PeerEndpoint **ret) {
        struct sockaddr_storage sa;
        socklen_t sa_len;
        PeerEndpoint *e;
        int fd, r;

        r = resolve_address(address, false, &sa, &sa_len);
        if (r < 0)
                return r;
        fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, (struct sockaddr *) &sa, sa_len) < 0 && errno != EINPROGRESS) {
                r = -errno;
                safe_close(fd);
                return r;
        }
        e = calloc(1, sizeof *e);
        if (!e) {
                safe_close(fd);
                return -ENOMEM;
        }
        e->ucx = u;
        e->userdata = userdata;
        e->pending_tail = &e->pending;
        r = handshake_new(u, fd, true, e, address, NULL);
        if (r < 0) {
                free(e);
                return r;
        }
        e->next = u->endpoints;
        u->endpoints = e;
        *ret = e;
        return 0;
}

void *peer_endpoint_userdata(PeerEndpoint *ep) {
        return ep->userdata;
}

void peer_ucx_close(PeerUcx *u, PeerEndpoint *ep) {
        if (ep)
                endpoint_close(u, ep);
}

typedef struct PeerSend {
        uint8_t *buf;
        size_t size;
        PeerUcx *ucx;
        PeerEndpoint *endpoint; /* NULL for replies */
} PeerSend;

/* The send is over; sent: UCX completed it (the bytes left this worker). */
static void send_finished(PeerSend *s, bool sent) {
        PeerEndpoint *e = s->endpoint;

        if (sent && s->ucx->callbacks.on_sent)
                s->ucx->callbacks.on_sent(s->ucx->callbacks.userdata, s->size);
        free(s->buf);
        free(s);
        if (e) {
                e->inflight--;
                endpoint_free_if_done(e);
        }
}

static void on_sent(void *request, ucs_status_t status, void *user_data) {
        send_finished(user_data, status == UCS_OK);
        ucp_request_free(request);
}

static int send_on_numbered(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *session,
                            uint8_t *buf, size_t size, uint64_t seq) {
        PeerSend *s;

        if (session) {
                uint8_t *frame;
                int r = peer_frame_seal(session_send_key(session), session->keys.id, seq, buf,
                                        size, &frame, &size);
                free(buf);
                if (r < 0)
                        return r;
                buf = frame;
        }
        s = calloc(1, sizeof *s);
        if (!s) {
                free(buf);
                return -ENOMEM;
        }
        s->buf = buf;
        s->size = size;
        s->ucx = u;
        s->endpoint = e;
        if (e)
                e->inflight++;

        ucp_request_param_t p = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_FLAGS,
                .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
                .cb.send = on_sent,
                .user_data = s,
        };
        void *req = ucp_am_send_nbx(ep, PEER_AM_ID, NULL, 0, buf, size, &p);
        if (UCS_PTR_IS_PTR(req))
                return 0;
        /* Done at once (NULL) or failed: the callback will not run. */
        send_finished(s, !UCS_PTR_IS_ERR(req));
        return UCS_PTR_IS_ERR(req) ? errno_from_ucs(UCS_PTR_STATUS(req)) : 0;
}

static int send_on(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *session, uint8_t *buf,
                   size_t size) {
        return send_on_numbered(u, ep, e, session, buf, size, session ? session->next_seq++ : 0);
}

int peer_ucx_send(PeerUcx *u, PeerEndpoint *ep, uint8_t *buf, size_t size) {
        if (ep->failed || ep->inflight + ep->n_pending >= PEER_MAX_INFLIGHT) {
                free(buf);
                return -EBUSY;
        }
        if (!ep->ep) {
                /* Still shaking hands: sent once the endpoint exists. */
                PeerPending *q = calloc(1, sizeof *q);
                if (!q) {
                        free(buf);
                        return -ENOMEM;
                }
                q->buf = buf;
                q->size = size;
                *ep->pending_tail = q;
                ep->pending_tail = &q->next;
                ep->n_pending++;
                return 0;
        }
        return send_on(u, ep->ep, ep, ep->session, buf, size);
}

int peer_ucx_reply(PeerUcx *u, void *reply, uint8_t *buf, size_t size) {
        PeerReplyTo *to = reply;

        if (!to || !to->ep || (u->keys.n > 0 && !to->session)) {
                free(buf);
                return -ENOTCONN;
        }
        return send_on(u, to->ep, NULL, to->session, buf, size);
}

PeerEndpoint *peer_ucx_reply_endpoint(PeerUcx *u, void *reply) {
        PeerReplyTo *to = reply;

        if (!to)
                return NULL;
        for (PeerEndpoint *e = u->endpoints; e; e = e->next) {
                if (e->closed || e->failed)
                        continue;
                if (u->keys.n > 0 ? (to->session && e->session == to->session)
                                  : (to->ep && e->ep == to->ep))
                        return e;
        }
        return NULL;
}

const char *peer_ucx_reply_bound(PeerUcx *u, void *reply, uint64_t *ret_boot_id) {
        PeerReplyTo *to = reply;
        PeerSession *s = to ? to->session : NULL;

        if (!s || !s->bound_name)
                return NULL;
        *ret_boot_id = s->bound_boot;
        return s->bound_name;
}

int peer_ucx_reply_bind(PeerUcx *u, void *reply, const char *name, uint64_t boot_id) {
        PeerReplyTo *to = reply;
        PeerSession *s = to ? to->session : NULL;

        if (!s || s->bound_name)
                return 0;
        s->bound_name = strdup(name);
        if (!s->bound_name)
                return -ENOMEM;
        s->bound_boot = boot_id;
        return 0;
}

int peer_ucx_send_numbered(PeerUcx *u, PeerEndpoint *ep, uint8_t *buf, size_t size, uint64_t seq) {
        if (!ep->ep || ep->failed) {
                free(buf);
                return -ENOTCONN;
        }
        return send_on_numbered(u, ep->ep, ep, ep->session, buf, size, seq);
}

bool peer_ucx_endpoint_ready(PeerEndpoint *ep) {
        return ep && ep->ep && !ep->failed;
}

void peer_ucx_set_keys(PeerUcx *u, const PeerKeys *keys) {
        peer_keys_wipe(&u->keys);
        u->keys = *keys;
}
