/* peer.c: membership over UCX: the peer thread, its loop, and the protocol's sink on peer-ucx. */

/*
 * DESIGN: one thread owns the UCX worker and the membership protocol (membership/peer-protocol.h,
 * which decides what to send when and what to believe). It makes the worker, its loop and
 * their sources itself, adds the seeds and publishes the first topology, then tells
 * peer_new(), which waits, how that went (so a bad --listen or a port in use fails the
 * daemon's start); at its end it frees them, the protocol's endpoints first: a UCX worker
 * belongs to the thread that made it (peer-ucx.c). It runs an sd-event loop over the
 * worker's wakeup fd, the bootstrap handshakes (peer-ucx.c), a heartbeat timer and an eventfd
 * that other threads use to hand it commands (forget, stop, new keys). This file only moves
 * bytes: it decodes what arrives and hands it to the protocol with where it came from (the
 * link this daemon dialed it came back on, the node a keyed link is bound to), and maps the
 * protocol's sink onto peer-ucx (dial, send, reply, bind, close), the manager (published) and
 * the log (notes, in this file's sentences). Before each sleep the worker is progressed and
 * re-armed, and the protocol flushes (eager heartbeats, a new topology for the manager, which
 * pushes it to watchers). Every message names the sender's registry digest: each heartbeat
 * first reads the manager's, so a reload reaches every peer within one interval. The traffic
 * counters count what UCX reports sent (on_sent()), not what was queued.
 */

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>

#include "codec/codec-peer.h"
#include "common/clock.h"
#include "common/log.h"
#include "membership/peer-protocol.h"
#include "peer-record.h"
#include "peer-ucx.h"
#include "peer.h"
#include "core/resource-limits.h"
#include "common/random.h"

/* The heartbeat fires within this of its time (not sd-event's default 250 ms). */
#define PEER_TIMER_ACCURACY_USEC 1000u

typedef struct PeerCommand {
        const char *node;
        FamilyError *error;
        int result;
        bool done;
        struct PeerCommand *next;
} PeerCommand;

struct Peer {
        PeerUcx *ucx;
        Protocol *protocol;
        MemberInfo self;
        Manager *manager;
        unsigned heartbeat_ms;

        pthread_t thread;
        bool thread_started;
        const PeerParams *params; /* peer_new()'s, for the thread's start only */
        int start_result;
        bool start_done; /* the thread started (start_result 0) or gave up */
        sd_event *event;
        sd_event_source *wakeup, *heartbeat, *command;
        sd_event_source *publish; /* a topology held back by the publish gap is due */
        int event_fd;

        pthread_mutex_t lock; /* commands and stop */
        pthread_cond_t done;
        PeerCommand *commands;
        PeerKeys keys;     /* the thread's: our record's MAC, and relayed ones checked */
        PeerKeys new_keys; /* from peer_set_keys(), for the thread to take */
        bool keys_pending;
        bool stop;
};

/* --- the protocol's sink --- */

static bool sink_verify(void *userdata, const MemberInfo *record) {
        Peer *p = userdata;

        return peer_record_verify(&p->keys, record);
}

static int sink_dial(void *userdata, const char *address, void **ret_endpoint) {
        Peer *p = userdata;
        PeerEndpoint *ep = NULL;
        int r = peer_ucx_connect(p->ucx, address, NULL, &ep);

        *ret_endpoint = r < 0 ? NULL : ep;
        return r;
}

static void sink_send(void *userdata, void *endpoint, const char *address, const PeerMessage *m) {
        Peer *p = userdata;
        uint8_t *buf;
        size_t size;

        int r = codec_peer_encode(m, &buf, &size);
        if (r < 0) {
                log_warning_errno(r, "Failed to encode a peer message, ignoring: %m");
                return;
        }
        r = peer_ucx_send(p->ucx, endpoint, buf, size);
        if (r == -EBUSY)
                log_debug("Peer %s is not reading, dropped a message.", address);
        else if (r < 0)
                log_debug("Sending to peer %s failed: %s", address, strerror(-r));
}

