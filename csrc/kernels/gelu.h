// GELU forward and backward over n fp32 values (any tile shape): y = gelu(x), dx = dy * gelu'(x), exact (erf)
// or tanh-approximated, with ATen's kernels (the same numbers torch gives).
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

// out_bf16: y (dx) holds bfloat16, a bf16 matmul's input (docs/fusion.md): ATen's fp32 values rounded to nearest
// even by convert_cpu / convert_cuda, the same bits as the unfused fp32 output and its cast.
void gelu_forward(const Where &w, int64_t n, bool tanh_approx, const float *x, void *y, bool out_bf16 = false);
void gelu_backward(const Where &w, int64_t n, bool tanh_approx, const float *dy, const float *x, void *dx,
                   bool out_bf16 = false);

}  // namespace nntile::kernels
