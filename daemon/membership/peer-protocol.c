/* peer-protocol.c: the membership protocol's state machine, driven by a clock and a sink. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer-protocol-internal.h"
#include "core/resource-limits.h"

/* --- sending --- */

/* The members to tell: everyone but ourselves, with how long ago we heard them. */
static int known_list(Protocol *p, const char *only, int64_t now, PeerKnown **ret,
                      size_t *ret_n) {
        size_t n = membership_count(p->membership), k = 0;
        PeerKnown *list = calloc(n ? n : 1, sizeof(PeerKnown));

        if (!list)
                return -ENOMEM;
        for (size_t i = 1; i < n; i++) {
                const Member *e = membership_get(p->membership, i);
                if (only && !streq(e->info->name, only))
                        continue;
                list[k].info = *e->info; /* borrowed */
                list[k].age_ms = (uint64_t) MAX(now - e->last_heard_ms, (int64_t) 0);
                list[k].state = e->state;
                list[k].incarnation = e->incarnation;
                k++;
        }
        *ret = list;
        *ret_n = k;
        return 0;
}

/* Names this node, its start and the version in a message about to go out. */
static void stamp(Protocol *p, PeerMessage *m) {
        m->sender = p->self; /* borrowed */
        /* Heartbeats and probes are most of the traffic: they name the start, not the devices. */
        m->sender.partial = m->body == PEER_HEARTBEAT || m->body == PEER_PING ||
                            m->body == PEER_ACK || m->body == PEER_PING_REQ;
        m->version = membership_version(p->membership);
        m->incarnation = own_incarnation(p);
        m->has_table = true;
        m->table_digest = membership_digest(p->membership);
        m->table_members = (uint32_t) membership_count(p->membership);
        if (p->mode == PROTOCOL_SWIM)
                m->verdict_digest = membership_verdict_digest(p->membership);
}

static void link_send(Protocol *p, ProtocolLink *l, PeerMessage *m) {
        if (!l->endpoint)
                return;
        stamp(p, m);
        p->sink.send(p->sink.userdata, l->endpoint, l->address, m);
}

void protocol_reply(Protocol *p, const ProtocolOrigin *o, PeerMessage *m) {
        stamp(p, m);
        p->sink.reply(p->sink.userdata, o->reply, m);
}

/* Members per hello, so that one stays well under the peer message limit (a receiver drops
 * larger ones): estimated from the largest member record. */
