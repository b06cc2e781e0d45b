// silu(g) * u and its backward on tiles, CPU loops; on GPUs silu_mul_cuda.cu's kernels (the same formulas).
#include "silu_mul.h"

#include <cmath>

namespace nntile::kernels {

void silu_mul_forward(const Where &w, int64_t n, const float *g, const float *u, float *y) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        silu_mul_forward_cuda(static_cast<cudaStream_t>(w.stream), n, g, u, y);
        return;
    }
#endif
    (void)w;
    for (int64_t i = 0; i < n; ++i) {
        const float s = 1.f / (1.f + std::exp(-g[i]));
        y[i] = g[i] * s * u[i];
    }
}

void silu_mul_backward(const Where &w, int64_t n, const float *dy, const float *g, const float *u, float *dg,
                       float *du) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        silu_mul_backward_cuda(static_cast<cudaStream_t>(w.stream), n, dy, g, u, dg, du);
        return;
    }
#endif
    (void)w;
    for (int64_t i = 0; i < n; ++i) {
        const float s = 1.f / (1.f + std::exp(-g[i]));
        const float silu = g[i] * s;
        dg[i] = dy[i] * u[i] * (s * (1.f + g[i] * (1.f - s)));
        du[i] = dy[i] * silu;
    }
}

}  // namespace nntile::kernels
