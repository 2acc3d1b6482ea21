/* peer.c: membership over UCX: links to every known daemon, heartbeats, hellos, forgetting. */

/*
 * DESIGN: one thread owns the UCX worker, the links and the Membership; it runs an sd-event
 * loop over the worker's wakeup fd, the bootstrap handshakes (peer-ucx.c), a heartbeat timer
 * and an eventfd that other threads use to hand it commands (forget, stop). Before each sleep
 * the worker is progressed and re-armed, and a change is published. Every daemon dials every
 * member it knows (one outgoing link per address) and sends only on its own links; what arrives
 * on the links others dialed is read, and a refusal is the one thing answered on them. A link's
 * first message is a hello with everything this daemon knows, so one seed teaches a joining
 * node the whole cluster; a join or restart heard directly is announced once to the other
 * links. After that each interval costs one small heartbeat per link: traffic per daemon grows
 * linearly with N. After each change a new Topology snapshot goes to the manager, which pushes
 * it to watchers. Every message names the sender's registry digest: each heartbeat first reads
 * the manager's, so a reload reaches every peer within one interval.
 *
 * Rules against a member that errs (issue 16; the membership's own are in membership.h):
 * - a refusal counts only when it comes back on a link this daemon dialed (peer-ucx.c names
 *   it) and closes that link alone, which is dialed again after PEER_REFUSED_BACKOFF_MIN_MS,
 *   doubling to PEER_REFUSED_BACKOFF_MAX_MS (the other side's configuration may change);
 * - with keys, a link speaks for the one start of one node first believed on it
 *   (peer_ucx_reply_bind()): a message in another name or start on it is dropped, so a
 *   restart comes only on the node's own new link;
 * - a hello or announce whose list would take the table past --max-nodes is refused whole;
 * - a version the member table cannot explain is logged once per sender and
 *   PEER_VERSION_LOG_MS;
 * - the traffic counters count what UCX reports sent (on_sent()), not what was queued.
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
#include "common/log.h"
#include "peer-ucx.h"
#include "peer.h"
#include "core/resource-limits.h"
#include "common/random.h"

#define PEER_BACKOFF_MIN_MS 200
#define PEER_BACKOFF_MAX_MS 5000
/* A daemon that refused us is asked again after 1 s, doubling up to 30 s. */
#define PEER_REFUSED_BACKOFF_MIN_MS 1000
#define PEER_REFUSED_BACKOFF_MAX_MS 30000
/* A refused version is logged at most once per sender in this long (by hash of its name). */
#define PEER_VERSION_LOG_MS 10000
#define PEER_VERSION_LOG_SLOTS 64u
/* The heartbeat fires within this of its time (not sd-event's default 250 ms). */
#define PEER_TIMER_ACCURACY_USEC 1000u

typedef struct PeerLink {
        char *address;
        PeerEndpoint *ep; /* NULL while waiting to dial again */
        bool seed;        /* from --peers: dialed even when no member lives there */
        bool refused;     /* that daemon refused us: dialed again at retry_at_ms */
        unsigned refusals; /* in a row, for the backoff */
        bool failing;     /* a failure was logged; the next success is logged too */
        bool reached;     /* heard from since the last failure */
        unsigned failures;
        int64_t retry_at_ms;
        struct PeerLink *next;
} PeerLink;

typedef struct PeerCommand {
        const char *node;
        FamilyError *error;
        int result;
        bool done;
        struct PeerCommand *next;
} PeerCommand;

struct Peer {
        PeerUcx *ucx;
        Membership *membership;
        MemberInfo self;
        Manager *manager;
        unsigned heartbeat_ms;
        PeerLink *links;
        uint64_t published_version;
        uint64_t published_revision; /* membership_revision(): digests change it, not versions */
        uint64_t sent_changes; /* membership_changes() when heartbeats last went out eagerly */
        int64_t eager_at_ms;
        bool dirty; /* the members changed in a way the version may not show */
        int64_t version_logged_ms[PEER_VERSION_LOG_SLOTS];
        int64_t link_lie_logged_ms;

