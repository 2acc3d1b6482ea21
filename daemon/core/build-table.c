/* build-table.c: reservations, records and their lookup under one mutex. */
#include <inttypes.h>
#include <stdio.h>
#include <sys/types.h>

#include "build-table.h"
#include "repr.h"

struct BuildTable {
        pthread_mutex_t lock;
        BuildRecord **records; /* creation order */
        size_t n_records;
        size_t allocated;
        unsigned reserved;      /* slots reserved and not yet committed */
        unsigned max_builds;
        uint64_t bytes_in_use;  /* committed and reserved */
        uint64_t budget;
        uint32_t boot_tag;
        uint64_t next_serial;
        BuildUidLimits uid_limits;
        /* Reservations not yet committed, by uid (records count by their charged_uid). */
        BuildUidUse *uid_reserved;
        size_t n_uid_reserved;
};

BuildRecord *build_record_ref(BuildRecord *r) {
        if (r)
                atomic_fetch_add(&r->n_ref, 1);
        return r;
}

BuildRecord *build_record_unref(BuildRecord *r) {
        if (r && atomic_fetch_sub(&r->n_ref, 1) == 1) {
                free(r->holding.holders);
                free(r->holding.key);
                free(r->holding.pinners);
                if (r->payload_free)
                        r->payload_free(r->payload);
                free(r);
        }
        return NULL;
}

int build_table_new(unsigned max_builds, uint64_t budget_bytes, uint32_t boot_tag,
                    BuildTable **ret) {
        BuildTable *t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        (void) pthread_mutex_init(&t->lock, NULL);
        t->max_builds = max_builds;
        t->budget = budget_bytes;
        t->boot_tag = boot_tag;
        t->next_serial = 1;
        *ret = t;
        return 0;
}

BuildTable *build_table_free(BuildTable *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_records; i++)
                build_record_unref(t->records[i]);
        free(t->records);
        free(t->uid_reserved);
        (void) pthread_mutex_destroy(&t->lock);
        return mfree(t);
}

void build_table_set_uid_limits(BuildTable *t, const BuildUidLimits *limits) {
        (void) pthread_mutex_lock(&t->lock);
        t->uid_limits = *limits;
        (void) pthread_mutex_unlock(&t->lock);
}

void build_table_uid_limits(BuildTable *t, BuildUidLimits *ret) {
        (void) pthread_mutex_lock(&t->lock);
        *ret = t->uid_limits;
        (void) pthread_mutex_unlock(&t->lock);
}

static bool has_pinner(const BuildHolding *h, uint32_t uid) {
        for (size_t i = 0; i < h->n_pinners; i++)
                if (h->pinners[i] == uid)
                        return true;
        return false;
}

/* Under the lock: what uid holds (its records, its reservations in flight, its pins). */
static BuildUidUse uid_use_locked(const BuildTable *t, uint32_t uid) {
        BuildUidUse u = { .uid = uid };

        for (size_t i = 0; i < t->n_records; i++) {
                const BuildRecord *rec = t->records[i];
                if (rec->charged && rec->charged_uid == uid) {
                        u.builds++;
                        u.bytes += rec->bytes;
                }
                u.pins += has_pinner(&rec->holding, uid);
        }
        for (size_t i = 0; i < t->n_uid_reserved; i++)
                if (t->uid_reserved[i].uid == uid) {
                        u.builds += t->uid_reserved[i].builds;
                        u.bytes += t->uid_reserved[i].bytes;
                }
        return u;
}

static BuildUidUse *uid_entry(BuildUidUse **list, size_t *n, uint32_t uid) {
        for (size_t i = 0; i < *n; i++)
                if ((*list)[i].uid == uid)
                        return &(*list)[i];
        BuildUidUse *grown = reallocarray(*list, *n + 1, sizeof **list);
        if (!grown)
                return NULL;
        *list = grown;
        grown[*n] = (BuildUidUse) { .uid = uid };
        return &grown[(*n)++];
}

static int uid_compare(const void *a, const void *b) {
        uint32_t x = ((const BuildUidUse *) a)->uid, y = ((const BuildUidUse *) b)->uid;
        return x < y ? -1 : x > y;
}