static size_t hello_chunk(const PeerKnown *known, size_t n) {
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

/* On our link l, or (NULL) as the answer to o. */
void protocol_send_or_reply(Protocol *p, ProtocolLink *l, const ProtocolOrigin *o, PeerMessage *m) {
        if (l)
                link_send(p, l, m);
        else
                protocol_reply(p, o, m);
}

/* The sender's whole record, and with `table` every member it knows: on our link l, or (l
 * NULL) as the answer to o. */
void protocol_send_hello(Protocol *p, ProtocolLink *l, const ProtocolOrigin *o, bool table,
                         int64_t now) {
        _cleanup_free_ PeerKnown *known = NULL;
        size_t n, chunk;

        if (!table) {
                protocol_send_or_reply(p, l, o, &(PeerMessage) { .body = PEER_HELLO });
                return;
        }
        if (known_list(p, NULL, now, &known, &n) < 0) {
                note_no_memory(p);
                return;
        }
        chunk = hello_chunk(known, n);
        for (size_t at = 0; at == 0 || at < n; at += chunk) {
                PeerMessage m = { .body = PEER_HELLO, .members = known + at,
                                  .n_members = MIN(chunk, n - at) };
                protocol_send_or_reply(p, l, o, &m);
                if (n == 0)
                        break;
        }
}

/* Tells every link but the member's own that it joined or restarted. */
static void announce(Protocol *p, const char *name, int64_t now) {
        _cleanup_free_ PeerKnown *known = NULL;
        PeerMessage m = { .body = PEER_ANNOUNCE };

        if (known_list(p, name, now, &known, &m.n_members) < 0 || m.n_members == 0)
                return;
        m.members = known;
        for (ProtocolLink *l = p->links; l; l = l->next)
                if (!streq(l->address, known[0].info.address))
                        link_send(p, l, &m);
}

/* xorshift64: which links hear a change first; no secret, only spread. */
uint64_t protocol_random(Protocol *p) {
        p->random ^= p->random << 13;
        p->random ^= p->random >> 7;
        p->random ^= p->random << 17;
        return p->random;
}

/* A heartbeat on every connected link, or on about `fanout` of them chosen at random (0:
 * all). */
static void send_heartbeats(Protocol *p, size_t fanout) {
        PeerMessage heartbeat = { .body = PEER_HEARTBEAT };
        size_t connected;

        (void) protocol_links(p, &connected);
        for (ProtocolLink *l = p->links; l; l = l->next) {
                if (l->refused || !l->endpoint)
                        continue;
                if (fanout > 0 && connected > fanout && protocol_random(p) % connected >= fanout)
                        continue;
                link_send(p, l, &heartbeat);
        }
}

/* --- links --- */

/* 200 ms, doubling per consecutive failure, at most 5 s. */
static int64_t backoff_ms(unsigned failures) {
        unsigned shift = failures > 8 ? 8 : failures;
        return MIN((int64_t) PROTOCOL_BACKOFF_MAX_MS, (int64_t) PROTOCOL_BACKOFF_MIN_MS << shift);
}

static const char *link_address_at(const void *userdata, uintptr_t value) {
        (void) userdata;
        return ((const ProtocolLink *) value)->address;
}

ProtocolLink *protocol_link_find(Protocol *p, const char *address) {
        uintptr_t l;

        if (!name_index_find(&p->links_by_address, address, link_address_at, NULL, &l))
                return NULL;
        return (ProtocolLink *) l;
}

static ProtocolLink *link_by_endpoint(Protocol *p, void *endpoint) {
        if (!endpoint)
                return NULL;
        for (ProtocolLink *l = p->links; l; l = l->next)
                if (l->endpoint == endpoint)
                        return l;
        return NULL;
}

static void link_close(Protocol *p, ProtocolLink *l) {
        if (l->endpoint)
                p->sink.close(p->sink.userdata, l->endpoint);
        l->endpoint = NULL;
}

void protocol_link_dial(Protocol *p, ProtocolLink *l, int64_t now) {
        int r = p->sink.dial(p->sink.userdata, l->address, &l->endpoint);
        if (r < 0) {
                l->endpoint = NULL;
                if (!l->failing)
                        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_DIAL_FAILED,
                                                 .address = l->address, .error = r });
                l->failing = true;
                l->failures++;
                l->retry_at_ms = now + backoff_ms(l->failures);
                return;
        }
        l->dialed_at_ms = now;
        l->used_at_ms = now;
        l->answered_boot_id = 0;
        /* The table follows when the other side's digest asks for it (table_check()). With
         * swim only a seed needs our record first: the others know us from tables. */
        if (p->mode == PROTOCOL_ALL_TO_ALL || l->seed)
                protocol_send_hello(p, l, NULL, false, now);
}

ProtocolLink *protocol_link_add(Protocol *p, const char *address, bool seed, int64_t now) {
        ProtocolLink *l;

        if (streq(address, p->self.address))
                return NULL;
        l = protocol_link_find(p, address);
        if (l) {
                l->seed = l->seed || seed;
                return l;
        }
        l = calloc(1, sizeof *l);
        if (!l || !(l->address = strdup(address)) ||
            name_index_put(&p->links_by_address, l->address, (uintptr_t) l) < 0) {
                if (l)
                        free(l->address);
                free(l);
                note_no_memory(p);
                return NULL;
        }
        l->seed = seed;
        l->next = p->links;
        p->links = l;
        p->n_links++;
        protocol_link_dial(p, l, now);
        return l;
}

void protocol_link_free(Protocol *p, ProtocolLink *l) {
        link_close(p, l);
        p->n_links--;
        (void) name_index_remove(&p->links_by_address, l->address, (uintptr_t) l);
        free(l->address);
        free(l);
}

