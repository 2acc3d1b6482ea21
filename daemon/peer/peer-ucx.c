/* peer-ucx.c: the UCX worker, its endpoints, receiving, dispatching and sending for the peer thread. */

/*
 * DESIGN: one thread makes, uses and frees a PeerUcx: the peer thread (UCS_THREAD_MODE_SINGLE),
 * on its sd-event loop: the listener and each handshake are sources of it, a handshake with a
 * timer for its deadline; the worker's wakeup descriptor is the caller's to watch. A SINGLE
 * worker, and the endpoints tied to its async context, belong to the thread that created the
 * worker: UCX 1.18 asserts it on progress (ucs_async_check_owner_thread), 1.13 does not check
 * at all. So peer_ucx_new() records its caller as the owner, and every call that reaches UCX
 * or the loop (progress and arm, connect and endpoint creation, send, close, free, new keys)
 * aborts on any other thread, in every build (peer_ucx_assert_owner(), one pthread_equal()):
 * a mistake shows on the first message on any UCX release. peer.c makes the PeerUcx at the
 * start of its thread and frees it at the thread's end.
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
 *
 * The handshakes and the listener are in peer-handshake.c, the sessions in peer-session.c;
 * peer-ucx-internal.h holds what the three share.
 */

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
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

void peer_ucx_check_owner(const PeerUcx *u, const char *caller) {
        if (pthread_equal(pthread_self(), u->owner))
                return;
        log_error("%s() called on a thread that does not own the peer UCX worker: aborting.",
                  caller);
        abort();
}

