// CUDA silu(g) * u and its backward: one grid-stride elementwise kernel each.
#include "../common.h"
#include "silu_mul.h"

namespace nntile::kernels {

namespace {

__global__ void silu_mul_forward_kernel(int64_t n, const float *g, const float *u, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = 1.f / (1.f + expf(-g[i]));
        y[i] = g[i] * s * u[i];
    }
}

__global__ void silu_mul_backward_kernel(int64_t n, const float *dy, const float *g, const float *u, float *dg,
                                         float *du) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float s = 1.f / (1.f + expf(-g[i]));
        const float silu = g[i] * s;
        dg[i] = dy[i] * u[i] * (s * (1.f + g[i] * (1.f - s)));
        du[i] = dy[i] * silu;
    }
}

unsigned silu_mul_blocks(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

void silu_mul_forward_cuda(cudaStream_t stream, int64_t n, const float *g, const float *u, float *y) {
    if (n == 0) return;
    silu_mul_forward_kernel<<<silu_mul_blocks(n), 256, 0, stream>>>(n, g, u, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "silu_mul forward kernel launch failed (n=" << n << "): "
                                         << cudaGetErrorString(err));
}

void silu_mul_backward_cuda(cudaStream_t stream, int64_t n, const float *dy, const float *g, const float *u,
                            float *dg, float *du) {
    if (n == 0) return;
    silu_mul_backward_kernel<<<silu_mul_blocks(n), 256, 0, stream>>>(n, dy, g, u, dg, du);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "silu_mul backward kernel launch failed (n=" << n << "): "
                                         << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
