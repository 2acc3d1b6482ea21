/* client.c: the client handle, one generic unary gRPC call, and the rich error it brings back. */

/*
 * DESIGN
 *
 * The handle owns one grpc_channel; gRPC channels are thread-safe. Each call creates its own
 * pluck completion queue, runs a single batch holding every op of a unary call, and plucks
 * that one tag. The call's deadline bounds the wait, so the pluck itself waits forever. The
 * queue is shut down, drained and destroyed before returning; nothing outlives the call.
 */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "build-config.h"
#include "client-private.h"
#include "familyd.h"
#include "google-protobuf-any.pb-c.h"
#include "common/macro.h"

/* A response may list every build or family of the node; gRPC's 4 MiB default is too small. */
#define CLIENT_MAX_RECEIVE_BYTES (64 * 1024 * 1024)

#define STATUS_DETAILS_KEY "grpc-status-details-bin"
#define ERROR_INFO_TYPE_URL_SUFFIX "/google.rpc.ErrorInfo"

static const char *const status_names[] = {
        [GRPC_STATUS_OK]                  = "OK",
        [GRPC_STATUS_CANCELLED]           = "CANCELLED",
        [GRPC_STATUS_UNKNOWN]             = "UNKNOWN",
        [GRPC_STATUS_INVALID_ARGUMENT]    = "INVALID_ARGUMENT",
        [GRPC_STATUS_DEADLINE_EXCEEDED]   = "DEADLINE_EXCEEDED",
        [GRPC_STATUS_NOT_FOUND]           = "NOT_FOUND",
        [GRPC_STATUS_ALREADY_EXISTS]      = "ALREADY_EXISTS",
        [GRPC_STATUS_PERMISSION_DENIED]   = "PERMISSION_DENIED",
        [GRPC_STATUS_RESOURCE_EXHAUSTED]  = "RESOURCE_EXHAUSTED",
        [GRPC_STATUS_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
        [GRPC_STATUS_ABORTED]             = "ABORTED",
        [GRPC_STATUS_OUT_OF_RANGE]        = "OUT_OF_RANGE",
        [GRPC_STATUS_UNIMPLEMENTED]       = "UNIMPLEMENTED",
        [GRPC_STATUS_INTERNAL]            = "INTERNAL",
        [GRPC_STATUS_UNAVAILABLE]         = "UNAVAILABLE",
        [GRPC_STATUS_DATA_LOSS]           = "DATA_LOSS",
        [GRPC_STATUS_UNAUTHENTICATED]     = "UNAUTHENTICATED",
};

const char *familyd_status_name(int code) {
        if (code < 0 || (size_t) code >= ELEMENTSOF(status_names) || !status_names[code])
                return "UNKNOWN_STATUS";
        return status_names[code];
}

void familyd_error_clear(FamilydError *error) {
        if (!error)
                return;
        free(error->message);
        free(error->reason);
        if (error->info)
                google__rpc__error_info__free_unpacked(error->info, NULL);
        *error = FAMILYD_ERROR_NULL;
}

void client_error_reset(FamilydError *error) {
        familyd_error_clear(error);
}

int familyd_client_new(const FamilydClientParams *params, FamilydClient **ret_client) {
        _cleanup_free_ FamilydClient *c = NULL;
        _cleanup_free_ char *target = NULL;
        const char *path = NULL;
        uint32_t timeout_ms = FAMILYD_CLIENT_DEFAULT_TIMEOUT_MS;

        if (!ret_client)
                return -EINVAL;

        if (params && (params->field_mask & FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH))
                path = params->socket_path;
        if (params && (params->field_mask & FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS))
                timeout_ms = params->timeout_ms;
        if (isempty(path))
                path = getenv("FAMILYD_SOCKET");
        if (isempty(path))
                path = FAMILYD_DEFAULT_SOCKET;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->timeout_ms = timeout_ms;
        c->socket_path = strdup(path);
        if (!c->socket_path)
                return -ENOMEM;
        if (asprintf(&target, "unix:%s", path) < 0) {
                target = NULL;
                free(c->socket_path);
                return -ENOMEM;
        }

        grpc_init();

        grpc_arg arg = {
                .type = GRPC_ARG_INTEGER,
                .key = (char *) GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                .value.integer = CLIENT_MAX_RECEIVE_BYTES,
        };
        grpc_channel_args args = { .num_args = 1, .args = &arg };
        grpc_channel_credentials *creds = grpc_insecure_credentials_create();
        c->channel = grpc_channel_create(target, creds, &args);
        grpc_channel_credentials_release(creds);
        if (!c->channel) {
                free(c->socket_path);
                grpc_shutdown();
                return -ENOMEM;
        }

        *ret_client = TAKE_PTR(c);
        return 0;
}

FamilydClient *familyd_client_free(FamilydClient *client) {
        if (!client)
                return NULL;
        grpc_channel_destroy(client->channel);
        free(client->socket_path);
        free(client);
        grpc_shutdown();
        return NULL;
}

const char *familyd_client_get_socket_path(const FamilydClient *client) {
        return client ? client->socket_path : NULL;
}

uint32_t familyd_client_get_timeout_ms(const FamilydClient *client) {
        return client ? client->timeout_ms : 0;
}

static char *slice_strdup(grpc_slice s) {
        size_t n = GRPC_SLICE_LENGTH(s);
        char *p = malloc(n + 1);

        if (!p)
                return NULL;
        memcpy(p, GRPC_SLICE_START_PTR(s), n);
        p[n] = 0;
        return p;
}

/* The trailer holds a serialized google.rpc.Status; the first detail that is an ErrorInfo gives
 * the reason. A trailer that does not decode is ignored: the status code and message, which
 * always arrive, are what the caller acts on. */
static int error_parse_details(const grpc_metadata_array *trailers, FamilydError *error) {
        for (size_t i = 0; i < trailers->count; i++) {
                const grpc_metadata *md = &trailers->metadata[i];
                Google__Rpc__Status *st;

                if (GRPC_SLICE_LENGTH(md->key) != strlen(STATUS_DETAILS_KEY) ||
                    memcmp(GRPC_SLICE_START_PTR(md->key), STATUS_DETAILS_KEY, strlen(STATUS_DETAILS_KEY)) != 0)
                        continue;

                st = google__rpc__status__unpack(NULL, GRPC_SLICE_LENGTH(md->value), GRPC_SLICE_START_PTR(md->value));
                if (!st)
                        return 0;

                for (size_t j = 0; j < st->n_details; j++) {
                        const Google__Protobuf__Any *any = st->details[j];
                        size_t ul = any->type_url ? strlen(any->type_url) : 0, sl = strlen(ERROR_INFO_TYPE_URL_SUFFIX);

                        if (ul < sl || !streq(any->type_url + ul - sl, ERROR_INFO_TYPE_URL_SUFFIX))
                                continue;

                        error->info = google__rpc__error_info__unpack(NULL, any->value.len, any->value.data);
                        if (error->info && !isempty(error->info->reason)) {
                                error->reason = strdup(error->info->reason);
                                if (!error->reason) {
                                        google__rpc__status__free_unpacked(st, NULL);
                                        return -ENOMEM;
                                }
                        }
                        break;
                }
                google__rpc__status__free_unpacked(st, NULL);
                return 0;
        }
        return 0;
}

int client_error_fill(FamilydError *error, grpc_status_code status, grpc_slice details,
                      const grpc_metadata_array *trailers) {
        if (!error)
                return 0;
        familyd_error_clear(error);
        error->code = status;
        error->message = slice_strdup(details);
        if (!error->message)
                return -ENOMEM;
        return error_parse_details(trailers, error);
}

int client_request_pack(const ProtobufCMessage *request, grpc_byte_buffer **ret) {
        size_t n = protobuf_c_message_get_packed_size(request);
        grpc_slice s = grpc_slice_malloc(n);

        (void) protobuf_c_message_pack(request, GRPC_SLICE_START_PTR(s));
        *ret = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        return *ret ? 0 : -ENOMEM;
}

int client_response_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **ret) {
        grpc_byte_buffer_reader reader;
        ProtobufCMessage *m;
        grpc_slice s;

        if (!bb)
                return -EBADMSG;
        if (!grpc_byte_buffer_reader_init(&reader, bb))
                return -EBADMSG;
        s = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);

        m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        grpc_slice_unref(s);
        if (!m)
                return -EBADMSG;
        *ret = m;
        return 0;
}

