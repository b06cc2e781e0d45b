// GELU forward and backward over n fp32 values (any tile shape): y = gelu(x), dx = dy * gelu'(x), exact (erf)
// or tanh-approximated, with ATen's kernels (the same numbers torch gives).
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

void gelu_forward(const Where &w, int64_t n, bool tanh_approx, const float *x, float *y);
void gelu_backward(const Where &w, int64_t n, bool tanh_approx, const float *dy, const float *x, float *dx);

}  // namespace nntile::kernels
