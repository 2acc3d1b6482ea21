/* peer-protocol-swim.c: the protocol's SWIM mode: probes, gossiped verdicts, verdict pulls. */

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "peer-protocol-internal.h"
#include "core/resource-limits.h"

/* How many times each news item is told: PROTOCOL_GOSSIP_TELL x ceil(log2(members + 1)). */
static unsigned gossip_limit(Protocol *p) {
        unsigned log2n = 1;

        while (log2n < 32 && ((size_t) 1 << log2n) < membership_count(p->membership) + 1)
                log2n++;
        return PROTOCOL_GOSSIP_TELL * log2n;
}

/* News to gossip: a member's changed verdict, or (forgotten) that it was forgotten. */
void protocol_swim_news(Protocol *p, const char *name, uint64_t boot_id, bool forgotten) {
        if (gossip_add(&p->gossip, name, boot_id, forgotten) < 0)
                note_no_memory(p);
}

/* A verdict heard or reached here; news when it changed the member's state. */
void protocol_swim_verdict_take(Protocol *p, const char *name, uint64_t boot_id,
                                uint64_t incarnation, NodeState state, int64_t now) {
        if (membership_verdict(p->membership, name, boot_id, incarnation, state, now) > 0)
                protocol_swim_news(p, name, boot_id, false);
}

/* A suspicion or down verdict about this very start: raise our incarnation above it (not one
 * further ahead than a member can have seen: a lie, MEMBERSHIP_INCARNATION_SLACK). */
static void refute(Protocol *p, uint64_t boot_id, NodeState state, uint64_t incarnation) {
        uint64_t ours = own_incarnation(p);

        if (boot_id != p->self.boot_id || state == NODE_UP || incarnation < ours ||
            incarnation > ours + MEMBERSHIP_INCARNATION_SLACK)
                return;
        membership_set_local_incarnation(p->membership, incarnation + 1);
        protocol_swim_news(p, p->self.name, p->self.boot_id, false);
}

typedef struct GossipOut {
        PeerUpdate updates[PROTOCOL_GOSSIP_PER_MESSAGE];
} GossipOut;

/* Puts the news due next into m (borrowing from the table and the queue until gossip_told()). */
static void gossip_attach(Protocol *p, PeerMessage *m, GossipOut *out) {
        GossipItem *items[PROTOCOL_GOSSIP_PER_MESSAGE];
        size_t n = gossip_pick(&p->gossip, PROTOCOL_GOSSIP_PER_MESSAGE, items);

        m->updates = out->updates;
        for (size_t i = 0; i < n; i++) {
                GossipItem *it = items[i];
                const Member *e = membership_find(p->membership, it->name);

                if (it->forgotten) {
                        out->updates[m->n_updates++] = (PeerUpdate) {
                                .name = it->name, .boot_id = it->boot_id, .forgotten = true };
                        continue;
                }
                if (!e || e->info->boot_id != it->boot_id) {
                        it->told = UINT_MAX - 1; /* stale: dropped by gossip_told() */
                        continue;
                }
                out->updates[m->n_updates++] = (PeerUpdate) {
                        .name = e->info->name, .boot_id = it->boot_id,
                        .incarnation = e->incarnation, .state = e->state };
        }
}

/* Our link to address, dialed now if there is none: NULL when it cannot carry a message. */
static ProtocolLink *swim_link(Protocol *p, const char *address, int64_t now) {
        ProtocolLink *l = protocol_link_find(p, address);

        if (!l)
                l = protocol_link_add(p, address, false, now);
        else if (!l->endpoint && !l->refused)
                protocol_link_dial(p, l, now);
        if (!l || !l->endpoint || l->refused)
                return NULL;
        l->used_at_ms = now;
        return l;
}

/* A probe message with the news due, to address (l NULL: as the answer to o). */
static void swim_send(Protocol *p, const char *address, const ProtocolOrigin *o, PeerMessage *m,
                      int64_t now) {
        ProtocolLink *l = address ? swim_link(p, address, now) : NULL;
        GossipOut out;

        if (address && !l)
                return;
        gossip_attach(p, m, &out);
        protocol_send_or_reply(p, l, o, m);
        gossip_told(&p->gossip, gossip_limit(p));
}

static void swim_ping(Protocol *p, const Member *e, uint32_t seq, int64_t now) {
        PeerMessage m = { .body = PEER_PING,
                          .probe = { .name = e->info->name, .boot_id = e->info->boot_id,
                                     .seq = seq, .state = e->state,
                                     .incarnation = e->incarnation } };

        swim_send(p, e->info->address, NULL, &m, now);
}

/* This period's member to probe: one named to us as possibly restarted, else one at random. */
static const Member *probe_target(Protocol *p) {
        size_t n = membership_count(p->membership);
        const Member *e = p->probe_next ? membership_find(p->membership, p->probe_next) : NULL;

        p->probe_next = mfree(p->probe_next);
        if (e && !e->local)
                return e;
        return n < 2 ? NULL : membership_get(p->membership, 1 + protocol_random(p) % (n - 1));
}