/* A member we hear from directly: its link (re)starts now if it was waiting. On a restart to
 * start `boot_id` (stale_ms not INT64_MIN), a link made at or before `stale_ms` may reach a
 * previous start of the member, and is made anew; with swim, so is any link the new start has
 * not answered on: a daemon hears few members directly, so when it last heard the old start
 * says little about when its link was made (links made at a cold start's greetings outlived
 * restarts, and their first probe after was lost). */
static void link_heard(Protocol *p, const char *address, int64_t stale_ms, uint64_t boot_id,
                       int64_t now) {
        ProtocolLink *l = protocol_link_find(p, address);
        bool stale;

        if (!l) {
                if (p->mode == PROTOCOL_ALL_TO_ALL) /* swim: links are made on demand */
                        (void) protocol_link_add(p, address, false, now);
                return;
        }
        if (l->refused || l->failing)
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_LINK_BACK, .address = l->address,
                                         .flag = l->refused });
        l->refused = false;
        l->refusals = 0;
        l->reached = true;
        l->failing = false;
        l->failures = 0;
        stale = l->dialed_at_ms <= stale_ms ||
                (p->mode == PROTOCOL_SWIM && stale_ms != INT64_MIN &&
                 l->answered_boot_id != boot_id);
        if (l->endpoint && stale)
                link_close(p, l); /* our old link went to its previous start */
        if (!l->endpoint)
                protocol_link_dial(p, l, now);
}

static const char *member_address_at(const void *userdata, uintptr_t i) {
        return membership_get(userdata, i)->info->address;
}

/* Drops links to addresses no member has, except seeds: one index of the members' addresses,
 * then one lookup per link (not a scan of the members per link). */
void protocol_links_prune(Protocol *p) {
        _cleanup_(name_index_done) NameIndex addresses = {};
        size_t n = membership_count(p->membership);
        uintptr_t unused;

        if (name_index_reserve(&addresses, n) < 0) {
                note_no_memory(p);
                return; /* the links stay until the next change */
        }
        for (size_t i = 1; i < n; i++)
                (void) name_index_put(&addresses, membership_get(p->membership, i)->info->address,
                                      i); /* reserved: cannot fail */
        for (ProtocolLink **pl = &p->links; *pl;) {
                ProtocolLink *l = *pl;
                bool used = l->seed || name_index_find(&addresses, l->address, member_address_at,
                                                       p->membership, &unused);

                if (used) {
                        pl = &l->next;
                        continue;
                }
                *pl = l->next;
                protocol_link_free(p, l);
        }
}

void protocol_on_link_failed(Protocol *p, void *endpoint, const char *cause, int64_t now_ms) {
        ProtocolLink *l = link_by_endpoint(p, endpoint);

        if (!l)
                return;
        l->endpoint = NULL; /* the transport closes it */
        if (!l->failing)
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_LINK_FAILED, .address = l->address,
                                         .text = cause, .flag = l->reached });
        l->reached = false;
        l->failing = true;
        l->failures++;
        l->retry_at_ms = now_ms + backoff_ms(l->failures);
}

int protocol_add_seed(Protocol *p, const char *address, int64_t now_ms) {
        if (!protocol_link_add(p, address, true, now_ms) && !streq(address, p->self.address))
                return -ENOMEM;
        return 0;
}

/* --- receiving --- */

/* When the start we know of the sender's node was last heard of (INT64_MIN: none, or this
 * very start). On a restart, our link to that address is made anew only when it is older than
 * that: a link made since reaches the new start already, and UCX may have paired it with the
 * new start's own link to us (one connection between two workers for both directions), so
 * closing it would cut the new start's messages to us too. */
static int64_t last_heard_of(Protocol *p, const MemberInfo *sender) {
        const Member *e = membership_find(p->membership, sender->name);

        return e && e->info->boot_id != sender->boot_id ? e->last_heard_ms : INT64_MIN;
}