int build_table_uid_use(BuildTable *t, BuildUidUse **ret, size_t *ret_n) {
        _cleanup_free_ BuildUidUse *list = NULL;
        size_t n = 0;
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records && r >= 0; i++) {
                const BuildRecord *rec = t->records[i];
                BuildUidUse *u;
                if (rec->charged) {
                        if (!(u = uid_entry(&list, &n, rec->charged_uid))) {
                                r = -ENOMEM;
                                break;
                        }
                        u->builds++;
                        u->bytes += rec->bytes;
                }
                for (size_t j = 0; j < rec->holding.n_pinners && r >= 0; j++) {
                        if (!(u = uid_entry(&list, &n, rec->holding.pinners[j])))
                                r = -ENOMEM;
                        else
                                u->pins++;
                }
        }
        for (size_t i = 0; i < t->n_uid_reserved && r >= 0; i++) {
                BuildUidUse *u = uid_entry(&list, &n, t->uid_reserved[i].uid);
                if (!u)
                        r = -ENOMEM;
                else {
                        u->builds += t->uid_reserved[i].builds;
                        u->bytes += t->uid_reserved[i].bytes;
                }
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0)
                return r;
        if (n > 1)
                qsort(list, n, sizeof *list, uid_compare);
        *ret = TAKE_PTR(list);
        *ret_n = n;
        return 0;
}

/* Under the lock: charge's refusal for its uid's limits, or 0. */
static int check_uid_locked(const BuildTable *t, const BuildCharge *charge, uint64_t bytes,
                            FamilyError *ret_error) {
        const BuildUidLimits *l = &t->uid_limits;
        BuildUidUse u;

        if (!charge || !charge->charged || charge->exempt || (l->builds == 0 && l->bytes == 0))
                return 0;
        u = uid_use_locked(t, charge->uid);
        if (l->builds > 0 && u.builds >= l->builds)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "UID_BUILD_LIMIT", NULL,
                                        "uid %" PRIu32 " holds %u of its %u builds "
                                        "(--max-builds-per-uid); release one of them first",
                                        charge->uid, u.builds, l->builds);
        if (l->bytes > 0 && (bytes > l->bytes || u.bytes > l->bytes - bytes))
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "UID_SHM_BUDGET", NULL,
                                        "uid %" PRIu32 " holds %" PRIu64 " of its %" PRIu64
                                        " bytes of shards (--shm-budget-per-uid); the build "
                                        "needs %" PRIu64 " more",
                                        charge->uid, u.bytes, l->bytes, bytes);
        return 0;
}

/* Under the lock: counts (sign 1) or gives back (-1) a reservation of charge's uid. */
static int uid_reserved_add_locked(BuildTable *t, const BuildCharge *charge, uint64_t bytes,
                                   int sign) {
        BuildUidUse *u;

        if (!charge || !charge->charged)
                return 0;
        if (sign < 0) {
                u = NULL;
                for (size_t i = 0; i < t->n_uid_reserved && !u; i++)
                        if (t->uid_reserved[i].uid == charge->uid)
                                u = &t->uid_reserved[i];
                if (!u || u->builds == 0)
                        return 0; /* nothing was counted (never for a matched reserve) */
                u->builds--;
                u->bytes -= MIN(bytes, u->bytes);
        } else {
                u = uid_entry(&t->uid_reserved, &t->n_uid_reserved, charge->uid);
                if (!u)
                        return -ENOMEM;
                u->builds++;
                u->bytes += bytes;
        }
        if (u->builds == 0) {
                size_t i = (size_t) (u - t->uid_reserved);
                memmove(u, u + 1, (t->n_uid_reserved - i - 1) * sizeof *u);
                t->n_uid_reserved--;
        }
        return 0;
}

/* Under the lock: the node's refusal (its slots, its budget), or 0. */
static int check_node_locked(const BuildTable *t, uint64_t bytes, FamilyError *ret_error) {
        if (t->n_records + t->reserved >= t->max_builds)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "BUILD_LIMIT", NULL, "build limit reached: %u builds",
                                        t->max_builds);
        if (bytes > t->budget || t->bytes_in_use > t->budget - bytes)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "SHM_BUDGET", NULL,
                                        "shm budget exceeded: build needs %" PRIu64
                                        " bytes, %" PRIu64 " of %" PRIu64 " in use",
                                        bytes, t->bytes_in_use, t->budget);
        return 0;
}

