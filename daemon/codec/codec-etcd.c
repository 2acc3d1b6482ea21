/* codec-etcd.c: etcd v3's requests and answers, encoded and decoded with protobuf-c. */
#include <stdlib.h>
#include <string.h>

#include "codec-etcd.h"
#include "etcdserverpb-rpc.pb-c.h"
#include "mvccpb-kv.pb-c.h"
#include "common/macro.h"

void etcd_kv_done(EtcdKv *kv) {
        if (!kv)
                return;
        free(kv->key);
        free(kv->value);
        *kv = (EtcdKv) {};
}

void etcd_range_done(EtcdRange *r) {
        if (!r)
                return;
        for (size_t i = 0; i < r->n_kvs; i++)
                etcd_kv_done(&r->kvs[i]);
        free(r->kvs);
        *r = (EtcdRange) {};
}

void etcd_watch_response_done(EtcdWatchResponse *w) {
        if (!w)
                return;
        for (size_t i = 0; i < w->n_events; i++)
                etcd_kv_done(&w->events[i].kv);
        free(w->events);
        free(w->cancel_reason);
        *w = (EtcdWatchResponse) {};
}

char *etcd_prefix_end(const char *prefix) {
        char *end = strdup(prefix);
        size_t n = strlen(end);

        if (!end)
                return NULL;
        while (n > 0) {
                if ((unsigned char) end[n - 1] < 0xff) {
                        end[n - 1]++;
                        end[n] = '\0';
                        return end;
                }
                n--;
        }
        /* "\0" as a range end means every key from the start. */
        end[0] = '\0';
        return end;
}

static ProtobufCBinaryData bytes_of(const char *s) {
        return (ProtobufCBinaryData) { .data = (uint8_t *) s, .len = s ? strlen(s) : 0 };
}

/* etcd reads an empty range_end as "the key alone" and "\0" as "every key from key on". */
static ProtobufCBinaryData range_end_of(const char *s) {
        if (s && s[0] == '\0')
                return (ProtobufCBinaryData) { .data = (uint8_t *) s, .len = 1 };
        return bytes_of(s);
}

static int pack(const ProtobufCMessage *m, uint8_t **ret, size_t *ret_size) {
        size_t n = protobuf_c_message_get_packed_size(m);
        uint8_t *buf = NULL;

        if (n > 0) {
                buf = malloc(n);
                if (!buf)
                        return -ENOMEM;
                (void) protobuf_c_message_pack(m, buf);
        }
        *ret = buf;
        *ret_size = n;
        return 0;
}

