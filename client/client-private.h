/* client-private.h: what client.c shares with the other files of libfamilyd (not installed). */
#pragma once

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "familyd.h"

/* None of these names starts with familyd_: libfamilyd.sym exports only those, so these stay
 * local to the library. */

struct FamilydClient {
        char *socket_path;
        uint32_t timeout_ms;
        grpc_channel *channel;
};

/* Resets *error (may be NULL) to FAMILYD_ERROR_NULL. */
void client_error_reset(FamilydError *error);

/* Fills *error (may be NULL) from a status other than OK: code, message, and the ErrorInfo of
 * the trailers' grpc-status-details-bin. Returns 0 or -ENOMEM. */
int client_error_fill(FamilydError *error, grpc_status_code status, grpc_slice details,
                      const grpc_metadata_array *trailers);

/* The request as a byte buffer for SEND_MESSAGE (destroyed by the caller). */
int client_request_pack(const ProtobufCMessage *request, grpc_byte_buffer **ret);

/* A received buffer as a message of desc: -EBADMSG when absent or it does not decode. */
int client_response_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **ret);

/* Now plus ms on the monotonic clock; 0: no deadline. */
gpr_timespec client_deadline_from_ms(uint32_t ms);

/* Shuts a pluck queue down, drops what is left in it, and destroys it. */
void client_cq_destroy(grpc_completion_queue *cq);
