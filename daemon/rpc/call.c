/* call.c: a server-side gRPC call from arrival to its last completion, for every method kind. */

/*
 * DESIGN: a Call is born armed (waiting in grpc_server_request_*call), and once a client's call
 * arrives it re-arms its site, so every method always has one request outstanding (otherwise
 * gRPC would stop serving it). Each batch started on the call holds one reference; the last
 * completion frees the call. Worker threads may run two completions of one call at once (the
 * send and the close of a watch), hence the atomic count; the steps of one stream are otherwise
 * sequential by construction (one receive or one send outstanding at a time).
 *
 * Each call holds its connection (rpc/caller.c) from arrival: a reply is packed into a slice
 * whose bytes count against the connection's and the daemon's queue bounds until gRPC frees
 * them (the slice's destructor), so a client that never reads holds a bounded amount, whatever
 * window it advertises, and a call past a bound is answered RESOURCE_EXHAUSTED instead. A unary call frees its decoded request and reply tree as
 * soon as the reply is packed: only the packed bytes wait for the client. A connection the
 * listener took over a cap answers its first call with the refusal and is closed once the client
 * has read it.
 */

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <assert.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "call.h"
#include "codec/codec-status.h"
#include "codec/codec-wire.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "core/resource-limits.h"
#include "executor.h"
#include "metrics/metrics.h"


typedef struct Call {
        CallSite site;
        atomic_uint n_ref;

        grpc_call *call;
        gpr_timespec deadline;
        grpc_metadata_array request_metadata;
        grpc_call_details details; /* catch-all site only */
        grpc_byte_buffer *payload; /* the request (unary, watch) or the last stream message */
        Arena arena;               /* the decoded request and the reply tree */
        ProtobufCMessage *request; /* decoded, in arena */

        uint64_t arrived_ns; /* metrics_now_ns() when the client's call arrived */
        RpcTag on_arrived;
        RpcTag on_sent;
        RpcTag on_received;
        RpcTag on_closed;

        int cancelled;
        /* A deferred unary call asks for its close at once (rpc_call_defer), so it learns when
         * its client cancels or goes away before the answer: gone is set then. */
        bool close_armed;
        atomic_bool gone;
        bool is_watch; /* counted in counter->watches */
        /* Pushed watches, under counter->lock: the list, a send in flight, a change since. */
        struct Call *pushed_next, *pushed_prev;
        bool pushed_sending;
        bool pushed_dirty;
        /* A watch of a method that skips repeats: the CRC-32C and size of its last reply. */
        bool reply_sent;
        uint32_t sent_crc;
        size_t sent_size;
        grpc_byte_buffer *reply;
        grpc_slice status_details;
        bool has_status_details;
        grpc_metadata trailer;
        bool has_trailer;
        RpcConnection *conn; /* NULL: not filed at accept (only the total bound counts) */
        int32_t watch_pid;   /* is_watch: the process whose watch this is (0: unknown) */
        bool close_connection; /* a refused connection: shut it down once answered */
} Call;

/* Open watches of one process. */
typedef struct WatchOwner {
        int32_t pid;
        unsigned n;
} WatchOwner;

static Call *call_unref(Call *c);

void call_counter_init(CallCounter *c, unsigned max_watches, unsigned max_watches_per_process) {
        *c = (CallCounter) { .max_watches = max_watches,
                             .max_watches_per_process = max_watches_per_process };
        (void) pthread_mutex_init(&c->lock, NULL);
        (void) pthread_cond_init(&c->drained, NULL);
}

void call_counter_done(CallCounter *c) {
        (void) pthread_cond_destroy(&c->drained);
        (void) pthread_mutex_destroy(&c->lock);
        c->owners = mfree(c->owners);
}

void call_counter_wait_drained(CallCounter *c) {
        (void) pthread_mutex_lock(&c->lock);
        while (c->live > 0)
                (void) pthread_cond_wait(&c->drained, &c->lock);
        (void) pthread_mutex_unlock(&c->lock);
}

static void counter_add(CallCounter *c) {
        (void) pthread_mutex_lock(&c->lock);
        c->live++;
        (void) pthread_mutex_unlock(&c->lock);
}

/* Under c->lock: the entry of pid's watches, or NULL. */
static WatchOwner *counter_owner(CallCounter *c, int32_t pid) {
        for (size_t i = 0; i < c->n_owners; i++)
                if (c->owners[i].pid == pid)
                        return &c->owners[i];
        return NULL;
}