int build_table_reserve_for(BuildTable *t, const BuildCharge *charge, uint64_t bytes,
                            FamilyError *ret_error) {
        int r;

        (void) pthread_mutex_lock(&t->lock);
        /* The uid's own limits first: they name what the caller can do about it. */
        r = check_uid_locked(t, charge, bytes, ret_error);
        if (r >= 0)
                r = check_node_locked(t, bytes, ret_error);
        if (r >= 0)
                r = uid_reserved_add_locked(t, charge, bytes, 1);
        if (r >= 0) {
                t->reserved++;
                t->bytes_in_use += bytes;
        }
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

int build_table_reserve(BuildTable *t, uint64_t bytes, FamilyError *ret_error) {
        return build_table_reserve_for(t, NULL, bytes, ret_error);
}

void build_table_cancel_for(BuildTable *t, const BuildCharge *charge, uint64_t bytes) {
        (void) pthread_mutex_lock(&t->lock);
        t->reserved--;
        t->bytes_in_use -= bytes;
        (void) uid_reserved_add_locked(t, charge, bytes, -1); /* an entry exists: no -ENOMEM */
        (void) pthread_mutex_unlock(&t->lock);
}

void build_table_cancel(BuildTable *t, uint64_t bytes) {
        build_table_cancel_for(t, NULL, bytes);
}

static bool id_in_use_locked(const BuildTable *t, const char *id) {
        for (size_t i = 0; i < t->n_records; i++)
                if (streq(t->records[i]->id, id))
                        return true;
        return false;
}

static void next_id_locked(BuildTable *t, char ret_id[static BUILD_TABLE_ID_MAX]) {
        (void) snprintf(ret_id, BUILD_TABLE_ID_MAX, "bld-%08" PRIx32 "-%" PRIu64, t->boot_tag,
                        t->next_serial++);
}

void build_table_next_id(BuildTable *t, char ret_id[static BUILD_TABLE_ID_MAX]) {
        (void) pthread_mutex_lock(&t->lock);
        next_id_locked(t, ret_id);
        (void) pthread_mutex_unlock(&t->lock);
}

/* Appends rec under the lock; id NULL: the next one. -EEXIST, -ENOMEM. */
static int insert_locked(BuildTable *t, BuildRecord *rec, const char *id) {
        if (id && id_in_use_locked(t, id))
                return -EEXIST;
        if (!GREEDY_REALLOC(t->records, t->allocated, t->n_records + 1))
                return -ENOMEM;
        if (id)
                (void) snprintf(rec->id, sizeof rec->id, "%s", id);
        else
                next_id_locked(t, rec->id);
        t->records[t->n_records++] = rec;
        return 0;
}

static BuildRecord *record_new(uint64_t bytes, void *payload, void (*payload_free)(void *)) {
        BuildRecord *rec = calloc(1, sizeof *rec);
        if (!rec)
                return NULL;
        rec->n_ref = 2; /* the table's and the caller's */
        rec->bytes = bytes;
        rec->payload = payload;
        rec->payload_free = payload_free;
        return rec;
}

static int commit(BuildTable *t, const BuildCharge *charge, const char *id, uint64_t bytes,
                  void *payload, void (*payload_free)(void *payload), BuildRecord **ret) {
        int r;

        if (id && strlen(id) >= BUILD_TABLE_ID_MAX)
                return -EINVAL;
        BuildRecord *rec = record_new(bytes, payload, payload_free);
        if (!rec)
                return -ENOMEM;

        (void) pthread_mutex_lock(&t->lock);
        r = insert_locked(t, rec, id);
        if (r >= 0) {
                t->reserved--;
                /* The reservation's charge moves to the record in the same step. */
                (void) uid_reserved_add_locked(t, charge, bytes, -1);
                rec->charged = charge && charge->charged;
                rec->charged_uid = rec->charged ? charge->uid : 0;
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0) {
                free(rec);
                return r;
        }

        *ret = rec;
        return 0;
}

int build_table_commit(BuildTable *t, uint64_t bytes, void *payload,
                       void (*payload_free)(void *payload), BuildRecord **ret) {
        return commit(t, NULL, NULL, bytes, payload, payload_free, ret);
}

int build_table_commit_id(BuildTable *t, const char *id, uint64_t bytes, void *payload,
                          void (*payload_free)(void *payload), BuildRecord **ret) {
        return build_table_commit_id_for(t, NULL, id, bytes, payload, payload_free, ret);
}

int build_table_commit_id_for(BuildTable *t, const BuildCharge *charge, const char *id,
                              uint64_t bytes, void *payload, void (*payload_free)(void *payload),
                              BuildRecord **ret) {
        if (!id)
                return -EINVAL;
        return commit(t, charge, id, bytes, payload, payload_free, ret);
}

int build_table_restore(BuildTable *t, const char *id, uint64_t bytes, void *payload,
                        void (*payload_free)(void *payload), BuildRecord **ret) {
        uint32_t tag;
        uint64_t serial;
        int n = 0, r;

        /* Only ids this table could have drawn: "bld-", 8 hex digits, "-", a serial. */
        if (!id || strlen(id) >= BUILD_TABLE_ID_MAX ||
            sscanf(id, "bld-%8" SCNx32 "-%" SCNu64 "%n", &tag, &serial, &n) != 2 ||
            (size_t) n != strlen(id) || strlen(id) < 14 || id[12] != '-')
                return -EINVAL;

        BuildRecord *rec = record_new(bytes, payload, payload_free);
        if (!rec)
                return -ENOMEM;

        (void) pthread_mutex_lock(&t->lock);
        r = insert_locked(t, rec, id);
        if (r >= 0) {
                t->bytes_in_use += bytes;
                /* Same boot tag (2^-32 per earlier run): later serials must not repeat it. */
                if (tag == t->boot_tag && serial >= t->next_serial)
                        t->next_serial = serial + 1;
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0) {
                free(rec);
                return r;
        }

        if (ret)
                *ret = rec;
        else
                build_record_unref(rec);
        return 0;
}

static int not_found(const char *id, FamilyError *e) {
        _cleanup_free_ char *q = repr_string(id);
        if (!q)
                return -ENOMEM;
        return family_error_set(e, FAMILY_STATUS_NOT_FOUND, "BUILD_NOT_FOUND", "build_id",
                                "build %s not found", q);
}

int build_table_get(BuildTable *t, const char *id, BuildRecord **ret, FamilyError *ret_error) {
        BuildRecord *found = NULL;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++)
                if (streq(t->records[i]->id, id)) {
                        found = build_record_ref(t->records[i]);
                        break;
                }
        (void) pthread_mutex_unlock(&t->lock);

        if (!found)
                return not_found(id, ret_error);
        *ret = found;
        return 0;
}

