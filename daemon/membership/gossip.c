/* gossip.c: news about members waiting to ride on probes, each told a bounded number of times. */

#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "gossip.h"

void gossip_done(Gossip *g) {
        for (size_t i = 0; i < g->n; i++)
                free(g->items[i].name);
        free(g->items);
        name_index_done(&g->by_name);
        *g = (Gossip) {};
}

static const char *item_name_at(const void *userdata, uintptr_t i) {
        const Gossip *g = userdata;

        return g->items[i].name;
}

/* The last item takes the place of item i. */
static void gossip_remove(Gossip *g, size_t i) {
        (void) name_index_remove(&g->by_name, g->items[i].name, i);
        free(g->items[i].name);
        g->items[i] = g->items[--g->n];
        if (i < g->n)
                (void) name_index_move(&g->by_name, g->items[i].name, g->n, i);
}

static GossipItem *gossip_find(Gossip *g, const char *name) {
        uintptr_t i;

        return name_index_find(&g->by_name, name, item_name_at, g, &i) ? &g->items[i] : NULL;
}

/* The item told most often (the oldest among equals): the first to go when full. */
static size_t gossip_most_told(const Gossip *g) {
        size_t worst = 0;

        for (size_t i = 1; i < g->n; i++)
                if (g->items[i].told > g->items[worst].told ||
                    (g->items[i].told == g->items[worst].told &&
                     g->items[i].order < g->items[worst].order))
                        worst = i;
        return worst;
}

int gossip_add(Gossip *g, const char *name, uint64_t boot_id, bool forgotten) {
        GossipItem *e = gossip_find(g, name);

        if (!e) {
                if (name_index_reserve(&g->by_name, MIN(g->n + 1, (size_t) GOSSIP_MAX_ITEMS)) < 0)
                        return -ENOMEM;
                char *copy = strdup(name);
                if (!copy)
                        return -ENOMEM;
                if (g->n == GOSSIP_MAX_ITEMS)
                        gossip_remove(g, gossip_most_told(g));
                if (g->n == g->allocated) {
                        size_t n = MAX(g->allocated * 2, (size_t) 16);
                        GossipItem *grown = reallocarray(g->items, n, sizeof *grown);
                        if (!grown) {
                                free(copy);
                                return -ENOMEM;
                        }
                        g->items = grown;
                        g->allocated = n;
                }
                e = &g->items[g->n];
                *e = (GossipItem) { .name = copy };
                (void) name_index_put(&g->by_name, copy, g->n++); /* reserved */
        }
        e->boot_id = boot_id;
        e->forgotten = forgotten;
        e->picked = false;
        e->told = 0;
        e->order = ++g->next_order;
        return 0;
}

/* Whether a is to be told before b: told less often, or newer among equals. */
static bool gossip_before(const GossipItem *a, const GossipItem *b) {
        return a->told != b->told ? a->told < b->told : a->order > b->order;
}

static void swap_items(GossipItem **a, GossipItem **b) {
        GossipItem *t = *a;

        *a = *b;
        *b = t;
}

/* h[0..n) is a heap whose top is the item to be told last of them. */
static void heap_down(GossipItem **h, size_t n, size_t i) {
        for (size_t c; (c = 2 * i + 1) < n; i = c) {
                if (c + 1 < n && gossip_before(h[c], h[c + 1]))
                        c++;
                if (!gossip_before(h[i], h[c]))
                        break;
                swap_items(&h[i], &h[c]);
        }
}

static void heap_up(GossipItem **h, size_t i) {
        for (size_t parent; i > 0 && gossip_before(h[parent = (i - 1) / 2], h[i]); i = parent)
                swap_items(&h[parent], &h[i]);
}

size_t gossip_pick(Gossip *g, size_t max, GossipItem **ret) {
        size_t k = 0;

        /* The first `max` in telling order, kept in a heap in ret (the items stay where they
         * are, and so does the name index), then sorted: O(n log max). */
        for (size_t i = 0; i < g->n; i++) {
                GossipItem *e = &g->items[i];
                e->picked = false;
                if (k < max) {
                        ret[k] = e;
                        heap_up(ret, k++);
                } else if (max > 0 && gossip_before(e, ret[0])) {
                        ret[0] = e;
                        heap_down(ret, k, 0);
                }
        }
        for (size_t n = k; n > 1; n--) {
                swap_items(&ret[0], &ret[n - 1]);
                heap_down(ret, n - 1, 0);
        }
        for (size_t i = 0; i < k; i++)
                ret[i]->picked = true;
        return k;
}

void gossip_told(Gossip *g, unsigned limit) {
        for (size_t i = 0; i < g->n;) {
                GossipItem *e = &g->items[i];
                if (e->picked) {
                        e->picked = false;
                        e->told++;
                        if (e->told >= limit) {
                                gossip_remove(g, i);
                                continue;
                        }
                }
                i++;
        }
}

size_t gossip_pending(const Gossip *g) {
        return g->n;
}