static void counter_remove(CallCounter *c, bool watch, int32_t pid) {
        (void) pthread_mutex_lock(&c->lock);
        if (watch)
                c->watches--;
        WatchOwner *o = watch && pid > 0 ? counter_owner(c, pid) : NULL;
        if (o && --o->n == 0)
                *o = c->owners[--c->n_owners];
        if (--c->live == 0)
                (void) pthread_cond_broadcast(&c->drained);
        (void) pthread_mutex_unlock(&c->lock);
}

typedef enum WatchSlot {
        WATCH_SLOT_TAKEN,
        WATCH_SLOT_ALL_FULL,     /* max_watches are open */
        WATCH_SLOT_PROCESS_FULL, /* pid has max_watches_per_process open */
} WatchSlot;

/* Takes a watch slot for process pid (0: unknown, only max_watches bounds it). */
static WatchSlot counter_take_watch(CallCounter *c, int32_t pid) {
        WatchSlot slot = WATCH_SLOT_TAKEN;

        (void) pthread_mutex_lock(&c->lock);
        WatchOwner *o = pid > 0 ? counter_owner(c, pid) : NULL;
        if (c->watches >= c->max_watches)
                slot = WATCH_SLOT_ALL_FULL;
        else if (o && o->n >= c->max_watches_per_process)
                slot = WATCH_SLOT_PROCESS_FULL;
        else if (pid > 0 && !o && !GREEDY_REALLOC(c->owners, c->allocated_owners,
                                                   c->n_owners + 1))
                slot = WATCH_SLOT_ALL_FULL; /* out of memory: refused as if full */
        else {
                if (pid > 0 && !o)
                        c->owners[c->n_owners++] = (WatchOwner) { .pid = pid };
                if (pid > 0)
                        counter_owner(c, pid)->n++;
                c->watches++;
        }
        (void) pthread_mutex_unlock(&c->lock);
        return slot;
}

static void call_free(Call *c) {
        if (c->call)
                grpc_call_unref(c->call);
        grpc_metadata_array_destroy(&c->request_metadata);
        if (!c->site.method)
                grpc_call_details_destroy(&c->details);
        if (c->payload)
                grpc_byte_buffer_destroy(c->payload);
        if (c->reply)
                grpc_byte_buffer_destroy(c->reply);
        c->conn = rpc_connection_unref(c->conn);
        if (c->has_status_details)
                grpc_slice_unref(c->status_details);
        if (c->has_trailer) {
                grpc_slice_unref(c->trailer.key);
                grpc_slice_unref(c->trailer.value);
        }
        arena_done(&c->arena);
        CallCounter *counter = c->site.counter;
        bool watch = c->is_watch;
        int32_t pid = c->watch_pid;
        free(c);
        /* Last: once live reaches zero the server may go away. */
        counter_remove(counter, watch, pid);
}

static Call *call_unref(Call *c) {
        if (c && atomic_fetch_sub(&c->n_ref, 1) == 1)
                call_free(c);
        return NULL;
}

static void call_ref(Call *c) {
        atomic_fetch_add(&c->n_ref, 1);
}

/* A batch that gRPC refuses never completes: drop the reference it would have released. */
static void call_start_batch(Call *c, const grpc_op *ops, size_t n, RpcTag *tag) {
        call_ref(c);
        grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
        if (e != GRPC_CALL_OK) {
                log_warning("grpc_call_start_batch failed (%d) on %s, dropping the call", (int) e,
                            c->site.method ? c->site.method->path : "an unknown method");
                call_unref(c);
        }
}

static int buffer_to_bytes(grpc_byte_buffer *b, grpc_slice *ret) {
        grpc_byte_buffer_reader reader;

        if (!grpc_byte_buffer_reader_init(&reader, b))
                return -EBADMSG;
        *ret = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        return 0;
}

static void error_from_errno(FamilyError *e, int r);

/* A reply's bytes, counted against the queue bounds until gRPC frees them. */
typedef struct QueuedReply {
        CallerTable *callers; /* NULL: not counted */
        RpcConnection *conn;
        size_t size;
        uint8_t data[];
} QueuedReply;

/* The slice's destructor, on whichever thread gRPC drops its last reference. */
static void queued_reply_free(void *userdata) {
        QueuedReply *q = userdata;
        CallerTable *callers = q->callers;
        RpcConnection *conn = q->conn;
        size_t size = q->size;

        /* Freed first: the queue may trim the heap once it is empty. */
        free(q);
        if (!callers)
                return;
        caller_table_unqueue(callers, conn, size);
        rpc_connection_unref(conn);
        caller_table_unref(callers);
}