int build_table_remove(BuildTable *t, const char *id, FamilyError *ret_error) {
        BuildRecord *found = NULL;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++)
                if (streq(t->records[i]->id, id)) {
                        found = t->records[i];
                        memmove(t->records + i, t->records + i + 1,
                                (t->n_records - i - 1) * sizeof(BuildRecord *));
                        t->n_records--;
                        t->bytes_in_use -= found->bytes;
                        found->removed = true;
                        break;
                }
        (void) pthread_mutex_unlock(&t->lock);

        if (!found)
                return not_found(id, ret_error);
        /* Outside the lock: the payload's destructor may close many descriptors. */
        build_record_unref(found);
        return 0;
}

int build_table_list(BuildTable *t, BuildRecord ***ret, size_t *ret_n) {
        BuildRecord **list = NULL;
        size_t n;

        (void) pthread_mutex_lock(&t->lock);
        n = t->n_records;
        if (n > 0) {
                list = calloc(n, sizeof(BuildRecord *));
                if (!list) {
                        (void) pthread_mutex_unlock(&t->lock);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < n; i++)
                        list[i] = build_record_ref(t->records[i]);
        }
        (void) pthread_mutex_unlock(&t->lock);

        *ret = list;
        *ret_n = n;
        return 0;
}

void build_list_free(BuildRecord **list, size_t n) {
        for (size_t i = 0; i < n; i++)
                build_record_unref(list[i]);
        free(list);
}

unsigned build_table_count(BuildTable *t) {
        (void) pthread_mutex_lock(&t->lock);
        unsigned n = (unsigned) t->n_records;
        (void) pthread_mutex_unlock(&t->lock);
        return n;
}

uint64_t build_table_bytes_in_use(BuildTable *t) {
        (void) pthread_mutex_lock(&t->lock);
        uint64_t b = t->bytes_in_use;
        (void) pthread_mutex_unlock(&t->lock);
        return b;
}

uint64_t build_table_budget(BuildTable *t) {
        return t->budget;
}

/* ---- references, pins and grace -------------------------------------------------------- */

static bool holding_idle(const BuildHolding *h) {
        return h->referenced && h->n_holders == 0 && !h->pinned;
}

static void holding_maybe_grace(BuildHolding *h, int64_t now_ms, uint64_t grace_ms) {
        if (holding_idle(h) && h->grace_deadline_ms == 0) {
                int64_t d = now_ms + (int64_t) MIN(grace_ms, (uint64_t) INT32_MAX * 1000);
                h->grace_deadline_ms = d > 0 ? d : 1;
        }
}

static uint64_t key_hash(const uint8_t *key, size_t size) {
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a: a filter before the full comparison */
        for (size_t i = 0; i < size; i++)
                h = (h ^ key[i]) * 0x100000001b3ull;
        return h;
}

void build_table_init_holding(BuildTable *t, BuildRecord *rec, BuildRecordInit *init) {
        (void) pthread_mutex_lock(&t->lock);
        rec->holding.referenced = init->referenced;
        rec->holding.writable = init->writable;
        rec->holding.private_build = init->private_build;
        rec->holding.has_owner = init->has_owner;
        rec->holding.owner_uid = init->owner_uid;
        rec->holding.share_group = init->share_group;
        rec->holding.binding = init->binding;
        rec->holding.created_ms = init->created_ms;
        free(rec->holding.key);
        rec->holding.key = TAKE_PTR(init->key);
        rec->holding.key_size = init->key_size;
        rec->holding.key_hash = rec->holding.key ? key_hash(rec->holding.key, init->key_size) : 0;
        (void) pthread_mutex_unlock(&t->lock);
}