/* Answers on the endpoint a message came in on (UCP_AM_SEND_FLAG_REPLY). */
static void sink_reply(void *userdata, void *reply, const PeerMessage *m) {
        Peer *p = userdata;
        uint8_t *buf;
        size_t size;

        if (codec_peer_encode(m, &buf, &size) < 0)
                return;
        (void) peer_ucx_reply(p->ucx, reply, buf, size);
}

static int sink_bind(void *userdata, void *reply, const char *name, uint64_t boot_id) {
        Peer *p = userdata;

        return peer_ucx_reply_bind(p->ucx, reply, name, boot_id);
}

static void sink_close(void *userdata, void *endpoint) {
        Peer *p = userdata;

        peer_ucx_close(p->ucx, endpoint);
}

static void sink_published(void *userdata, Topology *t) {
        Peer *p = userdata;

        manager_set_topology(p->manager, t);
        topology_unref(t);
}

static void note_member(int level, const MemberInfo *m, const char *format, ...)
        _printf_(3, 4);

static void note_member(int level, const MemberInfo *m, const char *format, ...) {
        _cleanup_free_ char *text = NULL;
        va_list ap;

        va_start(ap, format);
        if (vasprintf(&text, format, ap) < 0)
                text = NULL;
        va_end(ap);
        log_struct(level, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m->name)), "%s",
                   strempty(text));
}

/* The protocol's notes, in the log's sentences. */
static void sink_note(void *userdata, const ProtocolNote *n) {
        const MemberInfo *m = n->member;

        switch (n->kind) {
        case PROTOCOL_NOTE_DIAL_FAILED:
                log_warning_errno(n->error, "Cannot reach peer %s: %m; retrying with backoff.",
                                  n->address);
                break;
        case PROTOCOL_NOTE_LINK_FAILED:
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, n->address)),
                           "%s peer %s: %s; retrying with backoff.",
                           n->flag ? "Lost the link to" : "Cannot reach", n->address,
                           strempty(n->text));
                break;
        case PROTOCOL_NOTE_LINK_BACK:
                if (n->flag)
                        log_info("Peer %s accepted this node after refusing it.", n->address);
                else
                        log_info("Peer %s is reachable again.", n->address);
                break;
        case PROTOCOL_NOTE_ASKING_AGAIN:
                log_info("Asking peer %s again, which refused this node.", n->address);
                break;
        case PROTOCOL_NOTE_REFUSED_US:
                note_member(LOG_ERR, m, "Node %s (%s) refused this node: %s. Asking again in %"
                            PRIu64 " s; fix the configuration of one of them.",
                            m->name, n->address, n->text, n->number);
                break;
        case PROTOCOL_NOTE_REFUSAL_IGNORED:
                log_debug("Ignored a refusal in the name of %s (%s) that came on no link this "
                          "node dialed.", m->name, m->address);
                break;
        case PROTOCOL_NOTE_REFUSING:
                note_member(LOG_WARNING, m, "Refusing node %s at %s: %s.", m->name, m->address,
                            n->text);
                break;
        case PROTOCOL_NOTE_JOINED:
                note_member(LOG_INFO, m, "Node %s (%s, %zu device%s) %s.", m->name, m->address,
                            m->n_devices, m->n_devices == 1 ? "" : "s",
                            n->flag ? "restarted and rejoined" : "joined");
                break;
        case PROTOCOL_NOTE_LEARNED:
                log_info("Learned of node %s (%s) from %s.", m->name, m->address, n->name);
                break;
        case PROTOCOL_NOTE_FORGOT:
                if (n->text)
                        log_info("Forgot node %s, as %s asked.", n->name, n->text);
                else
                        log_info("Forgot node %s, as an operator asked.", n->name);
                break;
        case PROTOCOL_NOTE_VERSION_REFUSED:
                note_member(LOG_WARNING, m, "Refused topology version %" PRIu64 " from node %s "
                            "(%s): further ahead of this node's %" PRIu64 " than the member "
                            "table explains; kept until most members report it.",
                            n->number, m->name, m->address, n->number2);
                break;
        case PROTOCOL_NOTE_LINK_LIE:
                note_member(LOG_WARNING, m, "Dropped a peer message in the name of node %s "
                            "(start %016" PRIx64 ") that came on the link of node %s.",
                            m->name, m->boot_id, strempty(n->name));
                break;
        case PROTOCOL_NOTE_DIGEST:
                log_info("Registry digest now %s; telling the peers.",
                         isempty(n->text) ? "unknown" : n->text);
                break;
        default:
                log_error_errno(-ENOMEM, "Out of memory in the peer thread, ignoring.");
                break;
        }
}

