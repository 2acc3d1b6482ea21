/* gossip.c: news about members waiting to ride on probes, each told a bounded number of times. */

#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "gossip.h"

void gossip_done(Gossip *g) {
        for (size_t i = 0; i < g->n; i++)
                free(g->items[i].name);
        free(g->items);
        *g = (Gossip) {};
}

static void gossip_remove(Gossip *g, size_t i) {
        free(g->items[i].name);
        g->items[i] = g->items[--g->n];
}

static GossipItem *gossip_find(Gossip *g, const char *name) {
        for (size_t i = 0; i < g->n; i++)
                if (streq(g->items[i].name, name))
                        return &g->items[i];
        return NULL;
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
                e = &g->items[g->n++];
                *e = (GossipItem) { .name = copy };
        }
        e->boot_id = boot_id;
        e->forgotten = forgotten;
        e->picked = false;
        e->told = 0;
        e->order = ++g->next_order;
        return 0;
}

static int gossip_compare(const void *a, const void *b) {
        const GossipItem *x = a, *y = b;

        if (x->told != y->told)
                return x->told < y->told ? -1 : 1;
        return x->order > y->order ? -1 : x->order < y->order;
}

size_t gossip_pick(Gossip *g, size_t max, GossipItem **ret) {
        size_t k = MIN(max, g->n);

        /* Least told first, the newest among equals: the first k after sorting (the order of
         * the items is otherwise free). */
        if (g->n > 1)
                qsort(g->items, g->n, sizeof *g->items, gossip_compare);
        for (size_t i = 0; i < g->n; i++)
                g->items[i].picked = i < k;
        for (size_t i = 0; i < k; i++)
                ret[i] = &g->items[i];
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
