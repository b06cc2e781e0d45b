// CUDA RMSNorm, forward and backward: one thread block per row for y and dx; the weight gradient as column sums in
// two stages (per-chunk partials, then the chunks added in order, so every run gives the same numbers).
#include "../common.h"
#include "block_sum_cuda.cuh"
#include "rmsnorm.h"

namespace nntile::kernels {

namespace {

__global__ void rmsnorm_forward_kernel(int64_t c, float eps, const float *x, const float *weight, float *y,
                                       float *rstd) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * c;
    float *yr = y + row * c;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) q += xr[j] * xr[j];
    const float rs = rsqrtf(block_sum(q, red) / (float)c + eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        const float v = xr[j] * rs;
        yr[j] = weight ? weight[j] * v : v;
    }
    if (threadIdx.x == 0) rstd[row] = rs;
}

// dx = rstd * g - x * rstd^3 * mean(g * x), g = dy * weight.
__global__ void rmsnorm_backward_dx_kernel(int64_t c, const float *dy, const float *x, const float *rstd,
                                           const float *weight, float *dx) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const float *dyr = dy + row * c, *xr = x + row * c;
    const float rs = rstd[row];
    float sgx = 0.f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        const float g = weight ? dyr[j] * weight[j] : dyr[j];
        sgx += g * xr[j];
    }
    const float k = rs * rs * rs * block_sum(sgx, red) / (float)c;
    float *dxr = dx + row * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        const float g = weight ? dyr[j] * weight[j] : dyr[j];
        dxr[j] = rs * g - xr[j] * k;
    }
}

constexpr int kCols = 32, kPhases = 8;

// A block covers 32 columns of one chunk of rows (a warp reads 128 contiguous bytes of a row).
__global__ void rmsnorm_backward_partials_kernel(int64_t m, int64_t c, int64_t rows_per_chunk, const float *dy,
                                                 const float *x, const float *rstd, float *part_w) {
    __shared__ float sw[kPhases][kCols + 1];
    const int64_t j = blockIdx.x * (int64_t)kCols + threadIdx.x;
    const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = min(m, r0 + rows_per_chunk);
    float aw = 0.f;
    if (j < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kPhases) aw += dy[r * c + j] * (x[r * c + j] * rstd[r]);
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float tw = 0.f;
        for (int p = 0; p < kPhases; ++p) tw += sw[p][threadIdx.x];
        part_w[blockIdx.y * c + j] = tw;
    }
}

__global__ void rmsnorm_backward_sum_kernel(int64_t c, int64_t chunks, const float *part_w, float *dweight,
                                            float beta) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= c) return;
    float tw = 0.f;
    for (int64_t k = 0; k < chunks; ++k) tw += part_w[k * c + j];
    dweight[j] = (beta == 0.f ? 0.f : dweight[j]) + tw;
}

int rms_threads(int64_t c) { return c >= 2048 ? 512 : c >= 512 ? 256 : c >= 128 ? 128 : 32; }

}  // namespace

void rmsnorm_forward_cuda(cudaStream_t stream, int64_t m, int64_t c, float eps, const float *x, const float *weight,
                          float *y, float *rstd) {
    if (m == 0) return;
    NNTILE_CHECK(m <= 0x7fffffff, "rmsnorm: at most 2^31 - 1 rows per tile (got " << m << ")");
    rmsnorm_forward_kernel<<<(unsigned)m, rms_threads(c), 0, stream>>>(c, eps, x, weight, y, rstd);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "rmsnorm forward kernel launch failed: " << cudaGetErrorString(err));
}

void rmsnorm_backward_cuda(cudaStream_t stream, int64_t m, int64_t c, const float *dy, const float *x,
                           const float *rstd, const float *weight, float *dx, float *dweight, float beta,
                           float *partials) {
    if (m == 0) return;
    NNTILE_CHECK(m <= 0x7fffffff, "rmsnorm: at most 2^31 - 1 rows per tile (got " << m << ")");
    rmsnorm_backward_dx_kernel<<<(unsigned)m, rms_threads(c), 0, stream>>>(c, dy, x, rstd, weight, dx);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "rmsnorm backward kernel launch failed: " << cudaGetErrorString(err));
    if (!dweight) return;
    const int64_t chunks = rmsnorm_backward_chunks(m), rows_per_chunk = (m + chunks - 1) / chunks;
    dim3 grid((unsigned)((c + kCols - 1) / kCols), (unsigned)chunks);
    rmsnorm_backward_partials_kernel<<<grid, dim3(kCols, kPhases), 0, stream>>>(m, c, rows_per_chunk, dy, x, rstd,
                                                                                partials);
    rmsnorm_backward_sum_kernel<<<(unsigned)((c + 255) / 256), 256, 0, stream>>>(c, chunks, partials, dweight, beta);
    err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "rmsnorm backward kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