/* size bytes for a reply, counted; NULL with e set past a bound (or out of memory). */
static QueuedReply *call_reply_new(Call *c, size_t size, FamilyError *e) {
        uint64_t queued = 0, limit = 0;
        QueuedReply *q;
        int r = 0;

        if (c->site.callers)
                r = caller_table_queue(c->site.callers, c->conn, size, &queued, &limit);
        if (r == 0) {
                q = malloc(offsetof(QueuedReply, data) + size);
                if (!q) {
                        if (c->site.callers)
                                caller_table_unqueue(c->site.callers, c->conn, size);
                        error_from_errno(e, -ENOMEM);
                        return NULL;
                }
                *q = (QueuedReply) { .size = size };
                if (c->site.callers) {
                        q->callers = caller_table_ref(c->site.callers);
                        q->conn = rpc_connection_ref(c->conn);
                }
                return q;
        }
        if (r == CALLER_QUEUE_CONNECTION_FULL)
                (void) family_error_set(e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "QUEUE_LIMIT", NULL,
                                        "reply queue full: %" PRIu64 " bytes of replies wait for "
                                        "this connection to read them, the limit is %" PRIu64
                                        " bytes (--max-queued-bytes-per-connection)",
                                        queued, limit);
        else
                (void) family_error_set(e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "QUEUE_LIMIT", NULL,
                                        "reply queue full: %" PRIu64 " bytes of replies wait for "
                                        "clients to read them, the limit is %" PRIu64
                                        " bytes (--max-queued-bytes)",
                                        queued, limit);
        return NULL;
}

/* Hands q over to c->reply (replacing the last one); gRPC frees it when done with it. */
static void call_set_reply(Call *c, QueuedReply *q) {
        grpc_slice s = grpc_slice_new_with_user_data(q->data, q->size, queued_reply_free, q);

        if (c->reply)
                grpc_byte_buffer_destroy(c->reply);
        c->reply = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
}

/* Packs m as c->reply: 0, or -ENOBUFS with e set (past a queue bound, or out of memory). A
 * watch of a method that skips repeats remembers what it sends; then 1 (nothing packed) when
 * m's bytes are those sent last. */
static int call_pack_reply(Call *c, const ProtobufCMessage *m, FamilyError *e) {
        QueuedReply *q = call_reply_new(c, protobuf_c_message_get_packed_size(m), e);

        if (!q)
                return -ENOBUFS;
        (void) protobuf_c_message_pack(m, q->data);
        if (c->is_watch && c->site.method->skips_repeats) {
                uint32_t crc = crc32c(0, q->data, q->size);
                if (c->reply_sent && crc == c->sent_crc && q->size == c->sent_size) {
                        queued_reply_free(q);
                        return 1;
                }
                c->reply_sent = true;
                c->sent_crc = crc;
                c->sent_size = q->size;
        }
        call_set_reply(c, q);
        return 0;
}

/* The send completed: our reference to the reply goes (gRPC may still hold its own). */
static void call_drop_reply(Call *c) {
        if (c->reply) {
                grpc_byte_buffer_destroy(c->reply);
                c->reply = NULL;
        }
}

/* A refused connection has been answered; it is closed once the client has read the answer.
 * gRPC reports the status sent when it has framed it, which can be before the bytes reach the
 * socket, and a client whose write fails (a SETTINGS ack, say) may drop what it has not read
 * yet. So a closer thread waits until nothing sent is left unread in the socket (SIOCOUTQ), at
 * least CALL_CLOSE_MIN_NSEC and at most CALL_CLOSE_MAX_NSEC, and then shuts the read side only:
 * gRPC, seeing its read end, closes the transport once its write in progress has finished. */
#define CALL_CLOSE_POLL_NSEC (5ull * 1000000ull)
#define CALL_CLOSE_MIN_NSEC (20ull * 1000000ull)
#define CALL_CLOSE_MAX_NSEC (1000ull * 1000000ull)

static int call_fd(Call *c);
static void call_close_connection(Call *c) {
        int fd = call_fd(c);

        /* gRPC keeps the descriptor open while this call lives: still the same socket. */
        if (c->conn && rpc_connection_is_fd(c->conn, fd))
                (void) shutdown(fd, SHUT_RD);
}

static bool call_answer_read(Call *c) {
        int fd = call_fd(c), unread = 0;

        if (!c->conn || !rpc_connection_is_fd(c->conn, fd))
                return true; /* gone already */
        return ioctl(fd, SIOCOUTQ, &unread) < 0 || unread == 0;
}

/* Runs on the closer thread; holds a reference to the call, so to its socket. */
static void call_close_job(void *data, bool cancelled) {
        Call *c = data;
        unsigned long long waited = 0;
        const struct timespec poll = { .tv_nsec = (long) CALL_CLOSE_POLL_NSEC };

        while (!cancelled && !executor_stopping(c->site.closer) && waited < CALL_CLOSE_MAX_NSEC &&
               (waited < CALL_CLOSE_MIN_NSEC || !call_answer_read(c))) {
                (void) nanosleep(&poll, NULL);
                waited += CALL_CLOSE_POLL_NSEC;
        }
        call_close_connection(c);
        call_unref(c);
}