        pthread_t thread;
        bool thread_started;
        sd_event *event;
        sd_event_source *wakeup, *heartbeat, *command;
        int event_fd;

        pthread_mutex_t lock; /* commands and stop */
        pthread_cond_t done;
        PeerCommand *commands;
        PeerKeys new_keys; /* from peer_set_keys(), for the thread to take */
        bool keys_pending;
        bool stop;
};

static int64_t now_ms(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_unix_ms(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void peer_send_heartbeats(Peer *p);

static void peer_publish(Peer *p) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        uint64_t v = membership_version(p->membership);
        uint64_t revision = membership_revision(p->membership);
        uint64_t changes = membership_changes(p->membership);

        /* A change made here goes out at once (at most every quarter interval), so the
         * others take its version within a round trip instead of a heartbeat interval.
         * Versions merely taken from peers are not echoed. */
        if (changes != p->sent_changes) {
                int64_t now = now_ms();
                if (now - p->eager_at_ms >= (int64_t) p->heartbeat_ms / 4) {
                        p->sent_changes = changes;
                        p->eager_at_ms = now;
                        peer_send_heartbeats(p);
                }
        }
        if (v == p->published_version && revision == p->published_revision && !p->dirty)
                return;
        int r = membership_topology(p->membership, now_ms(), now_unix_ms(), &t);
        if (r < 0) {
                log_error_errno(r, "Failed to build the topology, keeping the old one: %m");
                return;
        }
        manager_set_topology(p->manager, t);
        p->published_version = v;
        p->published_revision = revision;
        p->dirty = false;
}

/* --- messages --- */

/* UCX finished sending a message: only bytes that left count (issue 16). */
static void on_sent(void *userdata, size_t size) {
        Peer *p = userdata;

        atomic_fetch_add_explicit(&p->manager->peer_messages_sent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->manager->peer_bytes_sent, size, memory_order_relaxed);
}

/* The members to tell: everyone but ourselves, with how long ago we heard them. */
static int peer_known_list(Peer *p, const char *only, PeerKnown **ret, size_t *ret_n) {
        size_t n = membership_count(p->membership), k = 0;
        int64_t now = now_ms();
        PeerKnown *list = calloc(n ? n : 1, sizeof(PeerKnown));

        if (!list)
                return -ENOMEM;
        for (size_t i = 1; i < n; i++) {
                const Member *e = membership_get(p->membership, i);
                if (only && !streq(e->info.name, only))
                        continue;
                list[k].info = e->info; /* borrowed */
                list[k].age_ms = (uint64_t) MAX(now - e->last_heard_ms, (int64_t) 0);
                k++;
        }
        *ret = list;
        *ret_n = k;
        return 0;
}

static int peer_encode(Peer *p, PeerMessage *m, uint8_t **ret, size_t *ret_size) {
        m->sender = p->self; /* borrowed */
        /* Heartbeats are most of the traffic: they name the start, not the devices. */
        m->sender.partial = m->body == PEER_HEARTBEAT;
        m->version = membership_version(p->membership);
        return codec_peer_encode(m, ret, ret_size);
}

static void link_send(Peer *p, PeerLink *l, PeerMessage *m) {
        uint8_t *buf;
        size_t size;

        if (!l->ep)
                return;
        int r = peer_encode(p, m, &buf, &size);
        if (r < 0) {
                log_warning_errno(r, "Failed to encode a peer message, ignoring: %m");
                return;
        }
        r = peer_ucx_send(p->ucx, l->ep, buf, size);
        if (r == -EBUSY)
                log_debug("Peer %s is not reading, dropped a message.", l->address);
        else if (r < 0)
                log_debug("Sending to peer %s failed: %s", l->address, strerror(-r));
}

/* Members per hello, so that one stays well under the peer message limit (a receiver drops
 * larger ones): estimated from the largest member record. */
static size_t hello_chunk(Peer *p, const PeerKnown *known, size_t n) {
        size_t biggest = 64;

        for (size_t i = 0; i < n; i++) {
                size_t r = 128 + REGISTRY_DIGEST_LENGTH + strlen(known[i].info.name) +
                           strlen(known[i].info.address);
                for (size_t d = 0; d < known[i].info.n_devices; d++) {
                        const Device *dev = &known[i].info.devices[d];
                        r += 64 + strlen(dev->kind) + strlen(dev->name) + strlen(dev->uuid) +
                             strlen(dev->pci_bus_id);
                }
                biggest = MAX(biggest, r);
        }
        return MAX((size_t) 1, (size_t) (FAMILYD_MAX_PEER_MESSAGE_BYTES / 2) / biggest);
}

static void link_send_hello(Peer *p, PeerLink *l) {
        _cleanup_free_ PeerKnown *known = NULL;
        size_t n, chunk;

        if (peer_known_list(p, NULL, &known, &n) < 0)
                return;
        chunk = hello_chunk(p, known, n);
        for (size_t at = 0; at == 0 || at < n; at += chunk) {
                PeerMessage m = { .body = PEER_HELLO, .members = known + at,
                                  .n_members = MIN(chunk, n - at) };
                link_send(p, l, &m);
                if (n == 0)
                        break;
        }
}

/* Tells every link but the member's own that it joined or restarted. */
static void peer_announce(Peer *p, const char *name) {
        _cleanup_free_ PeerKnown *known = NULL;
        PeerMessage m = { .body = PEER_ANNOUNCE };

        if (peer_known_list(p, name, &known, &m.n_members) < 0 || m.n_members == 0)
                return;
        m.members = known;
        for (PeerLink *l = p->links; l; l = l->next)
                if (!streq(l->address, known[0].info.address))
                        link_send(p, l, &m);
}

/* --- links --- */

/* 200 ms, doubling per consecutive failure, at most 5 s. */
static int64_t backoff_ms(unsigned failures) {
        unsigned shift = failures > 8 ? 8 : failures;
        return MIN((int64_t) PEER_BACKOFF_MAX_MS, (int64_t) PEER_BACKOFF_MIN_MS << shift);
}

static PeerLink *link_find(Peer *p, const char *address) {
        for (PeerLink *l = p->links; l; l = l->next)
                if (streq(l->address, address))
                        return l;
        return NULL;
}

static void link_dial(Peer *p, PeerLink *l) {
        int r = peer_ucx_connect(p->ucx, l->address, l, &l->ep);
        if (r < 0) {
                l->ep = NULL;
                if (!l->failing)
                        log_warning_errno(r, "Cannot reach peer %s: %m; retrying with backoff.",
                                          l->address);
                l->failing = true;
                l->failures++;
                l->retry_at_ms = now_ms() + backoff_ms(l->failures);
                return;
        }
        link_send_hello(p, l);
}

static PeerLink *link_add(Peer *p, const char *address, bool seed) {
        PeerLink *l;

        if (streq(address, p->self.address))
                return NULL;
        l = link_find(p, address);
        if (l) {
                l->seed = l->seed || seed;
                return l;
        }
        l = calloc(1, sizeof *l);
        if (!l || !(l->address = strdup(address))) {
                free(l);
                log_error_errno(-ENOMEM, "Out of memory in the peer thread, ignoring.");
                return NULL;
        }
        l->seed = seed;
        l->next = p->links;
        p->links = l;
        link_dial(p, l);
        return l;
}

static void link_free(Peer *p, PeerLink *l) {
        peer_ucx_close(p->ucx, l->ep);
        free(l->address);
        free(l);
}

/* A member we hear from directly: its link (re)starts now if it was waiting. */
static void link_heard(Peer *p, const char *address, bool restarted) {
        PeerLink *l = link_find(p, address);

        if (!l) {
                (void) link_add(p, address, false);
                return;
        }
        if (l->refused)
                log_info("Peer %s accepted this node after refusing it.", l->address);
        else if (l->failing)
                log_info("Peer %s is reachable again.", l->address);
        l->refused = false;
        l->refusals = 0;
        l->reached = true;
        l->failing = false;
        l->failures = 0;
        if (restarted && l->ep) {
                /* Our old link went to its previous start. */
                peer_ucx_close(p->ucx, l->ep);
                l->ep = NULL;
        }
        if (!l->ep)
                link_dial(p, l);
}

/* Drops links to addresses no member has, except seeds. */
static void links_prune(Peer *p) {
        for (PeerLink **pl = &p->links; *pl;) {
                PeerLink *l = *pl;
                bool used = l->seed;

                for (size_t i = 1; !used && i < membership_count(p->membership); i++)
                        used = streq(membership_get(p->membership, i)->info.address, l->address);
                if (used) {
                        pl = &l->next;
                        continue;
                }
                *pl = l->next;
                link_free(p, l);
        }
}

static void on_failure(void *userdata, PeerEndpoint *ep, const char *cause) {
        Peer *p = userdata;
        PeerLink *l = peer_endpoint_userdata(ep);

        if (!l || l->ep != ep)
                return;
        l->ep = NULL; /* closed by the caller */
        if (!l->failing)
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, l->address)),
                           "%s peer %s: %s; retrying with backoff.",
                           l->reached ? "Lost the link to" : "Cannot reach", l->address, cause);
        l->reached = false;
        l->failing = true;
        l->failures++;
        l->retry_at_ms = now_ms() + backoff_ms(l->failures);
        (void) p;
}

