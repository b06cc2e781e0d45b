// Tile GEMM kernels: C = alpha * op(A) @ op(B) + beta * C on row-major tiles (no StarPU, no torch types).
#pragma once
#include "../common.h"
#ifdef NNTILE_USE_CUDA
#include <cublas_v2.h>
#endif

namespace nntile::kernels {

// op(A) is m x k, op(B) is k x n, C is m x n. A is stored row-major as (m, k), or (k, m) when trans_a;
// B as (k, n), or (n, k) when trans_b. beta == 0 ignores what C held (NaN included). `bias` (n fp32 values, or
// nullptr) is added to every row of C: C = alpha op(A) op(B) + beta C + bias, the bias inside the GEMM's epilogue
// on GPUs (as torch's Linear does there) instead of another pass over C.
struct GemmShape {
    int64_t m, n, k;
    bool trans_a, trans_b;
    float alpha, beta;
};

// A bias gradient the GEMM computes from the input it reads anyway (a Linear's dW GEMM reads dy): dy is A, stored
// (k, m), when of_b is false (trans_a), or B, stored (k, n), when of_b (not trans_b); bfloat16. `out` (m or n
// fp32 values) gets dy's column sums (the sum over the GEMM's k) accumulated in fp32, as torch's bf16 autocast
// sums a bf16 gradient: written, or added to what `out` holds when `accumulate` (the next row tiles of dy). On
// GPUs cuBLASLt's BGRADA/BGRADB epilogue, else a column-sum kernel after the GEMM.
struct GemmBiasGrad {
    float *out = nullptr;
    bool of_b = false;
    bool accumulate = false;
};

// `residual` (m x n fp32 values, or nullptr) is added to C last: C = alpha op(A) op(B) + beta C + bias + residual,
// a Linear's output and the residual stream it joins in one task (docs/fusion.md, pair 3). On CPUs the same add
// after the GEMM (the bits of a GEMM task and an add task); on GPUs cuBLASLt's C input with beta 1 where C is the
// whole sum (beta 0), else an add after the GEMM on the same stream.
void gemm_cpu(const GemmShape &s, DType ta, const void *a, DType tb, const void *b, DType tc, void *c,
              Precision precision, const float *bias = nullptr, const GemmBiasGrad &bias_grad = {},
              const float *residual = nullptr);

#ifdef NNTILE_USE_CUDA
// Runs on the stream already set on `handle` (`stream`: the same one, for cuBLASLt, which the bias needs).
void gemm_cuda(cublasHandle_t handle, cudaStream_t stream, const GemmShape &s, DType ta, const void *a, DType tb,
               const void *b, DType tc, void *c, Precision precision, const float *bias = nullptr,
               const GemmBiasGrad &bias_grad = {}, const float *residual = nullptr);
#endif

}  // namespace nntile::kernels
