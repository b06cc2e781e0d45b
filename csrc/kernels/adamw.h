// AdamW update over n fp32 values, step by step as torch.optim.AdamW (single-tensor path) does it:
//   p *= 1 - lr * wd;  m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) g^2;
//   p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

namespace nntile::kernels {

// Scalars as torch computes them in Python (double) and hands to its float kernels.
struct AdamWScalars {
    float decay;         // 1 - lr * weight_decay
    float one_minus_b1;  // lerp weight
    float beta2;
    float one_minus_b2;
    float step_size;     // lr / (1 - beta1^step)
    float bc2_sqrt;      // sqrt(1 - beta2^step)
    float eps;
};

// copy (may be null): the updated parameter rounded to bf16 (to nearest, ties to even: convert's rounding), written in
// the same pass (the bf16 weight copy a matmul reads: one read of the parameter less than a separate conversion).
void adamw_cpu(int64_t n, const AdamWScalars &s, const float *grad, float *param, float *exp_avg, float *exp_avg_sq,
               uint16_t *copy = nullptr);

// The same update with exp_avg and exp_avg_sq kept in bf16 (raw bits): each step computes them in fp32 from
// their bf16 values, updates param with those fp32 values, and stores them rounded stochastically (the 16
// dropped bits are compared with hash(seed, i)), so small updates of exp_avg_sq (beta2 = 0.999: 0.1% of its
// value, under bf16's 0.4% spacing) are kept on average instead of being rounded away every step.
void adamw_bf16state_cpu(int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad, float *param,
                         uint16_t *exp_avg, uint16_t *exp_avg_sq, uint16_t *copy = nullptr);
// The same with the parameter in bf16 too (bf16 master weights, no copy): it is rounded stochastically as well, from
// 16 further bits of the element's hash.
void adamw_bf16_cpu(int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad, uint16_t *param,
                    uint16_t *exp_avg, uint16_t *exp_avg_sq);
#ifdef NNTILE_USE_CUDA
void adamw_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, const float *grad, float *param,
                float *exp_avg, float *exp_avg_sq, uint16_t *copy = nullptr);
void adamw_bf16state_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                          float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq, uint16_t *copy = nullptr);
void adamw_bf16_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                     uint16_t *param, uint16_t *exp_avg, uint16_t *exp_avg_sq);
#endif

}  // namespace nntile::kernels
