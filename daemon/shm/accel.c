/* accel.c: a rank's backend by its device's kind, and the GPUs' memory budgets. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "accel.h"
#include "common/log.h"
#include "fill-share.h"

typedef struct AccelDevice {
        bool gpu;
        uint64_t budget; /* GPUs: memory less the reserve */
        uint64_t used;   /* reserved by live builds, under the lock */
} AccelDevice;

struct Accel {
        atomic_uint n_ref;
        pthread_mutex_t lock;
        ShardBackend *host;
        ShardBackend *cuda; /* NULL without GPUs, or without a driver */
        char cuda_why[256]; /* why cuda is NULL on a node with GPUs */
        AccelDevice *devices;
        size_t n_devices;
        /* What fills did, by segment kind ([0] host, [1] cuda): one add each per fill. */
        atomic_uint_fast64_t fill_bytes[2], fill_ns[2];
        /* Host fills equal to one under way copy it (fill-share.h). */
        FillShare *share;
        atomic_uint_fast64_t copied_fills;
};

struct AccelReservation {
        Accel *accel; /* a reference */
        uint64_t *bytes; /* per device */
};

ShardBackend *shard_backend_ref(ShardBackend *b) {
        if (b)
                atomic_fetch_add_explicit(&b->n_ref, 1, memory_order_relaxed);
        return b;
}

ShardBackend *shard_backend_unref(ShardBackend *b) {
        if (b && atomic_fetch_sub_explicit(&b->n_ref, 1, memory_order_acq_rel) == 1)
                b->ops->free(b);
        return NULL;
}

int accel_new(const Device *devices, size_t n, Accel **ret) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        bool any_gpu = false;
        int r;

        a = calloc(1, sizeof *a);
        if (!a)
                return -ENOMEM;
        atomic_init(&a->n_ref, 1);
        (void) pthread_mutex_init(&a->lock, NULL);
        a->devices = calloc(n ? n : 1, sizeof(AccelDevice));
        if (!a->devices)
                return -ENOMEM;
        a->n_devices = n;
        for (size_t i = 0; i < n; i++) {
                AccelDevice *d = &a->devices[i];
                if (!streq(devices[i].kind, SHARD_SEGMENT_DEVICE_KIND_CUDA))
                        continue;
                d->gpu = any_gpu = true;
                /* Unknown memory: no budget of ours, the driver's own limit is the only one. */
                d->budget = devices[i].memory_bytes > 0
                                    ? devices[i].memory_bytes -
                                              (devices[i].memory_bytes >> ACCEL_GPU_RESERVE_SHIFT)
                                    : UINT64_MAX;
        }

        r = shard_backend_host_new(&a->host);
        if (r < 0)
                return r;
        r = fill_share_new(&a->share);
        if (r < 0)
                return r;
        if (any_gpu) {
                r = shard_backend_cuda_new(devices, n, &a->cuda, a->cuda_why, sizeof a->cuda_why);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        log_warning("CUDA: the driver that listed this node's GPUs cannot be "
                                    "opened again (%s): Builds that place a rank on a GPU fail.",
                                    a->cuda_why);
        }
        *ret = TAKE_PTR(a);
        return 0;
}

Accel *accel_ref(Accel *a) {
        if (a)
                atomic_fetch_add_explicit(&a->n_ref, 1, memory_order_relaxed);
        return a;
}

Accel *accel_unref(Accel *a) {
        if (!a || atomic_fetch_sub_explicit(&a->n_ref, 1, memory_order_acq_rel) != 1)
                return NULL;
        shard_backend_unref(a->host);
        shard_backend_unref(a->cuda);
        fill_share_free(a->share);
        free(a->devices);
        (void) pthread_mutex_destroy(&a->lock);
        return mfree(a);
}

bool accel_device_is_gpu(const Accel *a, int32_t device) {
        return a && device >= 0 && (size_t) device < a->n_devices && a->devices[device].gpu;
}

