/* arena.h: a bump allocator for everything one call builds and drops at once. */
#pragma once

#include <stddef.h>

#include "common/macro.h"

/*
 * A reply message tree, or a decoded request, is allocated piece by piece and released whole
 * when the call ends; an arena turns the dozens of malloc/free pairs of that into a pointer bump
 * and one release, and lets encoders stop caring about partial trees on failure. The first
 * chunk lives inside the Arena, so a small call allocates nothing from the heap.
 */

#define ARENA_INLINE_BYTES 2048u

typedef struct ArenaChunk ArenaChunk;

typedef struct Arena {
        ArenaChunk *chunks; /* heap chunks, newest first */
        size_t used;        /* in the current chunk (the inline one while chunks is NULL) */
        size_t size;        /* of the current chunk */
        unsigned char *current;
        _Alignas(16) unsigned char inline_chunk[ARENA_INLINE_BYTES];
} Arena;

void arena_init(Arena *a);
/* Releases every allocation; the arena may be used again after arena_init(). */
void arena_done(Arena *a);

/* Zeroed, aligned for any type; NULL on OOM. */
void *arena_alloc(Arena *a, size_t size);
void *arena_alloc_array(Arena *a, size_t n, size_t size);
/* NULL s copies as "". */
char *arena_strdup(Arena *a, const char *s);