static void learn(Protocol *p, const PeerMessage *m, int64_t now) {
        for (size_t i = 0; i < m->n_members; i++) {
                MemberInfo proven = m->members[i].info; /* borrowed */
                const MemberInfo *info = &proven;
                int64_t previous_heard;
                MemberVerdict v;
                int r;

                /* A record with its node's own MAC is the node's word (a restart it could not
                 * tell us itself). */
                proven.proven = proven.has_record_mac && p->sink.verify &&
                                p->sink.verify(p->sink.userdata, &proven);
                previous_heard = last_heard_of(p, info);
                r = membership_learn(p->membership, info, m->members[i].age_ms, now, &v);
                if (r < 0) {
                        note_no_memory(p);
                        return;
                }
                if (p->mode == PROTOCOL_SWIM && (v == MEMBER_KNOWN || v == MEMBER_JOINED))
                        protocol_swim_verdict_take(p, info->name, info->boot_id,
                                                   m->members[i].incarnation,
                                                   m->members[i].state, now);
                if (v == MEMBER_JOINED || v == MEMBER_RESTARTED) {
                        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_LEARNED,
                                                 .member = &m->members[i].info,
                                                 .name = m->sender.name });
                        link_heard(p, m->members[i].info.address,
                                   v == MEMBER_RESTARTED ? previous_heard : INT64_MIN,
                                   m->members[i].info.boot_id, now);
                }
        }
}

static void refuse(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                   const char *reason) {
        PeerMessage answer = { .body = PEER_REFUSE, .reason = (char *) reason };

        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_REFUSING, .member = &m->sender,
                                 .text = reason });
        protocol_reply(p, o, &answer);
}

/* A refusal is believed only on the link it answers, and closes that link alone. */
static void refused(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m, int64_t now) {
        ProtocolLink *l = link_by_endpoint(p, o->dialed);

        if (!l) {
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_REFUSAL_IGNORED,
                                         .member = &m->sender });
                return;
        }
        unsigned shift = l->refusals < 5 ? l->refusals : 5;
        l->refused = true;
        l->refusals++;
        l->retry_at_ms = now + MIN((int64_t) PROTOCOL_REFUSED_BACKOFF_MAX_MS,
                                   (int64_t) PROTOCOL_REFUSED_BACKOFF_MIN_MS << shift);
        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_REFUSED_US, .member = &m->sender,
                                 .address = l->address, .text = strempty(m->reason),
                                 .number = (uint64_t) (l->retry_at_ms - now + 999) / 1000 });
        link_close(p, l);
}

/* Whether the members a hello or announce names (and its sender) fit under --max-nodes; when
 * not, the sender is told and nothing of the message is taken. */
static bool list_fits(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m) {
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
        refuse(p, o, m, strempty(reason));
        return false;
}

/* Whether the link a message came on speaks for its sender (keyed links are bound to the
 * first start of a node we believed on them); a lie is noted once per PROTOCOL_VERSION_NOTE_MS. */
static bool link_speaks_for(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                            int64_t now) {
        if (!o->bound_name ||
            (o->bound_boot_id == m->sender.boot_id && streq(o->bound_name, m->sender.name)))
                return true;
        if (p->link_lie_noted_ms == 0 || now - p->link_lie_noted_ms >= PROTOCOL_VERSION_NOTE_MS) {
                p->link_lie_noted_ms = now;
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_LINK_LIE, .member = &m->sender,
                                         .name = o->bound_name });
        }
        return false;
}

/* Once per sender and PROTOCOL_VERSION_NOTE_MS. */
static void note_version_refused(Protocol *p, const PeerMessage *m, int64_t now) {
        uint64_t hash = 5381;

        for (const char *c = m->sender.name; *c; c++)
                hash = hash * 33 + (unsigned char) *c;
        int64_t *last = &p->version_noted_ms[hash % PROTOCOL_VERSION_NOTE_SLOTS];
        if (*last != 0 && now - *last < PROTOCOL_VERSION_NOTE_MS)
                return;
        *last = now;
        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_VERSION_REFUSED, .member = &m->sender,
                                 .number = m->version,
                                 .number2 = membership_version(p->membership) });
}

