// CUDA bias kernels.
#include <cstdint>

#include "../common.h"
#include "bias.h"

namespace nntile::kernels {

__global__ static void bias_add_kernel(int64_t m, int64_t n, const float *b, float *y) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < m * n; i += stride) y[i] += b[i % n];
}

// Column sums: a block covers 32 columns with 16 row phases; each thread sums every 16th row of its column
// (neighbouring threads read neighbouring addresses), then the block adds the 16 partial sums in a fixed
// order, so the result does not depend on timing. The general form, for any n and alignment.
constexpr int kCols = 32, kPhases = 16;

__global__ static void bias_grad_kernel(int64_t m, int64_t n, const float *dy, float beta, float *db) {
    __shared__ float part[kPhases][kCols + 1];
    int64_t j = blockIdx.x * (int64_t)kCols + threadIdx.x;
    float acc = 0.f;
    if (j < n)
        for (int64_t r = threadIdx.y; r < m; r += kPhases) acc += dy[r * n + j];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float sum = 0.f;
        for (int p = 0; p < kPhases; ++p) sum += part[p][threadIdx.x];
        db[j] = (beta == 0.f ? 0.f : beta * db[j]) + sum;
    }
}

// Rows a multiple of 4 floats wide and 16-byte aligned (a linear layer's output gradient): a block covers only 8
// columns (two threads of float4) with 128 row phases, so a 1600-wide gradient spreads over 200 blocks instead of
// 50 and each thread sums a short strip; a warp reads 16 rows of 32 bytes, whole memory sectors. The phases'
// partial sums are added by a fixed tree, so the result is the same on every run.
constexpr int kVecCols = 8, kVecThreadsX = kVecCols / 4, kVecPhases = 128;

__global__ static void bias_grad_vec4_kernel(int64_t m, int64_t n, const float *dy, float beta, float *db) {
    __shared__ float4 part[kVecPhases][kVecThreadsX];
    int64_t j = blockIdx.x * (int64_t)kVecCols + 4 * threadIdx.x;  // the first of this thread's 4 columns
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < n) {
        const float *col = dy + j;
#pragma unroll 4
        for (int64_t r = threadIdx.y; r < m; r += kVecPhases) {
            float4 v = *reinterpret_cast<const float4 *>(col + r * n);
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    for (int s = kVecPhases / 2; s > 0; s >>= 1) {
        if (threadIdx.y < s) {
            float4 a = part[threadIdx.y][threadIdx.x], b = part[threadIdx.y + s][threadIdx.x];
            part[threadIdx.y][threadIdx.x] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
        __syncthreads();
    }
    if (threadIdx.y == 0 && j < n) {
        float4 sum = part[0][threadIdx.x];
        float out[4] = {sum.x, sum.y, sum.z, sum.w};
        for (int c = 0; c < 4; ++c) db[j + c] = (beta == 0.f ? 0.f : beta * db[j + c]) + out[c];
    }
}

void bias_add_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *b, float *y) {
    int64_t total = m * n;
    int blocks = (int)std::min<int64_t>((total + 255) / 256, 65535);
    bias_add_kernel<<<blocks, 256, 0, stream>>>(m, n, b, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_add kernel launch failed: " << cudaGetErrorString(err));
}

void bias_grad_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *dy, float beta, float *db) {
    if (n % 4 == 0 && reinterpret_cast<uintptr_t>(dy) % 16 == 0)
        bias_grad_vec4_kernel<<<(int)((n + kVecCols - 1) / kVecCols), dim3(kVecThreadsX, kVecPhases), 0, stream>>>(
            m, n, dy, beta, db);
    else
        bias_grad_kernel<<<(int)((n + kCols - 1) / kCols), dim3(kCols, kPhases), 0, stream>>>(m, n, dy, beta, db);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "bias_grad kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