/* --- receiving --- */

static void peer_learn(Peer *p, const PeerMessage *m) {
        for (size_t i = 0; i < m->n_members; i++) {
                MemberVerdict v;
                int r = membership_learn(p->membership, &m->members[i].info,
                                         m->members[i].age_ms, now_ms(), &v);
                if (r < 0) {
                        log_error_errno(-ENOMEM, "Out of memory in the peer thread, ignoring.");
                        return;
                }
                if (v == MEMBER_JOINED || v == MEMBER_RESTARTED) {
                        log_info("Learned of node %s (%s) from %s.", m->members[i].info.name,
                                 m->members[i].info.address, m->sender.name);
                        link_heard(p, m->members[i].info.address, v == MEMBER_RESTARTED);
                }
        }
}

/* Answers on the endpoint a message came in on (UCP_AM_SEND_FLAG_REPLY). */
static void peer_reply(Peer *p, void *reply, PeerMessage *answer) {
        uint8_t *buf;
        size_t size;

        if (peer_encode(p, answer, &buf, &size) < 0)
                return;
        (void) peer_ucx_reply(p->ucx, reply, buf, size);
}

static void peer_refuse(Peer *p, void *reply, const PeerMessage *m, const char *reason) {
        PeerMessage answer = { .body = PEER_REFUSE, .reason = (char *) reason };

        log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m->sender.name)),
                   "Refusing node %s at %s: %s.", m->sender.name, m->sender.address, reason);
        peer_reply(p, reply, &answer);
}