const char *accel_device_kind(const Accel *a, int32_t device) {
        return accel_device_is_gpu(a, device) ? SHARD_SEGMENT_DEVICE_KIND_CUDA
                                              : SHARD_SEGMENT_DEVICE_KIND_HOST;
}

static ShardBackend *backend_of(const Accel *a, int32_t device) {
        return accel_device_is_gpu(a, device) ? a->cuda : a->host;
}

uint64_t accel_allocation_size(const Accel *a, int32_t device, uint64_t size) {
        ShardBackend *b = a ? backend_of(a, device) : NULL;
        return b ? b->ops->allocation_size(b, device, size) : size;
}

int accel_check_device(const Accel *a, int32_t device, FamilyError *ret_error) {
        if (!accel_device_is_gpu(a, device))
                return 0;
        if (!a->cuda)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "CUDA",
                                        NULL, "cannot hold shards on cuda:%d: %s", device,
                                        a->cuda_why);
        return a->cuda->ops->check_device(a->cuda, device, ret_error);
}

uint64_t accel_budget(const Accel *a, int32_t device) {
        return accel_device_is_gpu(a, device) ? a->devices[device].budget : 0;
}

uint64_t accel_in_use(Accel *a, int32_t device) {
        uint64_t u = 0;

        if (!accel_device_is_gpu(a, device))
                return 0;
        (void) pthread_mutex_lock(&a->lock);
        u = a->devices[device].used;
        (void) pthread_mutex_unlock(&a->lock);
        return u;
}

int accel_reserve(Accel *a, const int32_t *devices, const uint64_t *bytes, size_t n,
                  AccelReservation **ret, FamilyError *ret_error) {
        _cleanup_(accel_reservation_freep) AccelReservation *res = NULL;
        _cleanup_free_ uint64_t *need = NULL;
        bool any = false;

        if (n == 0) {
                *ret = NULL;
                return 0;
        }
        need = calloc(a->n_devices ? a->n_devices : 1, sizeof(uint64_t));
        if (!need)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                if (!accel_device_is_gpu(a, devices[i]))
                        return -EINVAL;
                if (__builtin_add_overflow(need[devices[i]], bytes[i], &need[devices[i]]))
                        need[devices[i]] = UINT64_MAX;
                any = any || bytes[i] > 0;
        }
        if (!any) {
                *ret = NULL;
                return 0;
        }
        res = calloc(1, sizeof *res);
        if (!res)
                return -ENOMEM;

        (void) pthread_mutex_lock(&a->lock);
        for (size_t d = 0; d < a->n_devices; d++) {
                const AccelDevice *x = &a->devices[d];
                if (need[d] == 0 || (need[d] <= x->budget && x->used <= x->budget - need[d]))
                        continue;
                uint64_t used = x->used, budget = x->budget;
                (void) pthread_mutex_unlock(&a->lock);
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "DEVICE_BUDGET", NULL,
                                        "GPU memory budget exceeded on cuda:%zu: build needs "
                                        "%" PRIu64 " bytes, %" PRIu64 " of %" PRIu64 " in use",
                                        d, need[d], used, budget);
        }
        for (size_t d = 0; d < a->n_devices; d++)
                a->devices[d].used += need[d];
        (void) pthread_mutex_unlock(&a->lock);

        res->accel = accel_ref(a);
        res->bytes = TAKE_PTR(need);
        *ret = TAKE_PTR(res);
        return 0;
}

AccelReservation *accel_reservation_free(AccelReservation *r) {
        if (!r)
                return NULL;
        if (r->accel && r->bytes) {
                Accel *a = r->accel;
                (void) pthread_mutex_lock(&a->lock);
                for (size_t d = 0; d < a->n_devices; d++)
                        a->devices[d].used -= MIN(r->bytes[d], a->devices[d].used);
                (void) pthread_mutex_unlock(&a->lock);
        }
        accel_unref(r->accel);
        free(r->bytes);
        return mfree(r);
}