/* --- from peer-ucx --- */

/* UCX finished sending a message: only bytes that left count. */
static void on_sent(void *userdata, size_t size) {
        Peer *p = userdata;

        atomic_fetch_add_explicit(&p->manager->peer_messages_sent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->manager->peer_bytes_sent, size, memory_order_relaxed);
}

static void on_failure(void *userdata, PeerEndpoint *ep, const char *cause) {
        Peer *p = userdata;

        protocol_on_link_failed(p->protocol, ep, cause, now_ms());
}

static void on_message(void *userdata, const uint8_t *data, size_t size, void *reply) {
        _cleanup_(peer_message_done) PeerMessage m = {};
        Peer *p = userdata;
        ProtocolOrigin origin = { .reply = reply };

        if (codec_peer_decode(data, size, &m) < 0) {
                log_warning("Dropped an undecodable peer message of %zu bytes.", size);
                return;
        }
        origin.dialed = peer_ucx_reply_endpoint(p->ucx, reply);
        origin.bound_name = peer_ucx_reply_bound(p->ucx, reply, &origin.bound_boot_id);
        protocol_on_message(p->protocol, &origin, &m, now_ms());
}

/* --- the thread --- */

/* This node's digest as the manager has it now (a reload since the last heartbeat). */
static void peer_sync_digest(Peer *p) {
        char digest[REGISTRY_DIGEST_LENGTH + 1];

        manager_registry_digest(p->manager, digest);
        protocol_set_local_digest(p->protocol, digest);
}

static int on_publish_due(sd_event_source *source, uint64_t usec, void *userdata) {
        return 0; /* on_prepare() flushes before the next sleep */
}

/* What changed goes to the manager, at most once per PROTOCOL_PUBLISH_GAP_MS: a change held
 * back wakes the loop when it is due. */
static void peer_flush(Peer *p) {
        int64_t due;

        protocol_flush(p->protocol, now_ms(), now_unix_ms());
        due = protocol_publish_due_ms(p->protocol);
        if (due < 0)
                return;
        if (!p->publish) {
                if (sd_event_add_time(p->event, &p->publish, CLOCK_MONOTONIC,
                                      (uint64_t) due * 1000u, PEER_TIMER_ACCURACY_USEC,
                                      on_publish_due, p) < 0)
                        protocol_flush_now(p->protocol, now_ms(), now_unix_ms());
                return;
        }
        if (sd_event_source_set_time(p->publish, (uint64_t) due * 1000u) < 0 ||
            sd_event_source_set_enabled(p->publish, SD_EVENT_ONESHOT) < 0)
                protocol_flush_now(p->protocol, now_ms(), now_unix_ms());
}

static void peer_run_commands(Peer *p) {
        (void) pthread_mutex_lock(&p->lock);
        if (p->keys_pending) {
                peer_ucx_set_keys(p->ucx, &p->new_keys);
                peer_keys_wipe(&p->keys);
                p->keys = p->new_keys;
                peer_keys_wipe(&p->new_keys);
                p->keys_pending = false;
                /* Our record's MAC under the new first key (no memory: the old one stays). */
                if (peer_record_sign(&p->keys, &p->self) >= 0 && p->self.has_record_mac)
                        protocol_set_record_mac(p->protocol, p->self.record_mac);
        }
        while (p->commands) {
                PeerCommand *c = p->commands;
                p->commands = c->next;
                c->result = protocol_forget(p->protocol, c->node, now_ms(), c->error);
                c->done = true;
        }
        /* The caller answers with the topology: it must already show the change. */
        protocol_flush_now(p->protocol, now_ms(), now_unix_ms());
        peer_flush(p);
        (void) pthread_cond_broadcast(&p->done);
        (void) pthread_mutex_unlock(&p->lock);
}