/* A refusal is believed only on the link it answers, and closes that link alone. */
static void peer_refused(Peer *p, void *reply, const PeerMessage *m) {
        PeerEndpoint *ep = peer_ucx_reply_endpoint(p->ucx, reply);
        PeerLink *l = ep ? peer_endpoint_userdata(ep) : NULL;

        if (!l || l->ep != ep) {
                log_debug("Ignored a refusal in the name of %s (%s) that came on no link this "
                          "node dialed.", m->sender.name, m->sender.address);
                return;
        }
        unsigned shift = l->refusals < 5 ? l->refusals : 5;
        l->refused = true;
        l->refusals++;
        l->retry_at_ms = now_ms() + MIN((int64_t) PEER_REFUSED_BACKOFF_MAX_MS,
                                        (int64_t) PEER_REFUSED_BACKOFF_MIN_MS << shift);
        log_struct(LOG_ERR, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m->sender.name)),
                   "Node %s (%s) refused this node: %s. Asking again in %" PRId64 " s; fix the "
                   "configuration of one of them.",
                   m->sender.name, l->address, strempty(m->reason),
                   (l->retry_at_ms - now_ms() + 999) / 1000);
        peer_ucx_close(p->ucx, l->ep);
        l->ep = NULL;
}

/* Whether the members a hello or announce names (and its sender) fit under --max-nodes; when
 * not, the sender is told and nothing of the message is taken. */