/* A member whose table differs from ours is asked for it: at once when it knows more nodes,
 * else once the difference has lasted PROTOCOL_TABLE_ROUNDS heartbeats. At most once per half
 * heartbeat in all, doubling up to PROTOCOL_TABLE_BACKOFF times while the tables asked for
 * change nothing here (they name a member we refuse or forgot). */
static void table_check(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                        int64_t now) {
        ProtocolLink *l = protocol_link_find(p, m->sender.address);
        uint64_t digest = membership_digest(p->membership);
        bool fruitless, *differs = l ? &l->differs : &p->differs;
        int64_t *since = l ? &l->differs_since_ms : &p->differs_since_ms;

        /* swim: most members have no link here; one difference for all of them. */
        if (p->mode == PROTOCOL_SWIM) {
                differs = &p->differs;
                since = &p->differs_since_ms;
        }
        if (!m->has_table || (!l && p->mode == PROTOCOL_ALL_TO_ALL))
                return;
        if (m->table_digest == digest) {
                *differs = false;
                return;
        }
        if (!*differs) {
                *differs = true;
                *since = now;
        }
        if (m->body == PEER_HELLO && m->n_members > 0)
                return; /* its table is on its way (a long one in several hellos) */
        if (m->table_members <= membership_count(p->membership) &&
            now - *since < (int64_t) p->heartbeat_ms * PROTOCOL_TABLE_ROUNDS)
                return;
        fruitless = p->pulled_at_ms != 0 && p->pulled_digest == digest;
        if (p->pulled_at_ms != 0 &&
            now - p->pulled_at_ms < ((int64_t) p->heartbeat_ms / 2)
                                            << (fruitless ? p->fruitless : 0))
                return;
        p->fruitless = fruitless ? MIN(p->fruitless + 1, (unsigned) PROTOCOL_TABLE_BACKOFF) : 0;
        p->pulled_at_ms = now;
        p->pulled_digest = digest;
        *since = now;
        protocol_reply(p, o, &(PeerMessage) { .body = PEER_WHO, .want_table = true });
}

/* Whether the others must hear of a member that joined through us: when it knows less than
 * half our table it will not dial them all soon (a daemon without digests: always). */
static bool announce_due(Protocol *p, const PeerMessage *m) {
        return !m->has_table || (size_t) m->table_members * 2 < membership_count(p->membership);
}


/* What a message asks of us once its sender is believed. */
static void on_body(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m, int64_t now) {
        switch (m->body) {
        case PEER_HELLO:
        case PEER_ANNOUNCE:
                learn(p, m, now);
                break;
        case PEER_WHO: {
                ProtocolLink *l = protocol_link_find(p, m->sender.address);
                /* A daemon without digests learns tables from hellos only. swim: answered on
                 * the link it came on (we may have none to the sender). */
                if (p->mode == PROTOCOL_SWIM && m->n_want_verdicts > 0)
                        protocol_swim_verdicts_answer(p, o, m, now);
                else if (p->mode == PROTOCOL_SWIM)
                        protocol_send_hello(p, NULL, o, m->want_table || !m->has_table, now);
                else if (l)
                        protocol_send_hello(p, l, NULL, m->want_table || !m->has_table, now);
                break;
        }
        case PEER_PING:
                protocol_swim_take_gossip(p, m, now);
                protocol_swim_answer(p, o, m, now);
                break;
        case PEER_ACK:
                protocol_swim_take_gossip(p, m, now);
                protocol_swim_acked(p, m, now);
                break;
        case PEER_PING_REQ:
                protocol_swim_take_gossip(p, m, now);
                protocol_swim_relay(p, m, now);
                break;
        case PEER_VERDICTS:
                if (p->mode != PROTOCOL_SWIM)
                        break;
                verdict_pull_took(&p->verdict_pull, m->n_updates);
                protocol_swim_take_gossip(p, m, now);
                break;
        case PEER_FORGET:
                if (membership_forget(p->membership, m->forget_name, m->forget_boot_id, true,
                                      now, NULL) > 0) {
                        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_FORGOT,
                                                 .name = m->forget_name,
                                                 .text = m->sender.name });
                        protocol_links_prune(p);
                }
                break;
        default:
                break;
        }
}