void build_table_set_published(BuildTable *t, BuildRecord *rec, uint8_t *key, size_t key_size) {
        (void) pthread_mutex_lock(&t->lock);
        rec->holding.writable = false;
        free(rec->holding.key);
        rec->holding.key = key;
        rec->holding.key_size = key ? key_size : 0;
        rec->holding.key_hash = key ? key_hash(key, key_size) : 0;
        (void) pthread_mutex_unlock(&t->lock);
}

void build_table_set_referenced(BuildTable *t, BuildRecord *rec) {
        (void) pthread_mutex_lock(&t->lock);
        rec->holding.referenced = true;
        (void) pthread_mutex_unlock(&t->lock);
}

int build_table_find_key(BuildTable *t, const uint8_t *key, size_t key_size, BuildRecord **ret) {
        uint64_t h = key_hash(key, key_size);
        BuildRecord *found = NULL;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records && !found; i++) {
                const BuildHolding *x = &t->records[i]->holding;
                if (x->key && x->key_hash == h && x->key_size == key_size &&
                    memcmp(x->key, key, key_size) == 0)
                        found = build_record_ref(t->records[i]);
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (!found)
                return -ENOENT;
        *ret = found;
        return 0;
}

static ssize_t holder_index(const BuildHolding *h, int32_t pid, uint64_t start_time) {
        for (size_t i = 0; i < h->n_holders; i++)
                if (h->holders[i].pid == pid && h->holders[i].start_time == start_time)
                        return (ssize_t) i;
        return -1;
}

int build_table_hold(BuildTable *t, BuildRecord *rec, const BuildHolder *holder) {
        BuildHolding *h = &rec->holding;
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        ssize_t i = holder_index(h, holder->pid, holder->start_time);
        if (rec->removed)
                r = -ESTALE;
        else if (i >= 0)
                h->holders[i].count++;
        else {
                BuildHolder *n;
                if (h->n_holders >= BUILD_TABLE_MAX_HOLDERS)
                        r = -E2BIG;
                else if (!(n = reallocarray(h->holders, h->n_holders + 1, sizeof *n)))
                        r = -ENOMEM;
                else {
                        h->holders = n;
                        h->holders[h->n_holders] = *holder;
                        h->holders[h->n_holders++].count = 1;
                }
        }
        if (r >= 0)
                h->grace_deadline_ms = 0;
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

/* Under the lock: drops holder i (all its references); 1 when that left the build idle (grace
 * started). */
static int holder_remove_locked(BuildHolding *h, size_t i, int64_t now_ms, uint64_t grace_ms) {
        memmove(h->holders + i, h->holders + i + 1, (h->n_holders - i - 1) * sizeof *h->holders);
        h->n_holders--;
        holding_maybe_grace(h, now_ms, grace_ms);
        return holding_idle(h);
}

int build_table_unhold(BuildTable *t, BuildRecord *rec, int32_t pid, uint64_t start_time,
                       int64_t now_ms, uint64_t grace_ms, FamilyError *ret_error) {
        ssize_t i;
        int r;

        (void) pthread_mutex_lock(&t->lock);
        i = rec->removed ? -1 : holder_index(&rec->holding, pid, start_time);
        if (i >= 0 && rec->holding.holders[i].count > 1) {
                rec->holding.holders[i].count--;
                r = 0;
        } else
                r = i < 0 ? -ENOENT
                          : holder_remove_locked(&rec->holding, (size_t) i, now_ms, grace_ms);
        (void) pthread_mutex_unlock(&t->lock);
        if (r != -ENOENT)
                return r;
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "NOT_HELD",
                                "build_id",
                                "build '%s' is not held by the calling process (pid %" PRId32
                                "); to free it whatever holds it, release it with force "
                                "(familyctl release %s --force)",
                                rec->id, pid, rec->id);
}