static bool peer_list_fits(Peer *p, void *reply, const PeerMessage *m) {
        _cleanup_free_ const MemberInfo **list = NULL;
        _cleanup_free_ char *reason = NULL;

        /* A sender alone is the membership's to refuse, in its own words. */
        if ((m->body != PEER_HELLO && m->body != PEER_ANNOUNCE) || m->n_members == 0)
                return true;
        list = calloc(m->n_members + 1, sizeof(MemberInfo *));
        if (!list)
                return false;
        list[0] = &m->sender;
        for (size_t i = 0; i < m->n_members; i++)
                list[i + 1] = &m->members[i].info;
        if (membership_can_take(p->membership, list, m->n_members + 1))
                return true;
        if (asprintf(&reason, "its list of %zu members would take this cluster past %zu nodes "
                              "(--max-nodes)",
                     m->n_members, membership_max_nodes(p->membership)) < 0)
                reason = NULL;
        peer_refuse(p, reply, m, strempty(reason));
        return false;
}

/* Whether the link a message came on speaks for its sender (keyed links are bound to the
 * first start of a node we believed on them); a lie is logged once per PEER_VERSION_LOG_MS. */
static bool peer_link_speaks_for(Peer *p, void *reply, const PeerMessage *m) {
        const char *bound = NULL;
        int64_t now;

        if (peer_ucx_reply_check(p->ucx, reply, m->sender.name, m->sender.boot_id, &bound) >= 0)
                return true;
        now = now_ms();
        if (p->link_lie_logged_ms == 0 || now - p->link_lie_logged_ms >= PEER_VERSION_LOG_MS) {
                p->link_lie_logged_ms = now;
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m->sender.name)),
                           "Dropped a peer message in the name of node %s (start %016" PRIx64
                           ") that came on the link of node %s.",
                           m->sender.name, m->sender.boot_id, strempty(bound));
        }
        return false;
}

/* Once per sender and PEER_VERSION_LOG_MS. */
static void peer_log_version_refused(Peer *p, const PeerMessage *m) {
        uint64_t hash = 5381;
        int64_t now = now_ms();

        for (const char *c = m->sender.name; *c; c++)
                hash = hash * 33 + (unsigned char) *c;
        int64_t *last = &p->version_logged_ms[hash % PEER_VERSION_LOG_SLOTS];
        if (*last != 0 && now - *last < PEER_VERSION_LOG_MS)
                return;
        *last = now;
        log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m->sender.name)),
                   "Refused topology version %" PRIu64 " from node %s (%s): further ahead of "
                   "this node's %" PRIu64 " than the member table explains; kept until most "
                   "members report it.",
                   m->version, m->sender.name, m->sender.address,
                   membership_version(p->membership));
}

