// Rotary position embeddings as Hugging Face's Llama family applies them, on a tile of rows of whole heads:
// y = x * cos + rotate_half(x) * sin per head, rotate_half(x) = cat(-x[half:], x[:half]) over the head's hd values.
// x, y: row-major (rows, width), width a multiple of hd (heads side by side); cos, sin: row-major (rows, hd), row r
// the angles of row r's position (the same for every head of the row).
// The backward is the transpose: dx[j] = dy[j] cos[j] + dy[j + half] sin[j + half],
// dx[j + half] = dy[j + half] cos[j + half] - dy[j] sin[j] (rope with -sin where sin's halves are equal, as HF's).
// Products and sums are rounded one by one (no fused multiply-add), as torch's elementwise ops: fp32 results are
// Hugging Face's to the bit.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

void rope_forward(const Where &w, int64_t rows, int64_t width, int64_t hd, const float *x, const float *cos,
                  const float *sin, float *y);
void rope_backward(const Where &w, int64_t rows, int64_t width, int64_t hd, const float *dy, const float *cos,
                   const float *sin, float *dx);
#ifdef NNTILE_USE_CUDA
void rope_cuda(cudaStream_t stream, bool transpose, int64_t rows, int64_t width, int64_t hd, const float *x,
               const float *cos, const float *sin, float *y);
#endif

}  // namespace nntile::kernels