/* Closes now when the closer is busy (over LISTENER_MAX_REFUSING waiting) or stopping. */
static void call_close_when_read(Call *c) {
        call_ref(c);
        if (!c->site.closer || executor_submit(c->site.closer, call_close_job, c) < 0) {
                call_close_connection(c);
                call_unref(c);
        }
}

/* Fills the status op: code, message, and the google.rpc.Status detail in the trailer. */
static void call_set_status(Call *c, grpc_op *op, FamilyError *e) {
        metrics_call_done(c->site.method ? c->site.method->path : NULL, (unsigned) e->status,
                          c->arrived_ns);
        op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        op->data.send_status_from_server.status = (grpc_status_code) e->status;
        if (e->status == FAMILY_STATUS_OK)
                return;

        /* On OOM the full text goes out; clients may then refuse the trailers, nothing worse. */
        (void) family_error_truncate(e, FAMILYD_MAX_STATUS_MESSAGE);
        c->status_details = grpc_slice_from_copied_string(strempty(e->message));
        c->has_status_details = true;
        op->data.send_status_from_server.status_details = &c->status_details;

        _cleanup_free_ uint8_t *detail = NULL;
        size_t detail_size = 0;
        if (codec_status_encode((int) e->status, strempty(e->message),
                                e->reason ? e->reason : family_status_to_string(e->status),
                                "familyd", e->field ? "field" : NULL, e->field, &detail,
                                &detail_size) >= 0) {
                c->trailer.key = grpc_slice_from_static_string("grpc-status-details-bin");
                c->trailer.value = grpc_slice_from_copied_buffer((const char *) detail,
                                                                 detail_size);
                c->has_trailer = true;
                op->data.send_status_from_server.trailing_metadata_count = 1;
                op->data.send_status_from_server.trailing_metadata = &c->trailer;
        }
}

static void on_final_sent(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_sent);

        call_drop_reply(c);
        if (c->close_connection)
                call_close_when_read(c);
        call_unref(c);
}

/* Sends initial metadata (unless already sent), an optional reply and the status, ending the
 * call; with close, also waits for the client's close in the same batch. */
static void call_finish(Call *c, ProtobufCMessage *reply, FamilyError *e, bool initial,
                        bool close) {
        grpc_op ops[4] = {};
        size_t n = 0;

        if (initial)
                ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        if (reply && call_pack_reply(c, reply, e) < 0)
                reply = NULL;
        if (!c->is_watch) {
                /* The answer is packed: the request and the reply tree (megabytes for a large
                 * ListBuilds) need not wait with it for a client that may never read. */
                arena_done(&c->arena);
                arena_init(&c->arena);
                c->request = NULL;
        }
        if (reply) {
                ops[n].op = GRPC_OP_SEND_MESSAGE;
                ops[n++].data.send_message.send_message = c->reply;
        }
        call_set_status(c, &ops[n++], e);
        if (close) {
                ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
                ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
        }
        c->on_sent.complete = on_final_sent;
        call_start_batch(c, ops, n, &c->on_sent);
}

static void error_from_errno(FamilyError *e, int r) {
        if (family_error_is_set(e))
                return;
        if (r == -ENOMEM)
                (void) family_error_set(e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", NULL,
                                        "familyd is out of memory");
        else
                (void) family_error_set(e, FAMILY_STATUS_INTERNAL, "INTERNAL", NULL,
                                        "internal error: %s", strerror(-r));
}

/* The deadline of the call whose handler runs on this worker (handlers run synchronously). */
static _Thread_local gpr_timespec handler_deadline;
static _Thread_local bool handler_has_deadline;
static _Thread_local Call *handler_call;

