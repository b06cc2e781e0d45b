// Dropout on tiles: the splitmix64 hash of each element's index, one pass over the tile (a CPU loop; on GPUs
// dropout_cuda.cu's kernel, the same integer arithmetic, so the masks are identical). dropout_keep: the same masks
// as a bool tensor through ATen integer ops (attention's CPU path, tests).
#include "dropout.h"

#include <c10/core/GradMode.h>

namespace nntile::kernels {

namespace {
// Logical right shift of int64 values (ATen's >> is arithmetic on signed types).
at::Tensor shr(const at::Tensor &z, int s) { return at::bitwise_and(at::bitwise_right_shift(z, s), (int64_t)((~0ULL) >> s)); }
}  // namespace

at::Tensor dropout_keep(const at::Tensor &index, int64_t seed, float p) {
    // splitmix64 of seed * golden + index (wrapping int64 arithmetic): dropout_hash's, as tensors
    auto z = index + (int64_t)dropout_salt(seed);
    z = (z ^ shr(z, 30)) * (int64_t)0xBF58476D1CE4E5B9ULL;
    z = (z ^ shr(z, 27)) * (int64_t)0x94D049BB133111EBULL;
    z = z ^ shr(z, 31);
    auto u = shr(z, 40);  // 24 uniform bits
    return u.lt(dropout_threshold(p));
}

void dropout(const Where &w, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        dropout_cuda(static_cast<cudaStream_t>(w.stream), tile, seed, p, x, y);
        return;
    }
#endif
    (void)w;
    int64_t n = 1;
    for (int64_t d = 0; d < tile.ndim; ++d) n *= tile.extents[d];
    const uint64_t salt = dropout_salt(seed);
    const int64_t threshold = dropout_threshold(p);
    const float scale = dropout_scale(p);
    // the element's index in the whole tensor, stepped like an odometer over the tile's extents
    int64_t coord[kDropoutMaxDims] = {};
    int64_t index = tile.base;
    for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] * (dropout_hash(salt, (uint64_t)index) < threshold ? scale : 0.0f);
        for (int64_t d = tile.ndim - 1; d >= 0; --d) {
            index += tile.strides[d];
            if (++coord[d] < tile.extents[d]) break;
            index -= coord[d] * tile.strides[d];
            coord[d] = 0;
        }
    }
}

}  // namespace nntile::kernels
