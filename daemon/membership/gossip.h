/* gossip.h: news about members waiting to ride on probes, each told a bounded number of times. */
#pragma once

/*
 * DESIGN: the dissemination half of SWIM (membership/peer-protocol.c, --membership swim). An item
 * names one start of a member whose state changed (or that was forgotten, by an operator);
 * what is told is read from the member table when a message goes out, so an item always
 * carries the newest verdict. One item per name: news about a name replaces the older item and
 * is told afresh. Each message takes the items told least often (the newest first among
 * equals), and an item told `limit` times (about 3 log2 N, the caller's) is dropped: a change
 * reaches every member in O(log N) probe periods, and a quiet cluster sends no news at all.
 * At most GOSSIP_MAX_ITEMS wait; past that the most told is dropped first (the member table's
 * digest still makes tables that differ meet, membership/peer-protocol.h).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "name-index.h"

#define GOSSIP_MAX_ITEMS 1024

typedef struct GossipItem {
        char *name;
        uint64_t boot_id;
        bool forgotten; /* an operator forgot this start */
        bool picked;
        unsigned told;
        uint64_t order; /* when added: newer first among items told as often */
} GossipItem;

typedef struct Gossip {
        GossipItem *items;
        size_t n, allocated;
        uint64_t next_order;
        NameIndex by_name; /* name -> position in items, kept in step with them */
} Gossip;

void gossip_done(Gossip *g);
/* News about `name`: replaces the item about it, to be told afresh. */
int gossip_add(Gossip *g, const char *name, uint64_t boot_id, bool forgotten);
/* Marks up to `max` items, told least often first, and returns how many; ret[i] point into g
 * until gossip_told(). */
size_t gossip_pick(Gossip *g, size_t max, GossipItem **ret);
/* The picked items were told once more; those told `limit` times are dropped. */
void gossip_told(Gossip *g, unsigned limit);
/* Items waiting to be told. */
size_t gossip_pending(const Gossip *g);
