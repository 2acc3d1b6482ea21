/* backend-cuda.c: the CUDA backend: VMM allocations exported as POSIX descriptors, filled on the GPU. */

/*
 * DESIGN
 *
 * Memory. A shard is one allocation of cuMemCreate (pinned, on the rank's GPU, requesting
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), its size rounded up to the GPU's minimum
 * allocation granularity (the driver refuses other sizes). cuMemExportToShareableHandle gives
 * the descriptor the shard socket hands out (dups of it); trainers import it with
 * cuMemImportFromShareableHandle, map it and set access themselves. The daemon keeps the
 * allocation handle and that descriptor until the segment's last reference goes; the memory
 * lives on while any importer still maps it or holds a handle (the driver's rule).
 *
 * Filling. The daemon maps the allocation into a reservation of its own (cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess read-write for the GPU), clears every byte (device memory comes
 * with whatever an earlier user left: the padding between slices and past the last one must
 * not hand that to a trainer), writes the slices, synchronises, and unmaps. A slice with a
 * constant pattern or a uniform init, of at most FK_RANK_MAX dimensions the walk needs, is
 * written by the fill kernel (cuda-fill.cu, embedded as PTX and loaded into each GPU's
 * primary context at start); every other slice (normal, trunc_normal, or when the kernel could not be
 * loaded, or FAMILYD_CUDA_FILL=host) is computed by fill.c into a host staging buffer, in
 * pieces of whole rows of its first dimension, and copied up with cuMemcpyHtoD. Both are
 * bit-exact with the host backend: staging by construction, the kernel by the rules of
 * cuda-fill-kernel.h.
 *
 * Contexts. Each GPU's primary context is retained at start and made current on whichever
 * thread calls the driver (build threads, and any thread that drops a segment's last
 * reference) right before the calls: the driver API is thread-safe, and the primary context is
 * the one trainers' CUDA runtimes use too.
 */

#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>

#include "backend.h"
#include "common/cuda-driver.h"
#include "cuda-fill-params.h"
#include "common/log.h"

/* The fill kernel's PTX, NUL-terminated (cuda-fill.ptx, embedded by embed-ptx.sh). */
extern unsigned char cuda_fill_ptx[];

/* Host staging per piece: whole rows of a slice's first dimension, about this many bytes. */
#define CUDA_STAGING_BYTES (64u << 20)
#define CUDA_FILL_THREADS 256u
#define CUDA_FILL_MAX_BLOCKS (1u << 20)

typedef struct CudaGpu {
        bool present;    /* a cuda device of this node */
        CudaDevice dev;
        CudaContext ctx; /* its retained primary context, or NULL */
        size_t granularity;
        CudaModule module; /* the fill kernel, or NULL */
        CudaFunction fill;
        char why[224]; /* not empty: this GPU cannot hold shards, and why */
} CudaGpu;

typedef struct CudaBackend {
        ShardBackend base;
        CudaDriver driver;
        CudaGpu *gpus; /* by local device index (= CUDA ordinal) */
        size_t n_gpus;
} CudaBackend;

/* A segment's device memory. */
typedef struct CudaMemory {
        CudaBackend *backend; /* a reference */
        int ordinal;
        CudaMemHandle handle;
        uint64_t size;
} CudaMemory;

static CudaBackend *cuda_of(ShardBackend *b) {
        return (CudaBackend *) b;
}

static CudaGpu *gpu_of(CudaBackend *c, int device) {
        if (device < 0 || (size_t) device >= c->n_gpus || !c->gpus[device].present)
                return NULL;
        return &c->gpus[device];
}

/* A driver failure as the Build's answer; logged once here. */
static int cuda_fail(CudaBackend *c, int device, const char *call, CudaResult r,
                     FamilyError *ret_error) {
        const char *text = cuda_driver_error(&c->driver, r);

        log_warning("CUDA: %s on cuda:%d failed: %s (CUresult %d)", call, device, text, r);
        if (r == CUDA_DRIVER_ERROR_OUT_OF_MEMORY)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                        "DEVICE_MEMORY", NULL,
                                        "GPU memory exhausted on cuda:%d (%s: %s); nothing was "
                                        "kept",
                                        device, call, text);
        return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "CUDA", NULL,
                                "the CUDA driver failed on cuda:%d: %s: %s (CUresult %d); "
                                "nothing was kept",
                                device, call, text, r);
}

static CudaResult gpu_enter(CudaBackend *c, CudaGpu *g) {
        return c->driver.ctx_set_current(g->ctx);
}