size_t build_table_drop_process_list(BuildTable *t, int32_t pid, uint64_t start_time,
                                     int64_t now_ms, uint64_t grace_ms, BuildRecord ***ret,
                                     size_t *ret_n) {
        BuildRecord **list = NULL;
        size_t n = 0, n_list = 0;

        (void) pthread_mutex_lock(&t->lock);
        if (ret && t->n_records > 0)
                list = calloc(t->n_records, sizeof(BuildRecord *));
        for (size_t i = 0; i < t->n_records; i++) {
                ssize_t j = holder_index(&t->records[i]->holding, pid, start_time);
                if (j < 0)
                        continue;
                n += holder_remove_locked(&t->records[i]->holding, (size_t) j, now_ms, grace_ms);
                if (list)
                        list[n_list++] = build_record_ref(t->records[i]);
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (ret) {
                *ret = list;
                *ret_n = n_list;
        }
        return n;
}

size_t build_table_drop_process(BuildTable *t, int32_t pid, uint64_t start_time, int64_t now_ms,
                                uint64_t grace_ms) {
        return build_table_drop_process_list(t, pid, start_time, now_ms, grace_ms, NULL, NULL);
}

bool build_table_process_holds(BuildTable *t, int32_t pid, uint64_t start_time) {
        bool found = false;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records && !found; i++)
                found = holder_index(&t->records[i]->holding, pid, start_time) >= 0;
        (void) pthread_mutex_unlock(&t->lock);
        return found;
}

/* Under the lock: whether a process of uid holds h. */
static bool uid_holds(const BuildHolding *h, uint32_t uid) {
        for (size_t i = 0; i < h->n_holders; i++)
                if (h->holders[i].uid == uid)
                        return true;
        return false;
}

/* Under the lock: pin of p's uid (0, or a refusal). */
static int pin_locked(BuildTable *t, BuildRecord *rec, const BuildPinner *p,
                      FamilyError *ret_error) {
        BuildHolding *h = &rec->holding;
        uint32_t *grown;

        if (!p->admin && h->has_owner && h->owner_uid != p->uid && !uid_holds(h, p->uid))
                return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED,
                                        "PIN_NOT_ALLOWED", "build_id",
                                        "PinBuild needs the build's owner (uid %" PRIu32
                                        "), a uid with a process holding the build, or an "
                                        "admin; uid %" PRIu32 " is none of them",
                                        h->owner_uid, p->uid);
        if (has_pinner(h, p->uid))
                return 0;
        if (!p->admin && t->uid_limits.pins > 0) {
                BuildUidUse u = uid_use_locked(t, p->uid);
                if (u.pins >= t->uid_limits.pins)
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "UID_PIN_LIMIT", NULL,
                                                "uid %" PRIu32 " holds %u of its %u pins "
                                                "(--max-pins-per-uid); unpin one first",
                                                p->uid, u.pins, t->uid_limits.pins);
        }
        if (h->n_pinners >= BUILD_TABLE_MAX_PINNERS)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "PIN_LIMIT", "build_id",
                                        "build '%s' is pinned by %u uids, the most one build "
                                        "takes",
                                        rec->id, BUILD_TABLE_MAX_PINNERS);
        grown = reallocarray(h->pinners, h->n_pinners + 1, sizeof *grown);
        if (!grown)
                return -ENOMEM;
        h->pinners = grown;
        h->pinners[h->n_pinners++] = p->uid;
        return 0;
}

/* Under the lock: unpin of p's uid (0, or a refusal). */
static int unpin_locked(BuildRecord *rec, const BuildPinner *p, FamilyError *ret_error) {
        BuildHolding *h = &rec->holding;

        for (size_t i = 0; i < h->n_pinners; i++)
                if (h->pinners[i] == p->uid) {
                        memmove(h->pinners + i, h->pinners + i + 1,
                                (h->n_pinners - i - 1) * sizeof *h->pinners);
                        h->n_pinners--;
                        h->pinned = h->n_pinners > 0;
                        return 0;
                }
        if (p->admin || (h->n_pinners == 0 && !h->has_owner)) {
                /* An admin's unpin takes every pin; so does anyone's a pin of unknown uid on a
                 * build of unknown owner (kept by an older familyd). */
                h->pinners = mfree(h->pinners);
                h->n_pinners = 0;
                h->pinned = false;
                return 0;
        }
        if (h->n_pinners == 0)
                return 0; /* not pinned: nothing to undo */
        return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED,
                                "UNPIN_NOT_ALLOWED", "build_id",
                                "UnpinBuild takes only the caller's own uid's pin, or any pin "
                                "for an admin; build '%s' is pinned by %zu other uid%s and not "
                                "by uid %" PRIu32,
                                rec->id, h->n_pinners, h->n_pinners == 1 ? "" : "s", p->uid);
}

