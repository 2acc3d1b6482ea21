/* codec-etcd.h: etcd v3's requests and answers (proto/etcd) to plain structs and back; pure. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Encoders return malloc'ed wire bytes (*ret, *ret_size; an empty message is a NULL pointer and
 * size 0). Decoders take an answer from etcd and return -EBADMSG for bytes that do not parse or
 * break a limit below: the etcd cluster is trusted to speak etcd, not to stay small, and keys
 * and values under our prefix may have been written by anyone with access to it.
 */

/* Limits on what an answer from etcd may hold. */
#define CODEC_ETCD_MAX_KEY_BYTES    1024u
#define CODEC_ETCD_MAX_VALUE_BYTES  (1024u * 1024u)
#define CODEC_ETCD_MAX_KVS          65536u
#define CODEC_ETCD_MAX_MESSAGE_BYTES (64u * 1024u * 1024u)

/* One key and its value; key is NUL-terminated (keys holding NUL bytes are refused). */
typedef struct EtcdKv {
        char *key;
        uint8_t *value;
        size_t value_size;
        int64_t create_revision;
        int64_t mod_revision;
        int64_t lease;
} EtcdKv;

typedef enum EtcdEventType {
        ETCD_EVENT_PUT,
        ETCD_EVENT_DELETE,
        _ETCD_EVENT_TYPE_MAX,
        _ETCD_EVENT_TYPE_INVALID = -EINVAL,
} EtcdEventType;

typedef struct EtcdEvent {
        EtcdEventType type;
        EtcdKv kv; /* for a delete: key and mod_revision (the delete's revision) */
} EtcdEvent;

typedef struct EtcdRange {
        int64_t revision; /* the store's revision the range was read at */
        EtcdKv *kvs;
        size_t n_kvs;
        bool more;
} EtcdRange;

typedef struct EtcdWatchResponse {
        int64_t revision;
        int64_t watch_id;
        bool created;
        bool canceled;
        int64_t compact_revision;
        char *cancel_reason;
        EtcdEvent *events;
        size_t n_events;
} EtcdWatchResponse;

void etcd_kv_done(EtcdKv *kv);
void etcd_range_done(EtcdRange *r);
void etcd_watch_response_done(EtcdWatchResponse *w);

/* The end of the range of keys starting with prefix (prefix with its last byte incremented);
 * "\0" (every key) when every byte is 0xff. Returns a malloc'ed string, NULL on ENOMEM. */
char *etcd_prefix_end(const char *prefix);

/* range_end NULL: key alone. limit 0: no limit. */
int codec_etcd_range_encode(const char *key, const char *range_end, int64_t limit,
                            uint8_t **ret, size_t *ret_size);
int codec_etcd_put_encode(const char *key, const uint8_t *value, size_t value_size,
                          int64_t lease, uint8_t **ret, size_t *ret_size);
int codec_etcd_delete_encode(const char *key, const char *range_end, uint8_t **ret,
                             size_t *ret_size);
/* A Txn that puts key only if it does not exist (its create_revision is 0). */
int codec_etcd_create_encode(const char *key, const uint8_t *value, size_t value_size,
                             int64_t lease, uint8_t **ret, size_t *ret_size);
int codec_etcd_lease_grant_encode(int64_t ttl_s, uint8_t **ret, size_t *ret_size);
int codec_etcd_lease_revoke_encode(int64_t id, uint8_t **ret, size_t *ret_size);
int codec_etcd_keepalive_encode(int64_t id, uint8_t **ret, size_t *ret_size);
int codec_etcd_watch_create_encode(const char *key, const char *range_end,
                                   int64_t start_revision, uint8_t **ret, size_t *ret_size);

int codec_etcd_range_decode(const uint8_t *data, size_t size, EtcdRange *ret);
/* Put, DeleteRange and LeaseRevoke answers: the store's revision. */
int codec_etcd_put_decode(const uint8_t *data, size_t size, int64_t *ret_revision);
int codec_etcd_delete_decode(const uint8_t *data, size_t size, int64_t *ret_revision,
                             int64_t *ret_deleted);
int codec_etcd_txn_decode(const uint8_t *data, size_t size, int64_t *ret_revision,
                          bool *ret_succeeded);
/* ret_ttl_s: the TTL etcd granted, in seconds. A grant etcd refused in its error field:
 * -ENOSPC. */
int codec_etcd_lease_grant_decode(const uint8_t *data, size_t size, int64_t *ret_id,
                                  int64_t *ret_ttl_s);
/* ret_ttl_s 0 or less: the lease expired. */
int codec_etcd_keepalive_decode(const uint8_t *data, size_t size, int64_t *ret_id,
                                int64_t *ret_ttl_s);
int codec_etcd_watch_decode(const uint8_t *data, size_t size, EtcdWatchResponse *ret);