int accel_segment_new(Accel *a, int32_t device, const char *name, uint64_t size,
                      ShardSegment **ret, FamilyError *ret_error) {
        if (!a)
                return shard_segment_new_host(name, size, device, ret);
        int r = accel_check_device(a, device, ret_error);
        if (r < 0)
                return r;
        ShardBackend *b = backend_of(a, device);
        return b->ops->segment_new(b, device, name, size, ret, ret_error);
}

static uint64_t monotonic_ns(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * UINT64_C(1000000000) + (uint64_t) ts.tv_nsec;
}

/* Fills seg by its kind and, when that worked, counts bytes and the time it took. */
static int fill_counted(Accel *a, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                        uint64_t bytes, FamilyError *ret_error) {
        bool host = shard_segment_is_host(seg);
        unsigned kind = host ? ACCEL_FILL_KIND_HOST : ACCEL_FILL_KIND_CUDA;
        uint64_t start = monotonic_ns();
        int r;

        if (host) {
                r = fill_share_host_fill(a ? a->share : NULL, seg, slices, n);
                if (r == FILL_SHARE_COPIED && a)
                        atomic_fetch_add_explicit(&a->copied_fills, 1, memory_order_relaxed);
        } else if (a && a->cuda)
                r = a->cuda->ops->fill(a->cuda, seg, slices, n, ret_error);
        else
                return -EINVAL;
        if (r < 0 || !a)
                return r;
        uint64_t end = monotonic_ns();
        atomic_fetch_add_explicit(&a->fill_bytes[kind], bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->fill_ns[kind], end > start ? end - start : 0,
                                  memory_order_relaxed);
        return 0;
}

int accel_fill(Accel *a, ShardSegment *seg, const BuildPlan *plan, const Layout *layout,
               const RankLayout *rank, Dtype dtype, uint64_t seed, FamilyError *ret_error) {
        _cleanup_free_ MaterializeSlice *slices = NULL;
        size_t n = 0;
        int r;

        /* dtype is the build's default: each parameter's own is in the layout. */
        (void) dtype;
        if (shard_segment_size(seg) < rank->size_bytes)
                return -EINVAL;
        r = materialize_slices(plan, layout, rank, seed, &slices, &n);
        if (r < 0)
                return r;
        /* The rank's bytes, alignment padding included: what Build and GetStatus count. */
        return fill_counted(a, seg, slices, n, rank->size_bytes, ret_error);
}

int accel_fill_slices(Accel *a, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                      FamilyError *ret_error) {
        uint64_t bytes = 0;

        for (size_t i = 0; i < n; i++)
                bytes += slices[i].byte_length;
        return fill_counted(a, seg, slices, n, bytes, ret_error);
}

int accel_write(Accel *a, ShardSegment *seg, uint64_t offset, const void *src, size_t size,
                FamilyError *ret_error) {
        uint8_t *base = shard_segment_data(seg);

        if (base) {
                if (size > shard_segment_size(seg) || offset > shard_segment_size(seg) - size)
                        return -EINVAL;
                memcpy(base + offset, src, size);
                return 0;
        }
        if (!a || !a->cuda || shard_segment_is_host(seg) || !a->cuda->ops->write)
                return -EINVAL;
        return a->cuda->ops->write(a->cuda, seg, offset, src, size, ret_error);
}

void accel_fill_counters(const Accel *a, AccelFillCounters *ret) {
        *ret = (AccelFillCounters) {};
        if (!a)
                return;
        for (size_t k = 0; k < ELEMENTSOF(ret->bytes); k++) {
                ret->bytes[k] = atomic_load_explicit(&a->fill_bytes[k], memory_order_relaxed);
                ret->ns[k] = atomic_load_explicit(&a->fill_ns[k], memory_order_relaxed);
        }
        ret->copied = atomic_load_explicit(&a->copied_fills, memory_order_relaxed);
}
