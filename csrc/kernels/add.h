// Elementwise y = alpha * x + beta * y over n fp32 values (gradient accumulation, tile copies), and z = alpha x + beta y.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

namespace nntile::kernels {

void add_cpu(int64_t n, float alpha, const float *x, float beta, float *y);
// z = alpha * x + beta * y (a sum into fresh tiles in one pass: residual connections, gradient sums).
void add_into_cpu(int64_t n, float alpha, const float *x, float beta, const float *y, float *z);
#ifdef NNTILE_USE_CUDA
void add_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, float *y);
void add_into_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, const float *y, float *z);
#endif

}  // namespace nntile::kernels
