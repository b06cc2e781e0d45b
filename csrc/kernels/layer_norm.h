// LayerNorm over the last dimension of a row-major (m, c) fp32 tile holding whole rows: ATen's kernels (the same
// numbers as torch.nn.LayerNorm), the forward on GPUs our own kernel (one launch; the same numbers to rounding).
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

// y = (x - mean) * rstd * weight + bias; mean, rstd (m,) kept for backward. weight/bias may be null. y_bf16: y
// holds bfloat16 (the input of a bf16 matmul, docs/fusion.md): fp32 arithmetic, one round to nearest even per value
// at the end, the same bits as a float32 y converted by convert_cpu / convert_cuda.
void layer_norm_forward(const Where &w, int64_t m, int64_t c, float eps, const float *x, const float *weight,
                        const float *bias, void *y, bool y_bf16, float *mean, float *rstd);
#ifdef NNTILE_USE_CUDA
void layer_norm_forward_cuda(cudaStream_t stream, int64_t m, int64_t c, float eps, const float *x,
                             const float *weight, const float *bias, void *y, bool y_bf16, float *mean, float *rstd);
// Row chunks of the backward's column sums: enough blocks to fill a GPU, each chunk at least 64 rows.
inline int64_t layer_norm_backward_chunks(int64_t m) { return m < 128 ? 1 : m / 64 < 256 ? m / 64 : 256; }
// partials: 2 * layer_norm_backward_chunks(m) * c floats of scratch.
void layer_norm_backward_cuda(cudaStream_t stream, int64_t m, int64_t c, const float *dy, const float *x,
                              const float *mean, const float *rstd, const float *weight, float *dx, float *dweight,
                              float *dbias, float beta, float *partials);
#endif
// dx (m, c) written; dweight, dbias (c,) accumulated (beta = 0 overwrites them, 1 adds). Null when absent.
void layer_norm_backward(const Where &w, int64_t m, int64_t c, const float *dy, const float *x, const float *mean,
                         const float *rstd, const float *weight, float *dx, float *dweight, float *dbias, float beta);

}  // namespace nntile::kernels
