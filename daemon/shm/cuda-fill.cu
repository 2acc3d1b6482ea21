/* cuda-fill.cu: the shard fill kernel; its PTX (cuda-fill.ptx) is what familyd embeds.
 *
 * Regenerate the PTX after changing this file or cuda-fill-kernel.h, on a machine with nvcc:
 *   sh daemon/shm/gen-cuda-fill-ptx.sh
 * (compute_75, -fmad=false; tests/unit/test-cuda-fill.c refuses a PTX older than its sources).
 */
#include "cuda-fill-kernel.h"

/* One thread per element, grid-stride: any grid covers any slice. */
extern "C" __global__ void familyd_fill(FillKernelParams p) {
        FkU64 stride = (FkU64) gridDim.x * blockDim.x;

        for (FkU64 j = (FkU64) blockIdx.x * blockDim.x + threadIdx.x; j < p.n; j += stride)
                fk_store(&p, (void *) p.dst, j);
}
