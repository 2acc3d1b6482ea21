/* backend-host.c: the host backend: sealed memfds, huge pages where allowed, filled in place. */
#include <stdatomic.h>

#include "backend.h"
#include "huge-pages.h"

static uint64_t host_allocation_size(ShardBackend *b, int device, uint64_t size) {
        /* What a segment will really take: a hugetlb one rounds up to the page size. */
        return huge_pages_allocation_size(size);
}

static int host_check_device(ShardBackend *b, int device, FamilyError *ret_error) {
        return 0;
}

static int host_segment_new(ShardBackend *b, int device, const char *name, uint64_t size,
                            ShardSegment **ret, FamilyError *ret_error) {
        return shard_segment_new_host(name, size, device, ret);
}

static int host_fill(ShardBackend *b, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                     FamilyError *ret_error) {
        return materialize_host_fill(seg, slices, n);
}

static void host_free(ShardBackend *b) {
        free(b);
}

static const ShardBackendOps host_ops = {
        .kind = SHARD_SEGMENT_DEVICE_KIND_HOST,
        .allocation_size = host_allocation_size,
        .check_device = host_check_device,
        .segment_new = host_segment_new,
        .fill = host_fill,
        .free = host_free,
};

int shard_backend_host_new(ShardBackend **ret) {
        ShardBackend *b = calloc(1, sizeof *b);

        if (!b)
                return -ENOMEM;
        b->ops = &host_ops;
        atomic_init(&b->n_ref, 1);
        *ret = b;
        return 0;
}
