/* codec-holders-record.c: what holds a build (references, pin, key), as a record of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec-holders-record.h"
#include "common/crc32c.h"
#include "common/macro.h"

#define MAGIC "FDHL"
#define HEADER_SIZE 32u
#define HOLDER_SIZE 32u
#define FLAG_PINNED 1u
#define FLAG_PRIVATE 2u
#define FLAG_OWNED 4u       /* the owner's u32 uid follows the holders */
#define FLAG_SHARE_GROUP 8u /* BuildRequest.share "group" */
#define FLAG_BOUND 16u      /* a training handout: its process's 16 bytes follow the owner */
#define FLAG_PINNERS 32u   /* u32 n, then n u32 uids that pinned it, follow the binding */
#define BOUND_SIZE 16u
#define FLAGS_KNOWN \
        (FLAG_PINNED | FLAG_PRIVATE | FLAG_OWNED | FLAG_SHARE_GROUP | FLAG_BOUND | FLAG_PINNERS)

static void put_u32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
        for (unsigned i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
        uint32_t v = 0;
        for (unsigned i = 0; i < 4; i++)
                v |= (uint32_t) p[i] << (8 * i);
        return v;
}

static uint64_t get_u64(const uint8_t *p) {
        uint64_t v = 0;
        for (unsigned i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

int codec_holders_record_encode(const HoldersRecord *h, uint8_t **ret, size_t *ret_size) {
        if (h->key_size > HOLDERS_RECORD_MAX_KEY_BYTES || h->n_holders > BUILD_TABLE_MAX_HOLDERS ||
            h->n_pinners > BUILD_TABLE_MAX_PINNERS)
                return -E2BIG;
        size_t size = HEADER_SIZE + h->key_size + HOLDER_SIZE * h->n_holders +
                      (h->has_owner ? 4 : 0) + (h->binding.bound ? BOUND_SIZE : 0) +
                      (h->n_pinners > 0 ? 4 + 4 * h->n_pinners : 0) + 4;
        uint8_t *out = calloc(1, size), *p;
        if (!out)
                return -ENOMEM;

        memcpy(out, MAGIC, 4);
        put_u32(out + 4, HOLDERS_RECORD_VERSION);
        put_u32(out + 8, (h->pinned ? FLAG_PINNED : 0) | (h->private_build ? FLAG_PRIVATE : 0) |
                                 (h->has_owner ? FLAG_OWNED : 0) |
                                 (h->share_group ? FLAG_SHARE_GROUP : 0) |
                                 (h->binding.bound ? FLAG_BOUND : 0) |
                                 (h->n_pinners > 0 ? FLAG_PINNERS : 0));
        put_u32(out + 12, (uint32_t) h->n_holders);
        put_u64(out + 16, (uint64_t) h->created_ms);
        put_u64(out + 24, h->key_size);
        if (h->key_size > 0)
                memcpy(out + HEADER_SIZE, h->key, h->key_size);
        p = out + HEADER_SIZE + h->key_size;
        for (size_t i = 0; i < h->n_holders; i++, p += HOLDER_SIZE) {
                const BuildHolder *x = &h->holders[i];
                put_u32(p, (uint32_t) x->pid);
                put_u32(p + 4, x->uid);
                put_u64(p + 8, x->start_time);
                put_u64(p + 16, (uint64_t) x->since_ms);
                put_u32(p + 24, x->count);
        }
        if (h->has_owner) {
                put_u32(p, h->owner_uid);
                p += 4;
        }
        if (h->binding.bound) {
                put_u32(p, (uint32_t) h->binding.pid);
                put_u64(p + 8, h->binding.start_time);
                p += BOUND_SIZE;
        }
        if (h->n_pinners > 0) {
                put_u32(p, (uint32_t) h->n_pinners);
                p += 4;
                for (size_t i = 0; i < h->n_pinners; i++, p += 4)
                        put_u32(p, h->pinners[i]);
        }
        put_u32(p, crc32c(0, out, size - 4));
        *ret = out;
        *ret_size = size;
        return 0;
}

static int bad(char *why, size_t why_size, const char *text) {
        (void) snprintf(why, why_size, "%s", text);
        return -EBADMSG;
}

/* The header's claims checked against the size; then each holder. */
static int check(const uint8_t *data, size_t size, char *why, size_t why_size) {
        if (size < HEADER_SIZE + 4 || memcmp(data, MAGIC, 4) != 0)
                return bad(why, why_size, "not a holders record");
        if (get_u32(data + size - 4) != crc32c(0, data, size - 4))
                return bad(why, why_size, "its checksum does not match (damaged)");
        if (get_u32(data + 4) != HOLDERS_RECORD_VERSION)
                return bad(why, why_size, "written in another version");
        if (get_u32(data + 8) & ~FLAGS_KNOWN)
                return bad(why, why_size, "unknown flags");

        uint64_t n = get_u32(data + 12), key_size = get_u64(data + 24);
        uint64_t owner = get_u32(data + 8) & FLAG_OWNED ? 4 : 0;
        uint64_t bound = get_u32(data + 8) & FLAG_BOUND ? BOUND_SIZE : 0;
        uint64_t fixed = HEADER_SIZE + key_size + HOLDER_SIZE * n + owner + bound + 4, pinners = 0;
        if (n > BUILD_TABLE_MAX_HOLDERS || key_size > HOLDERS_RECORD_MAX_KEY_BYTES ||
            size < fixed)
                return bad(why, why_size, "its sizes do not add up");
        if (get_u32(data + 8) & FLAG_PINNERS) {
                uint64_t n_pinners = size >= fixed + 4 ? get_u32(data + fixed - 4) : 0;
                if (n_pinners == 0 || n_pinners > BUILD_TABLE_MAX_PINNERS)
                        return bad(why, why_size, "its pinners do not add up");
                pinners = 4 + 4 * n_pinners;
        }
        if (size != fixed + pinners)
                return bad(why, why_size, "its sizes do not add up");
        if (bound) {
                const uint8_t *b = data + fixed - 4 - BOUND_SIZE;
                if ((int32_t) get_u32(b) <= 0 || get_u32(b + 4) != 0)
                        return bad(why, why_size, "a bound build without its process");
        }

        const uint8_t *p = data + HEADER_SIZE + key_size;
        for (uint64_t i = 0; i < n; i++, p += HOLDER_SIZE)
                if ((int32_t) get_u32(p) <= 0 || get_u32(p + 24) == 0 || get_u32(p + 28) != 0)
                        return bad(why, why_size, "a holder without a pid or a count");
        return 0;
}

int codec_holders_record_decode(const uint8_t *data, size_t size, HoldersRecord *ret, char *why,
                                size_t why_size) {
        HoldersRecord h = {};
        int r;

        r = check(data, size, why, why_size);
        if (r < 0)
                return r;
        uint32_t flags = get_u32(data + 8);
        h.pinned = flags & FLAG_PINNED;
        h.private_build = flags & FLAG_PRIVATE;
        h.has_owner = flags & FLAG_OWNED;
        h.share_group = flags & FLAG_SHARE_GROUP;
        h.n_holders = get_u32(data + 12);
        h.created_ms = (int64_t) get_u64(data + 16);
        h.key_size = get_u64(data + 24);
        if (h.key_size > 0) {
                h.key = malloc(h.key_size);
                if (!h.key)
                        return -ENOMEM;
                memcpy(h.key, data + HEADER_SIZE, h.key_size);
        }
        if (h.n_holders > 0) {
                h.holders = calloc(h.n_holders, sizeof *h.holders);
                if (!h.holders) {
                        codec_holders_record_done(&h);
                        return -ENOMEM;
                }
        }
        const uint8_t *p = data + HEADER_SIZE + h.key_size;
        for (size_t i = 0; i < h.n_holders; i++, p += HOLDER_SIZE)
                h.holders[i] = (BuildHolder) {
                        .pid = (int32_t) get_u32(p),
                        .uid = get_u32(p + 4),
                        .start_time = get_u64(p + 8),
                        .since_ms = (int64_t) get_u64(p + 16),
                        .count = get_u32(p + 24),
                };
        if (h.has_owner) {
                h.owner_uid = get_u32(p);
                p += 4;
        }
        if (flags & FLAG_BOUND) {
                h.binding = (BuildBinding) { .bound = true,
                                             .pid = (int32_t) get_u32(p),
                                             .start_time = get_u64(p + 8) };
                p += BOUND_SIZE;
        }
        if (flags & FLAG_PINNERS) {
                h.n_pinners = get_u32(p);
                p += 4;
                h.pinners = calloc(h.n_pinners, sizeof *h.pinners);
                if (!h.pinners) {
                        codec_holders_record_done(&h);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < h.n_pinners; i++, p += 4)
                        h.pinners[i] = get_u32(p);
        }
        *ret = h;
        return 0;
}

void codec_holders_record_done(HoldersRecord *h) {
        if (!h)
                return;
        h->key = mfree(h->key);
        h->holders = mfree(h->holders);
        h->pinners = mfree(h->pinners);
        h->key_size = h->n_holders = h->n_pinners = 0;
}