static void on_message(void *userdata, const uint8_t *data, size_t size, void *reply) {
        _cleanup_(peer_message_done) PeerMessage m = {};
        _cleanup_free_ char *refusal = NULL;
        Peer *p = userdata;
        bool version_refused;
        MemberVerdict v;
        int r;

        r = codec_peer_decode(data, size, &m);
        if (r < 0) {
                log_warning("Dropped an undecodable peer message of %zu bytes.", size);
                return;
        }
        if (!peer_link_speaks_for(p, reply, &m))
                return;
        if (m.body == PEER_REFUSE) {
                peer_refused(p, reply, &m);
                return;
        }
        if (!peer_list_fits(p, reply, &m))
                return;

        r = membership_heard_from(p->membership, &m.sender, m.version,
                                  m.body == PEER_HELLO || m.body == PEER_ANNOUNCE ? m.n_members : 0,
                                  now_ms(), &v, &version_refused, &refusal);
        if (r < 0) {
                log_error_errno(-ENOMEM, "Out of memory in the peer thread, ignoring.");
                return;
        }
        if (version_refused)
                peer_log_version_refused(p, &m);
        if ((v == MEMBER_KNOWN || v == MEMBER_JOINED || v == MEMBER_RESTARTED) &&
            peer_ucx_reply_bind(p->ucx, reply, m.sender.name, m.sender.boot_id) < 0) {
                log_error_errno(-ENOMEM, "Out of memory in the peer thread, ignoring.");
                return;
        }
        switch (v) {
        case MEMBER_REFUSED:
                peer_refuse(p, reply, &m, strempty(refusal));
                return;
        case MEMBER_UNKNOWN:
                peer_reply(p, reply, &(PeerMessage) { .body = PEER_WHO });
                return;
        case MEMBER_STALE:
        case MEMBER_DEFERRED:
                return;
        case MEMBER_JOINED:
        case MEMBER_RESTARTED:
                log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_PEER, m.sender.name)),
                           "Node %s (%s, %zu device%s) %s.", m.sender.name, m.sender.address,
                           m.sender.n_devices, m.sender.n_devices == 1 ? "" : "s",
                           v == MEMBER_JOINED ? "joined" : "restarted and rejoined");
                link_heard(p, m.sender.address, v == MEMBER_RESTARTED);
                peer_announce(p, m.sender.name);
                break;
        default:
                link_heard(p, m.sender.address, false);
                break;
        }

        switch (m.body) {
        case PEER_HELLO:
        case PEER_ANNOUNCE:
                peer_learn(p, &m);
                break;
        case PEER_WHO: {
                PeerLink *l = link_find(p, m.sender.address);
                if (l)
                        link_send_hello(p, l);
                break;
        }
        case PEER_FORGET:
                r = membership_forget(p->membership, m.forget_name, m.forget_boot_id, true,
                                      now_ms(), NULL);
                if (r > 0) {
                        log_info("Forgot node %s, as %s asked.", m.forget_name, m.sender.name);
                        links_prune(p);
                }
                break;
        default:
                break;
        }
}

/* --- the thread --- */

static void peer_send_heartbeats(Peer *p) {
        PeerMessage heartbeat = { .body = PEER_HEARTBEAT };

        for (PeerLink *l = p->links; l; l = l->next)
                if (!l->refused && l->ep)
                        link_send(p, l, &heartbeat);
}

/* This node's digest as the manager has it now (a reload since the last heartbeat). */
static void peer_sync_digest(Peer *p) {
        char digest[REGISTRY_DIGEST_LENGTH + 1];

        manager_registry_digest(p->manager, digest);
        if (!membership_set_local_digest(p->membership, digest))
                return;
        memcpy(p->self.registry_digest, digest, sizeof digest);
        log_info("Registry digest now %s; telling the peers.",
                 isempty(digest) ? "unknown" : digest);
}

static void peer_tick(Peer *p) {
        int64_t now = now_ms();

        peer_sync_digest(p);
        if (membership_tick(p->membership, now))
                links_prune(p);
        for (PeerLink *l = p->links; l; l = l->next)
                if (!l->ep && now >= l->retry_at_ms) {
                        if (l->refused)
                                log_info("Asking peer %s again, which refused this node.",
                                         l->address);
                        link_dial(p, l);
                }
        peer_send_heartbeats(p);
}