/* No command waits forever on a thread that is gone. */
static void peer_thread_exit(Peer *p) {
        (void) pthread_mutex_lock(&p->lock);
        p->stop = true;
        for (PeerCommand *c = p->commands; c; c = c->next) {
                c->result = family_error_set(c->error, FAMILY_STATUS_UNAVAILABLE, "PEERS_STOPPED",
                                             NULL, "the peer layer is stopping");
                c->done = true;
        }
        p->commands = NULL;
        (void) pthread_cond_broadcast(&p->done);
        (void) pthread_mutex_unlock(&p->lock);
}

/* Before each sleep: sends made by any handler need progress, the worker's wakeup must be
 * re-armed, and what changed goes to the manager. */
static int on_prepare(sd_event_source *source, void *userdata) {
        Peer *p = userdata;

        peer_ucx_dispatch(p->ucx);
        peer_flush(p);
        return 0;
}

/* The wakeup only ends the sleep: on_prepare() does the work before the next one. */
static int on_wakeup(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        return 0;
}

static int on_heartbeat(sd_event_source *source, uint64_t usec, void *userdata) {
        Peer *p = userdata;

        (void) sd_event_source_set_time_relative(
                source, protocol_tick_interval_ms(p->protocol) * 1000ull);
        peer_sync_digest(p);
        protocol_tick(p->protocol, now_ms());
        return 0;
}

static int on_command(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        Peer *p = userdata;
        uint64_t u;

        (void) read(fd, &u, sizeof u);
        peer_run_commands(p);
        (void) pthread_mutex_lock(&p->lock);
        bool stop = p->stop;
        (void) pthread_mutex_unlock(&p->lock);
        return stop ? sd_event_exit(p->event, 0) : 0;
}