static void probe_start(Protocol *p, int64_t now) {
        const Member *e = probe_target(p);

        p->phase = SWIM_IDLE;
        p->probe_name = mfree(p->probe_name);
        if (!e)
                return;
        p->probe_name = strdup(e->info->name);
        if (!p->probe_name) {
                note_no_memory(p);
                return;
        }
        p->probe_boot_id = e->info->boot_id;
        p->probe_seq = ++p->seq;
        p->phase = SWIM_DIRECT;
        swim_ping(p, e, p->probe_seq, now);
}

static const Member *probed(Protocol *p) {
        const Member *e = p->probe_name ? membership_find(p->membership, p->probe_name) : NULL;

        return e && e->info->boot_id == p->probe_boot_id ? e : NULL;
}

/* No ack in half a period: PROTOCOL_SWIM_HELPERS up members are asked to ping it for us. */
static void probe_indirect(Protocol *p, int64_t now) {
        const Member *t = probed(p);
        size_t n = membership_count(p->membership), asked = 0;

        p->phase = SWIM_INDIRECT;
        if (!t || t->state == NODE_DOWN || n < 3)
                return;
        for (unsigned tries = 0; asked < PROTOCOL_SWIM_HELPERS && tries < 4 * PROTOCOL_SWIM_HELPERS;
             tries++) {
                const Member *h = membership_get(p->membership, 1 + protocol_random(p) % (n - 1));
                PeerMessage m = { .body = PEER_PING_REQ,
                                  .probe = { .name = t->info->name, .boot_id = t->info->boot_id,
                                             .seq = p->probe_seq, .state = t->state,
                                             .incarnation = t->incarnation } };

                if (h == t || h->state != NODE_UP)
                        continue;
                swim_send(p, h->info->address, NULL, &m, now);
                asked++;
        }
}

/* No ack at all within the period: the member is suspect (it hears so from gossip, or from
 * the state in the next ping it gets from a member that holds it suspect). */
static void probe_failed(Protocol *p, int64_t now) {
        const Member *t = probed(p);

        p->phase = SWIM_IDLE;
        if (!t || t->state != NODE_UP)
                return; /* suspect or down already: its timer runs */
        protocol_swim_verdict_take(p, t->info->name, t->info->boot_id, t->incarnation,
                                   NODE_SUSPECT, now);
}

/* A ping_req: we ping the member, and its ack goes back to the requester. */
void protocol_swim_relay(Protocol *p, const PeerMessage *m, int64_t now) {
        const Member *t = membership_find(p->membership, m->probe.name);
        SwimRelay *r = &p->relays[p->next_relay++ % PROTOCOL_SWIM_RELAYS];

        if (!t || t->local || t->info->boot_id != m->probe.boot_id)
                return;
        free(r->requester);
        free(r->target);
        *r = (SwimRelay) { .requester = strdup(m->sender.address), .target = strdup(t->info->name),
                           .target_boot_id = t->info->boot_id, .their_seq = m->probe.seq,
                           .our_seq = ++p->seq };
        if (!r->requester || !r->target) {
                r->requester = mfree(r->requester);
                r->target = mfree(r->target);
                note_no_memory(p);
                return;
        }
        swim_ping(p, t, r->our_seq, now);
}

/* An ack: of our probe, or of a ping we sent for another member's ping_req. */
void protocol_swim_acked(Protocol *p, const PeerMessage *m, int64_t now) {
        const PeerProbe *a = &m->probe;

        if (p->phase != SWIM_IDLE && a->seq == p->probe_seq && p->probe_name &&
            streq(a->name, p->probe_name) && a->boot_id == p->probe_boot_id) {
                p->phase = SWIM_IDLE;
                protocol_swim_verdict_take(p, a->name, a->boot_id, a->incarnation, NODE_UP, now);
                return;
        }
        for (size_t i = 0; i < PROTOCOL_SWIM_RELAYS; i++) {
                SwimRelay *r = &p->relays[i];
                if (!r->requester || r->our_seq != a->seq || r->target_boot_id != a->boot_id ||
                    !streq(r->target, a->name))
                        continue;
                PeerMessage ack = { .body = PEER_ACK,
                                    .probe = { .name = r->target, .boot_id = a->boot_id,
                                               .seq = r->their_seq,
                                               .incarnation = a->incarnation } };
                swim_send(p, r->requester, NULL, &ack, now);
                r->requester = mfree(r->requester);
                r->target = mfree(r->target);
                return;
        }
}

/* A ping is answered whoever sent it (even a start we do not know yet). */
void protocol_swim_answer(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m, int64_t now) {
        PeerMessage ack = { .body = PEER_ACK,
                            .probe = { .name = p->self.name, .boot_id = p->self.boot_id,
                                       .seq = m->probe.seq } };

        if (streq(m->probe.name, p->self.name))
                refute(p, m->probe.boot_id, m->probe.state, m->probe.incarnation);
        ack.probe.incarnation = own_incarnation(p);
        swim_send(p, NULL, o, &ack, now);
}

/* swim: a member whose verdicts have differed from ours for a while (and whose table does not)
 * is asked for them where they differ (verdict-sync.h). */
