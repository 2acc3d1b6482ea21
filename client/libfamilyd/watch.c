/* watch.c: server-streaming calls (FamilydWatch) and the topology watch built on them. */

/*
 * DESIGN
 *
 * A watch owns one grpc_call and its own pluck completion queue. familyd_client_watch() starts
 * the first batch (SEND_INITIAL_METADATA, SEND_MESSAGE, SEND_CLOSE_FROM_CLIENT,
 * RECV_INITIAL_METADATA) and returns without waiting. Each familyd_watch_next() runs on the
 * caller's thread: it plucks that first batch once, then one RECV_MESSAGE batch; a message that
 * does not arrive (NULL buffer or failed batch) means the stream is over, and a last
 * RECV_STATUS_ON_CLIENT batch says why. Every batch is plucked before next() returns, so the
 * buffers the ops write into (in the FamilydWatch) never outlive a call of it.
 *
 * familyd_watch_cancel() is grpc_call_cancel(), which gRPC allows from any thread; the atomic
 * flag set first tells a cancel of ours from the daemon's CANCELLED at its shutdown.
 * familyd_watch_free() cancels, unrefs the call and drains the queue before freeing the
 * buffers. The channel's receive limit (client.c) bounds streamed messages as it does answers.
 */

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "client-private.h"
#include "familyd.h"
#include "common/macro.h"

struct FamilydWatch {
        grpc_completion_queue *cq;
        grpc_call *call;
        const ProtobufCMessageDescriptor *descriptor;

        grpc_byte_buffer *send_bb;
        grpc_metadata_array initial_md;
        bool start_pending;     /* the first batch is started and not plucked yet */
        bool ended;             /* the status was received: nothing more to pluck */
        atomic_bool cancelled;  /* familyd_watch_cancel() was called */

        /* Distinct addresses for the tags of the three kinds of batch. */
        char tag_start, tag_message, tag_status;
};

/* Plucks tag; false when the batch failed (the call is over: its status says why). */
static bool watch_pluck(FamilydWatch *w, void *tag) {
        /* The call's deadline, or a cancel, ends every batch: the tag always arrives. */
        grpc_event ev = grpc_completion_queue_pluck(w->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

        return ev.type == GRPC_OP_COMPLETE && ev.success;
}

FamilydWatch *familyd_watch_free(FamilydWatch *w) {
        if (!w)
                return NULL;
        if (w->call) {
                if (!w->ended)
                        (void) grpc_call_cancel(w->call, NULL);
                /* A completion left in a pluck queue is never released, and it holds the call
                 * and so the channel: pluck the first batch (the cancel ends it) if next() did
                 * not. */
                if (w->start_pending)
                        (void) watch_pluck(w, &w->tag_start);
                grpc_call_unref(w->call);
        }
        if (w->cq)
                client_cq_destroy(w->cq);
        grpc_metadata_array_destroy(&w->initial_md);
        if (w->send_bb)
                grpc_byte_buffer_destroy(w->send_bb);
        free(w);
        return NULL;
}

static inline void watch_freep(FamilydWatch **w) {
        familyd_watch_free(*w);
}

void familyd_watch_cancel(FamilydWatch *w) {
        if (!w)
                return;
        atomic_store(&w->cancelled, true);
        (void) grpc_call_cancel(w->call, NULL);
}

int familyd_client_watch(
                FamilydClient *client,
                const char *method,
                const ProtobufCMessage *request,
                const ProtobufCMessageDescriptor *message_descriptor,
                const FamilydWatchParams *params,
                FamilydWatch **ret_watch,
                FamilydError *ret_error) {

        _cleanup_(watch_freep) FamilydWatch *w = NULL;
        uint32_t timeout_ms = 0;
        grpc_call_error ce;
        grpc_op ops[4];
        int r;

        client_error_reset(ret_error);
        if (!client || !method || method[0] != '/' || !request || !message_descriptor || !ret_watch)
                return -EINVAL;
        if (params && (params->field_mask & FAMILYD_WATCH_PARAM_FIELD_TIMEOUT_MS))
                timeout_ms = params->timeout_ms;

        w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        grpc_metadata_array_init(&w->initial_md);
        atomic_init(&w->cancelled, false);
        w->descriptor = message_descriptor;

        r = client_request_pack(request, &w->send_bb);
        if (r < 0)
                return r;

        w->cq = grpc_completion_queue_create_for_pluck(NULL);
        if (!w->cq)
                return -ENOMEM;

        grpc_slice method_slice = grpc_slice_from_copied_string(method);
        w->call = grpc_channel_create_call(client->channel, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
                                           method_slice, NULL, client_deadline_from_ms(timeout_ms), NULL);
        grpc_slice_unref(method_slice);
        if (!w->call)
                return -EIO;

        /* gRPC reads fields of an op it does not use (flags, reserved): zero them all. */
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = w->send_bb;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &w->initial_md;
        ce = grpc_call_start_batch(w->call, ops, ELEMENTSOF(ops), &w->tag_start, NULL);
        if (ce != GRPC_CALL_OK)
                return -EIO;
        w->start_pending = true;

        *ret_watch = TAKE_PTR(w);
        return 0;
}

/* The stream is over: receive its status and turn it into next()'s result. */
static int watch_finish(FamilydWatch *w, FamilydError *ret_error) {
        grpc_status_code status = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_metadata_array trailing_md;
        grpc_call_error ce;
        grpc_op op = {};
        int r;

        w->ended = true;
        grpc_metadata_array_init(&trailing_md);
        op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        op.data.recv_status_on_client.trailing_metadata = &trailing_md;
        op.data.recv_status_on_client.status = &status;
        op.data.recv_status_on_client.status_details = &details;
        ce = grpc_call_start_batch(w->call, &op, 1, &w->tag_status, NULL);
        if (ce != GRPC_CALL_OK) {
                r = -EIO;
                goto finish;
        }
        (void) watch_pluck(w, &w->tag_status);

        if (atomic_load(&w->cancelled))
                r = -ECANCELED;
        else if (status == GRPC_STATUS_OK)
                r = FAMILYD_WATCH_ENDED;
        else {
                r = client_error_fill(ret_error, status, details, &trailing_md);
                if (r >= 0)
                        r = -EPROTO;
        }
finish:
        if (r != -EPROTO)
                client_error_reset(ret_error);
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&trailing_md);
        return r;
}

