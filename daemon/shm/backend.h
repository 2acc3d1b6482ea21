/* backend.h: the accelerator backend interface: where shard memory comes from and how it is filled. */
#pragma once

/*
 * DESIGN: two implementations, host (backend-host.c: sealed memfds, filled through the
 * daemon's mapping on all cores) and CUDA (backend-cuda.c: allocations of the driver's virtual
 * memory management API, exported as POSIX file descriptors, filled on the device). Either way
 * a segment is a descriptor the shard socket hands out; only making and filling it differ.
 * accel.c picks a rank's backend from the kind of the device the topology assigns to it.
 *
 * A backend is shared by every thread (Builds run on the build threads; a segment's last
 * reference may go on any thread) and reference-counted: its segments hold a reference, so it
 * lives until the last of them is gone.
 */

#include <stdint.h>

#include "core/error.h"
#include "materialize.h"
#include "segment.h"
#include "core/topology.h"

typedef struct ShardBackend ShardBackend;

typedef struct ShardBackendOps {
        const char *kind; /* SHARD_SEGMENT_DEVICE_KIND_HOST or _CUDA */
        /* The bytes a shard of size bytes occupies on device (its allocation granularity). */
        uint64_t (*allocation_size)(ShardBackend *b, int device, uint64_t size);
        /* 0 when shards can be made on device; else a negative errno with ret_error set. */
        int (*check_device)(ShardBackend *b, int device, FamilyError *ret_error);
        /* A new segment of allocation_size(size) bytes on device, every byte zero. */
        int (*segment_new)(ShardBackend *b, int device, const char *name, uint64_t size,
                           ShardSegment **ret, FamilyError *ret_error);
        /* Writes slices (byte offsets from the segment's start) into seg. */
        int (*fill)(ShardBackend *b, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                    FamilyError *ret_error);
        /* Copies size bytes of host memory src to offset of seg (a checkpoint's bytes); NULL
         * where the daemon writes seg through its own mapping (host memory). */
        int (*write)(ShardBackend *b, ShardSegment *seg, uint64_t offset, const void *src,
                     size_t size, FamilyError *ret_error);
        void (*free)(ShardBackend *b);
} ShardBackendOps;

struct ShardBackend {
        const ShardBackendOps *ops;
        _Atomic unsigned n_ref;
};

ShardBackend *shard_backend_ref(ShardBackend *b);
ShardBackend *shard_backend_unref(ShardBackend *b);
DEFINE_TRIVIAL_CLEANUP_FUNC(ShardBackend *, shard_backend_unref);

/* Host memory: memfds sealed against resizing (segment.h). */
int shard_backend_host_new(ShardBackend **ret);

/*
 * CUDA GPUs through the driver loaded at run time (hw/cuda-driver.h): devices are the node's
 * devices, cuda ones by local index, which is their CUDA ordinal. Opening never fails for a
 * GPU that cannot hold shards (no virtual memory management, no POSIX descriptor export, a
 * driver too old): it is marked, logged, and check_device() says why. -ENOENT, -EIO: no
 * usable driver at all (why says why).
 */
int shard_backend_cuda_new(const Device *devices, size_t n, ShardBackend **ret, char *why,
                           size_t why_size);
