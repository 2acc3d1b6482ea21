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
 * answer) closes that TCP connection only.
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

#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "common/log.h"
#include "peer-ucx.h"
#include "core/resource-limits.h"

#define PEER_AM_ID 7
/* Messages queued on one endpoint before sends are dropped (a stalled peer). */
#define PEER_MAX_INFLIGHT 64u
/* The bootstrap handshake: magic, then (answer only) a length and the worker address. */
#define PEER_MAGIC "FAMILYD1"
#define PEER_MAGIC_SIZE 8u
#define PEER_MAX_WORKER_ADDRESS 16384u
#define PEER_HANDSHAKE_MS 5000
/* The handshake timer fires within this of its deadline (not sd-event's default 250 ms). */
#define PEER_TIMER_ACCURACY_USEC 1000u
/* Handshakes in progress on the listening side; more are closed at once. */
#define PEER_MAX_HANDSHAKES 64u

typedef struct PeerHandshake {
        PeerUcx *ucx;
        int fd;
        sd_event_source *io;
        sd_event_source *timeout; /* PEER_HANDSHAKE_MS from the start */
        bool dialing;  /* ours: send the magic, read the answer */
        uint8_t *buf;  /* dialing: the answer so far; listening: the magic so far */
        size_t have;
        size_t sent;   /* bytes of our part written */
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
};

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
        free(h->buf);
        free(h);
}

/* Ends a handshake that failed; a dialing one fails its endpoint with `cause`. */
static void handshake_fail(PeerUcx *u, PeerHandshake *h, const char *cause) {
        if (h->endpoint)
                endpoint_fail(h->endpoint, cause);
        handshake_free(u, h);
}

static int send_on(ucp_ep_h ep, PeerEndpoint *e, uint8_t *buf, size_t size);

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
                (void) send_on(e->ep, e, q->buf, q->size);
                free(q);
        }
        e->pending_tail = &e->pending;
}

static bool io_would_block(ssize_t n) {
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

static void handshake_dial_step(PeerUcx *u, PeerHandshake *h) {
        if (h->sent < PEER_MAGIC_SIZE) {
                int err = 0;
                socklen_t len = sizeof err;
                if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                        err = errno;
                if (err != 0) {
                        handshake_fail(u, h, strerror(err));
                        return;
                }
                ssize_t n = send(h->fd, &PEER_MAGIC[h->sent], PEER_MAGIC_SIZE - h->sent,
                                 MSG_NOSIGNAL);
                if (io_would_block(n))
                        return;
                if (n <= 0) {
                        handshake_fail(u, h, strerror(n < 0 ? errno : EPIPE));
                        return;
                }
                h->sent += (size_t) n;
                if (h->sent == PEER_MAGIC_SIZE)
                        (void) sd_event_source_set_io_events(h->io, EPOLLIN);
                return;
        }

        size_t want = PEER_MAGIC_SIZE + 4;
        if (h->have >= want) {
                uint32_t len = (uint32_t) h->buf[8] | (uint32_t) h->buf[9] << 8 |
                               (uint32_t) h->buf[10] << 16 | (uint32_t) h->buf[11] << 24;
                want += len;
        }
        ssize_t n = recv(h->fd, h->buf + h->have, want - h->have, 0);
        if (io_would_block(n))
                return;
        if (n <= 0) {
                handshake_fail(u, h, n == 0 ? "closed during the handshake (not a familyd?)"
                                            : strerror(errno));
                return;
        }
        h->have += (size_t) n;
        if (h->have >= PEER_MAGIC_SIZE && memcmp(h->buf, PEER_MAGIC, PEER_MAGIC_SIZE) != 0) {
                handshake_fail(u, h, "the handshake answer is not familyd's");
                return;
        }
        if (h->have == PEER_MAGIC_SIZE + 4) {
                uint32_t len = (uint32_t) h->buf[8] | (uint32_t) h->buf[9] << 8 |
                               (uint32_t) h->buf[10] << 16 | (uint32_t) h->buf[11] << 24;
                if (len == 0 || len > PEER_MAX_WORKER_ADDRESS)
                        handshake_fail(u, h, "the handshake answer has a bad length");
                return;
        }
        if (h->have > PEER_MAGIC_SIZE + 4 && h->have == want)
                handshake_finish_dial(u, h, h->buf + PEER_MAGIC_SIZE + 4);
}

/* The listening side: read the magic, answer with our worker address, close. */
static void handshake_accept_step(PeerUcx *u, PeerHandshake *h) {
        if (h->have < PEER_MAGIC_SIZE) {
                ssize_t n = recv(h->fd, h->buf + h->have, PEER_MAGIC_SIZE - h->have, 0);
                if (io_would_block(n))
                        return;
                if (n <= 0 || memcmp(h->buf, PEER_MAGIC, (size_t) n + h->have) != 0) {
                        if (n > 0)
                                log_debug("Closed a peer-port connection that is not familyd.");
                        handshake_free(u, h);
                        return;
                }
                h->have += (size_t) n;
                if (h->have < PEER_MAGIC_SIZE)
                        return;
                (void) sd_event_source_set_io_events(h->io, EPOLLOUT);
        }

        size_t total = PEER_MAGIC_SIZE + 4 + u->address_size;
        uint8_t head[PEER_MAGIC_SIZE + 4];
        memcpy(head, PEER_MAGIC, PEER_MAGIC_SIZE);
        for (unsigned i = 0; i < 4; i++)
                head[PEER_MAGIC_SIZE + i] = (uint8_t) (u->address_size >> (8 * i));
        while (h->sent < total) {
                const uint8_t *from = h->sent < sizeof head
                                              ? head + h->sent
                                              : (const uint8_t *) u->address + (h->sent - sizeof head);
                size_t len = h->sent < sizeof head ? sizeof head - h->sent : total - h->sent;
                ssize_t n = send(h->fd, from, len, MSG_NOSIGNAL);
                if (io_would_block(n))
                        return;
                if (n <= 0) {
                        handshake_free(u, h);
                        return;
                }
                h->sent += (size_t) n;
        }
        handshake_free(u, h);
}

static int on_handshake_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        PeerHandshake *h = userdata;

        if (h->dialing)
                handshake_dial_step(h->ucx, h);
        else
                handshake_accept_step(h->ucx, h);
        return 0;
}

