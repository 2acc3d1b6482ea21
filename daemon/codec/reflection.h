/* reflection.h: gRPC server reflection (v1 and v1alpha) answered from a FileDescriptorSet. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

/* Real reflection requests name one symbol or file. The cap keeps protobuf-c from allocating one
 * record per unknown field of a multi-megabyte request, and keeps the echoed original_request small.
 * (A candidate for resource-limits.h.) */
#define REFLECTION_MAX_REQUEST_BYTES (64u * 1024u)

typedef struct Reflection Reflection;

/* Parses and indexes a serialized google.protobuf.FileDescriptorSet (the embedded
 * familyd_descriptors). The bytes are not kept. -EBADMSG: the set does not parse; -EINVAL: it is
 * inconsistent (a file without a name, a duplicate file or symbol, a missing dependency, nesting
 * or size past the limits); -ENOMEM. */
int reflection_new(const uint8_t *descriptor_set, size_t size, Reflection **ret);
Reflection *reflection_free(Reflection *rf);
DEFINE_TRIVIAL_CLEANUP_FUNC(Reflection *, reflection_free);

/* One serialized ServerReflectionRequest in, one serialized ServerReflectionResponse out
 * (malloc'ed, the caller frees it). v1 and v1alpha are the same on the wire, so this serves both.
 * Lookups that fail are answered in-band with an error_response (NOT_FOUND), not as a failure.
 * -EBADMSG: the request does not decode, or exceeds REFLECTION_MAX_REQUEST_BYTES; -ENOMEM.
 * Never modifies rf: several calls may answer concurrently from one Reflection. */
int reflection_answer(const Reflection *rf, const uint8_t *request, size_t size,
                      uint8_t **ret_reply, size_t *ret_reply_size);
