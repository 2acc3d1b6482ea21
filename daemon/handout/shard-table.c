/* shard-table.c: a chained hash table of tokens under SipHash-2-4 with a random key. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/random.h"
#include "shard-table.h"

#define SHARD_TABLE_MIN_BUCKETS 64u

typedef struct Entry Entry;
struct Entry {
        Entry *next;
        uint64_t hash;
        ShardToken token;
        char *group;
        ShardSegment *segment;
        ShardAccess access;
};

struct ShardTable {
        atomic_uint n_ref;
        pthread_mutex_t lock;
        uint8_t key[16];
        Entry **buckets;
        size_t n_buckets; /* a power of two */
        size_t n_entries;
        size_t max_entries;
};

/* SipHash-2-4 (Aumasson, Bernstein), as in the reference implementation. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                          \
        do {                                                              \
                v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
                v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                    \
                v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                    \
                v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
        } while (0)

static uint64_t load64_le(const uint8_t *p) {
        uint64_t v = 0;
        for (unsigned i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

static uint64_t siphash24(const uint8_t key[16], const uint8_t *in, size_t n) {
        uint64_t k0 = load64_le(key), k1 = load64_le(key + 8);
        uint64_t v0 = UINT64_C(0x736f6d6570736575) ^ k0, v1 = UINT64_C(0x646f72616e646f6d) ^ k1;
        uint64_t v2 = UINT64_C(0x6c7967656e657261) ^ k0, v3 = UINT64_C(0x7465646279746573) ^ k1;
        uint64_t b = (uint64_t) n << 56;
        size_t full = n - n % 8;

        for (size_t i = 0; i < full; i += 8) {
                uint64_t m = load64_le(in + i);
                v3 ^= m;
                SIPROUND;
                SIPROUND;
                v0 ^= m;
        }
        for (size_t i = 0; i < n % 8; i++)
                b |= (uint64_t) in[full + i] << (8 * i);
        v3 ^= b;
        SIPROUND;
        SIPROUND;
        v0 ^= b;
        v2 ^= 0xff;
        SIPROUND;
        SIPROUND;
        SIPROUND;
        SIPROUND;
        return v0 ^ v1 ^ v2 ^ v3;
}

/* Hashes at most SHARD_TOKEN_LENGTH + 1 bytes: a longer candidate matches nothing anyway. */
static uint64_t token_hash(const ShardTable *t, const char *token) {
        return siphash24(t->key, (const uint8_t *) token, strnlen(token, SHARD_TOKEN_LENGTH + 1));
}

static Entry *entry_free(Entry *e) {
        if (!e)
                return NULL;
        shard_segment_unref(e->segment);
        free(e->group);
        return mfree(e);
}

static void entry_list_free(Entry *e) {
        while (e) {
                Entry *next = e->next;
                entry_free(e);
                e = next;
        }
}

int shard_table_new(size_t max_tokens, ShardTable **ret) {
        ShardTable *t;
        int r;

        t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        r = random_bytes(t->key, sizeof t->key);
        if (r < 0) {
                free(t);
                return r;
        }
        t->n_buckets = SHARD_TABLE_MIN_BUCKETS;
        t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
        if (!t->buckets) {
                free(t);
                return -ENOMEM;
        }
        r = pthread_mutex_init(&t->lock, NULL);
        if (r != 0) {
                free(t->buckets);
                free(t);
                return -r;
        }
        atomic_init(&t->n_ref, 1);
        t->max_entries = max_tokens > 0 ? max_tokens : SHARD_TABLE_MAX_TOKENS;
        *ret = t;
        return 0;
}

ShardTable *shard_table_ref(ShardTable *t) {
        if (t)
                atomic_fetch_add_explicit(&t->n_ref, 1, memory_order_relaxed);
        return t;
}

