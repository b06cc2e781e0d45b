// CUDA float32 <-> bfloat16 conversion.
#include <cuda_bf16.h>

#include "convert.h"

namespace nntile::kernels {

__global__ static void f32_to_bf16_kernel(int64_t n, const float *src, __nv_bfloat16 *dst) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ static void bf16_to_f32_kernel(int64_t n, const __nv_bfloat16 *src, float *dst) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) dst[i] = __bfloat162float(src[i]);
}

void convert_cuda(cudaStream_t stream, int64_t n, DType src_type, const void *src, DType dst_type, void *dst) {
    if (n == 0) return;
    cudaError_t err;
    if (src_type == dst_type) {
        err = cudaMemcpyAsync(dst, src, n * dtype_size(src_type), cudaMemcpyDeviceToDevice, stream);
    } else {
        int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
        if (src_type == DType::f32)
            f32_to_bf16_kernel<<<blocks, 256, 0, stream>>>(n, (const float *)src, (__nv_bfloat16 *)dst);
        else
            bf16_to_f32_kernel<<<blocks, 256, 0, stream>>>(n, (const __nv_bfloat16 *)src, (float *)dst);
        err = cudaGetLastError();
    }
    NNTILE_CHECK(err == cudaSuccess, "convert of " << n << " values failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
