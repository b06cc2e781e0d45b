// GELU forward and backward that write bfloat16 in one pass (a bf16 matmul's input, docs/fusion.md): ATen's own
// float32 formulas (its CUDA GeluCUDAKernelImpl and GeluBackwardCUDAKernelImpl, opmath float, the same operations in
// the same order), then one round to nearest even: the bits of ATen's float32 result and its cast, without the
// float32 scratch written and read back.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "../common.h"
#include "gelu.h"

namespace nntile::kernels {

namespace {

template <bool Tanh>
__device__ __forceinline__ float gelu_value(float x) {
    if constexpr (Tanh) {
        constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * float(0.5);
        constexpr float kKappa = 0.044715;
        auto x_cube = x * x * x;
        auto inner = kBeta * (x + kKappa * x_cube);
        return float(0.5) * x * (float(1) + ::tanhf(inner));
    } else {
        constexpr float kAlpha = M_SQRT1_2;
        return x * float(0.5) * (float(1) + ::erff(x * kAlpha));
    }
}

template <bool Tanh>
__device__ __forceinline__ float gelu_grad(float dy, float x) {
    if constexpr (Tanh) {
        constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * float(0.5);
        constexpr float kKappa = 0.044715;
        auto x_sq = x * x;
        auto x_cube = x_sq * x;
        auto inner = kBeta * (x + kKappa * x_cube);
        auto tanh_inner = ::tanhf(inner);
        auto left = float(0.5) * x;
        auto right = float(1) + tanh_inner;
        auto left_derivative = float(0.5) * right;
        auto tanh_derivative = float(1) - tanh_inner * tanh_inner;
        auto inner_derivative = kBeta * (float(1) + float(3) * kKappa * x_sq);
        auto right_derivative = left * tanh_derivative * inner_derivative;
        return dy * (left_derivative + right_derivative);
    } else {
        constexpr float kBeta = M_2_SQRTPI * M_SQRT1_2 * float(0.5);
        constexpr float kAlpha = M_SQRT1_2;
        const float cdf = float(0.5) * (float(1) + ::erff(x * kAlpha));
        const float pdf = ::expf(float(-0.5) * x * x) * kBeta;
        return dy * (cdf + x * pdf);
    }
}

template <bool Tanh>
__global__ void gelu_bf16_kernel(int64_t n, const float *x, __nv_bfloat16 *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(gelu_value<Tanh>(x[i]));
}

template <bool Tanh>
__global__ void gelu_backward_bf16_kernel(int64_t n, const float *dy, const float *x, __nv_bfloat16 *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = __float2bfloat16_rn(gelu_grad<Tanh>(dy[i], x[i]));
}

int blocks_for(int64_t n) { return (int)std::min<int64_t>((n + 255) / 256, 65535); }

void check_launch(const char *what) {
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, what << " launch failed: " << cudaGetErrorString(err));
}

}  // namespace

void gelu_forward_bf16_cuda(cudaStream_t stream, int64_t n, bool tanh_approx, const float *x, void *y) {
    if (n == 0) return;
    auto *out = static_cast<__nv_bfloat16 *>(y);
    if (tanh_approx)
        gelu_bf16_kernel<true><<<blocks_for(n), 256, 0, stream>>>(n, x, out);
    else
        gelu_bf16_kernel<false><<<blocks_for(n), 256, 0, stream>>>(n, x, out);
    check_launch("gelu_forward_bf16_cuda");
}

void gelu_backward_bf16_cuda(cudaStream_t stream, int64_t n, bool tanh_approx, const float *dy, const float *x,
                             void *dx) {
    if (n == 0) return;
    auto *out = static_cast<__nv_bfloat16 *>(dx);
    if (tanh_approx)
        gelu_backward_bf16_kernel<true><<<blocks_for(n), 256, 0, stream>>>(n, dy, x, out);
    else
        gelu_backward_bf16_kernel<false><<<blocks_for(n), 256, 0, stream>>>(n, dy, x, out);
    check_launch("gelu_backward_bf16_cuda");
}

}  // namespace nntile::kernels