void protocol_on_message(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                         int64_t now) {
        _cleanup_free_ char *refusal = NULL;
        int64_t previous_heard;
        bool version_refused;
        MemberVerdict v;

        if (!link_speaks_for(p, o, m, now))
                return;
        if (o->dialed) {
                /* An answer on our own link: the start it reaches (see link_heard()). */
                ProtocolLink *l = protocol_link_find(p, m->sender.address);
                if (l && l->endpoint == o->dialed)
                        l->answered_boot_id = m->sender.boot_id;
        }
        if (m->body == PEER_REFUSE) {
                refused(p, o, m, now);
                return;
        }
        if (!list_fits(p, o, m))
                return;
        previous_heard = last_heard_of(p, &m->sender);
        if (membership_heard_from(p->membership, &m->sender, m->version,
                                  m->body == PEER_HELLO || m->body == PEER_ANNOUNCE ?
                                          m->n_members : 0,
                                  now, &v, &version_refused, &refusal) < 0) {
                note_no_memory(p);
                return;
        }
        if (version_refused)
                note_version_refused(p, m, now);
        if ((v == MEMBER_KNOWN || v == MEMBER_JOINED || v == MEMBER_RESTARTED) &&
            p->sink.bind(p->sink.userdata, o->reply, m->sender.name, m->sender.boot_id) < 0) {
                note_no_memory(p);
                return;
        }
        switch (v) {
        case MEMBER_REFUSED:
                refuse(p, o, m, strempty(refusal));
                return;
        case MEMBER_UNKNOWN:
                protocol_reply(p, o, &(PeerMessage) { .body = PEER_WHO });
                if (m->body == PEER_PING)
                        protocol_swim_answer(p, o, m, now);
                return;
        case MEMBER_DEFERRED:
                /* swim: the start we hold up may be gone (nobody may probe it soon). */
                if (p->mode == PROTOCOL_SWIM && !p->probe_next)
                        p->probe_next = strdup(m->sender.name); /* NULL: at random */
                if (m->body == PEER_PING)
                        protocol_swim_answer(p, o, m, now);
                return;
        case MEMBER_STALE:
                return;
        case MEMBER_JOINED:
        case MEMBER_RESTARTED:
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_JOINED, .member = &m->sender,
                                         .flag = v == MEMBER_RESTARTED });
                link_heard(p, m->sender.address,
                           v == MEMBER_RESTARTED ? previous_heard : INT64_MIN,
                           m->sender.boot_id, now);
                if (p->mode == PROTOCOL_SWIM) {
                        /* It joined through us and knows little: our table, on its link (we
                         * dial no one back); it greets the others itself
                         * (protocol_swim_greet()). */
                        if (announce_due(p, m) && m->body == PEER_HELLO)
                                protocol_send_hello(p, NULL, o, true, now);
                } else if (announce_due(p, m))
                        announce(p, m->sender.name, now);
                break;
        default:
                link_heard(p, m->sender.address, INT64_MIN, m->sender.boot_id, now);
                break;
        }
        /* Its own word on its incarnation lifts a suspicion it has refuted; one it has not
         * refuted yet is told again, so that our answer carries it to the member. */
        if (p->mode == PROTOCOL_SWIM) {
                const Member *e = membership_find(p->membership, m->sender.name);
                protocol_swim_verdict_take(p, m->sender.name, m->sender.boot_id,
                                           m->incarnation, NODE_UP, now);
                if (e && e->info->boot_id == m->sender.boot_id && e->state != NODE_UP)
                        protocol_swim_news(p, m->sender.name, m->sender.boot_id, false);
        }
        on_body(p, o, m, now);
        table_check(p, o, m, now);
        if (p->mode == PROTOCOL_SWIM)
                protocol_swim_verdict_check(p, o, m, now);
}

/* --- time and commands --- */

