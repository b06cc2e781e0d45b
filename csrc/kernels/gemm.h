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

void gemm_cpu(const GemmShape &s, DType ta, const void *a, DType tb, const void *b, DType tc, void *c,
              Precision precision, const float *bias = nullptr);

#ifdef NNTILE_USE_CUDA
// Runs on the stream already set on `handle` (`stream`: the same one, for cuBLASLt, which the bias needs).
void gemm_cuda(cublasHandle_t handle, cudaStream_t stream, const GemmShape &s, DType ta, const void *a, DType tb,
               const void *b, DType tc, void *c, Precision precision, const float *bias = nullptr);
#endif

}  // namespace nntile::kernels