bool rpc_call_expired(void) {
        if (!handler_has_deadline)
                return false;
        gpr_timespec now = gpr_now(handler_deadline.clock_type);
        return gpr_time_cmp(now, handler_deadline) >= 0;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; older headers lack it */
#endif

/* The descriptor gRPC names the call's connection by ("fd:N"), or -1. */
static int call_fd(Call *c) {
        char *peer;
        int fd = -1, n = 0;

        peer = grpc_call_get_peer(c->call);
        if (!peer)
                return -1;
        if (sscanf(peer, "fd:%d%n", &fd, &n) != 1 || peer[n] != 0)
                fd = -1;
        gpr_free(peer);
        return fd;
}

int rpc_call_caller(RpcCaller *ret) {
        Call *c = handler_call;

        if (!c || !c->call || !c->site.callers)
                return -ENOTCONN;
        return caller_table_find(c->site.callers, call_fd(c), ret);
}

int rpc_call_peer(int32_t *ret_pid, uint32_t *ret_uid, int *ret_pidfd) {
        RpcCaller caller;
        socklen_t len;
        int pidfd = -1, r;

        r = rpc_call_caller(&caller);
        if (r < 0)
                return r;
        if (caller.pid <= 0)
                return -ENOTCONN;
        /* The same socket as the credentials' (rpc_call_caller() checked its inode). */
        len = sizeof pidfd;
        if (getsockopt(call_fd(handler_call), SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0)
                pidfd = -1;
        *ret_pid = caller.pid;
        *ret_uid = caller.uid;
        *ret_pidfd = pidfd;
        return 0;
}

int rpc_require_admin(const char *what, FamilyError *ret_error) {
        RpcCaller caller;

        if (rpc_call_caller(&caller) < 0)
                return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED, "NOT_ADMIN",
                                        NULL,
                                        "%s needs an admin (root, or a member of --admin-group); "
                                        "the calling process cannot be told",
                                        what);
        if (caller.admin)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED, "NOT_ADMIN", NULL,
                                "%s needs an admin (root, or a member of --admin-group); uid "
                                "%u is neither",
                                what, caller.uid);
}

/* A state-changing call: who made it (pid, uid) and how it was answered, in the log. */
static void call_audit(Call *c, int r, const FamilyError *e) {
        const char *name = strrchr(c->site.method->path, '/') + 1;
        char pid[16] = "", uid[16] = "";
        RpcCaller caller;
        bool known = rpc_call_caller(&caller) >= 0;

        if (known) {
                (void) snprintf(pid, sizeof pid, "%d", (int) caller.pid);
                (void) snprintf(uid, sizeof uid, "%u", caller.uid);
        }
        log_struct(LOG_INFO, 0,
                   LOG_FIELDS(LOG_FIELD("CALLER_PID", known ? pid : "unknown"),
                              LOG_FIELD("CALLER_UID", known ? uid : "unknown"),
                              LOG_FIELD("RPC_METHOD", name)),
                   "%s called by pid %s (uid %s): %s.", name, known ? pid : "unknown",
                   known ? uid : "unknown",
                   r == RPC_PENDING ? "answered when done"
                   : r < 0          ? (e && e->reason ? e->reason : "failed")
                                    : "OK");
}

/* Decodes the request and runs the handler; on failure *ret_error says why. */
static int call_handle(Call *c, ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const RpcMethod *m = c->site.method;
        ProtobufCMessage *request = NULL;
        grpc_slice bytes;
        int r;

        if (!c->payload || buffer_to_bytes(c->payload, &bytes) < 0)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                        NULL, "request has no message");

        r = codec_wire_check(m->request_type, GRPC_SLICE_START_PTR(bytes),
                             GRPC_SLICE_LENGTH(bytes), FAMILYD_MAX_REQUEST_DEPTH,
                             FAMILYD_MAX_REQUEST_MESSAGES);
        if (r < 0) {
                grpc_slice_unref(bytes);
                if (r == -ELOOP)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "REQUEST_LIMIT", NULL,
                                                "request nests messages deeper than %u levels",
                                                FAMILYD_MAX_REQUEST_DEPTH);
                if (r == -E2BIG)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "REQUEST_LIMIT", NULL,
                                                "request holds more than %u messages or %u fields",
                                                FAMILYD_MAX_REQUEST_MESSAGES,
                                                FAMILYD_MAX_REQUEST_FIELDS);
                return r;
        }

        ProtobufCAllocator allocator = codec_wire_arena_allocator(&c->arena);
        request = protobuf_c_message_unpack(m->request_type, &allocator, GRPC_SLICE_LENGTH(bytes),
                                            GRPC_SLICE_START_PTR(bytes));
        grpc_slice_unref(bytes);
        c->request = request;
        if (!request)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                        NULL, "request could not be decoded as %s",
                                        m->request_type->name);

        handler_deadline = c->deadline;
        handler_has_deadline = true;
        handler_call = c;
        r = m->handler((RpcContext *) &c->site.context, &c->arena, request, ret_reply,
                       ret_error);
        if (m->audited)
                call_audit(c, r, ret_error);
        handler_call = NULL;
        handler_has_deadline = false;
        if (r < 0)
                error_from_errno(ret_error, r);
        return r;
}

/* Sends a unary call's answer: the reply, unless it is larger than clients accept. A deferred
 * call's close is already asked for. */