static CudaMemAllocationProp gpu_prop(int device) {
        return (CudaMemAllocationProp) {
                .type = CUDA_DRIVER_MEM_ALLOCATION_TYPE_PINNED,
                .requested_handle_types = CUDA_DRIVER_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, .id = device },
        };
}

static uint64_t cuda_allocation_size(ShardBackend *b, int device, uint64_t size) {
        CudaGpu *g = gpu_of(cuda_of(b), device);
        uint64_t gran = g && g->granularity > 0 ? g->granularity : 1;

        if (size > UINT64_MAX - (gran - 1))
                return UINT64_MAX;
        return (size + gran - 1) / gran * gran;
}

static int cuda_check_device(ShardBackend *b, int device, FamilyError *ret_error) {
        CudaGpu *g = gpu_of(cuda_of(b), device);

        if (!g)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "CUDA",
                                        NULL, "cuda:%d is not a GPU of this node", device);
        if (g->why[0])
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "CUDA",
                                        NULL, "cannot hold shards on cuda:%d: %s", device,
                                        g->why);
        return 0;
}

/* ---- mapping the daemon's own view of an allocation ------------------------------------- */

typedef struct CudaView {
        CudaDevicePtr va;
        uint64_t size;
        bool reserved, mapped;
} CudaView;

