/* coord-kv.c: the KV and lease calls on etcd, one unary call each. */
#include <stdlib.h>
#include <string.h>

#include "coord-private.h"
#include "common/log.h"

#define METHOD_RANGE        "/etcdserverpb.KV/Range"
#define METHOD_PUT          "/etcdserverpb.KV/Put"
#define METHOD_DELETE_RANGE "/etcdserverpb.KV/DeleteRange"
#define METHOD_TXN          "/etcdserverpb.KV/Txn"
#define METHOD_LEASE_GRANT  "/etcdserverpb.Lease/LeaseGrant"
#define METHOD_LEASE_REVOKE "/etcdserverpb.Lease/LeaseRevoke"

int64_t coord_client_lease_id(CoordClient *c) {
        return atomic_load(&c->lease_id);
}

int64_t coord_client_lease_ttl_s(CoordClient *c) {
        return atomic_load(&c->lease_granted_s);
}

static bool key_ok(const char *key) {
        return !isempty(key) && strlen(key) <= CODEC_ETCD_MAX_KEY_BYTES;
}

static int put_with_lease(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                          int64_t lease, int64_t *ret_revision) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int64_t revision;
        int r;

        if (!key_ok(key) || size > CODEC_ETCD_MAX_VALUE_BYTES)
                return -EINVAL;
        r = codec_etcd_put_encode(key, value, size, lease, &req, &req_size);
        if (r < 0)
                return r;
        r = coord_unary(c, METHOD_PUT, req, req_size, &ans, &ans_size);
        if (r < 0)
                return r;
        r = codec_etcd_put_decode(ans, ans_size, &revision);
        if (r < 0)
                return r;
        if (ret_revision)
                *ret_revision = revision;
        return 0;
}

int coord_client_put(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                     int64_t *ret_revision) {
        return put_with_lease(c, key, value, size, 0, ret_revision);
}

static int leased_remember(CoordClient *c, const char *key, const uint8_t *value, size_t size) {
        CoordLeasedKey *k = NULL;
        uint8_t *copy = NULL;

        for (size_t i = 0; i < c->n_leased; i++)
                if (streq(c->leased[i].key, key))
                        k = &c->leased[i];
        if (!k) {
                if (c->n_leased >= COORD_MAX_LEASED_KEYS)
                        return -E2BIG;
                k = &c->leased[c->n_leased];
                *k = (CoordLeasedKey) { .key = strdup(key) };
                if (!k->key)
                        return -ENOMEM;
                c->n_leased++;
        }
        if (size > 0) {
                copy = malloc(size);
                if (!copy)
                        return -ENOMEM;
                memcpy(copy, value, size);
        }
        free(k->value);
        k->value = copy;
        k->size = size;
        return 0;
}

int coord_client_put_leased(CoordClient *c, const char *key, const uint8_t *value, size_t size) {
        int r;

        if (!key_ok(key) || size > CODEC_ETCD_MAX_VALUE_BYTES || c->lease_ttl_s == 0)
                return -EINVAL;
        /* Held across the put: a renewal in between would re-put the key before this put. */
        (void) pthread_mutex_lock(&c->lease_lock);
        r = leased_remember(c, key, value, size);
        if (r >= 0) {
                r = atomic_load(&c->lease_id) != 0 ?
                            put_with_lease(c, key, value, size, atomic_load(&c->lease_id), NULL) :
                            -ENOTCONN;
                if (r < 0)
                        c->leased_dirty = true; /* the thread puts it when etcd answers */
        }
        (void) pthread_mutex_unlock(&c->lease_lock);
        return r;
}

static int create_with_lease(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                             int64_t lease, int64_t *ret_revision) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int64_t revision;
        bool succeeded;
        int r;

        if (!key_ok(key) || size > CODEC_ETCD_MAX_VALUE_BYTES)
                return -EINVAL;
        r = codec_etcd_create_encode(key, value, size, lease, &req, &req_size);
        if (r < 0)
                return r;
        r = coord_unary(c, METHOD_TXN, req, req_size, &ans, &ans_size);
        if (r < 0)
                return r;
        r = codec_etcd_txn_decode(ans, ans_size, &revision, &succeeded);
        if (r < 0)
                return r;
        if (ret_revision)
                *ret_revision = revision;
        return succeeded ? 0 : COORD_EXISTS;
}

int coord_client_create(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                        int64_t *ret_revision) {
        return create_with_lease(c, key, value, size, 0, ret_revision);
}

