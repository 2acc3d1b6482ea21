/* sealed-segments.h: the shard tests' segments: a host memfd of a size, filled with one byte, sealed as a build's are. Include after cmocka.h. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "shm/segment.h"

/* A sealed host segment of size bytes, every byte fill; writable: a writable build's. */
static inline ShardSegment *segment_make(uint64_t size, int device, uint8_t fill,
                                         bool writable) {
        ShardSegment *s = NULL;

        assert_int_equal(shard_segment_new_host("test", size, device, &s), 0);
        memset(shard_segment_data(s), fill, size);
        shard_segment_unmap(s);
        if (writable)
                shard_segment_allow_writes(s);
        assert_int_equal(shard_segment_seal(s), 0);
        return s;
}

static inline ShardSegment *segment_new(uint64_t size, int device, uint8_t fill) {
        return segment_make(size, device, fill, false);
}