ShardTable *shard_table_unref(ShardTable *t) {
        if (!t || atomic_fetch_sub_explicit(&t->n_ref, 1, memory_order_acq_rel) != 1)
                return NULL;
        for (size_t i = 0; i < t->n_buckets; i++)
                entry_list_free(t->buckets[i]);
        free(t->buckets);
        (void) pthread_mutex_destroy(&t->lock);
        return mfree(t);
}

/* Doubles the buckets past one entry per bucket; a failed grow just leaves chains longer. */
static void table_grow_locked(ShardTable *t) {
        if (t->n_entries < t->n_buckets || t->n_buckets > SIZE_MAX / 2 / sizeof(Entry *))
                return;

        size_t n = t->n_buckets * 2;
        Entry **b = calloc(n, sizeof *b);
        if (!b)
                return;
        for (size_t i = 0; i < t->n_buckets; i++)
                for (Entry *e = t->buckets[i], *next; e; e = next) {
                        next = e->next;
                        e->next = b[e->hash & (n - 1)];
                        b[e->hash & (n - 1)] = e;
                }
        free(t->buckets);
        t->buckets = b;
        t->n_buckets = n;
}

/* The link that points at token's entry, or NULL. */
static Entry **table_find_locked(ShardTable *t, const char *token) {
        uint64_t h = token_hash(t, token);
        Entry **link = &t->buckets[h & (t->n_buckets - 1)];

        for (; *link; link = &(*link)->next)
                if ((*link)->hash == h && shard_token_equal((*link)->token.hex, token))
                        return link;
        return NULL;
}

int shard_table_add(ShardTable *t, const char *group, ShardSegment *segment,
                    ShardToken *ret_token) {
        _cleanup_free_ Entry *e = NULL;
        _cleanup_free_ char *g = NULL;
        int r;

        if (isempty(group) || strnlen(group, SHARD_TABLE_MAX_GROUP_LENGTH + 1) >
                                      SHARD_TABLE_MAX_GROUP_LENGTH || !segment)
                return -EINVAL;

        e = calloc(1, sizeof *e);
        g = strdup(group);
        if (!e || !g)
                return -ENOMEM;

        (void) pthread_mutex_lock(&t->lock);
        if (t->n_entries >= t->max_entries) {
                (void) pthread_mutex_unlock(&t->lock);
                return SHARD_TABLE_FULL;
        }
        /* A repeat of a live token (2^-128 per pair) is drawn again, never shadowed. */
        do {
                r = shard_token_new(&e->token);
                if (r < 0) {
                        (void) pthread_mutex_unlock(&t->lock);
                        return r;
                }
        } while (table_find_locked(t, e->token.hex));

        e->hash = token_hash(t, e->token.hex);
        e->group = TAKE_PTR(g);
        e->segment = shard_segment_ref(segment);
        ShardToken token = e->token;
        Entry **bucket = &t->buckets[e->hash & (t->n_buckets - 1)];
        e->next = *bucket;
        *bucket = TAKE_PTR(e);
        t->n_entries++;
        table_grow_locked(t);
        (void) pthread_mutex_unlock(&t->lock);

        *ret_token = token;
        return 0;
}

int shard_table_restore(ShardTable *t, const char *group, ShardSegment *segment,
                        const char *token) {
        _cleanup_free_ Entry *e = NULL;
        _cleanup_free_ char *g = NULL;

        if (isempty(group) || strnlen(group, SHARD_TABLE_MAX_GROUP_LENGTH + 1) >
                                      SHARD_TABLE_MAX_GROUP_LENGTH || !segment ||
            !shard_token_is_valid(token))
                return -EINVAL;

        e = calloc(1, sizeof *e);
        g = strdup(group);
        if (!e || !g)
                return -ENOMEM;
        memcpy(e->token.hex, token, SHARD_TOKEN_LENGTH + 1);

        (void) pthread_mutex_lock(&t->lock);
        if (table_find_locked(t, token)) {
                (void) pthread_mutex_unlock(&t->lock);
                return -EEXIST;
        }
        e->hash = token_hash(t, e->token.hex);
        e->group = TAKE_PTR(g);
        e->segment = shard_segment_ref(segment);
        Entry **bucket = &t->buckets[e->hash & (t->n_buckets - 1)];
        e->next = *bucket;
        *bucket = TAKE_PTR(e);
        t->n_entries++;
        table_grow_locked(t);
        (void) pthread_mutex_unlock(&t->lock);
        return 0;
}

