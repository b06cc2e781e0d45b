// The gated MLP's elementwise step over n fp32 values (any tile shape): y = silu(g) * u, silu(g) = g * sigmoid(g),
// and its backward dg = dy * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))), du = dy * silu(g).
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

void silu_mul_forward(const Where &w, int64_t n, const float *g, const float *u, float *y);
void silu_mul_backward(const Where &w, int64_t n, const float *dy, const float *g, const float *u, float *dg,
                       float *du);
#ifdef NNTILE_USE_CUDA
void silu_mul_forward_cuda(cudaStream_t stream, int64_t n, const float *g, const float *u, float *y);
void silu_mul_backward_cuda(cudaStream_t stream, int64_t n, const float *dy, const float *g, const float *u,
                            float *dg, float *du);
#endif

}  // namespace nntile::kernels
