/* name-index.h: a string-keyed hash index from a name to a word its owner keeps the name in. */
#pragma once

/*
 * DESIGN: the index holds no names, only each name's hash and a value (a position in the
 * owner's array, or a pointer to the owner's entry), so the owner's array may grow, shrink and
 * move without the index copying a string. A lookup compares names through the owner's key
 * callback, only where the hashes agree. The owner keeps the index in step: name_index_put()
 * when an entry appears, name_index_move() when it moves (a removal that swaps the last
 * element in, or shifts the rest down), name_index_remove() when it goes. Several entries may
 * share a name; a lookup finds one of them.
 *
 * Open addressing with linear probing and backward-shift removal (no tombstones), FNV-1a
 * with a final mix. The slots are a power of two, at least 1.5 times the entries (at most two
 * thirds full: a miss probes about 5 slots): the index grows with its owner's array and never
 * past three times its largest count (bounded by the owner's own limit, e.g. --max-nodes), 16
 * bytes a slot. Not thread-safe; single-threaded like its owners.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The name the owner keeps under `value`. */
typedef const char *(*NameIndexKey)(const void *userdata, uintptr_t value);

typedef struct NameIndexSlot {
        uint64_t hash; /* the name's, with NAME_INDEX_USED set; 0: a free slot */
        uintptr_t value;
} NameIndexSlot;

typedef struct NameIndex {
        NameIndexSlot *slots; /* n_slots of them, a power of two; NULL while empty */
        size_t n_slots;
        size_t n; /* entries */
} NameIndex;

uint64_t name_index_hash(const char *name);

/* Room for `n` entries without growing again: -ENOMEM, the index unchanged. */
int name_index_reserve(NameIndex *x, size_t n);

/* Adds `name` -> `value` (growing when needed): 0, or -ENOMEM with the index unchanged. */
int name_index_put(NameIndex *x, const char *name, uintptr_t value);

/* The value of an entry named `name`: true and *ret_value, or false. */
bool name_index_find(const NameIndex *x, const char *name, NameIndexKey key, const void *userdata,
                     uintptr_t *ret_value);

/* The entry of `name` with `value` now has `to`: false when there is none. */
bool name_index_move(NameIndex *x, const char *name, uintptr_t value, uintptr_t to);

/* Removes the entry of `name` with `value`: false when there is none. */
bool name_index_remove(NameIndex *x, const char *name, uintptr_t value);

/* Removes every entry, keeping the slots. */
void name_index_clear(NameIndex *x);

size_t name_index_count(const NameIndex *x);

void name_index_done(NameIndex *x);