static int peer_add_seeds(Peer *p, const char *peers) {
        _cleanup_free_ char *copy = strdup(strempty(peers));
        unsigned n = 0;
        int r;

        if (!copy)
                return -ENOMEM;
        for (char *save = NULL, *a = strtok_r(copy, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
                _cleanup_free_ char *host = NULL, *port = NULL;

                if (isempty(a))
                        continue;
                if (++n > FAMILYD_MAX_SEEDS)
                        return log_error_errno(-E2BIG, "--peers lists more than %u addresses.",
                                               FAMILYD_MAX_SEEDS);
                if (peer_address_split(a, &host, &port) < 0)
                        return log_error_errno(-EINVAL,
                                               "--peers: '%s' is not ADDR:PORT.", a);
                r = protocol_add_seed(p->protocol, a, now_ms());
                if (r < 0)
                        return r;
        }
        return 0;
}

/* On the peer thread: the loop, the worker and its sources, the seeds, the first topology. */
static int peer_thread_start(Peer *p) {
        const PeerParams *params = p->params;
        int r;

        r = sd_event_new(&p->event);
        if (r < 0)
                return log_error_errno(r, "Failed to create the peer thread's loop: %m");
        PeerUcxCallbacks cb = { .on_message = on_message, .on_failure = on_failure,
                                .on_sent = on_sent, .userdata = p };
        r = peer_ucx_new(p->event, params->listen_address, params->keys, &cb, &p->ucx);
        if (r < 0)
                return r;
        peer_ucx_set_max_nodes(p->ucx, params->max_nodes);

        r = sd_event_add_io(p->event, &p->wakeup, peer_ucx_fd(p->ucx), EPOLLIN, on_wakeup, p);
        if (r >= 0)
                r = sd_event_source_set_prepare(p->wakeup, on_prepare);
        if (r >= 0)
                r = sd_event_add_time_relative(p->event, &p->heartbeat, CLOCK_MONOTONIC,
                                               protocol_tick_interval_ms(p->protocol) * 1000ull,
                                               PEER_TIMER_ACCURACY_USEC, on_heartbeat, p);
        if (r >= 0)
                r = sd_event_source_set_enabled(p->heartbeat, SD_EVENT_ON);
        if (r >= 0)
                r = sd_event_add_io(p->event, &p->command, p->event_fd, EPOLLIN, on_command, p);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the peer thread's loop: %m");

        r = peer_add_seeds(p, params->peers);
        if (r < 0)
                return r;
        peer_flush(p);
        return 0;
}

/* On the peer thread, last: the protocol closes its endpoints before the worker goes, and the
 * sources on the worker's fd go before it. */
static void peer_thread_finish(Peer *p) {
        p->protocol = protocol_free(p->protocol);
        p->wakeup = sd_event_source_disable_unref(p->wakeup);
        p->ucx = peer_ucx_free(p->ucx);
        p->heartbeat = sd_event_source_disable_unref(p->heartbeat);
        p->publish = sd_event_source_disable_unref(p->publish);
        p->command = sd_event_source_disable_unref(p->command);
        p->event = sd_event_unref(p->event);
}

static void *peer_thread(void *userdata) {
        Peer *p = userdata;
        int r;

        r = peer_thread_start(p);
        (void) pthread_mutex_lock(&p->lock);
        p->start_result = r;
        p->start_done = true;
        (void) pthread_cond_broadcast(&p->done);
        (void) pthread_mutex_unlock(&p->lock);
        if (r >= 0) {
                r = sd_event_loop(p->event);
                if (r < 0)
                        log_error_errno(r, "Peer thread: the event loop failed, peers stop being "
                                           "followed: %m");
        }
        peer_thread_exit(p);
        peer_thread_finish(p);
        return NULL;
}

/* What others dial: --listen, except that a wildcard host (0.0.0.0, ::) becomes this host's
 * name, which the other nodes can resolve. */
static int peer_advertised_address(const PeerParams *params, char **ret) {
        _cleanup_free_ char *host = NULL, *port = NULL;
        char name[256] = "";
        int r;

        if (params->advertise_address) {
                *ret = strdup(params->advertise_address);
                return *ret ? 0 : -ENOMEM;
        }
        r = peer_address_split(params->listen_address, &host, &port);
        if (r < 0)
                return log_error_errno(r, "--listen %s is not ADDR:PORT.", params->listen_address);
        if (!streq(host, "0.0.0.0") && !streq(host, "::")) {
                *ret = strdup(params->listen_address);
                return *ret ? 0 : -ENOMEM;
        }
        if (gethostname(name, sizeof name - 1) < 0 || isempty(name))
                return log_error_errno(-EINVAL, "--listen %s listens on every address, and "
                                                "this host has no name to tell peers instead.",
                                       params->listen_address);
        if (asprintf(ret, "%s:%s", name, port) < 0)
                return -ENOMEM;
        log_info("Peers will reach this node at %s (--listen %s).", *ret, params->listen_address);
        return 0;
}

int peer_new(const PeerParams *params, Peer **ret) {
        _cleanup_(peer_freep) Peer *p = calloc(1, sizeof(Peer));
        int r;

        if (!p)
                return -ENOMEM;
        p->event_fd = -1;
        (void) pthread_mutex_init(&p->lock, NULL);
        (void) pthread_cond_init(&p->done, NULL);
        p->manager = params->manager;
        p->heartbeat_ms = params->heartbeat_ms;

        r = member_info_copy(params->self, &p->self);
        if (r < 0)
                return r;
        free(p->self.address);
        p->self.address = NULL;
        r = peer_advertised_address(params, &p->self.address);
        if (r < 0)
                return r;
        r = random_bytes(&p->self.boot_id, sizeof p->self.boot_id);
        if (r < 0)
                return r;
        p->self.started_unix_ms = now_unix_ms();
        manager_registry_digest(p->manager, p->self.registry_digest);
        if (params->keys)
                p->keys = *params->keys;
        r = peer_record_sign(&p->keys, &p->self);
        if (r < 0)
                return r;

        ProtocolParams pp = { .self = &p->self, .timeouts = params->timeouts,
                              .max_nodes = params->max_nodes, .heartbeat_ms = p->heartbeat_ms,
                              .mode = params->mode,
                              .publish_gap_ms = PROTOCOL_PUBLISH_GAP_MS };
        ProtocolSink sink = { .dial = sink_dial, .send = sink_send, .reply = sink_reply,
                              .bind = sink_bind, .close = sink_close,
                              .published = sink_published, .note = sink_note,
                              .verify = p->keys.n > 0 ? sink_verify : NULL, .userdata = p };
        r = protocol_new(&pp, &sink, now_ms(), &p->protocol);
        if (r < 0)
                return r;

        p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->event_fd < 0)
                return log_error_errno(-errno, "Failed to set up the peer thread's loop: %m");

        /* The thread makes the worker and everything on it, and says how that went: a bad
         * --listen or a port in use still fails the daemon's start. */
        p->params = params;
        r = -pthread_create(&p->thread, NULL, peer_thread, p);
        if (r < 0)
                return log_error_errno(r, "Failed to start the peer thread: %m");
        p->thread_started = true;
        (void) pthread_mutex_lock(&p->lock);
        while (!p->start_done)
                (void) pthread_cond_wait(&p->done, &p->lock);
        r = p->start_result;
        p->params = NULL;
        (void) pthread_mutex_unlock(&p->lock);
        if (r < 0) {
                (void) pthread_join(p->thread, NULL);
                p->thread_started = false;
                return r;
        }

        log_info("Peers: listening on %s as node %s%s%s.", params->listen_address, p->self.name,
                 isempty(params->peers) ? "" : ", joining through ", strempty(params->peers));
        *ret = TAKE_PTR(p);
        return 0;
}

