// Element type conversion of n values between float32 and bfloat16 (round to nearest even), e.g. the bf16
// copies of fp32 weights and activations that bf16 matmuls read.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "../common.h"

namespace nntile::kernels {

void convert_cpu(int64_t n, DType src_type, const void *src, DType dst_type, void *dst);
#ifdef NNTILE_USE_CUDA
void convert_cuda(cudaStream_t stream, int64_t n, DType src_type, const void *src, DType dst_type, void *dst);
#endif

}  // namespace nntile::kernels