static int on_handshake_timeout(sd_event_source *source, uint64_t usec, void *userdata) {
        PeerHandshake *h = userdata;

        handshake_fail(h->ucx, h, "no handshake answer in time");
        return 0;
}

static int handshake_new(PeerUcx *u, int fd, bool dialing, PeerEndpoint *e) {
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
        h->next = u->handshakes;
        u->handshakes = h;
        if (dialing)
                e->handshake = h;
        else
                u->n_accepted++;
        h->buf = malloc(dialing ? PEER_MAGIC_SIZE + 4 + PEER_MAX_WORKER_ADDRESS : PEER_MAGIC_SIZE);
        r = h->buf ? sd_event_add_io(u->event, &h->io, fd, dialing ? EPOLLOUT : EPOLLIN,
                                     on_handshake_io, h)
                   : -ENOMEM;
        if (r >= 0)
                r = sd_event_add_time_relative(u->event, &h->timeout, CLOCK_MONOTONIC,
                                               PEER_HANDSHAKE_MS * 1000u,
                                               PEER_TIMER_ACCURACY_USEC, on_handshake_timeout, h);
        if (r < 0)
                handshake_free(u, h);
        return r < 0 ? r : 0;
}

static int on_listener_io(sd_event_source *source, int listen_fd, uint32_t revents,
                          void *userdata) {
        PeerUcx *u = userdata;

        for (;;) {
                int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                            errno != ECONNABORTED)
                                log_debug("Accepting on the peer port failed: %m");
                        return 0;
                }
                if (u->n_accepted >= PEER_MAX_HANDSHAKES) {
                        safe_close(fd);
                        continue;
                }
                (void) handshake_new(u, fd, false, NULL);
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

int peer_ucx_new(sd_event *event, const char *listen_address, const PeerUcxCallbacks *callbacks,
                 PeerUcx **ret) {
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

static void dispatch_messages(PeerUcx *u) {
        while (u->inbox) {
                PeerInbox *m = u->inbox;

                u->inbox = m->next;
                if (!u->inbox)
                        u->inbox_tail = &u->inbox;
                u->callbacks.on_message(u->callbacks.userdata, m->data, m->size, m->reply);
                free(m->data);
                free(m);
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
                if (u->dropped > 0) {
                        log_warning("Dropped %u peer message%s that were too large or not "
                                    "sent eagerly.",
                                    u->dropped, u->dropped == 1 ? "" : "s");
                        u->dropped = 0;
                }
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
        r = handshake_new(u, fd, true, e);
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
        PeerEndpoint *endpoint; /* NULL for replies */
} PeerSend;

static void send_finished(PeerSend *s) {
        PeerEndpoint *e = s->endpoint;

        free(s->buf);
        free(s);
        if (e) {
                e->inflight--;
                endpoint_free_if_done(e);
        }
}

static void on_sent(void *request, ucs_status_t status, void *user_data) {
        send_finished(user_data);
        ucp_request_free(request);
}

static int send_on(ucp_ep_h ep, PeerEndpoint *e, uint8_t *buf, size_t size) {
        PeerSend *s = calloc(1, sizeof *s);

        if (!s) {
                free(buf);
                return -ENOMEM;
        }
        s->buf = buf;
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
        send_finished(s);
        return UCS_PTR_IS_ERR(req) ? errno_from_ucs(UCS_PTR_STATUS(req)) : 0;
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
        return send_on(ep->ep, ep, buf, size);
}

int peer_ucx_reply(PeerUcx *u, void *reply, uint8_t *buf, size_t size) {
        if (!reply) {
                free(buf);
                return -ENOTCONN;
        }
        return send_on(reply, NULL, buf, size);
}