/* Maps handle read-write for its GPU at a fresh reservation. The GPU's context is current. */
static int view_map(CudaBackend *c, int device, CudaMemHandle handle, uint64_t size,
                    CudaView *v, FamilyError *ret_error) {
        const CudaDriver *d = &c->driver;
        CudaGpu *g = &c->gpus[device];
        CudaResult r;

        *v = (CudaView) { .size = size };
        r = d->mem_address_reserve(&v->va, (size_t) size, g->granularity, 0, 0);
        if (r != 0)
                return cuda_fail(c, device, "cuMemAddressReserve", r, ret_error);
        v->reserved = true;
        r = d->mem_map(v->va, (size_t) size, 0, handle, 0);
        if (r != 0)
                return cuda_fail(c, device, "cuMemMap", r, ret_error);
        v->mapped = true;
        CudaMemAccessDesc access = {
                .location = { .type = CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, .id = device },
                .flags = CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        r = d->mem_set_access(v->va, (size_t) size, &access, 1);
        if (r != 0)
                return cuda_fail(c, device, "cuMemSetAccess", r, ret_error);
        return 0;
}

static void view_unmap(CudaBackend *c, int device, CudaView *v) {
        CudaResult r;

        if (v->mapped) {
                r = c->driver.mem_unmap(v->va, (size_t) v->size);
                if (r != 0)
                        log_warning("CUDA: cuMemUnmap on cuda:%d failed, ignoring: %s", device,
                                    cuda_driver_error(&c->driver, r));
        }
        if (v->reserved) {
                r = c->driver.mem_address_free(v->va, (size_t) v->size);
                if (r != 0)
                        log_warning("CUDA: cuMemAddressFree on cuda:%d failed, ignoring: %s",
                                    device, cuda_driver_error(&c->driver, r));
        }
        *v = (CudaView) {};
}

/* ---- segments ------------------------------------------------------------------------ */

static void cuda_memory_release(void *p) {
        CudaMemory *m = p;
        CudaBackend *c = m->backend;
        CudaGpu *g = &c->gpus[m->ordinal];

        /* Any thread may drop the last reference: make the GPU's context current here. */
        CudaResult r = gpu_enter(c, g);
        if (r == 0)
                r = c->driver.mem_release(m->handle);
        if (r != 0)
                log_warning("CUDA: cuMemRelease on cuda:%d failed, ignoring: %s", m->ordinal,
                            cuda_driver_error(&c->driver, r));
        shard_backend_unref(&c->base);
        free(m);
}

static const ShardSegmentDeviceOps cuda_segment_ops = {
        .kind = SHARD_SEGMENT_DEVICE_KIND_CUDA,
        .release = cuda_memory_release,
};

static int cuda_segment_new(ShardBackend *b, int device, const char *name, uint64_t size,
                            ShardSegment **ret, FamilyError *ret_error) {
        CudaBackend *c = cuda_of(b);
        const CudaDriver *d = &c->driver;
        _cleanup_(shard_segment_unrefp) ShardSegment *seg = NULL;
        _cleanup_close_ int fd = -1;
        CudaMemHandle handle = 0;
        CudaView view;
        CudaResult cr;
        int r;

        r = cuda_check_device(b, device, ret_error);
        if (r < 0)
                return r;
        CudaGpu *g = &c->gpus[device];
        uint64_t alloc = cuda_allocation_size(b, device, size);
        if (size == 0 || alloc > SIZE_MAX || alloc > (uint64_t) INT64_MAX)
                return -EINVAL;

        cr = gpu_enter(c, g);
        if (cr != 0)
                return cuda_fail(c, device, "cuCtxSetCurrent", cr, ret_error);
        CudaMemAllocationProp prop = gpu_prop(device);
        cr = d->mem_create(&handle, (size_t) alloc, &prop, 0);
        if (cr != 0)
                return cuda_fail(c, device, "cuMemCreate", cr, ret_error);
        cr = d->mem_export_to_shareable_handle(&fd, handle,
                                               CUDA_DRIVER_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (cr != 0) {
                fd = -1;
                (void) d->mem_release(handle);
                return cuda_fail(c, device, "cuMemExportToShareableHandle", cr, ret_error);
        }
        /* The driver's descriptor may lack close-on-exec; ours never do. */
        if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                r = -errno;
                (void) d->mem_release(handle);
                return r;
        }

        CudaMemory *m = calloc(1, sizeof *m);
        if (!m) {
                (void) d->mem_release(handle);
                return -ENOMEM;
        }
        *m = (CudaMemory) {
                .backend = cuda_of(shard_backend_ref(b)),
                .ordinal = device,
                .handle = handle,
                .size = alloc,
        };
        r = shard_segment_new_device(&cuda_segment_ops, m, fd, alloc, device, &seg);
        if (r < 0) {
                cuda_memory_release(m);
                return r;
        }
        TAKE_FD(fd);

        /* Every byte zero (see DESIGN). */
        r = view_map(c, device, handle, alloc, &view, ret_error);
        if (r >= 0) {
                cr = d->memset_d8(view.va, 0, (size_t) alloc);
                if (cr == 0)
                        cr = d->ctx_synchronize();
                if (cr != 0)
                        r = cuda_fail(c, device, "cuMemsetD8", cr, ret_error);
        }
        view_unmap(c, device, &view);
        if (r < 0)
                return r;

        log_debug("CUDA: %s: %" PRIu64 " bytes on cuda:%d (%" PRIu64 " asked)", strempty(name),
                  alloc, device, size);
        *ret = TAKE_PTR(seg);
        return 0;
}

/* ---- filling ---------------------------------------------------------------------------- */

static int fill_kernel(CudaBackend *c, int device, const FillKernelParams *p,
                       FamilyError *ret_error) {
        CudaGpu *g = &c->gpus[device];
        uint64_t blocks = (p->n + CUDA_FILL_THREADS - 1) / CUDA_FILL_THREADS;
        FillKernelParams copy = *p;
        void *params[] = { &copy };

        if (p->n == 0)
                return 0;
        if (blocks > CUDA_FILL_MAX_BLOCKS)
                blocks = CUDA_FILL_MAX_BLOCKS;
        CudaResult r = c->driver.launch_kernel(g->fill, (unsigned) blocks, 1, 1, CUDA_FILL_THREADS,
                                               1, 1, 0, NULL, params, NULL);
        if (r != 0)
                return cuda_fail(c, device, "cuLaunchKernel", r, ret_error);
        return 0;
}

/* Through host memory: pieces of whole rows of the first dimension (see DESIGN). */
static int fill_staged(CudaBackend *c, int device, const MaterializeSlice *m, CudaDevicePtr base,
                       uint8_t **buf, size_t *buf_size, FamilyError *ret_error) {
        const FillSlice *s = &m->fill;
        size_t esize = dtype_size(m->spec.dtype);
        uint64_t rows = s->rank > 0 ? (uint64_t) s->local_shape[0] : 1, row_bytes = esize;
        int64_t local[FILL_RANK_MAX], offset[FILL_RANK_MAX];
        int r;

        for (size_t d = 1; d < s->rank; d++)
                row_bytes *= (uint64_t) s->local_shape[d];
        if (rows == 0 || row_bytes == 0)
                return 0;
        uint64_t per = MAX(CUDA_STAGING_BYTES / row_bytes, (uint64_t) 1);
        uint64_t want = MIN(per, rows) * row_bytes;
        if (want > SIZE_MAX)
                return -ENOMEM;
        if (*buf_size < want) {
                uint8_t *n = realloc(*buf, (size_t) want);
                if (!n)
                        return -ENOMEM;
                *buf = n;
                *buf_size = (size_t) want;
        }
        if (s->rank > 0) {
                memcpy(local, s->local_shape, s->rank * sizeof(int64_t));
                memcpy(offset, s->global_offset, s->rank * sizeof(int64_t));
        }

        for (uint64_t k = 0; k < rows; k += per) {
                uint64_t take = MIN(per, rows - k);
                FillSlice piece = *s;

                if (s->rank > 0) {
                        local[0] = (int64_t) take;
                        offset[0] = s->global_offset[0] + (int64_t) k;
                        piece.local_shape = local;
                        piece.global_offset = offset;
                }
                piece.dst = *buf;
                r = fill_run(&piece, 1, 0);
                if (r < 0)
                        return r;
                CudaResult cr = c->driver.memcpy_htod(base + m->byte_offset + k * row_bytes, *buf,
                                                      (size_t) (take * row_bytes));
                if (cr != 0)
                        return cuda_fail(c, device, "cuMemcpyHtoD", cr, ret_error);
        }
        return 0;
}

static int cuda_fill(ShardBackend *b, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                     FamilyError *ret_error) {
        CudaBackend *c = cuda_of(b);
        CudaMemory *m = shard_segment_device_memory(seg);
        _cleanup_free_ uint8_t *buf = NULL;
        size_t buf_size = 0;
        unsigned kernels = 0;
        CudaView view = {};
        CudaResult cr;
        int r;

        if (!m || m->backend != c)
                return -EINVAL;
        int device = m->ordinal;
        CudaGpu *g = &c->gpus[device];
        for (size_t i = 0; i < n; i++)
                if (slices[i].byte_length > m->size ||
                    slices[i].byte_offset > m->size - slices[i].byte_length)
                        return -EINVAL;

        cr = gpu_enter(c, g);
        if (cr != 0)
                return cuda_fail(c, device, "cuCtxSetCurrent", cr, ret_error);
        r = view_map(c, device, m->handle, m->size, &view, ret_error);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                FillKernelParams p;

                if (g->fill && cuda_fill_kernel_params(&slices[i], view.va, &p)) {
                        r = fill_kernel(c, device, &p, ret_error);
                        kernels++;
                } else
                        r = fill_staged(c, device, &slices[i], view.va, &buf, &buf_size,
                                        ret_error);
        }
        if (r >= 0) {
                cr = c->driver.ctx_synchronize();
                if (cr != 0)
                        r = cuda_fail(c, device, "cuCtxSynchronize", cr, ret_error);
        }
        view_unmap(c, device, &view);
        if (r >= 0)
                log_debug("CUDA: filled %zu slice%s on cuda:%d (%u by the kernel)", n,
                          n == 1 ? "" : "s", device, kernels);
        return r;
}

