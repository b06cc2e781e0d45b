// RMSNorm over the last dimension of a row-major (m, c) fp32 tile holding whole rows, as Hugging Face's
// LlamaRMSNorm computes it: y = weight * (x * rsqrt(mean(x^2) + eps)), the mean of squares in fp32 or wider.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

// y (m, c) and rstd (m,) written; rstd = rsqrt(mean(x^2) + eps) is kept for the backward. weight may be null.
void rmsnorm_forward(const Where &w, int64_t m, int64_t c, float eps, const float *x, const float *weight, float *y,
                     float *rstd);
// dx (m, c) written: with g = dy * weight, dx = rstd * g - x * rstd^3 * mean(g * x).
// dweight (c,) = sum over rows of dy * x * rstd, written (beta 0) or added (beta 1); null when absent.
void rmsnorm_backward(const Where &w, int64_t m, int64_t c, const float *dy, const float *x, const float *rstd,
                      const float *weight, float *dx, float *dweight, float beta);
#ifdef NNTILE_USE_CUDA
void rmsnorm_forward_cuda(cudaStream_t stream, int64_t m, int64_t c, float eps, const float *x, const float *weight,
                          float *y, float *rstd);
// Row chunks of the weight gradient's column sums: enough blocks to fill a GPU, each chunk at least 64 rows.
inline int64_t rmsnorm_backward_chunks(int64_t m) { return m < 128 ? 1 : m / 64 < 256 ? m / 64 : 256; }
// partials: rmsnorm_backward_chunks(m) * c floats of scratch (unused when dweight is null).
void rmsnorm_backward_cuda(cudaStream_t stream, int64_t m, int64_t c, const float *dy, const float *x,
                           const float *rstd, const float *weight, float *dx, float *dweight, float beta,
                           float *partials);
#endif

}  // namespace nntile::kernels
