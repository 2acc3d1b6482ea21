/* fuzz-wire.c: codec_wire_check, then protobuf-c unpacks what it passed, for the two request
 * types with maps of recursive Values (ResolveRequest, BuildRequest). */
#include <stdint.h>
#include <stdlib.h>

#include "codec/codec-wire.h"
#include "familyd-v1-family.pb-c.h"
#include "core/resource-limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_and_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                             size_t size) {
        int r = codec_wire_check(desc, data, size, CODEC_WIRE_MAX_DEPTH, CODEC_WIRE_MAX_MESSAGES);
        if (r != 0)
                return;
        ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, size, data);
        if (m)
                protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > FAMILYD_MAX_REQUEST_BYTES)
                return 0;
        check_and_unpack(&familyd__v1__resolve_request__descriptor, data, size);
        check_and_unpack(&familyd__v1__build_request__descriptor, data, size);
        return 0;
}