int coord_client_create_leased(CoordClient *c, const char *key, const uint8_t *value,
                               size_t size) {
        int r;

        if (c->lease_ttl_s == 0)
                return -EINVAL;
        (void) pthread_mutex_lock(&c->lease_lock);
        r = atomic_load(&c->lease_id) != 0 ?
                    create_with_lease(c, key, value, size, atomic_load(&c->lease_id), NULL) :
                    -ENOTCONN;
        /* Ours from now on: a new lease puts it again. */
        if (r == 0)
                r = leased_remember(c, key, value, size);
        (void) pthread_mutex_unlock(&c->lease_lock);
        return r;
}

int coord_client_revoke(CoordClient *c) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int64_t id;
        int r;

        /* No keep-alive or new grant races the revocation. */
        coord_client_stop(c);
        id = atomic_exchange(&c->lease_id, 0);
        if (id == 0)
                return 0;
        r = codec_etcd_lease_revoke_encode(id, &req, &req_size);
        if (r < 0)
                return r;
        return coord_unary(c, METHOD_LEASE_REVOKE, req, req_size, &ans, &ans_size);
}

static int range(CoordClient *c, const char *key, const char *end, EtcdRange *ret) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int r;

        if (!key_ok(key))
                return -EINVAL;
        r = codec_etcd_range_encode(key, end, CODEC_ETCD_MAX_KVS, &req, &req_size);
        if (r < 0)
                return r;
        r = coord_unary(c, METHOD_RANGE, req, req_size, &ans, &ans_size);
        if (r < 0)
                return r;
        return codec_etcd_range_decode(ans, ans_size, ret);
}

int coord_client_get(CoordClient *c, const char *key, EtcdKv *ret) {
        _cleanup_(etcd_range_done) EtcdRange rg = {};
        int r;

        r = range(c, key, NULL, &rg);
        if (r < 0)
                return r;
        if (rg.n_kvs != 1 || !streq(rg.kvs[0].key, key))
                return -ENOENT;
        *ret = rg.kvs[0];
        rg.kvs[0] = (EtcdKv) {};
        return 0;
}

int coord_client_range_prefix(CoordClient *c, const char *prefix, EtcdRange *ret) {
        _cleanup_free_ char *end = NULL;
        EtcdRange rg = {};
        int r;

        if (!key_ok(prefix))
                return -EINVAL;
        end = etcd_prefix_end(prefix);
        if (!end)
                return -ENOMEM;
        r = range(c, prefix, end, &rg);
        if (r < 0)
                return r;
        if (rg.more) {
                etcd_range_done(&rg);
                return -E2BIG; /* more than CODEC_ETCD_MAX_KVS keys under the prefix */
        }
        *ret = rg;
        return 0;
}

int coord_client_delete(CoordClient *c, const char *key, int64_t *ret_deleted) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int64_t revision, deleted;
        int r;

        if (!key_ok(key))
                return -EINVAL;
        r = codec_etcd_delete_encode(key, NULL, &req, &req_size);
        if (r < 0)
                return r;
        r = coord_unary(c, METHOD_DELETE_RANGE, req, req_size, &ans, &ans_size);
        if (r < 0)
                return r;
        r = codec_etcd_delete_decode(ans, ans_size, &revision, &deleted);
        if (r < 0)
                return r;
        if (ret_deleted)
                *ret_deleted = deleted;
        return 0;
}

/* Grants a new lease and puts every leased key under it; called with lease_lock held. */
static int lease_grant_locked(CoordClient *c) {
        _cleanup_free_ uint8_t *req = NULL, *ans = NULL;
        size_t req_size, ans_size = 0;
        int64_t id, ttl;
        int r;

        if (atomic_load(&c->lease_id) == 0) {
                r = codec_etcd_lease_grant_encode(c->lease_ttl_s, &req, &req_size);
                if (r < 0)
                        return r;
                r = coord_unary(c, METHOD_LEASE_GRANT, req, req_size, &ans, &ans_size);
                if (r < 0)
                        return r;
                r = codec_etcd_lease_grant_decode(ans, ans_size, &id, &ttl);
                if (r < 0)
                        return log_warning_errno(r, "etcd refused a lease of %llds",
                                                 (long long) c->lease_ttl_s);
                atomic_store(&c->lease_granted_s, ttl);
                atomic_store(&c->lease_id, id);
                c->leased_dirty = true;
                log_debug("etcd granted lease %llx for %llds", (unsigned long long) id, (long long) ttl);
        }
        if (!c->leased_dirty)
                return 0;
        for (size_t i = 0; i < c->n_leased; i++) {
                r = put_with_lease(c, c->leased[i].key, c->leased[i].value, c->leased[i].size,
                                   atomic_load(&c->lease_id), NULL);
                if (r < 0)
                        return r;
        }
        c->leased_dirty = false;
        return 0;
}

int coord_lease_grant(CoordClient *c) {
        int r;

        (void) pthread_mutex_lock(&c->lease_lock);
        r = lease_grant_locked(c);
        (void) pthread_mutex_unlock(&c->lease_lock);
        return r;
}
