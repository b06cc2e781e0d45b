// CUDA tile GEMM through cuBLAS; row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
#include "gemm.h"

namespace nntile::kernels {

static cudaDataType cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

void gemm_cuda(cublasHandle_t handle, const GemmShape &s, DType ta, const void *a, DType tb, const void *b,
               DType tc, void *c, Precision precision) {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    // fp32 tiles in tf32/bf16 mode: cuBLAS rounds the inputs itself and accumulates in fp32.
    if (ta == DType::f32 && tb == DType::f32) {
        if (precision == Precision::tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        if (precision == Precision::bf16) compute = CUBLAS_COMPUTE_32F_FAST_16BF;
    }
    int64_t lda = s.trans_a ? s.m : s.k;
    int64_t ldb = s.trans_b ? s.k : s.n;
    cublasStatus_t st = cublasGemmEx(
        handle, s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)s.n, (int)s.m,
        (int)s.k, &s.alpha, b, cuda_type(tb), (int)ldb, a, cuda_type(ta), (int)lda, &s.beta, c, cuda_type(tc),
        (int)s.n, compute, CUBLAS_GEMM_DEFAULT);
    NNTILE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmEx failed with status " << (int)st << " for m=" << s.m
                                                                                  << " n=" << s.n << " k=" << s.k);
}

}  // namespace nntile::kernels
