// CUDA LayerNorm, forward and backward. The forward: one thread block per row, one launch. ATen's op computes into
// new tensors and copies them into the tile (three more kernels), all of it launch time with the GPU idle when a
// step's tasks run one after another (docs/measurements.md, "LayerNorm and attention kernels").
#include <cuda_bf16.h>

#include <type_traits>

#include "../common.h"
#include "block_sum_cuda.cuh"
#include "layer_norm.h"

namespace nntile::kernels {

namespace {

// Two passes for the variance (the mean first): as accurate as ATen's Welford, without its per-element division.
// Y: float, or __nv_bfloat16 for a bf16 matmul's input (one rounding to nearest even per value, as convert_cuda's).
template <typename Y>
__global__ void layer_norm_forward_kernel(int64_t c, float eps, const float *x, const float *weight,
                                          const float *bias, Y *y, float *mean, float *rstd) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c;
    Y *yr = y + row * c;
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
        if constexpr (std::is_same_v<Y, float>)
            yr[j] = v;
        else
            yr[j] = __float2bfloat16_rn(v);
    }
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// dx of one row per block: with xhat = (x - mean) * rstd and g = dy * weight,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
__global__ void layer_norm_backward_dx_kernel(int64_t c, const float *dy, const float *x, const float *mean,
                                              const float *rstd, const float *weight, float *dx) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *dyr = dy + row * c, *xr = x + row * c;
    const float mu = mean[row], rs = rstd[row];
    float sg = 0.f, sgx = 0.f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float g = weight ? dyr[j] * weight[j] : dyr[j];
        sg += g;
        sgx += g * (xr[j] - mu) * rs;
    }
    const float mg = block_sum(sg, red) / (float)c;
    const float mgx = block_sum(sgx, red) / (float)c;
    float *dxr = dx + row * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float g = weight ? dyr[j] * weight[j] : dyr[j];
        dxr[j] = rs * (g - mg - (xr[j] - mu) * rs * mgx);
    }
}

// The weight and bias gradients are column sums over the rows: a block covers 32 columns of one chunk of rows
// (a warp reads 128 contiguous bytes of a row) and writes its partial sums; a second kernel adds the chunks'
// partials in chunk order, so the result is the same on every run whatever the scheduling.
constexpr int kCols = 32, kPhases = 8;

__global__ void layer_norm_backward_partials_kernel(int64_t m, int64_t c, int64_t rows_per_chunk, const float *dy,
                                                    const float *x, const float *mean, const float *rstd,
                                                    float *part_w, float *part_b) {
    __shared__ float sw[kPhases][kCols + 1], sb[kPhases][kCols + 1];
    const int64_t j = blockIdx.x * (int64_t)kCols + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = min(m, r0 + rows_per_chunk);
    float aw = 0.f, ab = 0.f;
    if (j < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kPhases) {
            float d = dy[r * c + j];
            aw += d * (x[r * c + j] - mean[r]) * rstd[r];
            ab += d;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float tw = 0.f, tb = 0.f;
        for (int p = 0; p < kPhases; ++p) tw += sw[p][threadIdx.x], tb += sb[p][threadIdx.x];
        part_w[blockIdx.y * c + j] = tw;
        part_b[blockIdx.y * c + j] = tb;
    }
}

__global__ void layer_norm_backward_sum_kernel(int64_t c, int64_t chunks, const float *part_w, const float *part_b,
                                               float *dweight, float *dbias, float beta) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= c) return;
    float tw = 0.f, tb = 0.f;
    for (int64_t k = 0; k < chunks; ++k) tw += part_w[k * c + j], tb += part_b[k * c + j];
    if (dweight) dweight[j] = (beta == 0.f ? 0.f : dweight[j]) + tw;
    if (dbias) dbias[j] = (beta == 0.f ? 0.f : dbias[j]) + tb;
}

}  // namespace

void layer_norm_forward_cuda(cudaStream_t stream, int64_t m, int64_t c, float eps, const float *x,
                             const float *weight, const float *bias, void *y, bool y_bf16, float *mean,
                             float *rstd) {
    if (m == 0) return;
    NNTILE_CHECK(m <= 0x7fffffff, "layer_norm: at most 2^31 - 1 rows per tile (got " << m << ")");
    int threads = c >= 2048 ? 512 : c >= 512 ? 256 : c >= 128 ? 128 : 32;
    if (y_bf16)
        layer_norm_forward_kernel<<<(unsigned)m, threads, 0, stream>>>(
            c, eps, x, weight, bias, static_cast<__nv_bfloat16 *>(y), mean, rstd);
    else
        layer_norm_forward_kernel<<<(unsigned)m, threads, 0, stream>>>(c, eps, x, weight, bias,
                                                                        static_cast<float *>(y), mean, rstd);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "layer_norm forward kernel launch failed: " << cudaGetErrorString(err));
}

void layer_norm_backward_cuda(cudaStream_t stream, int64_t m, int64_t c, const float *dy, const float *x,
                              const float *mean, const float *rstd, const float *weight, float *dx, float *dweight,
                              float *dbias, float beta, float *partials) {
    if (m == 0) return;
    NNTILE_CHECK(m <= 0x7fffffff, "layer_norm: at most 2^31 - 1 rows per tile (got " << m << ")");
    int threads = c >= 2048 ? 512 : c >= 512 ? 256 : c >= 128 ? 128 : 32;
    layer_norm_backward_dx_kernel<<<(unsigned)m, threads, 0, stream>>>(c, dy, x, mean, rstd, weight, dx);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "layer_norm backward kernel launch failed: " << cudaGetErrorString(err));
    if (!dweight && !dbias) return;
    const int64_t chunks = layer_norm_backward_chunks(m), rows_per_chunk = (m + chunks - 1) / chunks;
    dim3 grid((unsigned)((c + kCols - 1) / kCols), (unsigned)chunks);
    layer_norm_backward_partials_kernel<<<grid, dim3(kCols, kPhases), 0, stream>>>(
        m, c, rows_per_chunk, dy, x, mean, rstd, partials, partials + chunks * c);
    layer_norm_backward_sum_kernel<<<(unsigned)((c + 255) / 256), 256, 0, stream>>>(
        c, chunks, partials, partials + chunks * c, dweight, dbias, beta);
    err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "layer_norm backward kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
