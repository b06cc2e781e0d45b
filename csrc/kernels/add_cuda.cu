// CUDA elementwise add.
#include "../common.h"
#include "add.h"

namespace nntile::kernels {

__global__ static void add_kernel(int64_t n, float alpha, const float *x, float beta, float *y) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = beta == 0.f ? alpha * x[i] : alpha * x[i] + beta * y[i];
}

__global__ static void add_into_kernel(int64_t n, float alpha, const float *x, float beta, const float *y, float *z) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) z[i] = alpha * x[i] + beta * y[i];
}

void add_into_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, const float *y, float *z) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    add_into_kernel<<<blocks, 256, 0, stream>>>(n, alpha, x, beta, y, z);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "add_into kernel launch failed: " << cudaGetErrorString(err));
}

void add_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, float *y) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    add_kernel<<<blocks, 256, 0, stream>>>(n, alpha, x, beta, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "add kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
