/* coord-session.c: the client's thread: the lease's keep-alives and the prefix watch. */

/*
 * DESIGN
 *
 * One thread, one completion queue, two bidi streams on it: LeaseKeepAlive and Watch. Each
 * stream has at most one send, one receive and its status batch in flight; a stream is
 * released (its call unref'd, its buffers freed) only when its status has arrived and no
 * batch is pending, and reopened after a backoff (100 ms doubling to 2 s, reset by a sound
 * answer: a watch etcd keeps canceling is retried every 2 s and logged once).
 * The queue is polled with a 100 ms deadline: that is the tick for keep-alives (every third of
 * the TTL), retries, and noticing coord_client_free()'s stop flag.
 *
 * The watch starts with a Range of the prefix (delivered as RESET and one PUT per key) and
 * watches from the revision after it; a reconnect resumes from the last revision delivered, so
 * an etcd restart loses nothing and repeats nothing (events at or below it are dropped). An
 * answer saying the revision was compacted away re-reads the prefix the same way.
 *
 * The lease is granted by coord_client_start(); the thread keeps it alive and, when etcd
 * answers a keep-alive with TTL 0 (the lease expired during an outage), grants a new one and
 * puts the leased keys again under it (coord-kv.c).
 */

#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>

#include "coord-private.h"
#include "common/log.h"

#define METHOD_WATCH     "/etcdserverpb.Watch/Watch"
#define METHOD_KEEPALIVE "/etcdserverpb.Lease/LeaseKeepAlive"
#define BACKOFF_MIN_MS   100u
#define BACKOFF_MAX_MS   2000u
#define TICK_MS          100

static uint64_t backoff_next(uint64_t *b) {
        uint64_t now = *b ? *b : BACKOFF_MIN_MS;

        *b = MIN(now * 2, (uint64_t) BACKOFF_MAX_MS);
        return now;
}

static int stream_batch(CoordStream *s, grpc_op *ops, size_t n, void *tag) {
        if (grpc_call_start_batch(s->call, ops, n, tag, NULL) != GRPC_CALL_OK)
                return -EIO;
        s->pending++;
        return 0;
}

static void stream_recv(CoordStream *s) {
        grpc_op ops[2];
        size_t n = 0;

        memset(ops, 0, sizeof(ops));
        if (!s->got_initial_md) {
                ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
                ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
        }
        ops[n].op = GRPC_OP_RECV_MESSAGE;
        ops[n++].data.recv_message.recv_message = &s->recv_bb;
        if (stream_batch(s, ops, n, &s->tag_recv) >= 0) {
                s->got_initial_md = true;
                s->recv_pending = true;
        }
}

static int stream_send(CoordStream *s, const uint8_t *data, size_t size) {
        grpc_op ops[1];

        if (!s->call || s->over || s->send_pending)
                return -EBUSY;
        s->send_bb = coord_buffer_new(data, size);
        if (!s->send_bb)
                return -ENOMEM;
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_MESSAGE;
        ops[0].data.send_message.send_message = s->send_bb;
        if (stream_batch(s, ops, 1, &s->tag_send) < 0) {
                grpc_byte_buffer_destroy(TAKE_PTR(s->send_bb));
                return -EIO;
        }
        s->send_pending = true;
        return 0;
}

