/* member-records.c: member records shared between membership tables: one immutable copy of each distinct record, counted by reference. */

#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "member-records.h"

struct MemberRecords {
        MemberRecord **buckets;
        size_t n_buckets; /* a power of two */
        size_t n, bytes;
};

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                h = (h ^ ((const unsigned char *) p)[i]) * UINT64_C(1099511628211);
        return h;
}

static uint64_t hash_string(uint64_t h, const char *s) {
        return hash_bytes(h, strempty(s), strlen(strempty(s)) + 1);
}

/* Over everything a record holds. */
static uint64_t record_hash(const MemberInfo *info) {
        uint64_t h = membership_digest_member(strempty(info->name), info->boot_id);

        h = hash_string(h, info->address);
        h = hash_string(h, info->registry_digest);
        h = hash_bytes(h, &info->node_rank, sizeof info->node_rank);
        h = hash_bytes(h, &info->started_unix_ms, sizeof info->started_unix_ms);
        if (info->has_record_mac)
                h = hash_bytes(h, info->record_mac, sizeof info->record_mac);
        for (size_t i = 0; i < info->n_devices; i++) {
                const Device *d = &info->devices[i];
                h = hash_string(hash_string(h, d->kind), d->name);
                h = hash_string(hash_string(h, d->uuid), d->pci_bus_id);
                h = hash_bytes(h, &d->memory_bytes, sizeof d->memory_bytes);
        }
        return hash_bytes(h, &info->n_devices, sizeof info->n_devices);
}

static bool device_equal(const Device *a, const Device *b) {
        return a->local_index == b->local_index && a->memory_bytes == b->memory_bytes &&
               a->numa_node == b->numa_node && streq(strempty(a->kind), strempty(b->kind)) &&
               streq(strempty(a->name), strempty(b->name)) &&
               streq(strempty(a->uuid), strempty(b->uuid)) &&
               streq(strempty(a->pci_bus_id), strempty(b->pci_bus_id));
}

static bool record_equal(const MemberInfo *a, const MemberInfo *b) {
        if (a->boot_id != b->boot_id || a->node_rank != b->node_rank ||
            a->started_unix_ms != b->started_unix_ms || a->n_devices != b->n_devices ||
            a->has_record_mac != b->has_record_mac ||
            (a->has_record_mac && memcmp(a->record_mac, b->record_mac, sizeof a->record_mac)) ||
            !streq(strempty(a->name), strempty(b->name)) ||
            !streq(strempty(a->address), strempty(b->address)) ||
            !streq(a->registry_digest, b->registry_digest))
                return false;
        for (size_t i = 0; i < a->n_devices; i++)
                if (!device_equal(&a->devices[i], &b->devices[i]))
                        return false;
        return true;
}

static size_t record_bytes(const MemberInfo *info) {
        size_t n = sizeof(MemberRecord) + strlen(info->name) + strlen(info->address) + 2 +
                   info->n_devices * sizeof(Device);

        for (size_t i = 0; i < info->n_devices; i++) {
                const Device *d = &info->devices[i];
                n += strlen(strempty(d->kind)) + strlen(strempty(d->name)) +
                     strlen(strempty(d->uuid)) + strlen(strempty(d->pci_bus_id)) + 4;
        }
        return n;
}

int member_records_new(MemberRecords **ret) {
        MemberRecords *r = calloc(1, sizeof(MemberRecords));

        if (!r)
                return -ENOMEM;
        r->n_buckets = 1024;
        r->buckets = calloc(r->n_buckets, sizeof(MemberRecord *));
        if (!r->buckets) {
                free(r);
                return -ENOMEM;
        }
        *ret = r;
        return 0;
}

static void record_free(MemberRecord *rec) {
        member_info_done(&rec->info);
        free(rec);
}

MemberRecords *member_records_free(MemberRecords *r) {
        if (!r)
                return NULL;
        for (size_t b = 0; b < r->n_buckets; b++)
                while (r->buckets[b]) {
                        MemberRecord *e = r->buckets[b];
                        r->buckets[b] = e->next;
                        record_free(e);
                }
        free(r->buckets);
        return mfree(r);
}

size_t member_records_count(const MemberRecords *r) {
        return r->n;
}

size_t member_records_bytes(const MemberRecords *r) {
        return r->bytes + r->n_buckets * sizeof(MemberRecord *);
}

/* Twice the buckets once there are more records than buckets (a failure keeps the old). */
static void records_grow(MemberRecords *r) {
        size_t n = r->n_buckets * 2;
        MemberRecord **grown;

        if (r->n <= r->n_buckets || !(grown = calloc(n, sizeof(MemberRecord *))))
                return;
        for (size_t b = 0; b < r->n_buckets; b++)
                while (r->buckets[b]) {
                        MemberRecord *e = r->buckets[b];
                        r->buckets[b] = e->next;
                        e->next = grown[e->hash & (n - 1)];
                        grown[e->hash & (n - 1)] = e;
                }
        free(r->buckets);
        r->buckets = grown;
        r->n_buckets = n;
}

int member_records_take(MemberRecords *r, const MemberInfo *info, MemberRecord **ret) {
        uint64_t h = r ? record_hash(info) : 0;
        MemberRecord *e;
        int k;

        if (r)
                for (e = r->buckets[h & (r->n_buckets - 1)]; e; e = e->next)
                        if (e->hash == h && record_equal(&e->info, info)) {
                                e->n_ref++;
                                *ret = e;
                                return 0;
                        }
        e = calloc(1, sizeof(MemberRecord));
        if (!e)
                return -ENOMEM;
        k = member_info_copy(info, &e->info);
        if (k < 0) {
                free(e);
                return k;
        }
        e->info.partial = false;
        e->hash = h;
        e->start_digest = membership_digest_member(e->info.name, e->info.boot_id);
        e->n_ref = 1;
        e->owner = r;
        if (r) {
                e->bytes = record_bytes(&e->info);
                e->next = r->buckets[h & (r->n_buckets - 1)];
                r->buckets[h & (r->n_buckets - 1)] = e;
                r->n++;
                r->bytes += e->bytes;
                records_grow(r);
        }
        *ret = e;
        return 0;
}

void member_records_release(MemberRecord *rec) {
        MemberRecords *r = rec->owner;

        if (--rec->n_ref > 0)
                return;
        if (r) {
                for (MemberRecord **p = &r->buckets[rec->hash & (r->n_buckets - 1)]; *p;
                     p = &(*p)->next)
                        if (*p == rec) {
                                *p = rec->next;
                                break;
                        }
                r->n--;
                r->bytes -= rec->bytes;
        }
        record_free(rec);
}