int codec_etcd_range_encode(const char *key, const char *range_end, int64_t limit,
                            uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__RangeRequest m = ETCDSERVERPB__RANGE_REQUEST__INIT;

        m.key = bytes_of(key);
        m.range_end = range_end_of(range_end);
        m.limit = limit;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_put_encode(const char *key, const uint8_t *value, size_t value_size,
                          int64_t lease, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__PutRequest m = ETCDSERVERPB__PUT_REQUEST__INIT;

        m.key = bytes_of(key);
        m.value = (ProtobufCBinaryData) { .data = (uint8_t *) value, .len = value_size };
        m.lease = lease;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_delete_encode(const char *key, const char *range_end, uint8_t **ret,
                             size_t *ret_size) {
        Etcdserverpb__DeleteRangeRequest m = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;

        m.key = bytes_of(key);
        m.range_end = range_end_of(range_end);
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_create_encode(const char *key, const uint8_t *value, size_t value_size,
                             int64_t lease, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
        Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT;
        Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
        Etcdserverpb__TxnRequest m = ETCDSERVERPB__TXN_REQUEST__INIT;
        Etcdserverpb__Compare *cmps[] = { &cmp };
        Etcdserverpb__RequestOp *ops[] = { &op };

        put.key = bytes_of(key);
        put.value = (ProtobufCBinaryData) { .data = (uint8_t *) value, .len = value_size };
        put.lease = lease;
        op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
        op.request_put = &put;
        /* A key that does not exist has create_revision 0. */
        cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
        cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
        cmp.key = bytes_of(key);
        cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
        cmp.create_revision = 0;
        m.n_compare = 1;
        m.compare = cmps;
        m.n_success = 1;
        m.success = ops;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_lease_grant_encode(int64_t ttl_s, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__LeaseGrantRequest m = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;

        m.ttl = ttl_s;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_lease_revoke_encode(int64_t id, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__LeaseRevokeRequest m = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

        m.id = id;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_keepalive_encode(int64_t id, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__LeaseKeepAliveRequest m = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;

        m.id = id;
        return pack(&m.base, ret, ret_size);
}

int codec_etcd_watch_create_encode(const char *key, const char *range_end,
                                   int64_t start_revision, uint8_t **ret, size_t *ret_size) {
        Etcdserverpb__WatchCreateRequest create = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
        Etcdserverpb__WatchRequest m = ETCDSERVERPB__WATCH_REQUEST__INIT;

        create.key = bytes_of(key);
        create.range_end = range_end_of(range_end);
        create.start_revision = start_revision;
        m.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
        m.create_request = &create;
        return pack(&m.base, ret, ret_size);
}

static int kv_decode(const Mvccpb__KeyValue *pb, EtcdKv *ret) {
        _cleanup_(etcd_kv_done) EtcdKv kv = {};

        if (!pb || pb->key.len == 0 || pb->key.len > CODEC_ETCD_MAX_KEY_BYTES ||
            memchr(pb->key.data, '\0', pb->key.len) || pb->value.len > CODEC_ETCD_MAX_VALUE_BYTES)
                return -EBADMSG;
        kv.key = strndup((const char *) pb->key.data, pb->key.len);
        if (!kv.key)
                return -ENOMEM;
        if (pb->value.len > 0) {
                kv.value = malloc(pb->value.len);
                if (!kv.value)
                        return -ENOMEM;
                memcpy(kv.value, pb->value.data, pb->value.len);
        }
        kv.value_size = pb->value.len;
        kv.create_revision = pb->create_revision;
        kv.mod_revision = pb->mod_revision;
        kv.lease = pb->lease;
        *ret = kv;
        kv = (EtcdKv) {};
        return 0;
}

#define UNPACK(type, prefix, data, size)                                                     \
        ((data) && (size) > CODEC_ETCD_MAX_MESSAGE_BYTES ?                                   \
                 NULL :                                                                      \
                 (type *) protobuf_c_message_unpack(&prefix##__descriptor, NULL, (size),     \
                                                    (data)))

static int64_t header_revision(const Etcdserverpb__ResponseHeader *h) {
        return h ? h->revision : 0;
}

int codec_etcd_range_decode(const uint8_t *data, size_t size, EtcdRange *ret) {
        Etcdserverpb__RangeResponse *m =
                UNPACK(Etcdserverpb__RangeResponse, etcdserverpb__range_response, data, size);
        _cleanup_(etcd_range_done) EtcdRange r = {};
        int err = 0;

        if (!m)
                return -EBADMSG;
        if (m->n_kvs > CODEC_ETCD_MAX_KVS) {
                err = -EBADMSG;
                goto finish;
        }
        r.revision = header_revision(m->header);
        r.more = m->more;
        if (m->n_kvs > 0) {
                r.kvs = calloc(m->n_kvs, sizeof(EtcdKv));
                if (!r.kvs) {
                        err = -ENOMEM;
                        goto finish;
                }
        }
        for (size_t i = 0; i < m->n_kvs; i++) {
                err = kv_decode(m->kvs[i], &r.kvs[i]);
                if (err < 0)
                        goto finish;
                r.n_kvs++;
        }
        *ret = r;
        r = (EtcdRange) {};
finish:
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return err;
}

int codec_etcd_put_decode(const uint8_t *data, size_t size, int64_t *ret_revision) {
        Etcdserverpb__PutResponse *m =
                UNPACK(Etcdserverpb__PutResponse, etcdserverpb__put_response, data, size);

        if (!m)
                return -EBADMSG;
        *ret_revision = header_revision(m->header);
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return 0;
}

int codec_etcd_delete_decode(const uint8_t *data, size_t size, int64_t *ret_revision,
                             int64_t *ret_deleted) {
        Etcdserverpb__DeleteRangeResponse *m = UNPACK(
                Etcdserverpb__DeleteRangeResponse, etcdserverpb__delete_range_response, data, size);

        if (!m)
                return -EBADMSG;
        *ret_revision = header_revision(m->header);
        *ret_deleted = m->deleted;
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return 0;
}

int codec_etcd_txn_decode(const uint8_t *data, size_t size, int64_t *ret_revision,
                          bool *ret_succeeded) {
        Etcdserverpb__TxnResponse *m =
                UNPACK(Etcdserverpb__TxnResponse, etcdserverpb__txn_response, data, size);

        if (!m)
                return -EBADMSG;
        *ret_revision = header_revision(m->header);
        *ret_succeeded = m->succeeded;
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return 0;
}

int codec_etcd_lease_grant_decode(const uint8_t *data, size_t size, int64_t *ret_id,
                                  int64_t *ret_ttl_s) {
        Etcdserverpb__LeaseGrantResponse *m = UNPACK(
                Etcdserverpb__LeaseGrantResponse, etcdserverpb__lease_grant_response, data, size);
        int r = 0;

        if (!m)
                return -EBADMSG;
        if (!isempty(m->error) || m->id == 0 || m->ttl <= 0)
                r = -ENOSPC;
        else {
                *ret_id = m->id;
                *ret_ttl_s = m->ttl;
        }
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return r;
}

int codec_etcd_keepalive_decode(const uint8_t *data, size_t size, int64_t *ret_id,
                                int64_t *ret_ttl_s) {
        Etcdserverpb__LeaseKeepAliveResponse *m =
                UNPACK(Etcdserverpb__LeaseKeepAliveResponse,
                       etcdserverpb__lease_keep_alive_response, data, size);

        if (!m)
                return -EBADMSG;
        *ret_id = m->id;
        *ret_ttl_s = m->ttl;
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return 0;
}

static int event_decode(const Mvccpb__Event *pb, EtcdEvent *ret) {
        if (!pb)
                return -EBADMSG;
        switch (pb->type) {
        case MVCCPB__EVENT__EVENT_TYPE__PUT:
                ret->type = ETCD_EVENT_PUT;
                break;
        case MVCCPB__EVENT__EVENT_TYPE__DELETE:
                ret->type = ETCD_EVENT_DELETE;
                break;
        default:
                return -EBADMSG;
        }
        return kv_decode(pb->kv, &ret->kv);
}

int codec_etcd_watch_decode(const uint8_t *data, size_t size, EtcdWatchResponse *ret) {
        Etcdserverpb__WatchResponse *m =
                UNPACK(Etcdserverpb__WatchResponse, etcdserverpb__watch_response, data, size);
        _cleanup_(etcd_watch_response_done) EtcdWatchResponse w = {};
        int err = 0;

        if (!m)
                return -EBADMSG;
        if (m->n_events > CODEC_ETCD_MAX_KVS) {
                err = -EBADMSG;
                goto finish;
        }
        w.revision = header_revision(m->header);
        w.watch_id = m->watch_id;
        w.created = m->created;
        w.canceled = m->canceled;
        w.compact_revision = m->compact_revision;
        if (!isempty(m->cancel_reason)) {
                w.cancel_reason = strndup(m->cancel_reason, 256);
                if (!w.cancel_reason) {
                        err = -ENOMEM;
                        goto finish;
                }
        }
        if (m->n_events > 0) {
                w.events = calloc(m->n_events, sizeof(EtcdEvent));
                if (!w.events) {
                        err = -ENOMEM;
                        goto finish;
                }
        }
        for (size_t i = 0; i < m->n_events; i++) {
                err = event_decode(m->events[i], &w.events[i]);
                if (err < 0)
                        goto finish;
                w.n_events++;
        }
        *ret = w;
        w = (EtcdWatchResponse) {};
finish:
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return err;
}
