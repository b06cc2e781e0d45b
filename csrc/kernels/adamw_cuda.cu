// CUDA AdamW kernels: fp32 states, or bf16 states rounded stochastically (adamw.h).
#include "../common.h"
#include "adamw_impl.h"

namespace nntile::kernels {

namespace {

// One element with fp32 states (the seed is unused) or with bf16 states.
__device__ __forceinline__ void update(const AdamWScalars &s, uint64_t, int64_t, float g, float &p, float &m,
                                       float &v) {
    adamw_element(s, g, p, m, v);
}

__device__ __forceinline__ void update(const AdamWScalars &s, uint64_t seed, int64_t i, float g, float &p,
                                       uint16_t &m, uint16_t &v) {
    adamw_element_bf16state(s, seed, i, g, p, m, v);
}

template <class State>
__global__ void adamw_kernel(int64_t n, AdamWScalars s, uint64_t seed, const float *grad, float *param,
                             State *exp_avg, State *exp_avg_sq, uint16_t *copy) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float p = param[i];
        State m = exp_avg[i], v = exp_avg_sq[i];
        update(s, seed, i, grad[i], p, m, v);
        param[i] = p;
        if (copy) copy[i] = float_to_bf16_rne(p);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

__global__ void adamw_bf16_kernel(int64_t n, AdamWScalars s, uint64_t seed, const float *grad, uint16_t *param,
                                  uint16_t *exp_avg, uint16_t *exp_avg_sq) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        uint16_t p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
        adamw_element_bf16(s, seed, i, grad[i], p, m, v);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

template <class State>
void launch(const char *what, cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
            float *param, State *exp_avg, State *exp_avg_sq, uint16_t *copy) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    adamw_kernel<State><<<blocks, 256, 0, stream>>>(n, s, seed, grad, param, exp_avg, exp_avg_sq, copy);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, what << " kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace

void adamw_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, const float *grad, float *param,
                float *exp_avg, float *exp_avg_sq, uint16_t *copy) {
    launch("adamw", stream, n, s, 0, grad, param, exp_avg, exp_avg_sq, copy);
}

void adamw_bf16_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                     uint16_t *param, uint16_t *exp_avg, uint16_t *exp_avg_sq) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    if (blocks == 0) return;
    adamw_bf16_kernel<<<blocks, 256, 0, stream>>>(n, s, seed, grad, param, exp_avg, exp_avg_sq);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "adamw (bf16 master) kernel launch failed: " << cudaGetErrorString(err));
}

void adamw_bf16state_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                          float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq, uint16_t *copy) {
    launch("adamw (bf16 state)", stream, n, s, seed, grad, param, exp_avg, exp_avg_sq, copy);
}

}  // namespace nntile::kernels
