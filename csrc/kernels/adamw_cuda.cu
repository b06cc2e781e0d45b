// CUDA AdamW kernel.
#include "../common.h"
#include "adamw_impl.h"

namespace nntile::kernels {

__global__ static void adamw_kernel(int64_t n, AdamWScalars s, const float *grad, float *param, float *exp_avg,
                                    float *exp_avg_sq) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
        adamw_element(s, grad[i], p, m, v);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

void adamw_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, const float *grad, float *param,
                float *exp_avg, float *exp_avg_sq) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    adamw_kernel<<<blocks, 256, 0, stream>>>(n, s, grad, param, exp_avg, exp_avg_sq);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "adamw kernel launch failed: " << cudaGetErrorString(err));
}

__global__ static void adamw_bf16state_kernel(int64_t n, AdamWScalars s, uint64_t seed, const float *grad,
                                              float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float p = param[i];
        uint16_t m = exp_avg[i], v = exp_avg_sq[i];
        adamw_element_bf16state(s, seed, i, grad[i], p, m, v);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

void adamw_bf16state_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                          float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    adamw_bf16state_kernel<<<blocks, 256, 0, stream>>>(n, s, seed, grad, param, exp_avg, exp_avg_sq);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "adamw (bf16 state) kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