/* The timeouts; links to addresses no member lives at any more go (only a forgotten member
 * leaves: an O(N) pass on every state change would cost O(N) per change at 10,000 members). */
void protocol_tick_members(Protocol *p, int64_t now) {
        size_t before = membership_count(p->membership);

        if (membership_tick(p->membership, now) && membership_count(p->membership) < before)
                protocol_links_prune(p);
}

void protocol_tick(Protocol *p, int64_t now) {
        if (p->mode == PROTOCOL_SWIM) {
                protocol_swim_tick(p, now);
                return;
        }
        protocol_tick_members(p, now);
        for (ProtocolLink *l = p->links; l; l = l->next)
                if (!l->endpoint && now >= l->retry_at_ms) {
                        if (l->refused)
                                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_ASKING_AGAIN,
                                                         .address = l->address });
                        protocol_link_dial(p, l, now);
                }
        send_heartbeats(p, 0);
}

void protocol_set_record_mac(Protocol *p, const uint8_t mac[MEMBER_RECORD_MAC_BYTES]) {
        memcpy(p->self.record_mac, mac, MEMBER_RECORD_MAC_BYTES);
        p->self.has_record_mac = true;
}

void protocol_set_local_digest(Protocol *p, const char *digest) {
        if (!membership_set_local_digest(p->membership, digest))
                return;
        snprintf(p->self.registry_digest, sizeof p->self.registry_digest, "%s", digest);
        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_DIGEST, .text = digest });
}

int protocol_forget(Protocol *p, const char *node, int64_t now, FamilyError *ret_error) {
        const Member *e = membership_find(p->membership, node);
        uint64_t boot = e ? e->info->boot_id : 0;
        int r = membership_forget(p->membership, node, 0, false, now, ret_error);

        if (r > 0) {
                PeerMessage m = { .body = PEER_FORGET, .forget_name = (char *) node,
                                  .forget_boot_id = boot };
                note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_FORGOT, .name = node });
                protocol_links_prune(p);
                if (p->mode == PROTOCOL_SWIM)
                        protocol_swim_news(p, node, boot, true);
                else
                        for (ProtocolLink *l = p->links; l; l = l->next)
                                link_send(p, l, &m);
        }
        return r;
}

static void flush(Protocol *p, int64_t now, int64_t now_unix, bool gap) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        uint64_t v = membership_version(p->membership);
        uint64_t revision = membership_revision(p->membership);
        uint64_t changes = membership_changes(p->membership);

        /* A change made here goes out at once (at most every quarter interval) to
         * PROTOCOL_EAGER_FANOUT links, so those take its version within a round trip and the
         * rest within a heartbeat interval; versions merely taken from peers are not echoed.
         * (To every link, a change all N members see cost N^2 messages.) */
        if (p->mode == PROTOCOL_SWIM && !p->greeted && membership_count(p->membership) > 2)
                protocol_swim_greet(p, now);
        if (p->mode == PROTOCOL_ALL_TO_ALL && changes != p->sent_changes &&
            now - p->eager_at_ms >= (int64_t) p->heartbeat_ms / 4) {
                p->sent_changes = changes;
                p->eager_at_ms = now;
                send_heartbeats(p, PROTOCOL_EAGER_FANOUT);
        }
        if (v == p->published_version && revision == p->published_revision && !p->dirty) {
                p->publish_held = false;
                return;
        }
        /* Each publication copies every record: in a burst, one per gap. */
        if (gap && p->publish_gap_ms > 0 && p->published_at_ms != INT64_MIN &&
            now - p->published_at_ms < (int64_t) p->publish_gap_ms) {
                p->publish_held = true;
                return;
        }
        if (p->sink.published) {
                if (membership_topology(p->membership, now, now_unix, &t) < 0) {
                        note_no_memory(p); /* the old topology stays */
                        return;
                }
                p->sink.published(p->sink.userdata, TAKE_PTR(t));
        } else
                p->sink.changed(p->sink.userdata, p->membership);
        p->published_version = v;
        p->published_revision = revision;
        p->published_at_ms = now;
        p->publish_held = false;
        p->dirty = false;
}

