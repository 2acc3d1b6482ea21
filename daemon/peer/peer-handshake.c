/* peer-handshake.c: the bootstrap listener and handshakes that hand out UCX worker addresses. */

/*
 * DESIGN: see peer-ucx.c for why the handshake is ours and not UCX's connection manager. The
 * listener and each handshake are sources of the peer thread's sd-event loop, a handshake with
 * a timer for its deadline; limits on handshakes in total and per source address keep a
 * flood from one host from keeping others out. With a key the proofs come first
 * (peer-auth.c) and a proven handshake leaves a session (peer-session.c).
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
#include "peer-ucx-internal.h"

/* --- the bootstrap handshake --- */

void peer_handshake_free(PeerUcx *u, PeerHandshake *h) {
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
                peer_endpoint_fail(h->endpoint, cause);
        peer_handshake_free(u, h);
}

/* A listening handshake that did not prove the key: counted, logged now and then. */
static void handshake_refuse(PeerUcx *u, PeerHandshake *h, const char *why) {
        u->refused++;
        free(u->refused_last);
        u->refused_last = NULL;
        if (asprintf(&u->refused_last, "%s: %s", h->remote, why) < 0)
                u->refused_last = NULL;
        peer_handshake_free(u, h);
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

/* The dialer has the worker address: the endpoint comes to life and sends what waited. */
static void handshake_finish_dial(PeerUcx *u, PeerHandshake *h, const uint8_t *address) {
        PeerEndpoint *e = h->endpoint;
        ucp_ep_params_t p = {
                .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                .address = (const ucp_address_t *) address,
                .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                .err_handler = { .cb = peer_on_endpoint_error, .arg = e },
        };

        if (h->proven) {
                e->session = peer_session_new(u, &h->session, PEER_ROLE_DIALER);
                if (!e->session) {
                        handshake_fail(u, h, strerror(ENOMEM));
                        return;
                }
        }
        peer_ucx_assert_owner(u);
        ucs_status_t s = ucp_ep_create(u->worker, &p, &e->ep);
        if (s != UCS_OK) {
                e->ep = NULL;
                handshake_fail(u, h, ucs_status_string(s));
                return;
        }
        peer_handshake_free(u, h);
        while (e->pending) {
                PeerPending *q = e->pending;
                e->pending = q->next;
                e->n_pending--;
                (void) peer_send_on(u, e->ep, e, e->session, q->buf, q->size);
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
                        peer_handshake_free(u, h);
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
                if (!peer_session_new(u, &h->session, PEER_ROLE_LISTENER))
                        r = -ENOMEM;
                else
                        r = handshake_listen_answer(u, h, false);
                break;
        }
        default:
                r = -EPROTO;
        }
        if (r < 0)
                peer_handshake_free(u, h);
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
                peer_handshake_free(u, h);
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

int peer_handshake_new(PeerUcx *u, int fd, bool dialing, PeerEndpoint *e, const char *remote,
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
                peer_handshake_free(u, h);
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

int peer_on_listener_io(sd_event_source *source, int listen_fd, uint32_t revents,
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
                (void) peer_handshake_new(u, fd, false, NULL, remote, host);
        }
}

int peer_listener_open(const char *address, int *ret) {
        struct sockaddr_storage sa;
        socklen_t sa_len;
        int fd, one = 1, r;

        r = peer_resolve_address(address, true, &sa, &sa_len);
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

