// Rotary position embeddings on tiles, CPU loops; on GPUs rope_cuda.cu's kernel (the same formulas).
#include "rope.h"

namespace nntile::kernels {

namespace {
// One rounding per product and per sum (the build has -ffp-contract=off): torch's q * cos + rotate_half(q) * sin.
void rope_cpu(bool transpose, int64_t rows, int64_t width, int64_t hd, const float *x, const float *cos,
              const float *sin, float *y) {
    const int64_t half = hd / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos + r * hd, *s = sin + r * hd;
        for (int64_t h = 0; h < width; h += hd) {
            const float *a = x + r * width + h;
            float *b = y + r * width + h;
            for (int64_t j = 0; j < half; ++j) {
                const float lo = a[j], hi = a[j + half];
                if (!transpose) {
                    b[j] = lo * c[j] + (-hi) * s[j];
                    b[j + half] = hi * c[j + half] + lo * s[j + half];
                } else {
                    b[j] = lo * c[j] + hi * s[j + half];
                    b[j + half] = hi * c[j + half] + -(lo * s[j]);
                }
            }
        }
    }
}
}  // namespace

void rope_forward(const Where &w, int64_t rows, int64_t width, int64_t hd, const float *x, const float *cos,
                  const float *sin, float *y) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        rope_cuda(static_cast<cudaStream_t>(w.stream), false, rows, width, hd, x, cos, sin, y);
        return;
    }
#endif
    (void)w;
    rope_cpu(false, rows, width, hd, x, cos, sin, y);
}

void rope_backward(const Where &w, int64_t rows, int64_t width, int64_t hd, const float *dy, const float *cos,
                   const float *sin, float *dx) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        rope_cuda(static_cast<cudaStream_t>(w.stream), true, rows, width, hd, dy, cos, sin, dx);
        return;
    }
#endif
    (void)w;
    rope_cpu(true, rows, width, hd, dy, cos, sin, dx);
}

}  // namespace nntile::kernels
