/* cuda-driver.h: the CUDA driver API, loaded at run time (no build-time dependency on CUDA). */
#pragma once

/*
 * DESIGN: familyd never links libcuda. The few types it needs are declared here with the
 * layouts the CUDA driver API documents (cuda.h; tests/unit/test-cuda-abi.c checks them
 * against cuda.h wherever that header is installed), under names of our own so that this
 * header and cuda.h can meet in one file. Entry points come in three groups: the inventory's
 * (required to use the driver at all), the virtual memory management API (cuMemCreate and
 * friends, for shards in GPU memory) and modules (a fill kernel); a driver that lacks a later
 * group still lists its GPUs, and whoever needs the group is told which entry point is missing.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The few driver types familyd uses, as the CUDA driver API defines them. */
typedef int CudaResult; /* CUresult: 0 is CUDA_SUCCESS */
typedef int CudaDevice; /* CUdevice */
typedef struct CudaUuid {
        unsigned char bytes[16];
} CudaUuid;

typedef unsigned long long CudaDevicePtr; /* CUdeviceptr */
typedef unsigned long long CudaMemHandle; /* CUmemGenericAllocationHandle */
typedef struct CudaContextOpaque *CudaContext;   /* CUcontext */
typedef struct CudaModuleOpaque *CudaModule;     /* CUmodule */
typedef struct CudaFunctionOpaque *CudaFunction; /* CUfunction */
typedef struct CudaStreamOpaque *CudaStream;     /* CUstream */

/* CUmemLocation */
typedef struct CudaMemLocation {
        int type; /* CUmemLocationType */
        int id;
} CudaMemLocation;

/* CUmemAllocationProp (CUDA 11.0 and later: allocFlags where 10.2 had a reserved u64). */
typedef struct CudaMemAllocationProp {
        int type;                   /* CUmemAllocationType */
        int requested_handle_types; /* CUmemAllocationHandleType */
        CudaMemLocation location;
        void *win32_handle_metadata;
        struct {
                unsigned char compression_type;
                unsigned char gpu_direct_rdma_capable;
                unsigned short usage;
                unsigned char reserved[4];
        } alloc_flags;
} CudaMemAllocationProp;

/* CUmemAccessDesc */
typedef struct CudaMemAccessDesc {
        CudaMemLocation location;
        int flags; /* CUmemAccess_flags */
} CudaMemAccessDesc;

/* The values of cuda.h's enums that familyd uses. */
enum {
        CUDA_DRIVER_SUCCESS = 0,
        CUDA_DRIVER_ERROR_INVALID_VALUE = 1,
        CUDA_DRIVER_ERROR_OUT_OF_MEMORY = 2,
        CUDA_DRIVER_ERROR_NOT_INITIALIZED = 3,
        CUDA_DRIVER_ERROR_NO_DEVICE = 100,
        CUDA_DRIVER_ERROR_INVALID_DEVICE = 101,
        CUDA_DRIVER_ERROR_INVALID_CONTEXT = 201,
        CUDA_DRIVER_ERROR_NO_BINARY_FOR_GPU = 209,
        CUDA_DRIVER_ERROR_INVALID_PTX = 218,
        CUDA_DRIVER_ERROR_UNSUPPORTED_PTX_VERSION = 222,
        CUDA_DRIVER_ERROR_INVALID_HANDLE = 400,
        CUDA_DRIVER_ERROR_NOT_FOUND = 500,
        CUDA_DRIVER_ERROR_ILLEGAL_ADDRESS = 700,
        CUDA_DRIVER_ERROR_NOT_PERMITTED = 800,
        CUDA_DRIVER_ERROR_NOT_SUPPORTED = 801,
        CUDA_DRIVER_ERROR_UNKNOWN = 999,
};

enum {
        CUDA_DRIVER_MEM_ALLOCATION_TYPE_PINNED = 0x1,
        CUDA_DRIVER_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
        CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE = 0x1,
        CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
        CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
        CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
        CUDA_DRIVER_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
        CUDA_DRIVER_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
        CUDA_DRIVER_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
};

