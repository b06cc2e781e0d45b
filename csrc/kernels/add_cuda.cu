// CUDA elementwise add.
#include <cstdint>

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

// Four values per thread (16-byte loads and stores) for aligned tiles: the residual adds and gradient sums are pure
// memory streams. Each value is computed as in the one-value form.
__global__ static void add_vec4_kernel(int64_t n4, float alpha, const float4 *x, float beta, float4 *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = x[i], b = beta == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f) : y[i];
        y[i] = beta == 0.f ? make_float4(alpha * a.x, alpha * a.y, alpha * a.z, alpha * a.w)
                           : make_float4(alpha * a.x + beta * b.x, alpha * a.y + beta * b.y, alpha * a.z + beta * b.z,
                                         alpha * a.w + beta * b.w);
    }
}

__global__ static void add_into_vec4_kernel(int64_t n4, float alpha, const float4 *x, float beta, const float4 *y,
                                            float4 *z) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = x[i], b = y[i];
        z[i] = make_float4(alpha * a.x + beta * b.x, alpha * a.y + beta * b.y, alpha * a.z + beta * b.z,
                           alpha * a.w + beta * b.w);
    }
}

namespace {
int blocks_for(int64_t n) { return (int)std::min<int64_t>((n + 255) / 256, 65535); }
bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
void check_launch(const char *what) {
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, what << " kernel launch failed: " << cudaGetErrorString(err));
}
}  // namespace

void add_into_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, const float *y, float *z) {
    if (n == 0) return;
    int64_t n4 = aligned16(x) && aligned16(y) && aligned16(z) ? n / 4 : 0, done = 4 * n4;
    if (n4 > 0)
        add_into_vec4_kernel<<<blocks_for(n4), 256, 0, stream>>>(n4, alpha, (const float4 *)x, beta,
                                                                (const float4 *)y, (float4 *)z);
    if (done < n) add_into_kernel<<<blocks_for(n - done), 256, 0, stream>>>(n - done, alpha, x + done, beta, y + done, z + done);
    check_launch("add_into");
}

void add_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, float *y) {
    if (n == 0) return;
    int64_t n4 = aligned16(x) && aligned16(y) ? n / 4 : 0, done = 4 * n4;
    if (n4 > 0) add_vec4_kernel<<<blocks_for(n4), 256, 0, stream>>>(n4, alpha, (const float4 *)x, beta, (float4 *)y);
    if (done < n) add_kernel<<<blocks_for(n - done), 256, 0, stream>>>(n - done, alpha, x + done, beta, y + done);
    check_launch("add");
}

}  // namespace nntile::kernels