static int cuda_write(ShardBackend *b, ShardSegment *seg, uint64_t offset, const void *src,
                      size_t size, FamilyError *ret_error) {
        CudaBackend *c = cuda_of(b);
        CudaMemory *m = shard_segment_device_memory(seg);
        CudaView view = {};
        CudaResult cr;
        int r;

        if (!m || m->backend != c || size > m->size || offset > m->size - size)
                return -EINVAL;
        int device = m->ordinal;
        cr = gpu_enter(c, &c->gpus[device]);
        if (cr != 0)
                return cuda_fail(c, device, "cuCtxSetCurrent", cr, ret_error);
        r = view_map(c, device, m->handle, m->size, &view, ret_error);
        if (r >= 0) {
                cr = c->driver.memcpy_htod(view.va + offset, src, size);
                if (cr != 0)
                        r = cuda_fail(c, device, "cuMemcpyHtoD", cr, ret_error);
        }
        view_unmap(c, device, &view);
        return r;
}

/* ---- opening and closing ---------------------------------------------------------------- */

static void cuda_free(ShardBackend *b) {
        CudaBackend *c = cuda_of(b);

        for (size_t i = 0; i < c->n_gpus; i++) {
                CudaGpu *g = &c->gpus[i];
                if (!g->ctx)
                        continue;
                if (g->module && gpu_enter(c, g) == 0)
                        (void) c->driver.module_unload(g->module);
                (void) c->driver.primary_ctx_release(g->dev);
        }
        if (c->driver.ctx_set_current)
                (void) c->driver.ctx_set_current(NULL);
        cuda_driver_close(&c->driver);
        free(c->gpus);
        free(c);
}

static const ShardBackendOps cuda_ops = {
        .kind = SHARD_SEGMENT_DEVICE_KIND_CUDA,
        .allocation_size = cuda_allocation_size,
        .check_device = cuda_check_device,
        .segment_new = cuda_segment_new,
        .fill = cuda_fill,
        .write = cuda_write,
        .free = cuda_free,
};

