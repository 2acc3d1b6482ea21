/* codec-status.h: the google.rpc.Status carried in the grpc-status-details-bin trailer. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Serializes google.rpc.Status{code, message, details: [Any{ErrorInfo{reason, domain,
 * metadata}}]} into a malloc'ed buffer. message must equal the grpc-message the call ends with:
 * clients (grpcio-status) compare the two. The metadata entry is added only when both
 * metadata_key and metadata_value are non-NULL. -EINVAL: NULL reason or domain; -ENOMEM. */
int codec_status_encode(int code, const char *message, const char *reason, const char *domain,
                        const char *metadata_key, const char *metadata_value,
                        uint8_t **ret, size_t *ret_size);