static void peer_wake(Peer *p) {
        uint64_t one = 1;
        (void) write(p->event_fd, &one, sizeof one);
}

Peer *peer_free(Peer *p) {
        if (!p)
                return NULL;
        if (p->thread_started) {
                (void) pthread_mutex_lock(&p->lock);
                p->stop = true;
                (void) pthread_mutex_unlock(&p->lock);
                peer_wake(p);
                (void) pthread_join(p->thread, NULL);
        }
        /* Without a thread (it never started): the protocol only; the thread frees the
         * worker and everything on it (peer_thread_finish()). */
        p->protocol = protocol_free(p->protocol);
        member_info_done(&p->self);
        peer_keys_wipe(&p->new_keys);
        peer_keys_wipe(&p->keys);
        safe_close(p->event_fd);
        (void) pthread_cond_destroy(&p->done);
        (void) pthread_mutex_destroy(&p->lock);
        return mfree(p);
}

int peer_forget(Peer *p, const char *node, FamilyError *ret_error) {
        PeerCommand c = { .node = node, .error = ret_error };

        (void) pthread_mutex_lock(&p->lock);
        if (p->stop) {
                (void) pthread_mutex_unlock(&p->lock);
                return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "PEERS_STOPPED",
                                        NULL, "the peer layer is stopping");
        }
        c.next = p->commands;
        p->commands = &c;
        peer_wake(p);
        while (!c.done)
                (void) pthread_cond_wait(&p->done, &p->lock);
        (void) pthread_mutex_unlock(&p->lock);
        return c.result;
}

void peer_set_keys(Peer *p, const PeerKeys *keys) {
        (void) pthread_mutex_lock(&p->lock);
        peer_keys_wipe(&p->new_keys);
        p->new_keys = *keys;
        p->keys_pending = true;
        (void) pthread_mutex_unlock(&p->lock);
        peer_wake(p);
}