static void call_answer(Call *c, ProtobufCMessage *reply, FamilyError *e) {
        bool close = !c->close_armed;

        if (!reply) {
                call_finish(c, NULL, e, true, close);
                return;
        }
        size_t size = protobuf_c_message_get_packed_size(reply);
        if (size > FAMILYD_MAX_REPLY_BYTES) {
                (void) family_error_set(e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "REPLY_LIMIT", NULL,
                                        "the reply would be %zu bytes, more than the limit of "
                                        "%u bytes",
                                        size, FAMILYD_MAX_REPLY_BYTES);
                call_finish(c, NULL, e, true, close);
                return;
        }
        call_finish(c, reply, e, true, close);
}

static void call_run_unary(Call *c) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        ProtobufCMessage *reply = NULL;
        int r;

        r = call_handle(c, &reply, &e);
        if (r == RPC_PENDING)
                return; /* rpc_pending_finish() answers, holding its own reference */
        call_answer(c, r < 0 ? NULL : reply, &e);
}

/* The close of a deferred call: the answer was sent, or the client cancelled or went away
 * (killed, connection closed) while the work ran. */
static void on_pending_closed(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_closed);

        if (!ok || c->cancelled)
                atomic_store(&c->gone, true);
        call_unref(c);
}

RpcPending *rpc_call_defer(void) {
        Call *c = handler_call;
        grpc_op op = { .op = GRPC_OP_RECV_CLOSE_ON_SERVER };

        assert(c);
        call_ref(c);
        /* Asked for now, not with the answer: a client that dies while its Build fills must
         * not leave a build behind that nobody knows the id of. */
        op.data.recv_close_on_server.cancelled = &c->cancelled;
        c->on_closed.complete = on_pending_closed;
        c->close_armed = true;
        call_start_batch(c, &op, 1, &c->on_closed);
        return (RpcPending *) c;
}

Arena *rpc_pending_arena(RpcPending *p) {
        return &((Call *) p)->arena;
}

bool rpc_pending_expired(RpcPending *p) {
        Call *c = (Call *) p;
        return atomic_load(&c->gone) ||
               gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
}

void rpc_pending_finish(RpcPending *p, ProtobufCMessage *reply, FamilyError *error) {
        Call *c = (Call *) p;
        FamilyError none = FAMILY_ERROR_NULL;

        call_answer(c, family_error_is_set(error) ? NULL : reply, error ? error : &none);
        family_error_done(error);
        call_unref(c);
}

static void pushed_remove(Call *c) {
        CallCounter *counter = c->site.counter;

        (void) pthread_mutex_lock(&counter->lock);
        if (c->pushed_prev)
                c->pushed_prev->pushed_next = c->pushed_next;
        else if (counter->pushed == c)
                counter->pushed = c->pushed_next;
        if (c->pushed_next)
                c->pushed_next->pushed_prev = c->pushed_prev;
        c->pushed_next = c->pushed_prev = NULL;
        (void) pthread_mutex_unlock(&counter->lock);
}

static void on_closed(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_closed);

        if (c->is_watch && c->site.method->pushes_changes)
                pushed_remove(c);
        call_unref(c);
}

static void on_watch_sent(RpcTag *tag, bool ok);

/* Under counter->lock: builds the handler's reply anew and sends it. */
static void pushed_send(Call *c) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        ProtobufCMessage *reply = NULL;
        grpc_op op = { .op = GRPC_OP_SEND_MESSAGE };
        Arena scratch;

        arena_init(&scratch);
        int r = c->site.method->handler((RpcContext *) &c->site.context, &scratch,
                                        c->request, &reply, &e);
        if (r < 0 || !reply) {
                arena_done(&scratch);
                return;
        }
        if (r == RPC_WATCH_LAST) {
                /* The last reply and OK; the send stays "in flight" for good: no more pushes. */
                c->pushed_sending = true;
                call_finish(c, reply, &e, false, false);
                arena_done(&scratch);
                return;
        }
        r = call_pack_reply(c, reply, &e);
        arena_done(&scratch);
        if (r < 0) {
                /* The watch ends with the reason; no send is started on it again. */
                c->pushed_sending = true;
                call_finish(c, NULL, &e, false, false);
                return;
        }
        if (r > 0) /* the same as last sent: no news */
                return;

        c->pushed_sending = true;
        op.data.send_message.send_message = c->reply;
        c->on_sent.complete = on_watch_sent;
        call_start_batch(c, &op, 1, &c->on_sent);
}

static void on_watch_sent(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_sent);

        /* pushed_sending is still set: no pushed_send() runs on this call meanwhile. */
        call_drop_reply(c);
        if (c->site.method->pushes_changes) {
                CallCounter *counter = c->site.counter;
                (void) pthread_mutex_lock(&counter->lock);
                c->pushed_sending = false;
                if (ok && c->pushed_dirty) {
                        c->pushed_dirty = false;
                        pushed_send(c);
                }
                (void) pthread_mutex_unlock(&counter->lock);
        }
        call_unref(c);
}