/* The fill kernel into g's context, unless FAMILYD_CUDA_FILL=host; otherwise why not. */
static void gpu_load_kernel(CudaBackend *c, CudaGpu *g, int device, char *why, size_t why_size) {
        const CudaDriver *d = &c->driver;
        const char *mode = getenv("FAMILYD_CUDA_FILL");
        CudaResult r;

        if (mode && streq(mode, "host")) {
                (void) snprintf(why, why_size, "FAMILYD_CUDA_FILL=host");
                return;
        }
        if (!d->has_modules) {
                (void) snprintf(why, why_size, "the driver cannot load modules");
                return;
        }
        r = d->module_load_data(&g->module, cuda_fill_ptx);
        if (r != 0) {
                g->module = NULL;
                (void) snprintf(why, why_size, "cuModuleLoadData: %s (CUresult %d)",
                                cuda_driver_error(d, r), r);
                return;
        }
        r = d->module_get_function(&g->fill, g->module, "familyd_fill");
        if (r != 0) {
                (void) d->module_unload(g->module);
                g->module = NULL;
                g->fill = NULL;
                (void) snprintf(why, why_size, "cuModuleGetFunction: %s",
                                cuda_driver_error(d, r));
        }
}

static void gpu_open(CudaBackend *c, CudaGpu *g, int device, int count) {
        const CudaDriver *d = &c->driver;
        char kernel_why[192] = "";
        int vmm = 0, posix = 0;
        CudaResult r;

        if (!d->has_vmm) {
                (void) snprintf(g->why, sizeof g->why,
                                "the CUDA driver lacks %s (GPU shards need the virtual memory "
                                "management API of CUDA 10.2 or later)",
                                d->vmm_missing);
                return;
        }
        if (device >= count || d->device_get(&g->dev, device) != 0) {
                (void) snprintf(g->why, sizeof g->why, "the CUDA driver has no GPU %d", device);
                return;
        }
        if (d->device_get_attribute(&vmm, CUDA_DRIVER_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    g->dev) != 0 || !vmm) {
                (void) snprintf(g->why, sizeof g->why,
                                "the GPU does not support virtual memory management");
                return;
        }
        if (d->device_get_attribute(&posix,
                                    CUDA_DRIVER_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                    g->dev) != 0 || !posix) {
                (void) snprintf(g->why, sizeof g->why,
                                "the GPU cannot export memory as POSIX file descriptors");
                return;
        }
        r = d->primary_ctx_retain(&g->ctx, g->dev);
        if (r != 0) {
                g->ctx = NULL;
                (void) snprintf(g->why, sizeof g->why, "cuDevicePrimaryCtxRetain: %s",
                                cuda_driver_error(d, r));
                return;
        }
        r = gpu_enter(c, g);
        CudaMemAllocationProp prop = gpu_prop(device);
        if (r == 0)
                r = d->mem_get_allocation_granularity(&g->granularity, &prop,
                                                      CUDA_DRIVER_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != 0 || g->granularity == 0) {
                (void) snprintf(g->why, sizeof g->why, "cuMemGetAllocationGranularity: %s",
                                r != 0 ? cuda_driver_error(d, r) : "0");
                return;
        }
        gpu_load_kernel(c, g, device, kernel_why, sizeof kernel_why);
        if (g->fill)
                log_info("CUDA: cuda:%d holds shards (allocation granularity %zu bytes; filled "
                         "by the fill kernel).",
                         device, g->granularity);
        else
                log_info("CUDA: cuda:%d holds shards (allocation granularity %zu bytes; filled "
                         "through host memory: %s).",
                         device, g->granularity, kernel_why);
}

int shard_backend_cuda_new(const Device *devices, size_t n, ShardBackend **ret, char *why,
                           size_t why_size) {
        CudaBackend *c;
        int count = 0, r;

        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->base.ops = &cuda_ops;
        atomic_init(&c->base.n_ref, 1);
        r = cuda_driver_open(&c->driver, why, why_size);
        if (r < 0) {
                free(c);
                return r;
        }
        if (c->driver.device_get_count(&count) != 0)
                count = 0;

        c->gpus = calloc(n ? n : 1, sizeof(CudaGpu));
        if (!c->gpus) {
                cuda_driver_close(&c->driver);
                free(c);
                return -ENOMEM;
        }
        c->n_gpus = n;
        for (size_t i = 0; i < n; i++) {
                CudaGpu *g = &c->gpus[i];
                if (!streq(devices[i].kind, SHARD_SEGMENT_DEVICE_KIND_CUDA) ||
                    devices[i].local_index != (int32_t) i)
                        continue;
                g->present = true;
                gpu_open(c, g, (int) i, count);
                if (g->why[0])
                        log_warning("CUDA: cuda:%zu cannot hold shards: %s. Builds that place "
                                    "a rank there fail.",
                                    i, g->why);
        }
        *ret = &c->base;
        return 0;
}
