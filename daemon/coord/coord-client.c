/* coord-client.c: the client's endpoints and channels, its unary calls, failover and outages. */

/*
 * DESIGN
 *
 * One grpc_channel per endpoint, made at start and kept: gRPC channels connect lazily,
 * reconnect by themselves (backoff 100 ms to 2 s here, not gRPC's default of up to two
 * minutes, so a returning etcd is seen within about two seconds) and are thread-safe. `current`
 * names the endpoint calls go to first; a call that ends UNAVAILABLE or misses its deadline
 * moves it to the next endpoint and tries there, once round the list.
 *
 * Unary calls are synchronous on the calling thread, each with its own pluck queue and a
 * deadline, so a daemon thread can call them (and the client's own thread does, for lease
 * grants and re-reads). The streams (the watch and the lease's keep-alives) live on the
 * client's own thread and its completion queue (coord-session.c): gRPC's queue is what wakes
 * it, so it needs no fd in anyone's sd-event loop, and the callbacks run on it; a daemon hands
 * what they carry to its main loop.
 *
 * An outage is logged once when it starts and once when it ends (`reachable`, exchanged
 * atomically by every path that sees either).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "coord-private.h"
#include "common/log.h"

uint64_t coord_now_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

void coord_set_reachable(CoordClient *c, bool reachable, const char *why) {
        size_t i = atomic_load(&c->current) % c->n_endpoints;

        if (atomic_exchange(&c->reachable, reachable) == reachable)
                return;
        if (reachable)
                log_info("etcd reachable again at %s", c->endpoints[i]);
        else
                log_warning("etcd unreachable (%s; last tried %s): local calls go on, the "
                            "topology stays as last seen",
                            strempty(why), c->endpoints[i]);
        if (c->on_reachable) {
                char text[COORD_MAX_ENDPOINT_LENGTH + 128];

                (void) snprintf(text, sizeof text, "no answer to %s from %s", strempty(why),
                                c->endpoints[i]);
                c->on_reachable(reachable, reachable ? NULL : text, c->userdata);
        }
}

void coord_fail_over(CoordClient *c, size_t i) {
        size_t expected = i;

        (void) atomic_compare_exchange_strong(&c->current, &expected, (i + 1) % c->n_endpoints);
}

static int endpoints_parse(const char *list, CoordClient *c) {
        _cleanup_free_ char *copy = NULL;
        char *save = NULL;

        if (isempty(list))
                return -EINVAL;
        copy = strdup(list);
        if (!copy)
                return -ENOMEM;
        c->endpoints = calloc(COORD_MAX_ENDPOINTS, sizeof(char *));
        if (!c->endpoints)
                return -ENOMEM;
        for (char *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
                const char *colon = strrchr(e, ':');

                if (c->n_endpoints >= COORD_MAX_ENDPOINTS || strlen(e) > COORD_MAX_ENDPOINT_LENGTH ||
                    !colon || colon == e || colon[1] == '\0' ||
                    strspn(colon + 1, "0123456789") != strlen(colon + 1))
                        return -EINVAL;
                c->endpoints[c->n_endpoints] = strdup(e);
                if (!c->endpoints[c->n_endpoints])
                        return -ENOMEM;
                c->n_endpoints++;
        }
        return c->n_endpoints > 0 ? 0 : -EINVAL;
}

static grpc_channel *channel_new(const char *endpoint, grpc_channel_credentials *creds) {
        grpc_arg args[] = {
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                  .value.integer = 100 },
                /* Not a backoff but gRPC's minimum connect timeout (doc/connection-backoff.md:
                 * an attempt gets max(its backoff deadline, now + this)). At 100 ms a loaded
                 * machine's etcd missed it ("timed out before receiving SETTINGS frame") and
                 * the first call after a start failed; a refused connection still fails at
                 * once and is retried after the backoff (100 ms doubling to 2 s). */
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                  .value.integer = 5000 },
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                  .value.integer = 2000 },
                /* etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time). */
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_KEEPALIVE_TIME_MS,
                  .value.integer = 10000 },
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                  .value.integer = 5000 },
                { .type = GRPC_ARG_INTEGER, .key = (char *) GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                  .value.integer = (int) CODEC_ETCD_MAX_MESSAGE_BYTES },
        };
        grpc_channel_args channel_args = { .num_args = ELEMENTSOF(args), .args = args };

        return grpc_channel_create(endpoint, creds, &channel_args);
}