void call_counter_notify_watches(CallCounter *counter) {
        call_counter_notify_watches_of(counter, NULL);
}

void call_counter_notify_watches_of(CallCounter *counter, const char *path) {
        (void) pthread_mutex_lock(&counter->lock);
        for (Call *c = counter->pushed; c; c = c->pushed_next) {
                if (path && !streq(c->site.method->path, path))
                        continue;
                if (c->pushed_sending)
                        c->pushed_dirty = true;
                else
                        pushed_send(c);
        }
        (void) pthread_mutex_unlock(&counter->lock);
}

/* A watch sends its first reply and stays open: the close (client gone, or the server's
 * cancel-all at shutdown) ends it. */
static void call_run_watch(Call *c) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        ProtobufCMessage *reply = NULL;
        grpc_op ops[2] = {};
        int32_t pid = c->conn ? rpc_connection_caller(c->conn)->pid : 0;

        WatchSlot slot = counter_take_watch(c->site.counter, pid);
        if (slot == WATCH_SLOT_ALL_FULL)
                (void) family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "WATCH_LIMIT", NULL,
                                        "watch limit reached: %u open watches",
                                        c->site.counter->max_watches);
        else if (slot == WATCH_SLOT_PROCESS_FULL)
                (void) family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "WATCH_LIMIT", NULL,
                                        "watch limit reached: process %d has %u open watches "
                                        "(--max-watches-per-process)",
                                        (int) pid, c->site.counter->max_watches_per_process);
        if (slot != WATCH_SLOT_TAKEN) {
                call_finish(c, NULL, &e, true, true);
                return;
        }
        c->is_watch = true;
        c->watch_pid = pid;

        int r = call_handle(c, &reply, &e);
        if (r < 0) {
                call_finish(c, NULL, &e, true, true);
                return;
        }
        if (r == RPC_WATCH_LAST) { /* over already: one reply, then OK */
                call_finish(c, reply, &e, true, true);
                return;
        }
        if (call_pack_reply(c, reply, &e) < 0) {
                call_finish(c, NULL, &e, true, true);
                return;
        }

        /* Listed before the close batch starts, so on_closed always finds it listed. */
        if (c->site.method->pushes_changes) {
                CallCounter *counter = c->site.counter;
                (void) pthread_mutex_lock(&counter->lock);
                c->pushed_sending = true;
                c->pushed_next = counter->pushed;
                if (counter->pushed)
                        counter->pushed->pushed_prev = c;
                counter->pushed = c;
                (void) pthread_mutex_unlock(&counter->lock);
        }

        ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[0].data.recv_close_on_server.cancelled = &c->cancelled;
        c->on_closed.complete = on_closed;
        call_start_batch(c, ops, 1, &c->on_closed);

        ops[0] = (grpc_op) { .op = GRPC_OP_SEND_INITIAL_METADATA };
        ops[1] = (grpc_op) { .op = GRPC_OP_SEND_MESSAGE };
        ops[1].data.send_message.send_message = c->reply;
        c->on_sent.complete = on_watch_sent;
        call_start_batch(c, ops, 2, &c->on_sent);
}

static void bidi_receive(Call *c, bool initial);

static void on_bidi_sent(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_sent);

        call_drop_reply(c);
        if (ok)
                bidi_receive(c, false);
        call_unref(c);
}

static void on_bidi_received(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_received);
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;

        if (!ok) {
                call_unref(c);
                return;
        }

        if (!c->payload) {
                /* The client half-closed: every request has its answer. */
                call_finish(c, NULL, &e, false, false);
                call_unref(c);
                return;
        }

        grpc_slice bytes;
        _cleanup_free_ uint8_t *reply = NULL;
        size_t reply_size = 0;
        int r = buffer_to_bytes(c->payload, &bytes);
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
        if (r >= 0) {
                r = c->site.method->bytes_handler((RpcContext *) &c->site.context,
                                                  GRPC_SLICE_START_PTR(bytes),
                                                  GRPC_SLICE_LENGTH(bytes), &reply, &reply_size);
                grpc_slice_unref(bytes);
        }
        QueuedReply *q = NULL;
        if (r >= 0) {
                q = call_reply_new(c, reply_size, &e);
                r = q ? 0 : -ENOBUFS;
        }
        if (r < 0) {
                if (r == -EBADMSG)
                        (void) family_error_set(&e, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                                NULL, "request could not be decoded");
                else
                        error_from_errno(&e, r);
                call_finish(c, NULL, &e, false, false);
                call_unref(c);
                return;
        }

        grpc_op op = { .op = GRPC_OP_SEND_MESSAGE };
        if (reply_size > 0)
                memcpy(q->data, reply, reply_size);
        call_set_reply(c, q);
        op.data.send_message.send_message = c->reply;
        c->on_sent.complete = on_bidi_sent;
        call_start_batch(c, &op, 1, &c->on_sent);
        call_unref(c);
}

