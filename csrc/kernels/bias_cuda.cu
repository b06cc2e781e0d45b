// CUDA bias kernels.
#include "../common.h"
#include "bias.h"

namespace nntile::kernels {

__global__ static void bias_add_kernel(int64_t m, int64_t n, const float *b, float *y) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < m * n; i += stride) y[i] += b[i % n];
}

// Column sums: a block covers 32 columns with 16 row phases; each thread sums every 16th row of its column
// (neighbouring threads read neighbouring addresses), then the block adds the 16 partial sums in a fixed
// order, so the result does not depend on timing.
constexpr int kCols = 32, kPhases = 16;

__global__ static void bias_grad_kernel(int64_t m, int64_t n, const float *dy, float beta, float *db) {
    __shared__ float part[kPhases][kCols + 1];
    int64_t j = blockIdx.x * (int64_t)kCols + threadIdx.x;
    float acc = 0.f;
    if (j < n)
        for (int64_t r = threadIdx.y; r < m; r += kPhases) acc += dy[r * n + j];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float sum = 0.f;
        for (int p = 0; p < kPhases; ++p) sum += part[p][threadIdx.x];
        db[j] = (beta == 0.f ? 0.f : beta * db[j]) + sum;
    }
}

void bias_add_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *b, float *y) {
    int64_t total = m * n;
    int blocks = (int)std::min<int64_t>((total + 255) / 256, 65535);
    bias_add_kernel<<<blocks, 256, 0, stream>>>(m, n, b, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_add kernel launch failed: " << cudaGetErrorString(err));
}

void bias_grad_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *dy, float beta, float *db) {
    bias_grad_kernel<<<(int)((n + kCols - 1) / kCols), dim3(kCols, kPhases), 0, stream>>>(m, n, dy, beta, db);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_grad kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
