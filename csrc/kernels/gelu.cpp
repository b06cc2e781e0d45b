// GELU through ATen on tiles (CPU and CUDA).
#include "gelu.h"

namespace nntile::kernels {

void gelu_forward(const Where &w, int64_t n, bool tanh_approx, const float *x, float *y) {
    StreamScope scope(w);
    auto out = wrap(y, {n}, w);
    at::gelu_out(out, wrap(x, {n}, w), tanh_approx ? "tanh" : "none");
}

void gelu_backward(const Where &w, int64_t n, bool tanh_approx, const float *dy, const float *x, float *dx) {
    StreamScope scope(w);
    auto out = wrap(dx, {n}, w);
    at::gelu_backward_out(out, wrap(dy, {n}, w), wrap(x, {n}, w), tanh_approx ? "tanh" : "none");
}

}  // namespace nntile::kernels
