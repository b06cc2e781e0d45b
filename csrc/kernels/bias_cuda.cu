// CUDA bias kernels.
#include "../common.h"
#include "bias.h"

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

}  // namespace nntile::kernels