int familyd_watch_next(FamilydWatch *w, ProtobufCMessage **ret_message, FamilydError *ret_error) {
        grpc_byte_buffer *recv_bb = NULL;
        grpc_call_error ce;
        grpc_op op = {};
        int r;

        client_error_reset(ret_error);
        if (!w || !ret_message)
                return -EINVAL;
        if (w->ended)
                return -ESHUTDOWN;

        if (w->start_pending) {
                w->start_pending = false;
                if (!watch_pluck(w, &w->tag_start))
                        return watch_finish(w, ret_error);
        }

        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &recv_bb;
        ce = grpc_call_start_batch(w->call, &op, 1, &w->tag_message, NULL);
        if (ce != GRPC_CALL_OK) {
                /* Nothing started, so nothing to pluck: end the call here. */
                (void) grpc_call_cancel(w->call, NULL);
                (void) watch_finish(w, NULL);
                return -EIO;
        }
        if (!watch_pluck(w, &w->tag_message) || !recv_bb) {
                if (recv_bb)
                        grpc_byte_buffer_destroy(recv_bb);
                return watch_finish(w, ret_error);
        }

        r = client_response_unpack(recv_bb, w->descriptor, ret_message);
        grpc_byte_buffer_destroy(recv_bb);
        if (r < 0) {
                /* Not the daemon's status but ours: the stream cannot be trusted further. */
                (void) grpc_call_cancel(w->call, NULL);
                (void) watch_finish(w, NULL);
                return r;
        }
        return 0;
}

int familyd_watch_topology_start(FamilydClient *client, const FamilydWatchParams *params, FamilydWatch **ret_watch, FamilydError *ret_error) {
        Familyd__V1__WatchTopologyRequest req = FAMILYD__V1__WATCH_TOPOLOGY_REQUEST__INIT;

        return familyd_client_watch(client, "/familyd.v1.MeshService/WatchTopology", &req.base,
                                    &familyd__v1__topology__descriptor, params, ret_watch, ret_error);
}

int familyd_watch_topology(FamilydClient *client, const FamilydWatchParams *params, FamilydTopologyHandler handler, void *userdata, FamilydError *ret_error) {
        _cleanup_(watch_freep) FamilydWatch *w = NULL;
        int r;

        if (!handler) {
                client_error_reset(ret_error);
                return -EINVAL;
        }
        r = familyd_watch_topology_start(client, params, &w, ret_error);
        if (r < 0)
                return r;

        for (;;) {
                Familyd__V1__Topology *t = NULL;
                int k;

                r = familyd_watch_next(w, (ProtobufCMessage **) &t, ret_error);
                if (r != 0)
                        return r;
                k = handler(t, userdata);
                familyd__v1__topology__free_unpacked(t, NULL);
                if (k != 0) {
                        familyd_watch_cancel(w);
                        return k < 0 ? k : 0;
                }
        }
}