int peer_errno_from_ucs(ucs_status_t s) {
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

int peer_resolve_address(const char *address, bool passive, struct sockaddr_storage *ret,
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

void peer_endpoint_free_if_done(PeerEndpoint *e) {
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

void peer_endpoint_close(PeerUcx *u, PeerEndpoint *e) {
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
                peer_handshake_free(u, e->handshake);
        if (e->ep) {
                peer_ucx_assert_owner(u);
                void *req = ucp_ep_close_nbx(e->ep, &p);
                if (UCS_PTR_IS_ERR(req))
                        log_debug("Closing a peer endpoint failed: %s, ignoring.",
                                  ucs_status_string(UCS_PTR_STATUS(req)));
                e->ep = NULL;
        }
        peer_session_free(u, e->session);
        e->session = NULL;
        e->closed = true;
        peer_endpoint_free_if_done(e);
}

void peer_endpoint_fail(PeerEndpoint *e, const char *cause) {
        if (e->failed)
                return;
        e->failed = true;
        e->failure = strdup(cause);
}

void peer_on_endpoint_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
        peer_endpoint_fail(arg, ucs_status_string(status));
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

/* --- the worker --- */

int peer_ucx_new(sd_event *event, const char *listen_address, const PeerKeys *keys,
                 const PeerUcxCallbacks *callbacks, PeerUcx **ret) {
        _cleanup_(peer_ucx_freep) PeerUcx *u = calloc(1, sizeof(PeerUcx));
        ucp_config_t *config = NULL;
        ucs_status_t s;
        int r;

        if (!u)
                return -ENOMEM;
        u->owner = pthread_self();
        u->worker_fd = u->listen_fd = -1;
        u->max_listener_sessions = PEER_MAX_SESSIONS;
        u->event = sd_event_ref(event);
        u->callbacks = *callbacks;
        u->inbox_tail = &u->inbox;
        if (keys)
                u->keys = *keys;
        if (u->keys.n > 0 && sodium_init() < 0)
                return log_error_errno(-EIO, "Failed to initialise libsodium.");

        r = peer_listener_open(listen_address, &u->listen_fd);
        if (r < 0)
                return r;

        s = ucp_config_read(NULL, NULL, &config);
        if (s != UCS_OK)
                return log_error_errno(peer_errno_from_ucs(s), "Failed to read the UCX configuration: %s",
                                       ucs_status_string(s));
        ucp_params_t params = {
                .field_mask = UCP_PARAM_FIELD_FEATURES,
                .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        };
        s = ucp_init(&params, config, &u->context);
        ucp_config_release(config);
        if (s != UCS_OK)
                return log_error_errno(peer_errno_from_ucs(s), "Failed to initialise UCX: %s",
                                       ucs_status_string(s));

        ucp_worker_params_t wp = {
                .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                .thread_mode = UCS_THREAD_MODE_SINGLE,
        };
        s = ucp_worker_create(u->context, &wp, &u->worker);
        if (s != UCS_OK)
                return log_error_errno(peer_errno_from_ucs(s), "Failed to create a UCX worker: %s",
                                       ucs_status_string(s));
        s = ucp_worker_get_efd(u->worker, &u->worker_fd);
        if (s != UCS_OK)
                return log_error_errno(peer_errno_from_ucs(s), "Failed to get the UCX wakeup fd: %s",
                                       ucs_status_string(s));
        s = ucp_worker_get_address(u->worker, &u->address, &u->address_size);
        if (s != UCS_OK)
                return log_error_errno(peer_errno_from_ucs(s), "Failed to get the UCX worker address: %s",
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
                return log_error_errno(peer_errno_from_ucs(s), "Failed to set the UCX message handler: %s",
                                       ucs_status_string(s));

        r = sd_event_add_io(event, &u->listener, u->listen_fd, EPOLLIN, peer_on_listener_io, u);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the peer socket: %m");

        *ret = TAKE_PTR(u);
        return 0;
}

PeerUcx *peer_ucx_free(PeerUcx *u) {
        if (!u)
                return NULL;
        peer_ucx_assert_owner(u);
        while (u->endpoints)
                peer_endpoint_close(u, u->endpoints);
        while (u->handshakes)
                peer_handshake_free(u, u->handshakes);
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
                peer_session_free(u, u->sessions);
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
                    !(reply.session = peer_session_find(u, id))) {
                        u->unauthenticated++;
                        return;
                }
                int r = peer_frame_open(peer_session_receive_key(reply.session), &reply.session->window,
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
                peer_endpoint_close(u, e);
                /* The callback may have closed others: start over. */
                n = u->endpoints;
        }
}

void peer_ucx_dispatch(PeerUcx *u) {
        peer_ucx_assert_owner(u);
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

        peer_ucx_assert_owner(u);
        r = peer_resolve_address(address, false, &sa, &sa_len);
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
        r = peer_handshake_new(u, fd, true, e, address, NULL);
        if (r < 0) {
                free(e);
                return r;
        }
        e->next = u->endpoints;
        u->endpoints = e;
        *ret = e;
        return 0;
}

void peer_ucx_close(PeerUcx *u, PeerEndpoint *ep) {
        if (ep)
                peer_endpoint_close(u, ep);
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
                peer_endpoint_free_if_done(e);
        }
}

static void on_sent(void *request, ucs_status_t status, void *user_data) {
        send_finished(user_data, status == UCS_OK);
        ucp_request_free(request);
}

static int send_on_numbered(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *session,
                            uint8_t *buf, size_t size, uint64_t seq) {
        PeerSend *s;

        peer_ucx_assert_owner(u);
        if (session) {
                uint8_t *frame;
                int r = peer_frame_seal(peer_session_send_key(session), session->keys.id, seq, buf,
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
        return UCS_PTR_IS_ERR(req) ? peer_errno_from_ucs(UCS_PTR_STATUS(req)) : 0;
}

int peer_send_on(PeerUcx *u, ucp_ep_h ep, PeerEndpoint *e, PeerSession *session, uint8_t *buf,
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
        return peer_send_on(u, ep->ep, ep, ep->session, buf, size);
}

int peer_ucx_reply(PeerUcx *u, void *reply, uint8_t *buf, size_t size) {
        PeerReplyTo *to = reply;

        if (!to || !to->ep || (u->keys.n > 0 && !to->session)) {
                free(buf);
                return -ENOTCONN;
        }
        return peer_send_on(u, to->ep, NULL, to->session, buf, size);
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

void peer_ucx_set_max_nodes(PeerUcx *u, unsigned max_nodes) {
        unsigned n = max_nodes == 0 ? FAMILYD_MAX_PEERS : max_nodes;

        u->max_listener_sessions = 2u * n + PEER_MAX_HANDSHAKES;
}

void peer_ucx_set_keys(PeerUcx *u, const PeerKeys *keys) {
        peer_ucx_assert_owner(u);
        peer_keys_wipe(&u->keys);
        u->keys = *keys;
}
