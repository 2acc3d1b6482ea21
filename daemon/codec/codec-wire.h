/* codec-wire.h: a bounded, iterative pre-scan of protobuf wire bytes before protobuf-c unpacks them (into an arena). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "core/arena.h"
#include "core/resource-limits.h"

/*
 * protobuf_c_message_unpack() recurses once per nested message and allocates one struct per
 * message, without any limit: familyd.v1.Value -> ValueList -> Value is recursive, so a small
 * request can overflow the stack, and a 4 MiB one can hold a million tiny messages. The limits
 * (FAMILYD_MAX_REQUEST_DEPTH, _MESSAGES, _FIELDS) live in resource-limits.h.
 */
#define CODEC_WIRE_MAX_DEPTH     FAMILYD_MAX_REQUEST_DEPTH
#define CODEC_WIRE_MAX_MESSAGES  FAMILYD_MAX_REQUEST_MESSAGES

/*
 * Walks the wire bytes of one message of type desc without recursion and without decoding
 * anything, and checks the tree of messages protobuf-c would build from them.
 *
 * Depth: the top-level message is at depth 0; a submessage (a length-delimited field whose type
 * is a message, map entries included, empty ones included) is one deeper than the message that
 * holds it. For a ResolveRequest: arguments entry 1, its Value 2, that Value's ValueList 3, a
 * Value in it 4, and so on: a Value wrapped in n list levels puts its innermost Value at 2 + 2n.
 *
 * Returns 0 when no submessage is deeper than max_depth and there are at most max_messages
 * submessages (the top-level message is not counted); -ELOOP when a submessage lies deeper than
 * max_depth; -E2BIG when there are more than max_messages, or more than
 * FAMILYD_MAX_REQUEST_FIELDS fields of any kind (whichever is met first in byte order; depth
 * first when one submessage breaks both); -ENOMEM.
 *
 * Malformed bytes (a varint that does not end, a length past the end of its enclosing message,
 * wire types 3, 4, 6 and 7) end the scan with 0: protobuf-c rejects the message that holds them
 * while scanning its fields, before it descends into any of them, and everything it could have
 * descended into earlier has been checked here already. Anything protobuf-c might accept is
 * scanned on: field number 0 (protobuf-c accepts it when not minimally encoded) and unknown
 * fields are skipped by their wire type, and a message field with the wrong wire type is skipped
 * too (protobuf-c refuses it). Every read is bounded by size; lengths are 64-bit safe.
 */
int codec_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size,
                     unsigned max_depth, size_t max_messages);

/* protobuf-c's allocations in an Arena: a message unpacked with it is released with the arena
 * (its free_unpacked need not be called). */
ProtobufCAllocator codec_wire_arena_allocator(Arena *a);