static void peer_run_commands(Peer *p) {
        (void) pthread_mutex_lock(&p->lock);
        if (p->keys_pending) {
                peer_ucx_set_keys(p->ucx, &p->new_keys);
                peer_keys_wipe(&p->new_keys);
                p->keys_pending = false;
        }
        while (p->commands) {
                PeerCommand *c = p->commands;
                p->commands = c->next;

                const Member *e = membership_find(p->membership, c->node);
                uint64_t boot = e ? e->info.boot_id : 0;
                c->result = membership_forget(p->membership, c->node, 0, false, now_ms(),
                                              c->error);
                if (c->result > 0) {
                        PeerMessage m = { .body = PEER_FORGET, .forget_name = (char *) c->node,
                                          .forget_boot_id = boot };
                        log_info("Forgot node %s, as an operator asked.", c->node);
                        links_prune(p);
                        for (PeerLink *l = p->links; l; l = l->next)
                                link_send(p, l, &m);
                }
                c->done = true;
        }
        /* The caller answers with the topology: it must already show the change. */
        peer_publish(p);
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
        peer_publish(p);
        return 0;
}

/* The wakeup only ends the sleep: on_prepare() does the work before the next one. */
static int on_wakeup(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        return 0;
}

static int on_heartbeat(sd_event_source *source, uint64_t usec, void *userdata) {
        Peer *p = userdata;

        (void) sd_event_source_set_time_relative(source, p->heartbeat_ms * 1000ull);
        peer_tick(p);
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

static void *peer_thread(void *userdata) {
        Peer *p = userdata;

        int r = sd_event_loop(p->event);
        if (r < 0)
                log_error_errno(r, "Peer thread: the event loop failed, peers stop being "
                                   "followed: %m");
        peer_thread_exit(p);
        return NULL;
}

static int peer_add_seeds(Peer *p, const char *peers) {
        _cleanup_free_ char *copy = strdup(strempty(peers));
        unsigned n = 0;

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
                (void) link_add(p, a, true);
        }
        return 0;
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

        r = membership_new(&p->self, &params->timeouts, now_ms(), &p->membership);
        if (r < 0)
                return r;
        membership_set_max_nodes(p->membership, params->max_nodes);

        r = sd_event_new(&p->event);
        if (r < 0)
                return log_error_errno(r, "Failed to create the peer thread's loop: %m");
        PeerUcxCallbacks cb = { .on_message = on_message, .on_failure = on_failure,
                                .on_sent = on_sent, .userdata = p };
        r = peer_ucx_new(p->event, params->listen_address, params->keys, &cb, &p->ucx);
        if (r < 0)
                return r;

        p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->event_fd < 0)
                return log_error_errno(-errno, "Failed to set up the peer thread's loop: %m");
        r = sd_event_add_io(p->event, &p->wakeup, peer_ucx_fd(p->ucx), EPOLLIN, on_wakeup, p);
        if (r >= 0)
                r = sd_event_source_set_prepare(p->wakeup, on_prepare);
        if (r >= 0)
                r = sd_event_add_time_relative(p->event, &p->heartbeat, CLOCK_MONOTONIC,
                                               p->heartbeat_ms * 1000ull,
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
        p->dirty = true;
        peer_publish(p);

        r = -pthread_create(&p->thread, NULL, peer_thread, p);
        if (r < 0)
                return log_error_errno(r, "Failed to start the peer thread: %m");
        p->thread_started = true;

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
        while (p->links) {
                PeerLink *l = p->links;
                p->links = l->next;
                link_free(p, l);
        }
        /* Before the worker and its wakeup fd go. */
        sd_event_source_disable_unref(p->wakeup);
        peer_ucx_free(p->ucx);
        sd_event_source_disable_unref(p->heartbeat);
        sd_event_source_disable_unref(p->command);
        sd_event_unref(p->event);
        membership_free(p->membership);
        member_info_done(&p->self);
        peer_keys_wipe(&p->new_keys);
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