gpr_timespec client_deadline_from_ms(uint32_t ms) {
        if (ms == 0)
                return gpr_inf_future(GPR_CLOCK_MONOTONIC);
        return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

void client_cq_destroy(grpc_completion_queue *cq) {
        grpc_event ev;

        grpc_completion_queue_shutdown(cq);
        do
                ev = grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        while (ev.type != GRPC_QUEUE_SHUTDOWN);
        grpc_completion_queue_destroy(cq);
}

int familyd_client_call(
                FamilydClient *client,
                const char *method,
                const ProtobufCMessage *request,
                const ProtobufCMessageDescriptor *response_descriptor,
                ProtobufCMessage **ret_response,
                FamilydError *ret_error) {

        grpc_metadata_array initial_md, trailing_md;
        grpc_byte_buffer *send_bb = NULL, *recv_bb = NULL;
        grpc_status_code status = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_completion_queue *cq;
        grpc_call *call;
        grpc_call_error ce;
        grpc_op ops[6];
        grpc_event ev;
        void *tag = &ops;   /* any unique address */
        int r;

        client_error_reset(ret_error);
        if (!client || !method || method[0] != '/' || !request || !response_descriptor || !ret_response)
                return -EINVAL;

        r = client_request_pack(request, &send_bb);
        if (r < 0)
                return r;

        cq = grpc_completion_queue_create_for_pluck(NULL);
        if (!cq) {
                grpc_byte_buffer_destroy(send_bb);
                return -ENOMEM;
        }

        grpc_slice method_slice = grpc_slice_from_copied_string(method);
        call = grpc_channel_create_call(client->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                        method_slice, NULL, client_deadline_from_ms(client->timeout_ms), NULL);
        grpc_slice_unref(method_slice);
        if (!call) {
                grpc_byte_buffer_destroy(send_bb);
                client_cq_destroy(cq);
                return -EIO;
        }

        grpc_metadata_array_init(&initial_md);
        grpc_metadata_array_init(&trailing_md);

        /* gRPC reads fields of an op it does not use (flags, reserved): zero them all. */
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

        ce = grpc_call_start_batch(call, ops, ELEMENTSOF(ops), tag, NULL);
        if (ce != GRPC_CALL_OK) {
                r = -EIO;
                goto finish;
        }

        /* The call's deadline ends the batch; the tag always arrives. */
        ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
                r = -EIO;
                goto finish;
        }

        if (status != GRPC_STATUS_OK) {
                r = client_error_fill(ret_error, status, details, &trailing_md);
                if (r >= 0)
                        r = -EPROTO;
                goto finish;
        }

        r = client_response_unpack(recv_bb, response_descriptor, ret_response);

finish:
        if (r < 0 && r != -EPROTO)
                client_error_reset(ret_error);
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&initial_md);
        grpc_metadata_array_destroy(&trailing_md);
        grpc_byte_buffer_destroy(send_bb);
        if (recv_bb)
                grpc_byte_buffer_destroy(recv_bb);
        grpc_call_unref(call);
        client_cq_destroy(cq);
        return r;
}
