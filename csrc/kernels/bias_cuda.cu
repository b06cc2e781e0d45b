// CUDA bias kernels.
#include "../common.h"
#include "bias.h"

namespace nntile::kernels {

__global__ static void bias_add_kernel(int64_t m, int64_t n, const float *b, float *y) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < m * n; i += stride) y[i] += b[i % n];
}

// One thread per column: neighbouring threads read neighbouring addresses, so rows are read coalesced.
__global__ static void bias_grad_kernel(int64_t m, int64_t n, const float *dy, float beta, float *db) {
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= n) return;
    float acc = 0.f;
    for (int64_t r = 0; r < m; ++r) acc += dy[r * n + j];
    db[j] = (beta == 0.f ? 0.f : beta * db[j]) + acc;
}

void bias_add_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *b, float *y) {
    int64_t total = m * n;
    int blocks = (int)std::min<int64_t>((total + 255) / 256, 65535);
    bias_add_kernel<<<blocks, 256, 0, stream>>>(m, n, b, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_add kernel launch failed: " << cudaGetErrorString(err));
}

void bias_grad_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *dy, float beta, float *db) {
    bias_grad_kernel<<<(int)((n + 255) / 256), 256, 0, stream>>>(m, n, dy, beta, db);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_grad kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
