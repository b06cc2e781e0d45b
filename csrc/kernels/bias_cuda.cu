// CUDA bias kernels.
#include "../common.h"
#include "bias.h"

#include <cuda_bf16.h>

namespace nntile::kernels {

__global__ static void bias_add_kernel(int64_t m, int64_t n, const float *b, float *y) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < m * n; i += stride) y[i] += b[i % n];
}

void bias_add_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *b, float *y) {
    int64_t total = m * n;
    int blocks = (int)std::min<int64_t>((total + 255) / 256, 65535);
    bias_add_kernel<<<blocks, 256, 0, stream>>>(m, n, b, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_add kernel launch failed: " << cudaGetErrorString(err));
}

// A block sums 32 columns over all rows: thread (x, y) the rows y, y + 16, ..., coalesced across x; then the 16
// partial sums of a column in a fixed order.
constexpr int kColumnsPerBlock = 32, kRowPhases = 16;

__global__ static void bias_grad_bf16_kernel(int64_t m, int64_t n, const __nv_bfloat16 *dy, bool accumulate,
                                             float *db) {
    __shared__ float partial[kRowPhases][kColumnsPerBlock];
    int64_t col = blockIdx.x * (int64_t)kColumnsPerBlock + threadIdx.x;
    float acc = 0.f;
    if (col < n)
        for (int64_t r = threadIdx.y; r < m; r += kRowPhases) acc += __bfloat162float(dy[r * n + col]);
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || col >= n) return;
    float sum = 0.f;
    for (int y = 0; y < kRowPhases; ++y) sum += partial[y][threadIdx.x];
    db[col] = accumulate ? db[col] + sum : sum;
}

void bias_grad_bf16_cuda(cudaStream_t stream, int64_t m, int64_t n, const void *dy, bool accumulate, float *db) {
    int64_t blocks = (n + kColumnsPerBlock - 1) / kColumnsPerBlock;
    NNTILE_CHECK(blocks <= INT32_MAX, "bias_grad_bf16: too many columns (got n=" << n << ")");
    bias_grad_bf16_kernel<<<(unsigned)blocks, dim3(kColumnsPerBlock, kRowPhases), 0, stream>>>(
        m, n, static_cast<const __nv_bfloat16 *>(dy), accumulate, db);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_grad_bf16 kernel launch failed (m=" << m << " n=" << n
                                                                                << "): " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
