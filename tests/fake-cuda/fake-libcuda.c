/* fake-libcuda.c: a stand-in for libcuda.so.1 on machines without a GPU (tests only).
 *
 * It implements the driver entry points familyd and its clients load, over host memory, with
 * the CUDA driver API's signatures and return codes, and enforces the rules the CUDA
 * documentation states for them, so code that passes here breaks no rule a real driver checks:
 *  - a current context for memory operations (cuDevicePrimaryCtxRetain + cuCtxSetCurrent);
 *  - cuMemCreate: a pinned allocation on a device location, flags 0, a size that is a
 *    multiple of the allocation granularity (FAKE_CUDA_GRANULARITY, default 2 MiB); device
 *    memory is counted and runs out (CUDA_ERROR_OUT_OF_MEMORY);
 *  - cuMemExportToShareableHandle only for the handle types the allocation requested;
 *  - cuMemAddressReserve: page-multiple size, power-of-two alignment; cuMemAddressFree: the
 *    exact range reserved, with nothing mapped in it;
 *  - cuMemMap: offset 0, pointer and size multiples of the granularity, inside one
 *    reservation, over nothing mapped; mappings start inaccessible (PROT_NONE), so a read or
 *    write before cuMemSetAccess faults, as on a GPU;
 *  - cuMemSetAccess over whole mappings (PROT_READ mappings are really read-only);
 *    cuMemUnmap of whole mappings; cuMemRelease of live handles only;
 *  - copies and memsets only within one mapping with the access they need.
 * An allocation is a memfd named "fake-cuda-dev<N>"; exporting dups it, importing (in any
 * process) checks that name, so the descriptors familyd passes around are exactly what the
 * fake made. Kernels: cuModuleLoadData accepts PTX that defines familyd's fill kernel and
 * cuLaunchKernel runs it on the CPU, thread by thread of the grid, through the same
 * element function the PTX was compiled from (daemon/shm/cuda-fill-kernel.h).
 *
 * Knobs (environment):
 *   FAKE_CUDA_DEVICES=N            how many GPUs it reports (default 2)
 *   FAKE_CUDA_INIT_ERROR=N         cuInit fails with CUresult N (e.g. 100, no device)
 *   FAKE_CUDA_MEMORY=BYTES         memory per GPU (default 80 GiB)
 *   FAKE_CUDA_GRANULARITY=BYTES    the allocation granularity (default 2 MiB)
 *   FAKE_CUDA_FAIL_ALLOC=N         cuMemCreate fails with CUresult N ...
 *   FAKE_CUDA_FAIL_ALLOC_AFTER=K   ... after K allocations succeeded (default 0)
 *   FAKE_CUDA_NO_VMM=1             the GPUs do not support virtual memory management
 *   FAKE_CUDA_NO_READONLY=1        cuMemSetAccess refuses PROT_READ (CUDA_ERROR_NOT_SUPPORTED)
 *   FAKE_CUDA_NO_KERNELS=1         cuModuleLoadData fails (CUDA_ERROR_NO_BINARY_FOR_GPU)
 *   FAKE_CUDA_STATE_FILE=PATH      after each change: "allocations=A bytes=B mappings=M
 *                                  reservations=R imports=I launches=L contexts=C" (this
 *                                  process's live objects; launches counts all)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/cuda-fill-kernel.h"

typedef int CUresult;
typedef int CUdevice;
typedef struct {
        unsigned char bytes[16];
} CUuuid;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct FakeContext *CUcontext;
typedef struct FakeModule *CUmodule;
typedef struct FakeFunction *CUfunction;
typedef void *CUstream;

typedef struct {
        int type;
        int id;
} CUmemLocation;

typedef struct {
        int type;
        int requestedHandleTypes;
        CUmemLocation location;
        void *win32HandleMetaData;
        unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef struct {
        CUmemLocation location;
        int flags;
} CUmemAccessDesc;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define CUDA_ERROR_NOT_MAPPED 211
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_NOT_SUPPORTED 801

#define MAX_DEVICES 16
#define MAX_OBJECTS 4096
#define GRANULARITY_DEFAULT (2u << 20)

#define ACCESS_NONE 0
#define ACCESS_READ 1
#define ACCESS_READWRITE 3

struct FakeContext {
        int device;
        int refs;
};

struct FakeModule {
        int live;
};

struct FakeFunction {
        int kernel;
};

typedef struct Allocation {
        int used;
        int fd;       /* the memfd; -1 once released and unmapped */
        size_t size;
        int device;
        int handle_types;
        int released; /* the handle is gone; mappings may remain */
        int imported;
        int n_mappings;
} Allocation;

