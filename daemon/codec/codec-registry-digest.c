/* codec-registry-digest.c: the registry's canonical form (its families' messages) and SHA-256. */

/*
 * DESIGN: the canonical form is the Family message GetFamily answers, so a field added to it
 * later counts without a change here. What the loader keeps in file order but what no call
 * depends on is sorted: selectors and arguments (looked up by name), variants (by name), a
 * variant's requires and a rule's when (maps), a parameter's placements (nested in the mesh's
 * dimension order whatever their order); a negative shard dim is counted from the end, in a
 * placement's cases too. What
 * is an order stays one: the rules (the first match decides), the parameters (Build lays them
 * out and fills them in declared order), accepts and shapes (lists). `source` (a file name and
 * line) is cleared. The message cannot tell a variant whose `parameters: {}` replaces the
 * family's with none from one that declares none, so each family's bytes are followed by one
 * byte per variant saying which. Families are ordered by their bytes (baselines are unique,
 * so no two are equal) and each is framed by its length, so no two registries share a stream.
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "codec-registry-digest.h"
#include "codec.h"

#define DIGEST_STREAM_TAG "familyd registry digest 1"

typedef struct DigestItem {
        uint8_t *bytes;
        size_t size;
} DigestItem;

static int typed_field_cmp(const void *a, const void *b) {
        const Familyd__V1__TypedField *const *x = a, *const *y = b;
        return strcmp((*x)->name, (*y)->name);
}

static int variant_cmp(const void *a, const void *b) {
        const Familyd__V1__Variant *const *x = a, *const *y = b;
        return strcmp((*x)->name, (*y)->name);
}

static int requires_cmp(const void *a, const void *b) {
        const Familyd__V1__Variant__RequiresEntry *const *x = a, *const *y = b;
        return strcmp((*x)->key, (*y)->key);
}

static int when_cmp(const void *a, const void *b) {
        const Familyd__V1__Rule__WhenEntry *const *x = a, *const *y = b;
        return strcmp((*x)->key, (*y)->key);
}

static int placement_cmp(const void *a, const void *b) {
        const Familyd__V1__Placement *const *x = a, *const *y = b;
        return strcmp((*x)->axis, (*y)->axis);
}

#define SORT(array, n, cmp)                                          \
        do {                                                         \
                if ((n) > 1)                                         \
                        qsort((array), (n), sizeof *(array), (cmp)); \
        } while (0)

static void parameters_canonicalize(Familyd__V1__ParameterSpec **params, size_t n) {
        for (size_t i = 0; i < n; i++) {
                Familyd__V1__ParameterSpec *p = params[i];

                for (size_t j = 0; j < p->n_placements; j++) {
                        if (streq(p->placements[j]->kind, "shard") && p->placements[j]->dim < 0)
                                p->placements[j]->dim += (int64_t) p->n_shape;
                        /* a case list is an order (the first that holds decides) */
                        for (size_t k = 0; k < p->placements[j]->n_cases; k++) {
                                Familyd__V1__PlacementCase *c = p->placements[j]->cases[k];

                                if (streq(c->kind, "shard") && c->dim < 0)
                                        c->dim += (int64_t) p->n_shape;
                        }
                }
                SORT(p->placements, p->n_placements, placement_cmp);
        }
}

static void family_canonicalize(Familyd__V1__Family *pb) {
        pb->source = (char *) "";
        SORT(pb->selectors, pb->n_selectors, typed_field_cmp);
        SORT(pb->arguments, pb->n_arguments, typed_field_cmp);
        SORT(pb->variants, pb->n_variants, variant_cmp);
        for (size_t i = 0; i < pb->n_variants; i++) {
                SORT(pb->variants[i]->requires, pb->variants[i]->n_requires, requires_cmp);
                parameters_canonicalize(pb->variants[i]->parameters,
                                        pb->variants[i]->n_parameters);
        }
        for (size_t i = 0; i < pb->n_rules; i++)
                SORT(pb->rules[i]->when, pb->rules[i]->n_when, when_cmp);
        parameters_canonicalize(pb->parameters, pb->n_parameters);
}

static void put_u64(uint8_t *p, uint64_t v) {
        for (size_t i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

/* One family's bytes: the length of its message, the message, one byte per variant. */
static int family_item(const Family *f, DigestItem *ret) {
        _cleanup_(arena_done) Arena a;
        Familyd__V1__Family *pb;
        size_t packed;
        uint8_t *buf;
        int r;

        arena_init(&a);
        r = codec_family_encode(&a, f, &pb);
        if (r < 0)
                return r;
        family_canonicalize(pb);

        packed = familyd__v1__family__get_packed_size(pb);
        buf = malloc(8 + packed + pb->n_variants);
        if (!buf)
                return -ENOMEM;
        put_u64(buf, packed);
        (void) familyd__v1__family__pack(pb, buf + 8);
        for (size_t i = 0; i < pb->n_variants; i++) {
                const Variant *v = family_find_variant(f, pb->variants[i]->name);
                buf[8 + packed + i] = v && v->has_parameters;
        }
        *ret = (DigestItem) { .bytes = buf, .size = 8 + packed + pb->n_variants };
        return 0;
}

static int item_cmp(const void *a, const void *b) {
        const DigestItem *x = a, *y = b;
        int c = memcmp(x->bytes, y->bytes, MIN(x->size, y->size));

        if (c != 0)
                return c;
        return x->size < y->size ? -1 : x->size > y->size;
}

static void items_free(DigestItem *items, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(items[i].bytes);
        free(items);
}

static void digest_items(const DigestItem *items, size_t n, char *ret) {
        unsigned char hash[crypto_hash_sha256_BYTES];
        crypto_hash_sha256_state st;
        uint8_t len[8];

        (void) crypto_hash_sha256_init(&st);
        (void) crypto_hash_sha256_update(&st, (const uint8_t *) DIGEST_STREAM_TAG,
                                         sizeof DIGEST_STREAM_TAG);
        put_u64(len, n);
        (void) crypto_hash_sha256_update(&st, len, sizeof len);
        for (size_t i = 0; i < n; i++) {
                put_u64(len, items[i].size);
                (void) crypto_hash_sha256_update(&st, len, sizeof len);
                (void) crypto_hash_sha256_update(&st, items[i].bytes, items[i].size);
        }
        (void) crypto_hash_sha256_final(&st, hash);
        (void) sodium_bin2hex(ret, REGISTRY_DIGEST_LENGTH + 1, hash, sizeof hash);
}

int codec_registry_digest(const Registry *r, char *ret) {
        DigestItem *items;
        size_t n = 0;
        int k = 0;

        /* Idempotent and thread-safe; picks the SHA-256 implementation for this CPU. */
        if (sodium_init() < 0)
                return -ENOMEM;
        items = calloc(r->n_families ? r->n_families : 1, sizeof(DigestItem));
        if (!items)
                return -ENOMEM;
        for (; n < r->n_families; n++) {
                k = family_item(&r->families[n], &items[n]);
                if (k < 0)
                        break;
        }
        if (k >= 0) {
                SORT(items, n, item_cmp);
                digest_items(items, n, ret);
        }
        items_free(items, n);
        return k < 0 ? k : 0;
}
