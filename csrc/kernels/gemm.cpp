// CPU tile GEMM through ATen's BLAS (MKL or OpenBLAS), on the calling worker's thread only.
#include "add.h"
#include "bias.h"
#include "gemm.h"

#include <ATen/ATen.h>

namespace nntile::kernels {

static at::ScalarType scalar_type(DType t) { return t == DType::f32 ? at::kFloat : at::kBFloat16; }

void gemm_cpu(const GemmShape &s, DType ta, const void *a, DType tb, const void *b, DType tc, void *c,
              Precision precision, const float *bias, const GemmBiasGrad &bias_grad, const float *residual) {
    NNTILE_CHECK(!residual || (tc == DType::f32 && !bias_grad.out),
                 "gemm_cpu: a residual needs a float32 C and no bias gradient");
    auto opts = [](DType t) { return at::TensorOptions().dtype(scalar_type(t)).device(at::kCPU); };
    at::Tensor A = s.trans_a ? at::from_blob(const_cast<void *>(a), {s.k, s.m}, opts(ta)).t()
                             : at::from_blob(const_cast<void *>(a), {s.m, s.k}, opts(ta));
    at::Tensor B = s.trans_b ? at::from_blob(const_cast<void *>(b), {s.n, s.k}, opts(tb)).t()
                             : at::from_blob(const_cast<void *>(b), {s.k, s.n}, opts(tb));
    at::Tensor C = at::from_blob(c, {s.m, s.n}, opts(tc));
    // bf16 mode: inputs rounded to bf16, products accumulated in fp32 (what tensor cores do). tf32 has no
    // CPU counterpart; like torch on the CPU it computes in full fp32.
    if (precision == Precision::bf16) {
        A = A.to(at::kBFloat16);
        B = B.to(at::kBFloat16);
    }
    A = A.to(C.scalar_type());
    B = B.to(C.scalar_type());
    C.addmm_(A, B, s.beta, s.alpha);
    if (bias) bias_add_cpu(s.m, s.n, bias, static_cast<float *>(c));
    if (bias_grad.out)  // dy's stored tile is (k, m or n)
        bias_grad_bf16(Where{}, s.k, bias_grad.of_b ? s.n : s.m, bias_grad.of_b ? b : a, bias_grad.accumulate,
                       bias_grad.out);
    if (residual) add_cpu(s.m * s.n, 1.f, residual, 1.f, static_cast<float *>(c));
}

}  // namespace nntile::kernels
