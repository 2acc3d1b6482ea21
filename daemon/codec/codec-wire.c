/* codec-wire.c: checks the depth and size of a message tree in wire bytes, iteratively; protobuf-c's allocator over an arena. */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "codec-wire.h"
#include "core/resource-limits.h"
#include "common/macro.h"

/* protobuf-c's own bounds: a tag takes at most 5 bytes, any other varint at most 10. */
#define WIRE_TAG_MAX_BYTES     5u
#define WIRE_VARINT_MAX_BYTES  10u

enum {
        WIRE_TYPE_VARINT = 0,
        WIRE_TYPE_64BIT = 1,
        WIRE_TYPE_LENGTH_DELIMITED = 2,
        WIRE_TYPE_32BIT = 5,
};

/* The message being scanned when a submessage was entered: where to carry on after it. */
typedef struct WireFrame {
        const ProtobufCMessageDescriptor *desc;
        size_t end;
} WireFrame;

/* Reads a varint from data[*pos, end) into *ret; false when it does not end within max_bytes
 * or before end. Bits past the 64th are dropped, as protobuf-c does. */
static bool wire_read_varint(const uint8_t *data, size_t end, size_t *pos, unsigned max_bytes,
                             uint64_t *ret) {
        uint64_t v = 0;

        assert(*pos <= end);

        for (unsigned i = 0; i < max_bytes && i < end - *pos; i++) {
                uint8_t b = data[*pos + i];

                v |= (uint64_t) (b & 0x7f) << (7 * i);
                if (!(b & 0x80)) {
                        *pos += i + 1;
                        *ret = v;
                        return true;
                }
        }
        return false;
}

int codec_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size,
                     unsigned max_depth, size_t max_messages) {
        _cleanup_free_ WireFrame *frames = NULL;
        size_t n_frames = 0, depth = 0, messages = 0, fields = 0, pos = 0, end = size;

        assert(desc);
        assert(data || size == 0);

        for (;;) {
                const ProtobufCFieldDescriptor *field;
                uint64_t key, value;

                /* Back out of every submessage that ends here. */
                while (pos == end) {
                        if (depth == 0)
                                return 0;
                        depth--;
                        desc = frames[depth].desc;
                        end = frames[depth].end;
                }

                /* The number has at most 32 bits: 5 bytes, 3 of them the wire type. */
                if (!wire_read_varint(data, end, &pos, WIRE_TAG_MAX_BYTES, &key))
                        return 0;
                /* protobuf-c keeps ~70 bytes of bookkeeping per field it reads, known or not. */
                if (++fields > FAMILYD_MAX_REQUEST_FIELDS)
                        return -E2BIG;

                switch (key & 7) {
                case WIRE_TYPE_VARINT:
                        if (!wire_read_varint(data, end, &pos, WIRE_VARINT_MAX_BYTES, &value))
                                return 0;
                        break;
                case WIRE_TYPE_64BIT:
                        if (end - pos < 8)
                                return 0;
                        pos += 8;
                        break;
                case WIRE_TYPE_32BIT:
                        if (end - pos < 4)
                                return 0;
                        pos += 4;
                        break;
                case WIRE_TYPE_LENGTH_DELIMITED:
                        if (!wire_read_varint(data, end, &pos, WIRE_VARINT_MAX_BYTES, &value))
                                return 0;
                        if (value > end - pos)
                                return 0;

                        field = protobuf_c_message_descriptor_get_field(desc, (unsigned) (key >> 3));
                        if (!field || field->type != PROTOBUF_C_TYPE_MESSAGE) {
                                pos += (size_t) value;
                                break;
                        }

                        /* protobuf-c would unpack it, one call deeper, even when empty. */
                        if (depth >= max_depth)
                                return -ELOOP;
                        if (messages >= max_messages)
                                return -E2BIG;
                        messages++;

                        if (!GREEDY_REALLOC(frames, n_frames, depth + 1))
                                return -ENOMEM;
                        frames[depth++] = (WireFrame) { .desc = desc, .end = end };
                        desc = field->descriptor;
                        end = pos + (size_t) value;
                        break;
                default:
                        /* Groups (3, 4) and 6, 7: protobuf-c refuses them. */
                        return 0;
                }
        }
}

static void *arena_pb_alloc(void *data, size_t size) {
        return arena_alloc(data, size);
}

static void arena_pb_free(void *data, void *p) {
        /* Released with the arena. */
}

ProtobufCAllocator codec_wire_arena_allocator(Arena *a) {
        return (ProtobufCAllocator) { .alloc = arena_pb_alloc, .free = arena_pb_free,
                                      .allocator_data = a };
}