void protocol_swim_verdict_check(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                                 int64_t now) {
        unsigned n_buckets = verdict_sync_buckets(membership_count(p->membership));
        _cleanup_free_ uint64_t *buckets = NULL;

        if (!m->has_table || m->table_digest != membership_digest(p->membership) ||
            !verdict_pull_due(&p->verdict_pull, membership_verdict_digest(p->membership),
                              m->verdict_digest, now, p->heartbeat_ms,
                              VERDICT_SYNC_ROUNDS))
                return;
        buckets = calloc(n_buckets, sizeof(uint64_t));
        if (!buckets) {
                note_no_memory(p);
                return;
        }
        membership_verdict_buckets(p->membership, n_buckets, buckets);
        protocol_reply(p, o, &(PeerMessage) { .body = PEER_WHO, .want_verdicts = buckets,
                                              .n_want_verdicts = n_buckets });
}

/* A pull: our verdicts where the asker's buckets differ, at most VERDICT_SYNC_ANSWERS a
 * heartbeat. */
void protocol_swim_verdicts_answer(Protocol *p, const ProtocolOrigin *o, const PeerMessage *m,
                                   int64_t now) {
        _cleanup_free_ PeerUpdate *list = NULL;
        size_t n;

        if (now - p->answers_at_ms >= (int64_t) p->heartbeat_ms) {
                p->answers_at_ms = now;
                p->answers = 0;
        }
        if (p->answers >= VERDICT_SYNC_ANSWERS)
                return;
        p->answers++;
        if (verdict_sync_answer(p->membership, m->want_verdicts, m->n_want_verdicts, &list,
                                &n) < 0) {
                note_no_memory(p);
                return;
        }
        for (size_t at = 0, k; at < n; at += k) {
                k = verdict_sync_chunk(list, n, at);
                protocol_reply(p, o, &(PeerMessage) { .body = PEER_VERDICTS,
                                                      .updates = list + at, .n_updates = k });
        }
}

/* The verdicts a probe message carries. */
void protocol_swim_take_gossip(Protocol *p, const PeerMessage *m, int64_t now) {
        for (size_t i = 0; i < m->n_updates; i++) {
                const PeerUpdate *u = &m->updates[i];

                if (streq(u->name, p->self.name)) {
                        if (!u->forgotten)
                                refute(p, u->boot_id, u->state, u->incarnation);
                } else if (u->forgotten) {
                        if (membership_forget(p->membership, u->name, u->boot_id, true, now,
                                              NULL) <= 0)
                                continue;
                        note(p, (ProtocolNote) { .kind = PROTOCOL_NOTE_FORGOT, .name = u->name,
                                                 .text = m->sender.name });
                        protocol_links_prune(p);
                        protocol_swim_news(p, u->name, u->boot_id, true);
                } else
                        protocol_swim_verdict_take(p, u->name, u->boot_id, u->incarnation,
                                                   u->state, now);
        }
}

/* Past PROTOCOL_SWIM_LINKS links, closes those not sent on for PROTOCOL_SWIM_LINK_IDLE_PERIODS
 * (made again when next needed); failed ones go once their backoff is over. Seeds stay, and are
 * dialed again as with all-to-all. Below the bound no live link is closed: closing one may cut
 * the other side's link to us that UCX pairs with it, without an error reaching it. */
static void swim_links(Protocol *p, int64_t now) {
        int64_t idle = (int64_t) p->heartbeat_ms * PROTOCOL_SWIM_LINK_IDLE_PERIODS;
        size_t n = p->n_links;

        for (ProtocolLink **pl = &p->links; *pl;) {
                ProtocolLink *l = *pl;
                bool due = !l->endpoint && now >= l->retry_at_ms;
                bool stale = l->endpoint && n > PROTOCOL_SWIM_LINKS &&
                             now - l->used_at_ms >= idle;

                if (l->seed || (!due && !stale)) {
                        if (due)
                                protocol_link_dial(p, l, now);
                        pl = &l->next;
                        continue;
                }
                *pl = l->next;
                protocol_link_free(p, l);
                n--;
        }
}

/* Every half period; a probe starts on every other tick. */
void protocol_swim_tick(Protocol *p, int64_t now) {
        bool period = p->ticks++ % 2 == 0;

        protocol_tick_members(p, now);
        swim_links(p, now);
        if (!period) {
                if (p->phase == SWIM_DIRECT)
                        probe_indirect(p, now);
                return;
        }
        if (p->phase != SWIM_IDLE)
                probe_failed(p, now);
        probe_start(p, now);
}

/* Once we know a table: every member hears our start from us (a join or a restart is believed
 * only from the node itself), as with all-to-all a node that knows the table dials everyone. */
void protocol_swim_greet(Protocol *p, int64_t now) {
        size_t n = membership_count(p->membership);

        p->greeted = true;
        for (size_t i = 1; i < n; i++) {
                ProtocolLink *l = swim_link(p, membership_get(p->membership, i)->info->address,
                                            now);
                if (l)
                        protocol_send_hello(p, l, NULL, false, now);
        }
}