int coord_client_new(const CoordOptions *o, CoordClient **ret) {
        _cleanup_(coord_client_freep) CoordClient *c = NULL;
        grpc_channel_credentials *creds = NULL;
        int r;

        if (!o || (o->lease_ttl_ms > (uint64_t) COORD_MAX_LEASE_TTL_S * 1000u))
                return -EINVAL;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        grpc_init();
        (void) pthread_mutex_init(&c->lease_lock, NULL);
        atomic_init(&c->reachable, true);
        c->cq = grpc_completion_queue_create_for_next(NULL);
        c->timeout_ms = o->timeout_ms ?: 2000;
        c->on_event = o->on_event;
        c->on_reachable = o->on_reachable;
        c->userdata = o->userdata;
        if (o->lease_ttl_ms > 0)
                c->lease_ttl_s = MAX((int64_t) ((o->lease_ttl_ms + 999) / 1000),
                                     (int64_t) COORD_MIN_LEASE_TTL_S);
        r = endpoints_parse(o->endpoints, c);
        if (r < 0)
                return r;
        c->channels = calloc(c->n_endpoints, sizeof(grpc_channel *));
        if (!c->channels)
                return -ENOMEM;
        r = coord_credentials_new(o, &creds);
        if (r < 0)
                return r;
        for (size_t i = 0; i < c->n_endpoints && r >= 0; i++) {
                c->channels[i] = channel_new(c->endpoints[i], creds);
                if (!c->channels[i])
                        r = -ENOMEM;
        }
        /* Each channel holds its own reference. */
        grpc_channel_credentials_release(creds);
        if (r < 0)
                return r;
        if (o->watch_prefix) {
                if (isempty(o->watch_prefix) || strlen(o->watch_prefix) > CODEC_ETCD_MAX_KEY_BYTES)
                        return -EINVAL;
                c->watch_prefix = strdup(o->watch_prefix);
                c->watch_end = c->watch_prefix ? etcd_prefix_end(c->watch_prefix) : NULL;
                if (!c->watch_end)
                        return -ENOMEM;
                c->need_sync = true;
        }
        *ret = TAKE_PTR(c);
        return 0;
}

void coord_client_stop(CoordClient *c) {
        if (!c->thread_started)
                return;
        atomic_store(&c->stop, true);
        (void) pthread_join(c->thread, NULL);
        c->thread_started = false;
}

CoordClient *coord_client_free(CoordClient *c) {
        if (!c)
                return NULL;
        coord_client_stop(c);
        if (c->cq) {
                grpc_completion_queue_shutdown(c->cq);
                while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                               .type != GRPC_QUEUE_SHUTDOWN)
                        ;
                grpc_completion_queue_destroy(c->cq);
        }
        for (size_t i = 0; c->channels && i < c->n_endpoints; i++)
                if (c->channels[i])
                        grpc_channel_destroy(c->channels[i]);
        for (size_t i = 0; c->endpoints && i < c->n_endpoints; i++)
                free(c->endpoints[i]);
        for (size_t i = 0; i < c->n_leased; i++) {
                free(c->leased[i].key);
                free(c->leased[i].value);
        }
        free(c->channels);
        free(c->endpoints);
        free(c->watch_prefix);
        free(c->watch_end);
        (void) pthread_mutex_destroy(&c->lease_lock);
        free(c);
        grpc_shutdown();
        return NULL;
}

