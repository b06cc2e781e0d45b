// RMSNorm on tiles, CPU: row loops with double accumulators (torch's fp32 reductions to rounding); on GPUs
// rmsnorm_cuda.cu's kernels.
#include "rmsnorm.h"

#include <cmath>
#include <vector>

namespace nntile::kernels {

void rmsnorm_forward(const Where &w, int64_t m, int64_t c, float eps, const float *x, const float *weight, float *y,
                     float *rstd) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        rmsnorm_forward_cuda(static_cast<cudaStream_t>(w.stream), m, c, eps, x, weight, y, rstd);
        return;
    }
#endif
    (void)w;
    for (int64_t i = 0; i < m; ++i) {
        const float *xr = x + i * c;
        float *yr = y + i * c;
        double s = 0.0;
        for (int64_t j = 0; j < c; ++j) s += (double)xr[j] * xr[j];
        // HF: variance in fp32, then torch.rsqrt(variance + eps) in fp32.
        const float var = (float)(s / (double)c);
        const float rs = 1.f / std::sqrt(var + eps);
        for (int64_t j = 0; j < c; ++j) {
            const float v = xr[j] * rs;
            yr[j] = weight ? weight[j] * v : v;
        }
        rstd[i] = rs;
    }
}

void rmsnorm_backward(const Where &w, int64_t m, int64_t c, const float *dy, const float *x, const float *rstd,
                      const float *weight, float *dx, float *dweight, float beta) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        StreamScope scope(w);
        at::Tensor partials;
        if (dweight)
            partials = at::empty({rmsnorm_backward_chunks(m) * c},
                                 at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, w.device));
        rmsnorm_backward_cuda(static_cast<cudaStream_t>(w.stream), m, c, dy, x, rstd, weight, dx, dweight, beta,
                              partials.defined() ? partials.data_ptr<float>() : nullptr);
        return;
    }
#endif
    (void)w;
    std::vector<double> dw(dweight ? c : 0, 0.0);
    for (int64_t i = 0; i < m; ++i) {
        const float *dyr = dy + i * c, *xr = x + i * c;
        float *dxr = dx + i * c;
        const float rs = rstd[i];
        double sgx = 0.0;
        for (int64_t j = 0; j < c; ++j) {
            const double g = weight ? (double)dyr[j] * weight[j] : (double)dyr[j];
            sgx += g * xr[j];
        }
        const double k = (double)rs * rs * rs * sgx / (double)c;
        for (int64_t j = 0; j < c; ++j) {
            const double g = weight ? (double)dyr[j] * weight[j] : (double)dyr[j];
            dxr[j] = (float)(rs * g - xr[j] * k);
        }
        if (dweight)
            for (int64_t j = 0; j < c; ++j) dw[j] += (double)dyr[j] * (double)(xr[j] * rs);
    }
    if (dweight)
        for (int64_t j = 0; j < c; ++j) dweight[j] = (beta == 0.f ? 0.f : dweight[j]) + (float)dw[j];
}

}  // namespace nntile::kernels