typedef struct Reservation {
        int used;
        uintptr_t ptr;
        size_t size;
} Reservation;

typedef struct Mapping {
        int used;
        uintptr_t ptr;
        size_t size;
        int alloc; /* index into allocations */
        int access;
} Mapping;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static struct FakeContext contexts[MAX_DEVICES];
/* The calling thread's current context. A pthread key, not __thread: this library is
 * dlopen()ed, so __thread would be dynamic TLS, which GCC 12's LeakSanitizer (Debian 12) finds
 * by a heuristic that fails for some block addresses and crashes its tracer at exit (LLVM
 * fixed it in 2023, "Fix tls_get_addr handling for glibc >=2.25"). */
static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;

static void current_key_make(void) {
        if (pthread_key_create(&current_key, NULL) != 0)
                abort();
}

static CUcontext current_get(void) {
        (void) pthread_once(&current_once, current_key_make);
        return pthread_getspecific(current_key);
}

static void current_set(CUcontext ctx) {
        (void) pthread_once(&current_once, current_key_make);
        if (pthread_setspecific(current_key, ctx) != 0)
                abort();
}
static Allocation allocations[MAX_OBJECTS];
static Reservation reservations[MAX_OBJECTS];
static Mapping mappings[MAX_OBJECTS];
static size_t device_bytes[MAX_DEVICES];
static unsigned long n_created, n_launches;
static struct FakeModule the_module;
static struct FakeFunction the_function = { .kernel = 1 };

static long env_long(const char *name, long fallback) {
        const char *s = getenv(name);
        return s && *s ? strtol(s, NULL, 0) : fallback;
}

static int device_count(void) {
        long n = env_long("FAKE_CUDA_DEVICES", 2);
        return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : (int) n;
}

static size_t granularity(void) {
        long g = env_long("FAKE_CUDA_GRANULARITY", GRANULARITY_DEFAULT);
        return g > 0 ? (size_t) g : GRANULARITY_DEFAULT;
}

static size_t device_memory(void) {
        const char *s = getenv("FAKE_CUDA_MEMORY");
        return s && *s ? (size_t) strtoull(s, NULL, 0) : (size_t) 80 << 30;
}

static int valid_device(int dev) {
        return dev >= 0 && dev < device_count();
}

/* Under lock. */
static void write_state(void) {
        const char *path = getenv("FAKE_CUDA_STATE_FILE");
        unsigned long a = 0, m = 0, r = 0, imp = 0, ctx = 0;
        size_t bytes = 0;

        if (!path || !*path)
                return;
        for (int i = 0; i < MAX_OBJECTS; i++) {
                if (allocations[i].used && !allocations[i].imported) {
                        a++;
                        bytes += allocations[i].size;
                }
                if (allocations[i].used && allocations[i].imported)
                        imp++;
                m += mappings[i].used != 0;
                r += reservations[i].used != 0;
        }
        for (int i = 0; i < MAX_DEVICES; i++)
                ctx += contexts[i].refs > 0;

        char tmp[4096];
        (void) snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int) getpid());
        FILE *f = fopen(tmp, "we");
        if (!f)
                return;
        fprintf(f, "allocations=%lu bytes=%zu mappings=%lu reservations=%lu imports=%lu "
                   "launches=%lu contexts=%lu\n",
                a, bytes, m, r, imp, n_launches, ctx);
        if (fclose(f) == 0)
                (void) rename(tmp, path);
        else
                (void) unlink(tmp);
}

static void lock_state(void) {
        (void) pthread_mutex_lock(&lock);
}

static CUresult unlock_result(CUresult r) {
        write_state();
        (void) pthread_mutex_unlock(&lock);
        return r;
}

/* ---- the inventory's entry points ------------------------------------------------------ */