static int bytes_of_buffer(grpc_byte_buffer *bb, uint8_t **ret, size_t *ret_size) {
        grpc_byte_buffer_reader reader;
        grpc_slice s;
        uint8_t *buf = NULL;
        size_t n;

        if (!grpc_byte_buffer_reader_init(&reader, bb))
                return -EBADMSG;
        s = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        n = GRPC_SLICE_LENGTH(s);
        if (n > 0) {
                buf = malloc(n);
                if (!buf) {
                        grpc_slice_unref(s);
                        return -ENOMEM;
                }
                memcpy(buf, GRPC_SLICE_START_PTR(s), n);
        }
        grpc_slice_unref(s);
        *ret = buf;
        *ret_size = n;
        return 0;
}

int coord_buffer_read(grpc_byte_buffer *bb, uint8_t **ret, size_t *ret_size) {
        return bytes_of_buffer(bb, ret, ret_size);
}

grpc_byte_buffer *coord_buffer_new(const uint8_t *data, size_t size) {
        grpc_slice s = grpc_slice_from_copied_buffer((const char *) data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);

        grpc_slice_unref(s);
        return bb;
}

/* One call to channel i: the gRPC status, or -errno for a local failure. */
static int unary_once(CoordClient *c, size_t i, const char *method, grpc_byte_buffer *send_bb,
                      uint8_t **ret, size_t *ret_size) {
        grpc_metadata_array initial_md, trailing_md;
        grpc_byte_buffer *recv_bb = NULL;
        grpc_status_code status = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
        gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis((int64_t) c->timeout_ms, GPR_TIMESPAN));
        grpc_slice method_slice = grpc_slice_from_static_string(method);
        grpc_call *call = grpc_channel_create_call(c->channels[i], NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                   method_slice, NULL, deadline, NULL);
        grpc_op ops[6];
        grpc_event ev;
        int r;

        grpc_metadata_array_init(&initial_md);
        grpc_metadata_array_init(&trailing_md);
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = send_bb;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &recv_bb;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
        ops[5].data.recv_status_on_client.status = &status;
        ops[5].data.recv_status_on_client.status_details = &details;

        r = -EIO;
        if (call && grpc_call_start_batch(call, ops, ELEMENTSOF(ops), ops, NULL) == GRPC_CALL_OK) {
                /* The deadline ends the batch: the tag always arrives. */
                ev = grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type == GRPC_OP_COMPLETE) {
                        r = (int) status;
                        if (status == GRPC_STATUS_OK)
                                r = recv_bb ? bytes_of_buffer(recv_bb, ret, ret_size) : -EBADMSG;
                        else
                                log_debug("etcd %s at %s: status %d: %.*s", method, c->endpoints[i],
                                          (int) status, (int) MIN(GRPC_SLICE_LENGTH(details), (size_t) 200),
                                          (const char *) GRPC_SLICE_START_PTR(details));
                }
        }
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&initial_md);
        grpc_metadata_array_destroy(&trailing_md);
        if (recv_bb)
                grpc_byte_buffer_destroy(recv_bb);
        if (call)
                grpc_call_unref(call);
        grpc_completion_queue_shutdown(cq);
        while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(cq);
        return r;
}

int coord_unary(CoordClient *c, const char *method, const uint8_t *req, size_t req_size,
                uint8_t **ret, size_t *ret_size) {
        grpc_byte_buffer *send_bb = coord_buffer_new(req, req_size);
        int r = -ENOTCONN;

        if (!send_bb)
                return -ENOMEM;
        for (size_t attempt = 0; attempt < c->n_endpoints; attempt++) {
                size_t i = atomic_load(&c->current) % c->n_endpoints;

                r = unary_once(c, i, method, send_bb, ret, ret_size);
                if (r == GRPC_STATUS_UNAVAILABLE || r == GRPC_STATUS_DEADLINE_EXCEEDED) {
                        coord_fail_over(c, i);
                        r = -ENOTCONN;
                        continue;
                }
                break;
        }
        grpc_byte_buffer_destroy(send_bb);
        if (r == -ENOTCONN)
                coord_set_reachable(c, false, method);
        else if (r == 0)
                coord_set_reachable(c, true, NULL);
        else if (r > 0)
                r = -EIO; /* another gRPC status: etcd answered, and refused */
        return r;
}
