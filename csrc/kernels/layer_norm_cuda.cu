// CUDA LayerNorm forward: one thread block per row. ATen's op costs the launching thread ~65 us per tile on the
// H200 (it computes into new tensors and copies them into the tile: three more kernels), all of it GPU idle when a
// step's tasks run one after another; this kernel is one launch.
#include "../common.h"
#include "layer_norm.h"

namespace nntile::kernels {

namespace {

// The sum of v over the block, returned to every thread; `red` holds 32 floats.
__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    __syncthreads();  // red may still be read from the previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nwarps ? red[lane] : 0.f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Two passes for the variance (the mean first): as accurate as ATen's Welford, without its per-element division.
__global__ void layer_norm_forward_kernel(int64_t c, float eps, const float *x, const float *weight,
                                          const float *bias, float *y, float *mean, float *rstd) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c;
    float *yr = y + row * c;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += xr[j];
    const float mu = block_sum(s, red) / (float)c;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float d = xr[j] - mu;
        q += d * d;
    }
    const float rs = rsqrtf(block_sum(q, red) / (float)c + eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float v = (xr[j] - mu) * rs;
        if (weight) v *= weight[j];
        if (bias) v += bias[j];
        yr[j] = v;
    }
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

}  // namespace

void layer_norm_forward_cuda(cudaStream_t stream, int64_t m, int64_t c, float eps, const float *x,
                             const float *weight, const float *bias, float *y, float *mean, float *rstd) {
    if (m == 0) return;
    NNTILE_CHECK(m <= 0x7fffffff, "layer_norm: at most 2^31 - 1 rows per tile (got " << m << ")");
    int threads = c >= 2048 ? 512 : c >= 512 ? 256 : c >= 128 ? 128 : 32;
    layer_norm_forward_kernel<<<(unsigned)m, threads, 0, stream>>>(c, eps, x, weight, bias, y, mean, rstd);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "layer_norm forward kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
