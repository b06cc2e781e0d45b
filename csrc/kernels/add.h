// Elementwise y = alpha * x + beta * y over n fp32 values (gradient accumulation, tile copies).
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

namespace nntile::kernels {

void add_cpu(int64_t n, float alpha, const float *x, float beta, float *y);
#ifdef NNTILE_USE_CUDA
void add_cuda(cudaStream_t stream, int64_t n, float alpha, const float *x, float beta, float *y);
#endif

}  // namespace nntile::kernels