CUresult cuInit(unsigned flags) {
        const char *e = getenv("FAKE_CUDA_INIT_ERROR");
        if (flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (e && atoi(e) != 0)
                return atoi(e);
        initialised = 1;
        return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!count)
                return CUDA_ERROR_INVALID_VALUE;
        *count = device_count();
        return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!device || !valid_device(ordinal))
                return CUDA_ERROR_INVALID_DEVICE;
        *device = ordinal;
        return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
        if (!name || len <= 0 || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE;
        (void) snprintf(name, (size_t) len, "Fake GPU %d", dev);
        return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
        if (!uuid || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE;
        for (int i = 0; i < 16; i++)
                uuid->bytes[i] = (unsigned char) (0x10 * dev + i);
        return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
        if (!bytes || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE;
        *bytes = device_memory();
        return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
        if (!bus_id || len < 13 || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE;
        (void) snprintf(bus_id, (size_t) len, "0000:%02x:00.0", 0x10 + dev);
        return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **str) {
        if (!str)
                return CUDA_ERROR_INVALID_VALUE;
        switch (error) {
        case 100:
                *str = "no CUDA-capable device is detected";
                break;
        case CUDA_ERROR_NOT_INITIALIZED:
                *str = "initialization error";
                break;
        case CUDA_ERROR_OUT_OF_MEMORY:
                *str = "out of memory";
                break;
        case CUDA_ERROR_INVALID_VALUE:
                *str = "invalid argument";
                break;
        case CUDA_ERROR_INVALID_CONTEXT:
                *str = "invalid device context";
                break;
        case CUDA_ERROR_NO_BINARY_FOR_GPU:
                *str = "no kernel image is available for execution on the device";
                break;
        case CUDA_ERROR_NOT_SUPPORTED:
                *str = "operation not supported";
                break;
        default:
                *str = "fake CUDA error";
                break;
        }
        return CUDA_SUCCESS;
}

/* ---- attributes and contexts ----------------------------------------------------------- */

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!value || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE;
        switch (attribute) {
        case 102: /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
        case 103: /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
                *value = env_long("FAKE_CUDA_NO_VMM", 0) ? 0 : 1;
                return CUDA_SUCCESS;
        default:
                *value = 0;
                return CUDA_SUCCESS;
        }
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!ctx || !valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        lock_state();
        contexts[dev].device = dev;
        contexts[dev].refs++;
        *ctx = &contexts[dev];
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        lock_state();
        if (contexts[dev].refs <= 0)
                return unlock_result(CUDA_ERROR_INVALID_CONTEXT);
        contexts[dev].refs--;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (ctx && (ctx < contexts || ctx >= contexts + MAX_DEVICES || ctx->refs <= 0))
                return CUDA_ERROR_INVALID_CONTEXT;
        current_set(ctx);
        return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
        if (!ctx)
                return CUDA_ERROR_INVALID_VALUE;
        *ctx = current_get();
        return CUDA_SUCCESS;
}

/* Memory operations need a live current context. */
static int have_context(void) {
        CUcontext current = current_get();

        return initialised && current && current->refs > 0;
}

CUresult cuCtxSynchronize(void) {
        return have_context() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- allocations ----------------------------------------------------------------------- */

static int prop_is_valid(const CUmemAllocationProp *prop) {
        static const unsigned char zero[8];
        return prop && prop->type == 1 /* PINNED */ && prop->location.type == 1 /* DEVICE */ &&
               valid_device(prop->location.id) && !prop->win32HandleMetaData &&
               memcmp(prop->allocFlags, zero, sizeof zero) == 0 &&
               (prop->requestedHandleTypes & ~1) == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!g || !prop_is_valid(prop) || (option != 0 && option != 1))
                return CUDA_ERROR_INVALID_VALUE;
        *g = granularity();
        return CUDA_SUCCESS;
}

static int alloc_slot(void) {
        for (int i = 0; i < MAX_OBJECTS; i++)
                if (!allocations[i].used)
                        return i;
        return -1;
}

/* Handles are slot + 1, so 0 is never valid. */
static Allocation *alloc_of(CUmemGenericAllocationHandle h) {
        if (h == 0 || h > MAX_OBJECTS || !allocations[h - 1].used || allocations[h - 1].released)
                return NULL;
        return &allocations[h - 1];
}

/* Under lock: forgets a released allocation once nothing maps it. */
static void alloc_maybe_free(Allocation *a) {
        if (!a->released || a->n_mappings > 0)
                return;
        if (!a->imported)
                device_bytes[a->device] -= a->size;
        if (a->fd >= 0)
                (void) close(a->fd);
        *a = (Allocation) { .fd = -1 };
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
        char name[32];

        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!handle || !prop_is_valid(prop) || flags != 0 || size == 0 ||
            size % granularity() != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (env_long("FAKE_CUDA_NO_VMM", 0))
                return CUDA_ERROR_NOT_SUPPORTED;

        lock_state();
        long fail = env_long("FAKE_CUDA_FAIL_ALLOC", 0);
        if (fail != 0 && n_created >= (unsigned long) env_long("FAKE_CUDA_FAIL_ALLOC_AFTER", 0))
                return unlock_result((CUresult) fail);
        int dev = prop->location.id;
        if (size > device_memory() || device_bytes[dev] > device_memory() - size)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        int i = alloc_slot();
        if (i < 0)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);

        (void) snprintf(name, sizeof name, "fake-cuda-dev%d", dev);
        int fd = memfd_create(name, MFD_CLOEXEC);
        if (fd < 0)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        if (ftruncate(fd, (off_t) size) < 0) {
                (void) close(fd);
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        }
        /* Device memory is not zeroed: make that visible (familyd must clear what it hands
         * out, or a trainer would read an earlier tenant's bytes). */
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
                memset(p, 0xa5, size);
                (void) munmap(p, size);
        }

        allocations[i] = (Allocation) {
                .used = 1,
                .fd = fd,
                .size = size,
                .device = dev,
                .handle_types = prop->requestedHandleTypes,
        };
        device_bytes[dev] += size;
        n_created++;
        *handle = (CUmemGenericAllocationHandle) i + 1;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
        lock_state();
        Allocation *a = alloc_of(handle);
        if (!a)
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        a->released = 1;
        alloc_maybe_free(a);
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                      int handle_type, unsigned long long flags) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!shareable || flags != 0 || handle_type != 1)
                return CUDA_ERROR_INVALID_VALUE;
        lock_state();
        Allocation *a = alloc_of(handle);
        if (!a || !(a->handle_types & handle_type))
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        /* A descriptor of its own, without close-on-exec: the caller decides. */
        int fd = fcntl(a->fd, F_DUPFD, 3);
        if (fd < 0)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        *(int *) shareable = fd;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                        int handle_type) {
        char path[64], target[256];
        struct stat st;
        int dev = -1;

        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!handle || handle_type != 1)
                return CUDA_ERROR_INVALID_VALUE;
        int fd = (int) (intptr_t) os_handle;
        (void) snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(path, target, sizeof target - 1);
        if (k <= 0 || fstat(fd, &st) < 0 || st.st_size <= 0)
                return CUDA_ERROR_INVALID_VALUE;
        target[k] = 0;
        if (sscanf(target, "/memfd:fake-cuda-dev%d", &dev) != 1 || !valid_device(dev))
                return CUDA_ERROR_INVALID_VALUE; /* not an allocation this driver exported */

        lock_state();
        int i = alloc_slot();
        if (i < 0)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        /* The handle holds a descriptor of its own: the caller may close theirs. */
        int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (own < 0)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        allocations[i] = (Allocation) {
                .used = 1,
                .fd = own,
                .size = (size_t) st.st_size,
                .device = dev,
                .handle_types = 1,
                .imported = 1,
        };
        *handle = (CUmemGenericAllocationHandle) i + 1;
        return unlock_result(CUDA_SUCCESS);
}

