// CUDA float32 <-> bfloat16 conversion.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

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

// Four values per thread (16-byte loads, 8-byte stores): a matmul input's cast is a pure stream of memory, and the
// one-value form reaches under half of the GPU's bandwidth. Same rounding (to nearest even) value by value.
__global__ static void f32_to_bf16_vec4_kernel(int64_t n4, const float4 *src, uint2 *dst) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = src[i];
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 out;
        memcpy(&out.x, &lo, 4);
        memcpy(&out.y, &hi, 4);
        dst[i] = out;
    }
}

__global__ static void bf16_to_f32_vec4_kernel(int64_t n4, const uint2 *src, float4 *dst) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        uint2 in = src[i];
        __nv_bfloat162 lo, hi;
        memcpy(&lo, &in.x, 4);
        memcpy(&hi, &in.y, 4);
        float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
        dst[i] = make_float4(a.x, a.y, b.x, b.y);
    }
}

namespace {
int blocks_for(int64_t n) { return (int)std::min<int64_t>((n + 255) / 256, 65535); }
bool aligned(const void *p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace

void convert_cuda(cudaStream_t stream, int64_t n, DType src_type, const void *src, DType dst_type, void *dst) {
    if (n == 0) return;
    cudaError_t err;
    if (src_type == dst_type) {
        err = cudaMemcpyAsync(dst, src, n * dtype_size(src_type), cudaMemcpyDeviceToDevice, stream);
    } else {
        bool f32_src = src_type == DType::f32;
        const void *f32 = f32_src ? src : dst, *bf16 = f32_src ? dst : src;
        // the first n - n % 4 values four at a time where both sides are aligned for it, the rest one by one
        int64_t n4 = aligned(f32, 16) && aligned(bf16, 8) ? n / 4 : 0, done = 4 * n4;
        if (n4 > 0) {
            if (f32_src)
                f32_to_bf16_vec4_kernel<<<blocks_for(n4), 256, 0, stream>>>(n4, (const float4 *)src, (uint2 *)dst);
            else
                bf16_to_f32_vec4_kernel<<<blocks_for(n4), 256, 0, stream>>>(n4, (const uint2 *)src, (float4 *)dst);
        }
        if (done < n) {
            if (f32_src)
                f32_to_bf16_kernel<<<blocks_for(n - done), 256, 0, stream>>>(n - done, (const float *)src + done,
                                                                             (__nv_bfloat16 *)dst + done);
            else
                bf16_to_f32_kernel<<<blocks_for(n - done), 256, 0, stream>>>(n - done, (const __nv_bfloat16 *)src + done,
                                                                             (float *)dst + done);
        }
        err = cudaGetLastError();
    }
    NNTILE_CHECK(err == cudaSuccess, "convert of " << n << " values failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