static void bidi_receive(Call *c, bool initial) {
        grpc_op ops[2] = {};
        size_t n = 0;

        if (initial)
                ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].op = GRPC_OP_RECV_MESSAGE;
        ops[n++].data.recv_message.recv_message = &c->payload;
        c->on_received.complete = on_bidi_received;
        call_start_batch(c, ops, n, &c->on_received);
}

static void call_run_bidi(Call *c) {
        grpc_op op = { .op = GRPC_OP_RECV_CLOSE_ON_SERVER };

        op.data.recv_close_on_server.cancelled = &c->cancelled;
        c->on_closed.complete = on_closed;
        call_start_batch(c, &op, 1, &c->on_closed);
        bidi_receive(c, true);
}

static void call_run_unknown(Call *c) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        char *method = grpc_slice_to_c_string(c->details.method);

        (void) family_error_set(&e, FAMILY_STATUS_UNIMPLEMENTED, "UNKNOWN_METHOD", NULL,
                                "familyd does not serve the method %s", strempty(method));
        gpr_free(method);
        call_finish(c, NULL, &e, true, true);
}

/* The connection was taken over a cap: its call gets the reason, then it is closed. */
static void call_refuse(Call *c) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        const RpcRefusal *refusal = rpc_connection_refusal(c->conn);
        const RpcCaller *caller = rpc_connection_caller(c->conn);

        if (refusal->kind == RPC_REFUSAL_PEER)
                (void) family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "CONNECTION_LIMIT",
                                        NULL,
                                        "connection limit reached: process %d has %u "
                                        "connections open (--max-connections-per-process)",
                                        (int) caller->pid, refusal->limit);
        else if (refusal->kind == RPC_REFUSAL_UID)
                (void) family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "CONNECTION_LIMIT",
                                        NULL,
                                        "connection limit reached: uid %u has %u connections "
                                        "open (--max-connections-per-uid)",
                                        caller->uid, refusal->limit);
        else
                (void) family_error_set(&e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "CONNECTION_LIMIT",
                                        NULL,
                                        "connection limit reached: %u connections are open "
                                        "(--max-connections)",
                                        refusal->limit);
        c->close_connection = true;
        /* Not waiting for the client's close: a stream it keeps open must not delay this. */
        call_finish(c, NULL, &e, true, false);
}

static void on_arrived(RpcTag *tag, bool ok) {
        Call *c = container_of(tag, Call, on_arrived);

        c->arrived_ns = metrics_now_ns();
        if (!ok || atomic_load(c->site.shutting_down)) {
                call_unref(c);
                return;
        }

        /* Keep one request outstanding per method before doing any work on this one. */
        int r = call_arm(&c->site);
        if (r < 0)
                log_error_errno(r, "Failed to re-arm %s, it stops being served: %m",
                                c->site.method ? c->site.method->path : "the catch-all");

        if (c->site.callers)
                c->conn = caller_table_connection(c->site.callers, call_fd(c));
        if (c->conn && rpc_connection_refusal(c->conn)->kind != RPC_REFUSAL_NONE)
                call_refuse(c);
        else if (!c->site.method)
                call_run_unknown(c);
        else
                switch (c->site.method->kind) {
                case RPC_UNARY:
                        call_run_unary(c);
                        break;
                case RPC_WATCH:
                        call_run_watch(c);
                        break;
                default:
                        call_run_bidi(c);
                        break;
                }
        call_unref(c);
}

int call_arm(const CallSite *site) {
        grpc_call_error e;
        Call *c;

        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->site = *site;
        c->n_ref = 1;
        arena_init(&c->arena);
        counter_add(site->counter);
        c->on_arrived.complete = on_arrived;
        grpc_metadata_array_init(&c->request_metadata);

        if (!site->method) {
                grpc_call_details_init(&c->details);
                e = grpc_server_request_call(site->server, &c->call, &c->details,
                                             &c->request_metadata, site->cq, site->cq,
                                             &c->on_arrived);
        } else
                e = grpc_server_request_registered_call(
                        site->server, site->registered, &c->call, &c->deadline,
                        &c->request_metadata,
                        site->method->kind == RPC_BIDI_BYTES ? NULL : &c->payload, site->cq,
                        site->cq, &c->on_arrived);
        if (e != GRPC_CALL_OK) {
                call_free(c);
                return -EIO;
        }
        return 0;
}
