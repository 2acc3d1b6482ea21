/* client-private.h: what client.c shares with the other files of libfamilyd (not installed). */
#pragma once

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "familyd-v1-shard.pb-c.h"
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

/* One request on the shard socket (shard.c): connects to shard_socket_path (NULL or "": beside
 * the API socket), sends req as one frame with send_fds (0..FAMILYD_SHARD_MAX_TOKENS, may be
 * NULL when none) as SCM_RIGHTS on its first bytes, and reads the reply, all within the
 * client's timeout (client may be NULL: no timeout, a path needed). On success *ret_reply is
 * the caller's (familyd__v1__shard_fd_reply__free_unpacked) with code 0, and ret_fds (room for
 * FAMILYD_SHARD_MAX_TOKENS) the *ret_n_fds descriptors that came with it, the caller's to
 * close. A reply with another code is -EPROTO with *ret_error filled; otherwise the errors of
 * familyd_shard_fetch(), and no descriptor is left open. send_fds stay the caller's. */
int shard_socket_exchange(
                FamilydClient *client,
                const char *shard_socket_path,
                const Familyd__V1__ShardFdRequest *req,
                const int *send_fds,
                size_t n_send_fds,
                Familyd__V1__ShardFdReply **ret_reply,
                int *ret_fds,
                size_t *ret_n_fds,
                FamilydError *ret_error);
