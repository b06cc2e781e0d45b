// A thread block's sum (or max), for the CUDA kernels that reduce one row or block per thread block (LayerNorm,
// RMSNorm, the 8-bit AdamW's per-block absmax).
#pragma once

namespace nntile::kernels {

// The sum of v over the block (a multiple of 32 threads), returned to every thread; `red` holds 32 floats of shared
// memory. The order is fixed (warp shuffles, then the warps in order), so every run gives the same sum.
__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    __syncthreads();  // red may still be read from the previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nwarps ? red[lane] : 0.f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The same pattern for the maximum of v >= 0 over the block (exact: a maximum does not depend on the order).
__device__ __forceinline__ float block_max_nonneg(float v, float *red) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nwarps ? red[lane] : 0.f;
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

}  // namespace nntile::kernels
