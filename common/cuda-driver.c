/* cuda-driver.c: dlopen()s the CUDA driver and resolves the entry points familyd calls. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda-driver.h"
#include "macro.h"

typedef struct Symbol {
        void **fn;
        const char *name;
} Symbol;

/* Resolves every entry of table; NULL, or the name of the first one missing (all NULL then). */
static const char *resolve(void *handle, const Symbol *table, size_t n) {
        for (size_t i = 0; i < n; i++) {
                *table[i].fn = dlsym(handle, table[i].name);
                if (!*table[i].fn) {
                        for (size_t j = 0; j < n; j++)
                                *table[j].fn = NULL;
                        return table[i].name;
                }
        }
        return NULL;
}

int cuda_driver_load(CudaDriver *ret, char *why, size_t why_size) {
        const char *path = getenv(CUDA_DRIVER_ENV);
        const char *missing;
        CudaDriver d = {};

        d.handle = dlopen(isempty(path) ? CUDA_DRIVER_LIBRARY : path, RTLD_NOW | RTLD_LOCAL);
        if (!d.handle) {
                (void) snprintf(why, why_size, "the CUDA driver (libcuda.so.1) is not installed");
                return -ENOENT;
        }

        /* The versioned names are the ones current drivers export for these calls (cuda.h
         * maps cuDeviceTotalMem to cuDeviceTotalMem_v2, and so on). */
        const Symbol base[] = {
                { (void **) &d.init, "cuInit" },
                { (void **) &d.device_get_count, "cuDeviceGetCount" },
                { (void **) &d.device_get, "cuDeviceGet" },
                { (void **) &d.device_get_name, "cuDeviceGetName" },
                { (void **) &d.device_get_uuid, "cuDeviceGetUuid" },
                { (void **) &d.device_total_mem, "cuDeviceTotalMem_v2" },
                { (void **) &d.device_get_pci_bus_id, "cuDeviceGetPCIBusId" },
                { (void **) &d.get_error_string, "cuGetErrorString" },
        };
        const Symbol vmm[] = {
                { (void **) &d.device_get_attribute, "cuDeviceGetAttribute" },
                { (void **) &d.primary_ctx_retain, "cuDevicePrimaryCtxRetain" },
                { (void **) &d.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2" },
                { (void **) &d.ctx_set_current, "cuCtxSetCurrent" },
                { (void **) &d.ctx_synchronize, "cuCtxSynchronize" },
                { (void **) &d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity" },
                { (void **) &d.mem_create, "cuMemCreate" },
                { (void **) &d.mem_release, "cuMemRelease" },
                { (void **) &d.mem_export_to_shareable_handle, "cuMemExportToShareableHandle" },
                { (void **) &d.mem_import_from_shareable_handle,
                  "cuMemImportFromShareableHandle" },
                { (void **) &d.mem_address_reserve, "cuMemAddressReserve" },
                { (void **) &d.mem_address_free, "cuMemAddressFree" },
                { (void **) &d.mem_map, "cuMemMap" },
                { (void **) &d.mem_unmap, "cuMemUnmap" },
                { (void **) &d.mem_set_access, "cuMemSetAccess" },
                { (void **) &d.memcpy_htod, "cuMemcpyHtoD_v2" },
                { (void **) &d.memcpy_dtoh, "cuMemcpyDtoH_v2" },
                { (void **) &d.memset_d8, "cuMemsetD8_v2" },
        };
        const Symbol modules[] = {
                { (void **) &d.module_load_data, "cuModuleLoadData" },
                { (void **) &d.module_unload, "cuModuleUnload" },
                { (void **) &d.module_get_function, "cuModuleGetFunction" },
                { (void **) &d.launch_kernel, "cuLaunchKernel" },
        };

        missing = resolve(d.handle, base, ELEMENTSOF(base));
        if (missing) {
                dlclose(d.handle);
                (void) snprintf(why, why_size, "the CUDA driver lacks %s", missing);
                return -EIO;
        }
        d.vmm_missing = resolve(d.handle, vmm, ELEMENTSOF(vmm));
        d.has_vmm = !d.vmm_missing;
        d.has_modules = !resolve(d.handle, modules, ELEMENTSOF(modules));

        *ret = d;
        return 0;
}

int cuda_driver_open(CudaDriver *ret, char *why, size_t why_size) {
        CudaDriver d;
        int r = cuda_driver_load(&d, why, why_size);
        if (r < 0)
                return r;

        CudaResult k = d.init(0);
        if (k != 0) {
                /* Copied: the driver's text goes away with the library. */
                (void) snprintf(why, why_size, "%s", cuda_driver_error(&d, k));
                cuda_driver_close(&d);
                return -EIO;
        }
        *ret = d;
        return 0;
}

void cuda_driver_close(CudaDriver *d) {
        if (d && d->handle)
                dlclose(d->handle);
        if (d)
                *d = (CudaDriver) {};
}

const char *cuda_driver_error(const CudaDriver *d, CudaResult r) {
        const char *s = NULL;

        if (d->get_error_string && d->get_error_string(r, &s) == 0 && s)
                return s;
        return "unknown CUDA error";
}