typedef struct CudaDriver {
        void *handle;
        /* The inventory's: always there once cuda_driver_open() succeeded. */
        CudaResult (*init)(unsigned flags);
        CudaResult (*device_get_count)(int *count);
        CudaResult (*device_get)(CudaDevice *device, int ordinal);
        CudaResult (*device_get_name)(char *name, int len, CudaDevice device);
        CudaResult (*device_get_uuid)(CudaUuid *uuid, CudaDevice device);
        CudaResult (*device_total_mem)(size_t *bytes, CudaDevice device);
        CudaResult (*device_get_pci_bus_id)(char *bus_id, int len, CudaDevice device);
        CudaResult (*get_error_string)(CudaResult error, const char **ret);

        /* Shards in GPU memory: contexts, the virtual memory management API, copies. Set
         * together (has_vmm), or vmm_missing names the first entry point the driver lacks. */
        bool has_vmm;
        const char *vmm_missing;
        CudaResult (*device_get_attribute)(int *value, int attribute, CudaDevice device);
        CudaResult (*primary_ctx_retain)(CudaContext *ctx, CudaDevice device);
        CudaResult (*primary_ctx_release)(CudaDevice device);
        CudaResult (*ctx_set_current)(CudaContext ctx);
        CudaResult (*ctx_synchronize)(void);
        CudaResult (*mem_get_allocation_granularity)(size_t *granularity,
                                                     const CudaMemAllocationProp *prop,
                                                     int option);
        CudaResult (*mem_create)(CudaMemHandle *handle, size_t size,
                                 const CudaMemAllocationProp *prop, unsigned long long flags);
        CudaResult (*mem_release)(CudaMemHandle handle);
        CudaResult (*mem_export_to_shareable_handle)(void *shareable, CudaMemHandle handle,
                                                     int handle_type, unsigned long long flags);
        CudaResult (*mem_import_from_shareable_handle)(CudaMemHandle *handle, void *os_handle,
                                                       int handle_type);
        CudaResult (*mem_address_reserve)(CudaDevicePtr *ptr, size_t size, size_t alignment,
                                          CudaDevicePtr addr, unsigned long long flags);
        CudaResult (*mem_address_free)(CudaDevicePtr ptr, size_t size);
        CudaResult (*mem_map)(CudaDevicePtr ptr, size_t size, size_t offset, CudaMemHandle handle,
                              unsigned long long flags);
        CudaResult (*mem_unmap)(CudaDevicePtr ptr, size_t size);
        CudaResult (*mem_set_access)(CudaDevicePtr ptr, size_t size, const CudaMemAccessDesc *desc,
                                     size_t count);
        CudaResult (*memcpy_htod)(CudaDevicePtr dst, const void *src, size_t n);
        CudaResult (*memcpy_dtoh)(void *dst, CudaDevicePtr src, size_t n);
        CudaResult (*memset_d8)(CudaDevicePtr dst, unsigned char value, size_t n);

        /* A fill kernel: set together (has_modules). */
        bool has_modules;
        CudaResult (*module_load_data)(CudaModule *module, const void *image);
        CudaResult (*module_unload)(CudaModule module);
        CudaResult (*module_get_function)(CudaFunction *function, CudaModule module,
                                          const char *name);
        CudaResult (*launch_kernel)(CudaFunction f, unsigned grid_x, unsigned grid_y,
                                    unsigned grid_z, unsigned block_x, unsigned block_y,
                                    unsigned block_z, unsigned shared_bytes, CudaStream stream,
                                    void **params, void **extra);
} CudaDriver;

/* The environment variable naming the driver library (the tests' fake driver). */
#define CUDA_DRIVER_ENV "FAMILYD_CUDA_DRIVER"
#define CUDA_DRIVER_LIBRARY "libcuda.so.1"

/*
 * Loads the driver: $FAMILYD_CUDA_DRIVER if set (the tests' fake driver), else libcuda.so.1,
 * and calls cuInit(0). -ENOENT when no driver can be loaded (a node without GPUs), -EIO when
 * it loads but cannot initialise; why (why_size bytes) says why in words.
 */
int cuda_driver_open(CudaDriver *ret, char *why, size_t why_size);
/* The same without cuInit(0): for a client that reports the init failure in its own words. */
int cuda_driver_load(CudaDriver *ret, char *why, size_t why_size);
void cuda_driver_close(CudaDriver *d);
const char *cuda_driver_error(const CudaDriver *d, CudaResult r);