static int stream_open(CoordClient *c, CoordStream *s, const uint8_t *first, size_t size) {
        grpc_op ops[1];
        int r;

        s->endpoint = atomic_load(&c->current) % c->n_endpoints;
        s->call = grpc_channel_create_call(c->channels[s->endpoint], NULL, GRPC_PROPAGATE_DEFAULTS,
                                           c->cq, grpc_slice_from_static_string(s->method), NULL,
                                           gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (!s->call)
                return -EIO;
        grpc_metadata_array_init(&s->initial_md);
        grpc_metadata_array_init(&s->trailing_md);
        s->details = grpc_empty_slice();
        s->status = GRPC_STATUS_UNKNOWN;
        s->over = s->got_initial_md = s->recv_pending = s->send_pending = false;
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        (void) stream_batch(s, ops, 1, &s->tag_start);
        ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
        ops[0].data.recv_status_on_client.status = &s->status;
        ops[0].data.recv_status_on_client.status_details = &s->details;
        if (stream_batch(s, ops, 1, &s->tag_status) < 0) {
                /* Nothing will end the call by itself: cancel it and let the status come. */
                grpc_call_cancel(s->call, NULL);
        }
        stream_recv(s);
        r = stream_send(s, first, size);
        if (r < 0)
                grpc_call_cancel(s->call, NULL); /* useless without its first message */
        return r;
}

static void stream_cancel(CoordStream *s) {
        if (s->call && !s->over)
                grpc_call_cancel(s->call, NULL);
}

/* Releases a stream whose status arrived and whose batches all completed. */
static void stream_release(CoordStream *s) {
        if (!s->call || !s->over || s->pending > 0)
                return;
        grpc_call_unref(TAKE_PTR(s->call));
        grpc_metadata_array_destroy(&s->initial_md);
        grpc_metadata_array_destroy(&s->trailing_md);
        grpc_slice_unref(s->details);
        if (s->recv_bb)
                grpc_byte_buffer_destroy(TAKE_PTR(s->recv_bb));
}

static void stream_ended(CoordClient *c, CoordStream *s) {
        s->over = true;
        s->reopen_at_ms = coord_now_ms() + backoff_next(&s->backoff_ms);
        if (atomic_load(&c->stop))
                return;
        log_debug("etcd %s at %s ended: status %d", s->method, c->endpoints[s->endpoint],
                  (int) s->status);
        if (s->status == GRPC_STATUS_UNAVAILABLE) {
                coord_fail_over(c, s->endpoint);
                coord_set_reachable(c, false, s->method);
        }
}

static void deliver(CoordClient *c, CoordEventType type, const EtcdKv *kv, int64_t revision) {
        CoordEvent e = { .type = type, .mod_revision = revision };

        if (kv) {
                e.key = kv->key;
                e.value = kv->value;
                e.value_size = kv->value_size;
                e.mod_revision = kv->mod_revision;
                if (type == COORD_EVENT_PUT)
                        e.create_revision = kv->create_revision;
        }
        if (c->on_event)
                c->on_event(&e, c->userdata);
}

/* Reads the prefix anew: RESET, one PUT per key, then the watch goes on after its revision. */
static int watch_sync(CoordClient *c) {
        _cleanup_(etcd_range_done) EtcdRange rg = {};
        int r;

        r = coord_client_range_prefix(c, c->watch_prefix, &rg);
        if (r < 0)
                return r;
        deliver(c, COORD_EVENT_RESET, NULL, rg.revision);
        for (size_t i = 0; i < rg.n_kvs; i++)
                deliver(c, COORD_EVENT_PUT, &rg.kvs[i], 0);
        c->last_revision = rg.revision;
        c->need_sync = false;
        c->watch.reopen_at_ms = 0;
        return 0;
}

static void watch_handle(CoordClient *c, const uint8_t *data, size_t size) {
        _cleanup_(etcd_watch_response_done) EtcdWatchResponse w = {};
        int r;

        r = codec_etcd_watch_decode(data, size, &w);
        if (r < 0) {
                if (!c->watch_trouble_logged)
                        log_warning_errno(r, "Refusing an answer on the etcd watch of %s, re-reading it: %m",
                                          c->watch_prefix);
                c->watch_trouble_logged = true;
                c->need_sync = true;
                stream_cancel(&c->watch);
                return;
        }
        if (w.compact_revision > 0) {
                log_notice("etcd compacted the watch's revision %lld away, re-reading %s",
                           (long long) c->last_revision + 1, c->watch_prefix);
                c->need_sync = true;
                stream_cancel(&c->watch);
                return;
        }
        if (w.canceled) {
                /* Once until a watch is created again: a cancel that persists (a permission
                 * taken away) would otherwise log at every retry. */
                if (!c->watch_trouble_logged)
                        log_warning("etcd canceled the watch of %s (%s), watching again",
                                    c->watch_prefix, strempty(w.cancel_reason));
                c->watch_trouble_logged = true;
                stream_cancel(&c->watch);
                return;
        }
        /* A sound answer: retries start from the shortest backoff again. */
        c->watch.backoff_ms = 0;
        if (w.created)
                c->watch_trouble_logged = false;
        for (size_t i = 0; i < w.n_events; i++) {
                const EtcdEvent *e = &w.events[i];

                if (e->kv.mod_revision <= c->last_revision)
                        continue; /* delivered before a reconnect */
                deliver(c, e->type == ETCD_EVENT_PUT ? COORD_EVENT_PUT : COORD_EVENT_DELETE, &e->kv, 0);
                c->last_revision = e->kv.mod_revision;
        }
}

static void keepalive_handle(CoordClient *c, const uint8_t *data, size_t size) {
        int64_t id, ttl;
        int r;

        r = codec_etcd_keepalive_decode(data, size, &id, &ttl);
        if (r < 0 || id != atomic_load(&c->lease_id))
                return;
        if (ttl > 0) {
                c->keepalive.backoff_ms = 0;
                return;
        }
        log_warning("etcd lease %llx expired, granting a new one", (unsigned long long) id);
        atomic_store(&c->lease_id, 0);
        stream_cancel(&c->keepalive);
}

static void on_complete(CoordClient *c, void *tag, bool success) {
        CoordStream *s = (char *) tag >= (char *) &c->watch && (char *) tag < (char *) (&c->watch + 1) ?
                                 &c->watch : &c->keepalive;
        _cleanup_free_ uint8_t *data = NULL;
        size_t size = 0;

        s->pending--;
        if (tag == &s->tag_send) {
                s->send_pending = false;
                if (s->send_bb)
                        grpc_byte_buffer_destroy(TAKE_PTR(s->send_bb));
        } else if (tag == &s->tag_recv) {
                s->recv_pending = false;
                if (!success || !s->recv_bb)
                        return; /* the stream is over: its status says why */
                if (coord_buffer_read(s->recv_bb, &data, &size) >= 0) {
                        coord_set_reachable(c, true, NULL);
                        if (s == &c->watch)
                                watch_handle(c, data, size);
                        else
                                keepalive_handle(c, data, size);
                }
                grpc_byte_buffer_destroy(TAKE_PTR(s->recv_bb));
                if (!s->over)
                        stream_recv(s);
        } else if (tag == &s->tag_status)
                stream_ended(c, s);
}

static void lease_tick(CoordClient *c, uint64_t now) {
        _cleanup_free_ uint8_t *req = NULL;
        uint64_t interval = (uint64_t) MAX(atomic_load(&c->lease_granted_s), (int64_t) 1) * 1000u / 3u;
        size_t size;
        int r;

        if ((atomic_load(&c->lease_id) == 0 || atomic_load(&c->leased_dirty)) &&
            now >= c->lease_retry_at_ms) {
                r = coord_lease_grant(c);
                if (r < 0) {
                        c->lease_retry_at_ms = now + backoff_next(&c->lease_backoff_ms);
                        return;
                }
                c->lease_backoff_ms = 0;
        }
        if (atomic_load(&c->lease_id) == 0 || now < c->next_keepalive_ms)
                return;
        if (codec_etcd_keepalive_encode(atomic_load(&c->lease_id), &req, &size) < 0)
                return;
        if (!c->keepalive.call) {
                if (now < c->keepalive.reopen_at_ms)
                        return;
                (void) stream_open(c, &c->keepalive, req, size);
        } else
                (void) stream_send(&c->keepalive, req, size);
        c->next_keepalive_ms = now + interval;
}

static void watch_tick(CoordClient *c, uint64_t now) {
        _cleanup_free_ uint8_t *req = NULL;
        size_t size;

        if (c->need_sync) {
                if (c->watch.call || now < c->sync_at_ms)
                        return;
                if (watch_sync(c) < 0) {
                        c->sync_at_ms = now + backoff_next(&c->sync_backoff_ms);
                        return;
                }
                c->sync_backoff_ms = 0;
        }
        if (c->watch.call || now < c->watch.reopen_at_ms)
                return;
        if (codec_etcd_watch_create_encode(c->watch_prefix, c->watch_end, c->last_revision + 1,
                                           &req, &size) < 0)
                return;
        (void) stream_open(c, &c->watch, req, size);
}

void *coord_session_run(void *userdata) {
        CoordClient *c = userdata;

        for (;;) {
                grpc_event ev = grpc_completion_queue_next(
                        c->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                            gpr_time_from_millis(TICK_MS, GPR_TIMESPAN)),
                        NULL);
                uint64_t now;

                if (ev.type == GRPC_OP_COMPLETE)
                        on_complete(c, ev.tag, ev.success);
                stream_release(&c->watch);
                stream_release(&c->keepalive);
                if (atomic_load(&c->stop)) {
                        stream_cancel(&c->watch);
                        stream_cancel(&c->keepalive);
                        if (!c->watch.call && !c->keepalive.call)
                                return NULL;
                        continue;
                }
                now = coord_now_ms();
                if (c->lease_ttl_s > 0)
                        lease_tick(c, now);
                if (c->watch_prefix)
                        watch_tick(c, now);
        }
}

int coord_client_start(CoordClient *c) {
        int r;

        if (c->thread_started)
                return -EALREADY;
        if (c->lease_ttl_s > 0) {
                r = coord_lease_grant(c);
                if (r < 0)
                        return r;
        }
        c->keepalive.method = METHOD_KEEPALIVE;
        c->watch.method = METHOD_WATCH;
        r = -pthread_create(&c->thread, NULL, coord_session_run, c);
        if (r < 0)
                return r;
        c->thread_started = true;
        return 0;
}
