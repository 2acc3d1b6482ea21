/* test-cuda-abi.c: familyd's own declarations of the CUDA driver's types and constants
 * (common/cuda-driver.h, daemon/shm/cuda-fill-kernel.h) against cuda.h, where it is
 * installed. Built only then (tests/unit/meson.build); the daemon never includes cuda.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda.h>

#include "common/cuda-driver.h"

#define SAME_LAYOUT(ours, theirs) \
        _Static_assert(sizeof(ours) == sizeof(theirs), #ours " has the size of " #theirs); \
        _Static_assert(_Alignof(ours) == _Alignof(theirs), #ours " has the alignment of " #theirs)
#define SAME_OFFSET(ours, of, theirs, tof) \
        _Static_assert(offsetof(ours, of) == offsetof(theirs, tof), #ours "." #of " is " #theirs "." #tof)
#define SAME_VALUE(ours, theirs) _Static_assert((long long) (ours) == (long long) (theirs), #ours " is " #theirs)

SAME_LAYOUT(CudaResult, CUresult);
SAME_LAYOUT(CudaDevice, CUdevice);
SAME_LAYOUT(CudaUuid, CUuuid);
SAME_LAYOUT(CudaDevicePtr, CUdeviceptr);
SAME_LAYOUT(CudaMemHandle, CUmemGenericAllocationHandle);
SAME_LAYOUT(CudaContext, CUcontext);
SAME_LAYOUT(CudaModule, CUmodule);
SAME_LAYOUT(CudaFunction, CUfunction);
SAME_LAYOUT(CudaStream, CUstream);

SAME_LAYOUT(CudaMemLocation, CUmemLocation);
SAME_OFFSET(CudaMemLocation, type, CUmemLocation, type);
SAME_OFFSET(CudaMemLocation, id, CUmemLocation, id);

SAME_LAYOUT(CudaMemAllocationProp, CUmemAllocationProp);
SAME_OFFSET(CudaMemAllocationProp, type, CUmemAllocationProp, type);
SAME_OFFSET(CudaMemAllocationProp, requested_handle_types, CUmemAllocationProp, requestedHandleTypes);
SAME_OFFSET(CudaMemAllocationProp, location, CUmemAllocationProp, location);
SAME_OFFSET(CudaMemAllocationProp, win32_handle_metadata, CUmemAllocationProp, win32HandleMetaData);
SAME_OFFSET(CudaMemAllocationProp, alloc_flags, CUmemAllocationProp, allocFlags);
SAME_OFFSET(CudaMemAllocationProp, alloc_flags.usage, CUmemAllocationProp, allocFlags.usage);

SAME_LAYOUT(CudaMemAccessDesc, CUmemAccessDesc);
SAME_OFFSET(CudaMemAccessDesc, location, CUmemAccessDesc, location);
SAME_OFFSET(CudaMemAccessDesc, flags, CUmemAccessDesc, flags);

SAME_VALUE(CUDA_DRIVER_SUCCESS, CUDA_SUCCESS);
SAME_VALUE(CUDA_DRIVER_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_DRIVER_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME_VALUE(CUDA_DRIVER_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_DRIVER_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_DRIVER_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_DRIVER_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME_VALUE(CUDA_DRIVER_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_BINARY_FOR_GPU);
SAME_VALUE(CUDA_DRIVER_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_PTX);
SAME_VALUE(CUDA_DRIVER_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
SAME_VALUE(CUDA_DRIVER_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME_VALUE(CUDA_DRIVER_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
SAME_VALUE(CUDA_DRIVER_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS);
SAME_VALUE(CUDA_DRIVER_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED);
SAME_VALUE(CUDA_DRIVER_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CUDA_DRIVER_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
SAME_VALUE(CUDA_DRIVER_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(CUDA_DRIVER_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME_VALUE(CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_NONE);
SAME_VALUE(CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READ);
SAME_VALUE(CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(CUDA_DRIVER_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME_VALUE(CUDA_DRIVER_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
SAME_VALUE(CUDA_DRIVER_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);

/* Everything above is checked at compile time; this executable only has to build. */
static void test_layouts(void **state) {
        assert_int_equal(sizeof(CudaMemAllocationProp), sizeof(CUmemAllocationProp));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_layouts),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
