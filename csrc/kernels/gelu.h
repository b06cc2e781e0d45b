// GELU forward and backward over n fp32 values (any tile shape): y = gelu(x), dx = dy * gelu'(x), exact (erf)
// or tanh-approximated, with ATen's kernels (the same numbers torch gives).
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

// out_bf16: y (dx) holds bfloat16, a bf16 matmul's input (docs/fusion.md): ATen's fp32 values rounded to nearest
// even, the same bits as the unfused fp32 output and its cast (on CPUs through fp32 scratch and convert_cpu; on GPUs
// one kernel that computes ATen's formula and rounds).
void gelu_forward(const Where &w, int64_t n, bool tanh_approx, const float *x, void *y, bool out_bf16 = false);
void gelu_backward(const Where &w, int64_t n, bool tanh_approx, const float *dy, const float *x, void *dx,
                   bool out_bf16 = false);
#ifdef NNTILE_USE_CUDA
// The bf16 outputs on GPUs in one pass (gelu_cuda.cu): ATen's float32 formulas, then the round to nearest even.
void gelu_forward_bf16_cuda(cudaStream_t stream, int64_t n, bool tanh_approx, const float *x, void *y);
void gelu_backward_bf16_cuda(cudaStream_t stream, int64_t n, bool tanh_approx, const float *dy, const float *x,
                             void *dx);
#endif

}  // namespace nntile::kernels