int shard_table_lookup(ShardTable *t, const char *token, ShardSegment **ret) {
        return shard_table_lookup_many(t, &token, 1, ret, &(size_t) { 0 });
}

int shard_table_lookup_many(ShardTable *t, const char *const *tokens, size_t n, ShardSegment **ret,
                            size_t *ret_bad_index) {
        return shard_table_lookup_many_as(t, tokens, n, NULL, ret, ret_bad_index);
}

/* 0, or why asker may not map a token of access a. A bound token goes to its one process
 * only, whatever the asker's uid or admin. */
static int access_check(const ShardAccess *a, const ShardAsker *asker) {
        if (!asker)
                return 0;
        if (a->bound && (asker->pid <= 0 || asker->pid != a->pid ||
                         asker->start_time != a->start_time))
                return SHARD_TABLE_OTHER_PROCESS;
        if (a->restricted && !asker->admin && asker->uid != a->owner_uid)
                return SHARD_TABLE_DENIED;
        return 0;
}

int shard_table_lookup_many_as(ShardTable *t, const char *const *tokens, size_t n,
                               const ShardAsker *asker, ShardSegment **ret,
                               size_t *ret_bad_index) {
        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < n; i++) {
                Entry **link = tokens[i] ? table_find_locked(t, tokens[i]) : NULL;
                int r = link ? access_check(&(*link)->access, asker) : SHARD_TABLE_NOT_FOUND;
                if (r != 0) {
                        (void) pthread_mutex_unlock(&t->lock);
                        *ret_bad_index = i;
                        return r;
                }
        }
        for (size_t i = 0; i < n; i++)
                ret[i] = shard_segment_ref((*table_find_locked(t, tokens[i]))->segment);
        (void) pthread_mutex_unlock(&t->lock);
        return 0;
}

void shard_table_set_access(ShardTable *t, const char *group, const ShardAccess *access) {
        (void) pthread_mutex_lock(&t->lock);
        for (size_t b = 0; b < t->n_buckets; b++)
                for (Entry *e = t->buckets[b]; e; e = e->next)
                        if (streq(e->group, group))
                                e->access = *access;
        (void) pthread_mutex_unlock(&t->lock);
}

int shard_table_remove(ShardTable *t, const char *token) {
        Entry *e = NULL;

        if (!token)
                return SHARD_TABLE_NOT_FOUND;

        (void) pthread_mutex_lock(&t->lock);
        Entry **link = table_find_locked(t, token);
        if (link) {
                e = *link;
                *link = e->next;
                t->n_entries--;
        }
        (void) pthread_mutex_unlock(&t->lock);

        if (!e)
                return SHARD_TABLE_NOT_FOUND;
        /* The last reference may munmap and close: outside the lock. */
        entry_free(e);
        return 0;
}

size_t shard_table_remove_group(ShardTable *t, const char *group) {
        Entry *removed = NULL;
        size_t n = 0;

        if (!group)
                return 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_buckets; i++)
                for (Entry **link = &t->buckets[i]; *link;) {
                        Entry *e = *link;
                        if (!streq(e->group, group)) {
                                link = &e->next;
                                continue;
                        }
                        *link = e->next;
                        e->next = removed;
                        removed = e;
                        n++;
                }
        t->n_entries -= n;
        (void) pthread_mutex_unlock(&t->lock);

        entry_list_free(removed);
        return n;
}

size_t shard_table_size(ShardTable *t) {
        (void) pthread_mutex_lock(&t->lock);
        size_t n = t->n_entries;
        (void) pthread_mutex_unlock(&t->lock);
        return n;
}

size_t shard_table_max(ShardTable *t) {
        return t->max_entries;
}
