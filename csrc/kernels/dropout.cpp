// Dropout through ATen integer ops on tiles (identical masks on CPU and CUDA).
#include "dropout.h"

#include <c10/core/GradMode.h>

namespace nntile::kernels {

namespace {
// Logical right shift of int64 values (ATen's >> is arithmetic on signed types).
at::Tensor shr(const at::Tensor &z, int s) { return at::bitwise_and(at::bitwise_right_shift(z, s), (int64_t)((~0ULL) >> s)); }
}  // namespace

at::Tensor dropout_keep(const at::Tensor &index, int64_t seed, float p) {
    // splitmix64 of seed * golden + index (wrapping int64 arithmetic)
    auto z = index + (int64_t)((uint64_t)seed * 0x9E3779B97F4A7C15ULL);
    z = (z ^ shr(z, 30)) * (int64_t)0xBF58476D1CE4E5B9ULL;
    z = (z ^ shr(z, 27)) * (int64_t)0x94D049BB133111EBULL;
    z = z ^ shr(z, 31);
    auto u = shr(z, 40);  // 24 uniform bits
    return u.lt((int64_t)((1.0 - (double)p) * (double)(1 << 24)));
}

void dropout(const Where &w, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto opts = at::TensorOptions().dtype(at::kLong).device(w.cuda ? at::Device(at::kCUDA, w.device) : at::kCPU);
    // Every element's index in the whole tensor, as the tile's row-major extents broadcast it.
    at::Tensor index = at::full({}, tile.base, opts);
    int64_t n = 1;
    for (int64_t d = 0; d < tile.ndim; ++d) {
        index = index.unsqueeze(-1) + at::arange(tile.extents[d], opts) * tile.strides[d];
        n *= tile.extents[d];
    }
    auto keep = dropout_keep(index.reshape({n}), seed, p);
    auto X = wrap(x, {n}, w);
    auto Y = wrap(y, {n}, w);
    at::mul_out(Y, X, keep.to(at::kFloat) * (float)(1.0 / (1.0 - (double)p)));
}

}  // namespace nntile::kernels