/* ---- address ranges and mappings -------------------------------------------------------- */

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
        size_t page = (size_t) sysconf(_SC_PAGESIZE), g = granularity();
        size_t align;

        if (!initialised)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!ptr || size == 0 || size % page != 0 || addr % page != 0 || flags != 0 ||
            (alignment & (alignment - 1)) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        align = alignment > g ? alignment : g;

        lock_state();
        int i;
        for (i = 0; i < MAX_OBJECTS && reservations[i].used; i++)
                ;
        if (i == MAX_OBJECTS)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        uint8_t *p = mmap(NULL, size + align, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        uintptr_t start = ((uintptr_t) p + align - 1) & ~(uintptr_t) (align - 1);
        if (start > (uintptr_t) p)
                (void) munmap(p, start - (uintptr_t) p);
        (void) munmap((void *) (start + size), (uintptr_t) p + size + align - start - size);
        reservations[i] = (Reservation) { .used = 1, .ptr = start, .size = size };
        *ptr = (CUdeviceptr) start;
        return unlock_result(CUDA_SUCCESS);
}

static Reservation *reservation_containing(uintptr_t ptr, size_t size) {
        for (int i = 0; i < MAX_OBJECTS; i++) {
                Reservation *r = &reservations[i];
                if (r->used && ptr >= r->ptr && size <= r->size && ptr - r->ptr <= r->size - size)
                        return r;
        }
        return NULL;
}