int build_table_pin_as(BuildTable *t, BuildRecord *rec, const BuildPinner *p, bool pin,
                       int64_t now_ms, uint64_t grace_ms, FamilyError *ret_error) {
        BuildHolding *h = &rec->holding;
        int r;

        (void) pthread_mutex_lock(&t->lock);
        if (pin) {
                r = pin_locked(t, rec, p, ret_error);
                if (r >= 0) {
                        h->pinned = true;
                        h->grace_deadline_ms = 0;
                }
        } else {
                r = unpin_locked(rec, p, ret_error);
                if (r >= 0) {
                        holding_maybe_grace(h, now_ms, grace_ms);
                        r = holding_idle(h) && !rec->removed;
                }
        }
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

int build_table_pin(BuildTable *t, BuildRecord *rec, bool pin, int64_t now_ms,
                    uint64_t grace_ms) {
        return build_table_pin_as(t, rec, &(BuildPinner) { .uid = 0, .admin = true }, pin, now_ms,
                                  grace_ms, NULL);
}

size_t build_table_start_grace(BuildTable *t, int64_t now_ms, uint64_t grace_ms) {
        size_t n = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++) {
                BuildHolding *h = &t->records[i]->holding;
                if (holding_idle(h) && h->grace_deadline_ms == 0) {
                        holding_maybe_grace(h, now_ms, grace_ms);
                        n++;
                }
        }
        (void) pthread_mutex_unlock(&t->lock);
        return n;
}

int build_table_take(BuildTable *t, const char *id, BuildTakeMode mode, int64_t now_ms,
                     BuildRecord **ret, FamilyError *ret_error) {
        BuildRecord *found = NULL;
        bool refused = false;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++) {
                BuildRecord *rec = t->records[i];
                const BuildHolding *h = &rec->holding;
                if (!streq(rec->id, id))
                        continue;
                refused = mode != BUILD_TAKE_ANY &&
                          (!holding_idle(h) || h->grace_deadline_ms == 0 ||
                           (mode == BUILD_TAKE_EXPIRED && h->grace_deadline_ms > now_ms));
                if (refused)
                        break;
                found = rec;
                memmove(t->records + i, t->records + i + 1,
                        (t->n_records - i - 1) * sizeof(BuildRecord *));
                t->n_records--;
                t->bytes_in_use -= rec->bytes;
                rec->removed = true;
                break;
        }
        (void) pthread_mutex_unlock(&t->lock);

        if (refused)
                return -EBUSY;
        if (!found)
                return not_found(id, ret_error);
        *ret = found;
        return 0;
}

int build_table_oldest_idle(BuildTable *t, char ret_id[static BUILD_TABLE_ID_MAX]) {
        return build_table_oldest_idle_where(t, NULL, ret_id);
}

int build_table_oldest_idle_where(BuildTable *t, bool (*match)(const void *payload),
                                  char ret_id[static BUILD_TABLE_ID_MAX]) {
        const BuildRecord *oldest = NULL;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++) {
                const BuildHolding *h = &t->records[i]->holding;
                if (holding_idle(h) && h->grace_deadline_ms != 0 &&
                    (!oldest || h->grace_deadline_ms < oldest->holding.grace_deadline_ms) &&
                    (!match || match(t->records[i]->payload)))
                        oldest = t->records[i];
        }
        if (oldest)
                memcpy(ret_id, oldest->id, BUILD_TABLE_ID_MAX);
        (void) pthread_mutex_unlock(&t->lock);
        return oldest ? 0 : -ENOENT;
}

int build_table_oldest_idle_of_uid(BuildTable *t, uint32_t uid,
                                   char ret_id[static BUILD_TABLE_ID_MAX]) {
        const BuildRecord *oldest = NULL;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++) {
                const BuildRecord *rec = t->records[i];
                const BuildHolding *h = &rec->holding;
                if (rec->charged && rec->charged_uid == uid && holding_idle(h) &&
                    h->grace_deadline_ms != 0 &&
                    (!oldest || h->grace_deadline_ms < oldest->holding.grace_deadline_ms))
                        oldest = rec;
        }
        if (oldest)
                memcpy(ret_id, oldest->id, BUILD_TABLE_ID_MAX);
        (void) pthread_mutex_unlock(&t->lock);
        return oldest ? 0 : -ENOENT;
}

int64_t build_table_next_deadline(BuildTable *t) {
        int64_t next = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++) {
                const BuildHolding *h = &t->records[i]->holding;
                if (holding_idle(h) && h->grace_deadline_ms != 0 &&
                    (next == 0 || h->grace_deadline_ms < next))
                        next = h->grace_deadline_ms;
        }
        (void) pthread_mutex_unlock(&t->lock);
        return next;
}

unsigned build_table_count_idle(BuildTable *t) {
        unsigned n = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t i = 0; i < t->n_records; i++)
                n += holding_idle(&t->records[i]->holding) &&
                     t->records[i]->holding.grace_deadline_ms != 0;
        (void) pthread_mutex_unlock(&t->lock);
        return n;
}

