// LayerNorm over the last dimension of a row-major (m, c) fp32 tile holding whole rows, with ATen's kernels
// (the same numbers as torch.nn.LayerNorm).
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

// y = (x - mean) * rstd * weight + bias; mean, rstd (m,) kept for backward. weight/bias may be null.
void layer_norm_forward(const Where &w, int64_t m, int64_t c, float eps, const float *x, const float *weight,
                        const float *bias, float *y, float *mean, float *rstd);
// dx (m, c) written; dweight, dbias (c,) accumulated (beta = 0 overwrites them, 1 adds). Null when absent.
void layer_norm_backward(const Where &w, int64_t m, int64_t c, const float *dy, const float *x, const float *mean,
                         const float *rstd, const float *weight, float *dx, float *dweight, float *dbias, float beta);

}  // namespace nntile::kernels
