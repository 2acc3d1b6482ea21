/* coord-private.h: the client's state, shared by its unary calls (coord-call.c) and its thread
 * (coord-session.c). */
#pragma once

#include <pthread.h>
#include <stdatomic.h>

#include <grpc/grpc.h>

#include "coord-client.h"

typedef struct CoordLeasedKey {
        char *key;
        uint8_t *value;
        size_t size;
} CoordLeasedKey;

/* One bidi stream (Watch or LeaseKeepAlive) on the client's completion queue. */
typedef struct CoordStream {
        const char *method;
        grpc_call *call;
        grpc_metadata_array initial_md, trailing_md;
        grpc_status_code status;
        grpc_slice details;
        grpc_byte_buffer *recv_bb, *send_bb;
        unsigned pending;          /* batches started and not completed */
        bool recv_pending, send_pending, over, got_initial_md;
        uint64_t reopen_at_ms;     /* CLOCK_MONOTONIC; when over, not before this */
        uint64_t backoff_ms;
        /* Distinct addresses: the tags of its batches. */
        size_t endpoint;           /* the channel it was opened on */
        char tag_start, tag_send, tag_recv, tag_status;
} CoordStream;

struct CoordClient {
        char **endpoints;
        grpc_channel **channels;
        size_t n_endpoints;
        atomic_size_t current;     /* the endpoint calls go to first */
        uint64_t timeout_ms;

        atomic_bool reachable;     /* false during an outage: logged once at each edge */
        CoordReachableFn on_reachable;
        CoordEventFn on_event;
        void *userdata;

        /* The lease; the mutex orders puts under it against its renewal. */
        pthread_mutex_t lease_lock;
        int64_t lease_ttl_s;       /* asked for; 0: none */
        atomic_llong lease_id;
        atomic_llong lease_granted_s;
        CoordLeasedKey leased[COORD_MAX_LEASED_KEYS];
        size_t n_leased;
        atomic_bool leased_dirty;  /* some key is not under the current lease yet */

        /* The watch. */
        char *watch_prefix, *watch_end;
        int64_t last_revision;     /* the newest revision delivered */
        bool need_sync;            /* the prefix must be re-read before watching */
        bool watch_trouble_logged; /* a refused answer or a cancel was logged: not again until
                                    * a watch is created */

        /* The thread. */
        grpc_completion_queue *cq;
        CoordStream watch, keepalive;
        uint64_t next_keepalive_ms, lease_retry_at_ms, lease_backoff_ms;
        uint64_t sync_at_ms, sync_backoff_ms;
        pthread_t thread;
        bool thread_started;
        atomic_bool stop;
};

uint64_t coord_now_ms(void);
void coord_set_reachable(CoordClient *c, bool reachable, const char *why);
/* The channel calls go to next after endpoint i failed with UNAVAILABLE. */
void coord_fail_over(CoordClient *c, size_t i);
/* One unary call; *ret malloc'ed (NULL for an empty answer). */
int coord_unary(CoordClient *c, const char *method, const uint8_t *req, size_t req_size,
                uint8_t **ret, size_t *ret_size);
int coord_lease_grant(CoordClient *c);
int coord_credentials_new(const CoordOptions *o, grpc_channel_credentials **ret);
int coord_buffer_read(grpc_byte_buffer *bb, uint8_t **ret, size_t *ret_size);
grpc_byte_buffer *coord_buffer_new(const uint8_t *data, size_t size);
void *coord_session_run(void *userdata);
/* Stops and joins the thread, if it runs. */
void coord_client_stop(CoordClient *c);