static int overlaps_mapping(uintptr_t ptr, size_t size) {
        for (int i = 0; i < MAX_OBJECTS; i++)
                if (mappings[i].used && ptr < mappings[i].ptr + mappings[i].size &&
                    mappings[i].ptr < ptr + size)
                        return 1;
        return 0;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
        lock_state();
        for (int i = 0; i < MAX_OBJECTS; i++) {
                Reservation *r = &reservations[i];
                if (!r->used || r->ptr != ptr)
                        continue;
                if (r->size != size || overlaps_mapping(r->ptr, r->size))
                        return unlock_result(CUDA_ERROR_INVALID_VALUE);
                (void) munmap((void *) r->ptr, r->size);
                *r = (Reservation) {};
                return unlock_result(CUDA_SUCCESS);
        }
        return unlock_result(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
        size_t g = granularity();

        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (size == 0 || ptr % g != 0 || size % g != 0 || offset != 0 || flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        lock_state();
        Allocation *a = alloc_of(handle);
        if (!a || size > a->size || !reservation_containing(ptr, size) ||
            overlaps_mapping(ptr, size))
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        int i;
        for (i = 0; i < MAX_OBJECTS && mappings[i].used; i++)
                ;
        if (i == MAX_OBJECTS)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        if (mmap((void *) ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) == MAP_FAILED)
                return unlock_result(CUDA_ERROR_OUT_OF_MEMORY);
        mappings[i] = (Mapping) {
                .used = 1,
                .ptr = ptr,
                .size = size,
                .alloc = (int) (a - allocations),
                .access = ACCESS_NONE,
        };
        a->n_mappings++;
        return unlock_result(CUDA_SUCCESS);
}

/* Under lock: the mappings covering exactly [ptr, ptr + size), contiguous; 0 if not so. */
static int whole_mappings(uintptr_t ptr, size_t size, int *ret, int max) {
        int n = 0;
        uintptr_t at = ptr;

        while (at < ptr + size) {
                int found = -1;
                for (int i = 0; i < MAX_OBJECTS; i++)
                        if (mappings[i].used && mappings[i].ptr == at) {
                                found = i;
                                break;
                        }
                if (found < 0 || n == max || mappings[found].ptr + mappings[found].size > ptr + size)
                        return 0;
                ret[n++] = found;
                at += mappings[found].size;
        }
        return n;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
        int which[64], n, prot;

        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!desc || count == 0 || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < count; k++) {
                if (desc[k].location.type != 1 || !valid_device(desc[k].location.id))
                        return CUDA_ERROR_INVALID_DEVICE;
                if (desc[k].flags != ACCESS_NONE && desc[k].flags != ACCESS_READ &&
                    desc[k].flags != ACCESS_READWRITE)
                        return CUDA_ERROR_INVALID_VALUE;
                if (desc[k].flags == ACCESS_READ && env_long("FAKE_CUDA_NO_READONLY", 0))
                        return CUDA_ERROR_NOT_SUPPORTED;
        }
        /* One host: the last descriptor's flags apply to the whole range. */
        int access = desc[count - 1].flags;
        prot = access == ACCESS_READWRITE ? PROT_READ | PROT_WRITE
               : access == ACCESS_READ    ? PROT_READ
                                          : PROT_NONE;
        lock_state();
        n = whole_mappings(ptr, size, which, 64);
        if (n == 0)
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        if (mprotect((void *) ptr, size, prot) < 0)
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        for (int k = 0; k < n; k++)
                mappings[which[k]].access = access;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
        int which[64], n;

        lock_state();
        n = whole_mappings(ptr, size, which, 64);
        if (n == 0)
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        /* Back to a bare reservation. */
        if (mmap((void *) ptr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
                return unlock_result(CUDA_ERROR_INVALID_VALUE);
        for (int k = 0; k < n; k++) {
                Allocation *a = &allocations[mappings[which[k]].alloc];
                mappings[which[k]] = (Mapping) {};
                a->n_mappings--;
                alloc_maybe_free(a);
        }
        return unlock_result(CUDA_SUCCESS);
}

/* Under lock: the mapping holding [ptr, ptr + n) with at least access, or NULL. */
static Mapping *mapping_for(uintptr_t ptr, size_t n, int access) {
        for (int i = 0; i < MAX_OBJECTS; i++) {
                Mapping *m = &mappings[i];
                if (m->used && ptr >= m->ptr && n <= m->size && ptr - m->ptr <= m->size - n)
                        return (m->access & access) == access ? m : NULL;
        }
        return NULL;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (n == 0)
                return CUDA_SUCCESS;
        if (!src)
                return CUDA_ERROR_INVALID_VALUE;
        lock_state();
        if (!mapping_for(dst, n, ACCESS_READWRITE))
                return unlock_result(CUDA_ERROR_ILLEGAL_ADDRESS);
        memcpy((void *) dst, src, n);
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (n == 0)
                return CUDA_SUCCESS;
        if (!dst)
                return CUDA_ERROR_INVALID_VALUE;
        lock_state();
        if (!mapping_for(src, n, ACCESS_READ))
                return unlock_result(CUDA_ERROR_ILLEGAL_ADDRESS);
        memcpy(dst, (const void *) src, n);
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (n == 0)
                return CUDA_SUCCESS;
        lock_state();
        if (!mapping_for(dst, n, ACCESS_READWRITE))
                return unlock_result(CUDA_ERROR_ILLEGAL_ADDRESS);
        memset((void *) dst, value, n);
        return unlock_result(CUDA_SUCCESS);
}

/* ---- modules and the fill kernel -------------------------------------------------------- */

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!module || !image)
                return CUDA_ERROR_INVALID_VALUE;
        if (env_long("FAKE_CUDA_NO_KERNELS", 0))
                return CUDA_ERROR_NO_BINARY_FOR_GPU;
        /* PTX text that defines familyd's kernel; anything else has no code for this "GPU". */
        if (!strstr(image, ".entry familyd_fill("))
                return CUDA_ERROR_NO_BINARY_FOR_GPU;
        lock_state();
        the_module.live++;
        *module = &the_module;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuModuleUnload(CUmodule module) {
        if (module != &the_module)
                return CUDA_ERROR_INVALID_HANDLE;
        lock_state();
        if (the_module.live <= 0)
                return unlock_result(CUDA_ERROR_INVALID_HANDLE);
        the_module.live--;
        return unlock_result(CUDA_SUCCESS);
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
        if (!f || module != &the_module || the_module.live <= 0 || !name)
                return CUDA_ERROR_INVALID_VALUE;
        if (strcmp(name, "familyd_fill") != 0)
                return CUDA_ERROR_NOT_FOUND;
        *f = &the_function;
        return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream,
                        void **params, void **extra) {
        if (!have_context())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (f != &the_function || !params || !params[0] || extra || gx == 0 || gy != 1 ||
            gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1 || shared != 0 || stream)
                return CUDA_ERROR_INVALID_VALUE;

        FillKernelParams p;
        memcpy(&p, params[0], sizeof p);
        if (p.inner == 0 || p.n_outer > FK_RANK_MAX || p.dtype > FK_DTYPE_FLOAT16)
                return CUDA_ERROR_INVALID_VALUE;
        size_t size = p.dtype == FK_DTYPE_FLOAT32 ? 4 : 2;

        lock_state();
        n_launches++;
        if (p.n > 0 && (p.n > SIZE_MAX / size || !mapping_for(p.dst, p.n * size, ACCESS_READWRITE)))
                return unlock_result(CUDA_ERROR_ILLEGAL_ADDRESS);
        (void) pthread_mutex_unlock(&lock);

        /* familyd_fill as the GPU runs it: every thread of the grid, grid-stride. */
        FkU64 threads = (FkU64) gx * bx;
        for (FkU64 t = 0; t < threads; t++)
                for (FkU64 j = t; j < p.n; j += threads)
                        fk_store(&p, (void *) (uintptr_t) p.dst, j);

        lock_state();
        return unlock_result(CUDA_SUCCESS);
}
