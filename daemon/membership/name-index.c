/* name-index.c: a string-keyed hash index from a name to a word its owner keeps the name in. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "name-index.h"

#define NAME_INDEX_MIN_SLOTS 8u
/* Marks a used slot in its hash (the top bit: the slots are chosen by the low ones). */
#define NAME_INDEX_USED (UINT64_C(1) << 63)

uint64_t name_index_hash(const char *name) {
        uint64_t h = UINT64_C(14695981039346656037);

        for (const char *c = name; *c; c++)
                h = (h ^ (unsigned char) *c) * UINT64_C(1099511628211);
        /* FNV-1a spreads its last bytes poorly into the low bits the slots use: mix once. */
        h ^= h >> 32;
        h *= UINT64_C(0x9E3779B97F4A7C15);
        return h ^ (h >> 29);
}

static uint64_t slot_hash(const char *name) {
        return name_index_hash(name) | NAME_INDEX_USED;
}

static size_t slot_of(const NameIndex *x, uint64_t hash) {
        return (size_t) hash & (x->n_slots - 1);
}

static void slot_place(NameIndex *x, uint64_t hash, uintptr_t value) {
        size_t i = slot_of(x, hash);

        while (x->slots[i].hash != 0)
                i = (i + 1) & (x->n_slots - 1);
        x->slots[i] = (NameIndexSlot) { .hash = hash, .value = value };
}

int name_index_reserve(NameIndex *x, size_t n) {
        size_t want = NAME_INDEX_MIN_SLOTS;
        NameIndexSlot *old = x->slots;
        size_t n_old = x->n_slots;

        if (n > SIZE_MAX / 4)
                return -ENOMEM;
        while (2 * want < 3 * n)
                want *= 2;
        if (want <= x->n_slots)
                return 0;
        x->slots = calloc(want, sizeof(NameIndexSlot));
        if (!x->slots) {
                x->slots = old;
                return -ENOMEM;
        }
        x->n_slots = want;
        for (size_t i = 0; i < n_old; i++)
                if (old[i].hash != 0)
                        slot_place(x, old[i].hash, old[i].value);
        free(old);
        return 0;
}

int name_index_put(NameIndex *x, const char *name, uintptr_t value) {
        int r = name_index_reserve(x, x->n + 1);
        if (r < 0)
                return r;
        slot_place(x, slot_hash(name), value);
        x->n++;
        return 0;
}

bool name_index_find(const NameIndex *x, const char *name, NameIndexKey key, const void *userdata,
                     uintptr_t *ret_value) {
        uint64_t h;

        if (x->n == 0)
                return false;
        h = slot_hash(name);
        for (size_t i = slot_of(x, h); x->slots[i].hash != 0; i = (i + 1) & (x->n_slots - 1))
                if (x->slots[i].hash == h && streq(key(userdata, x->slots[i].value), name)) {
                        *ret_value = x->slots[i].value;
                        return true;
                }
        return false;
}

/* The slot of the entry (hash(name), value), or n_slots. */
static size_t slot_find(const NameIndex *x, const char *name, uintptr_t value) {
        uint64_t h;

        if (x->n == 0)
                return x->n_slots;
        h = slot_hash(name);
        for (size_t i = slot_of(x, h); x->slots[i].hash != 0; i = (i + 1) & (x->n_slots - 1))
                if (x->slots[i].hash == h && x->slots[i].value == value)
                        return i;
        return x->n_slots;
}

bool name_index_move(NameIndex *x, const char *name, uintptr_t value, uintptr_t to) {
        size_t i = slot_find(x, name, value);

        if (i == x->n_slots)
                return false;
        x->slots[i].value = to;
        return true;
}

/* Backward-shift removal: each later slot of the run moves into the hole when its home slot
 * does not lie (cyclically) between the hole and itself, so no probe ever meets a gap. */
bool name_index_remove(NameIndex *x, const char *name, uintptr_t value) {
        size_t mask, hole = slot_find(x, name, value);

        if (hole == x->n_slots)
                return false;
        mask = x->n_slots - 1;
        for (size_t i = (hole + 1) & mask; x->slots[i].hash != 0; i = (i + 1) & mask) {
                size_t home = slot_of(x, x->slots[i].hash);

                if (((i - home) & mask) >= ((i - hole) & mask)) {
                        x->slots[hole] = x->slots[i];
                        hole = i;
                }
        }
        x->slots[hole] = (NameIndexSlot) {};
        x->n--;
        return true;
}

void name_index_clear(NameIndex *x) {
        if (x->slots)
                memset(x->slots, 0, x->n_slots * sizeof(NameIndexSlot));
        x->n = 0;
}

size_t name_index_count(const NameIndex *x) {
        return x->n;
}

void name_index_done(NameIndex *x) {
        if (!x)
                return;
        free(x->slots);
        *x = (NameIndex) {};
}
