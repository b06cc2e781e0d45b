// Bias kernels on a row-major (m, n) fp32 tile: y[r, :] += b (the GEMM's, where cuBLASLt's epilogue cannot), and
// db = beta * db + sum_r dy[r, :]; and the same sums of a bf16 dy (a bf16 dW GEMM's bias gradient).
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

namespace nntile::kernels {

void bias_add_cpu(int64_t m, int64_t n, const float *b, float *y);
void bias_grad_cpu(int64_t m, int64_t n, const float *dy, float beta, float *db);
// On a GPU through ATen's column reduction (vectorized loads, rows split across blocks and summed in a fixed
// order, so as deterministic as the CPU's); on the CPU bias_grad_cpu.
void bias_grad(const Where &w, int64_t m, int64_t n, const float *dy, float beta, float *db);
// db (n) = column sums of a row-major bfloat16 dy (m, n), accumulated in fp32 and added to db's values when
// `accumulate`: the bias gradient of a bf16 GEMM where cuBLASLt's epilogue cannot sum it (and on CPUs).
void bias_grad_bf16(const Where &w, int64_t m, int64_t n, const void *dy, bool accumulate, float *db);
#ifdef NNTILE_USE_CUDA
void bias_add_cuda(cudaStream_t stream, int64_t m, int64_t n, const float *b, float *y);
#endif

}  // namespace nntile::kernels