void protocol_flush(Protocol *p, int64_t now, int64_t now_unix) {
        flush(p, now, now_unix, true);
}

void protocol_flush_now(Protocol *p, int64_t now, int64_t now_unix) {
        flush(p, now, now_unix, false);
}

int64_t protocol_publish_due_ms(const Protocol *p) {
        return p->publish_held ? p->published_at_ms + (int64_t) p->publish_gap_ms : -1;
}

/* --- the object --- */

int protocol_new(const ProtocolParams *params, const ProtocolSink *sink, int64_t now_ms,
                 Protocol **ret) {
        _cleanup_(protocol_freep) Protocol *p = calloc(1, sizeof(Protocol));
        int r;

        if (!p)
                return -ENOMEM;
        p->sink = *sink;
        p->heartbeat_ms = params->heartbeat_ms;
        p->publish_gap_ms = params->publish_gap_ms;
        p->published_at_ms = INT64_MIN;
        if (params->mode < 0 || params->mode >= _PROTOCOL_MODE_MAX)
                return -EINVAL;
        p->mode = params->mode;
        r = member_info_copy(params->self, &p->self);
        if (r < 0)
                return r;
        r = membership_new(&p->self, &params->timeouts, now_ms, &p->membership);
        if (r < 0)
                return r;
        membership_set_max_nodes(p->membership, params->max_nodes);
        membership_set_records(p->membership, params->records);
        if (params->reserve > 0) {
                r = membership_reserve(p->membership, params->reserve);
                if (r < 0)
                        return r;
        }
        if (p->mode == PROTOCOL_SWIM)
                membership_set_verdicts(p->membership, p->heartbeat_ms);
        /* splitmix64 of the boot id: xorshift from seeds that differ in a few low bits (1, 2,
         * 3...) runs in step for many draws, and daemons would probe the same members. */
        uint64_t z = p->self.boot_id + UINT64_C(0x9E3779B97F4A7C15);
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        p->random = (z ^ (z >> 31)) | 1;
        p->dirty = true;
        *ret = TAKE_PTR(p);
        return 0;
}

Protocol *protocol_free(Protocol *p) {
        if (!p)
                return NULL;
        while (p->links) {
                ProtocolLink *l = p->links;
                p->links = l->next;
                protocol_link_free(p, l);
        }
        name_index_done(&p->links_by_address);
        gossip_done(&p->gossip);
        for (size_t i = 0; i < PROTOCOL_SWIM_RELAYS; i++) {
                free(p->relays[i].requester);
                free(p->relays[i].target);
        }
        free(p->probe_name);
        free(p->probe_next);
        membership_free(p->membership);
        member_info_done(&p->self);
        return mfree(p);
}

static const char *const protocol_mode_names[_PROTOCOL_MODE_MAX] = {
        [PROTOCOL_ALL_TO_ALL] = "all-to-all",
        [PROTOCOL_SWIM] = "swim",
};

const char *protocol_mode_to_string(ProtocolMode mode) {
        return mode >= 0 && mode < _PROTOCOL_MODE_MAX ? protocol_mode_names[mode] : NULL;
}

ProtocolMode protocol_mode_from_string(const char *s) {
        for (ProtocolMode m = 0; m < _PROTOCOL_MODE_MAX; m++)
                if (s && streq(s, protocol_mode_names[m]))
                        return m;
        return _PROTOCOL_MODE_INVALID;
}

unsigned protocol_tick_interval_ms(const Protocol *p) {
        return p->mode == PROTOCOL_SWIM ? MAX(p->heartbeat_ms / 2, 1u) : p->heartbeat_ms;
}

const Membership *protocol_membership(const Protocol *p) {
        return p->membership;
}

size_t protocol_links(const Protocol *p, size_t *ret_connected) {
        size_t up = 0;

        if (ret_connected) {
                for (const ProtocolLink *l = p->links; l; l = l->next)
                        up += l->endpoint != NULL;
                *ret_connected = up;
        }
        return p->n_links;
}
