/* coord-client.h: familyd's etcd v3 client: unary KV calls, a kept-alive lease, a prefix watch. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/codec-etcd.h"
#include "common/macro.h"

/* Limits on what the caller configures. */
#define COORD_MAX_ENDPOINTS      16u
#define COORD_MAX_ENDPOINT_LENGTH 256u
#define COORD_MAX_LEASED_KEYS    64u
#define COORD_MIN_LEASE_TTL_S    2
#define COORD_MAX_LEASE_TTL_S    3600
#define COORD_MAX_PEM_BYTES      (256u * 1024u)

typedef struct CoordClient CoordClient;

typedef enum CoordEventType {
        COORD_EVENT_RESET,  /* the prefix was (re-)read: the PUTs that follow are all there is */
        COORD_EVENT_PUT,
        COORD_EVENT_DELETE,
        _COORD_EVENT_TYPE_MAX,
        _COORD_EVENT_TYPE_INVALID = -EINVAL,
} CoordEventType;

typedef struct CoordEvent {
        CoordEventType type;
        const char *key;        /* NULL for RESET */
        const uint8_t *value;   /* PUT only */
        size_t value_size;
        int64_t mod_revision;   /* RESET: the revision the prefix was read at */
        int64_t create_revision; /* PUT: when the key was created (0 for RESET and DELETE) */
} CoordEvent;

/* on_event runs on the client's thread. on_reachable runs on the thread that saw the edge: the
 * client's, or a caller's in a unary call; calls are serialized by nothing, so a daemon posts
 * what it learns to its own loop. why: at an outage's start, what failed and where ("no answer
 * to /etcdserverpb.KV/Put from 127.0.0.1:2379"); NULL at its end. */
typedef void (*CoordEventFn)(const CoordEvent *e, void *userdata);
typedef void (*CoordReachableFn)(bool reachable, const char *why, void *userdata);

typedef struct CoordOptions {
        const char *endpoints;     /* "HOST:PORT[,HOST:PORT...]" */
        uint64_t timeout_ms;       /* each unary call; 0: 2000 */
        const char *watch_prefix;  /* NULL: no watch */
        CoordEventFn on_event;
        CoordReachableFn on_reachable;
        void *userdata;
        uint64_t lease_ttl_ms;     /* 0: no lease; else rounded up to whole seconds, at least 2 */
        /* TLS: the CA that signed etcd's certificate (PEM; NULL: plaintext), and this client's
         * certificate and key (PEM, both or neither) for etcd's --client-cert-auth. */
        const char *tls_ca_path;
        const char *tls_cert_path;
        const char *tls_key_path;
} CoordOptions;

/* 1: coord_client_create() found the key there already. */
#define COORD_EXISTS 1

/* Parses the endpoints and makes one channel each; connects nothing yet. -EINVAL for a bad
 * endpoint list (empty, more than COORD_MAX_ENDPOINTS, an entry without ":PORT"), a certificate
 * without its key or either without a CA; a PEM file that cannot be read is logged. */
int coord_client_new(const CoordOptions *o, CoordClient **ret);
/* Grants the lease (when asked for) and starts the thread that keeps it alive and watches. */
int coord_client_start(CoordClient *c);
/* Stops the thread, then revokes the lease: every leased key goes at once (a clean stop's
 * last word). -ENOTCONN: etcd did not answer, and the keys go when the lease expires. */
int coord_client_revoke(CoordClient *c);
/* Stops and joins the thread (within one call's timeout: a re-read may be under way), so the
 * callbacks may run, and their userdata must live, until this returns. */
CoordClient *coord_client_free(CoordClient *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(CoordClient *, coord_client_free);

/* The lease's id and the TTL etcd granted (seconds); 0 while there is none. */
int64_t coord_client_lease_id(CoordClient *c);
int64_t coord_client_lease_ttl_s(CoordClient *c);

/* Unary calls, from any thread, each with the timeout, failing over to the next endpoint on
 * UNAVAILABLE or a missed deadline. -ENOTCONN: no endpoint answered. */
int coord_client_put(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                     int64_t *ret_revision);
/* Puts key under the client's lease, and again under each new lease it is granted later. */
int coord_client_put_leased(CoordClient *c, const char *key, const uint8_t *value, size_t size);
/* Puts key only if absent: 0 created, COORD_EXISTS when it was there. */
int coord_client_create(CoordClient *c, const char *key, const uint8_t *value, size_t size,
                        int64_t *ret_revision);
/* coord_client_create() under the client's lease: 0 created (and put again under each new
 * lease, as coord_client_put_leased() does), COORD_EXISTS when it was there. */
int coord_client_create_leased(CoordClient *c, const char *key, const uint8_t *value,
                               size_t size);
/* -ENOENT when absent. */
int coord_client_get(CoordClient *c, const char *key, EtcdKv *ret);
int coord_client_range_prefix(CoordClient *c, const char *prefix, EtcdRange *ret);
int coord_client_delete(CoordClient *c, const char *key, int64_t *ret_deleted);