int build_table_holding(BuildTable *t, const BuildRecord *rec, BuildHolding *ret) {
        BuildHolding copy;
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        copy = rec->holding;
        copy.key = NULL;
        copy.holders = NULL;
        copy.pinners = NULL;
        if (copy.n_pinners > 0) {
                copy.pinners = calloc(copy.n_pinners, sizeof(uint32_t));
                if (copy.pinners)
                        memcpy(copy.pinners, rec->holding.pinners,
                               copy.n_pinners * sizeof(uint32_t));
                else
                        r = -ENOMEM;
        }
        if (r >= 0 && copy.n_holders > 0) {
                copy.holders = calloc(copy.n_holders, sizeof(BuildHolder));
                if (copy.holders)
                        memcpy(copy.holders, rec->holding.holders,
                               copy.n_holders * sizeof(BuildHolder));
                else
                        r = -ENOMEM;
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0) {
                build_holding_done(&copy);
                return r;
        }
        *ret = copy;
        return 0;
}

void build_holding_done(BuildHolding *h) {
        h->holders = mfree(h->holders);
        h->n_holders = 0;
        h->pinners = mfree(h->pinners);
        h->n_pinners = 0;
}

void build_holding_kept_done(BuildHoldingKept *k) {
        if (!k)
                return;
        k->key = mfree(k->key);
        k->holders = mfree(k->holders);
        k->pinners = mfree(k->pinners);
        k->key_size = k->n_holders = k->n_pinners = 0;
}

int build_table_holding_kept(BuildTable *t, const BuildRecord *rec, BuildHoldingKept *ret) {
        BuildHoldingKept k = {};
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        const BuildHolding *h = &rec->holding;
        k.pinned = h->pinned;
        k.private_build = h->private_build;
        k.has_owner = h->has_owner;
        k.owner_uid = h->owner_uid;
        k.share_group = h->share_group;
        k.binding = h->binding;
        k.created_ms = h->created_ms;
        k.key_size = h->key ? h->key_size : 0;
        k.n_holders = h->n_holders;
        k.n_pinners = h->n_pinners;
        if (rec->removed)
                r = -ESTALE;
        else if (k.n_pinners > 0 && !(k.pinners = calloc(k.n_pinners, sizeof(uint32_t))))
                r = -ENOMEM;
        else if (k.key_size > 0 && !(k.key = malloc(k.key_size)))
                r = -ENOMEM;
        else if (k.n_holders > 0 && !(k.holders = calloc(k.n_holders, sizeof(BuildHolder))))
                r = -ENOMEM;
        else {
                if (k.key_size > 0)
                        memcpy(k.key, h->key, k.key_size);
                if (k.n_holders > 0)
                        memcpy(k.holders, h->holders, k.n_holders * sizeof(BuildHolder));
                if (k.n_pinners > 0)
                        memcpy(k.pinners, h->pinners, k.n_pinners * sizeof(uint32_t));
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0) {
                build_holding_kept_done(&k);
                return r;
        }
        *ret = k;
        return 0;
}

void build_table_holding_put_back(BuildTable *t, BuildRecord *rec, BuildHoldingKept *k) {
        (void) pthread_mutex_lock(&t->lock);
        BuildHolding *h = &rec->holding;
        h->pinned = k->pinned;
        h->private_build = k->private_build;
        h->has_owner = k->has_owner;
        h->owner_uid = k->owner_uid;
        h->share_group = k->share_group;
        h->binding = k->binding;
        if (k->created_ms > 0)
                h->created_ms = k->created_ms;
        if (k->key) {
                free(h->key);
                h->key = TAKE_PTR(k->key);
                h->key_size = k->key_size;
                h->key_hash = key_hash(h->key, h->key_size);
        }
        free(h->holders);
        h->holders = TAKE_PTR(k->holders);
        h->n_holders = k->n_holders;
        free(h->pinners);
        h->pinners = NULL;
        h->n_pinners = 0;
        if (k->n_pinners > 0) {
                h->pinners = TAKE_PTR(k->pinners);
                h->n_pinners = k->n_pinners;
                h->pinned = true;
        } else if (k->pinned && k->has_owner && (h->pinners = malloc(sizeof(uint32_t)))) {
                /* Kept by a familyd that did not record pinners: the owner's pin. */
                h->pinners[0] = k->owner_uid;
                h->n_pinners = 1;
        }
        /* Its owner's from now on, as if it had been built now. */
        rec->charged = k->has_owner;
        rec->charged_uid = k->has_owner ? k->owner_uid : 0;
        if (h->n_holders > 0 || h->pinned)
                h->grace_deadline_ms = 0;
        (void) pthread_mutex_unlock(&t->lock);
        build_holding_kept_done(k);
}
