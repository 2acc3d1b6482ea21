/* arena.c: chunked bump allocation, released whole. */
#include <stdint.h>

#include "arena.h"

struct ArenaChunk {
        ArenaChunk *next;
        size_t size;
        _Alignas(16) unsigned char data[];
};

#define ARENA_ALIGN 16u
#define ARENA_MIN_CHUNK (16u * 1024u)

void arena_init(Arena *a) {
        a->chunks = NULL;
        a->used = 0;
        a->size = sizeof a->inline_chunk;
        a->current = a->inline_chunk;
}

void arena_done(Arena *a) {
        while (a->chunks) {
                ArenaChunk *next = a->chunks->next;
                free(a->chunks);
                a->chunks = next;
        }
        arena_init(a);
}

void *arena_alloc(Arena *a, size_t size) {
        size_t start = (a->used + ARENA_ALIGN - 1) & ~(size_t) (ARENA_ALIGN - 1);

        if (size == 0)
                size = 1;
        if (start > a->size || size > a->size - start) {
                size_t chunk = size > ARENA_MIN_CHUNK ? size : ARENA_MIN_CHUNK;
                /* Double with each chunk, so a large reply needs few of them. */
                if (a->chunks && chunk < a->chunks->size * 2 && a->chunks->size <= SIZE_MAX / 4)
                        chunk = a->chunks->size * 2;
                if (chunk > SIZE_MAX - sizeof(ArenaChunk))
                        return NULL;

                ArenaChunk *c = malloc(sizeof(ArenaChunk) + chunk);
                if (!c)
                        return NULL;
                c->next = a->chunks;
                c->size = chunk;
                a->chunks = c;
                a->current = c->data;
                a->size = chunk;
                start = 0;
        }

        void *p = a->current + start;
        a->used = start + size;
        memset(p, 0, size);
        return p;
}

void *arena_alloc_array(Arena *a, size_t n, size_t size) {
        if (size != 0 && n > SIZE_MAX / size)
                return NULL;
        return arena_alloc(a, n * size);
}

char *arena_strdup(Arena *a, const char *s) {
        if (!s)
                s = "";
        size_t n = strlen(s) + 1;
        char *p = arena_alloc(a, n);
        if (p)
                memcpy(p, s, n);
        return p;
}
