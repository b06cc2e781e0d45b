// Block broadcast and block sums through ATen on tiles (CPU and CUDA).
#include "blocks.h"

namespace nntile::kernels {

void add_blocks(const Where &w, int64_t nblk, int64_t r, int64_t c, const float *src, float *dst) {
    StreamScope scope(w);
    wrap(dst, {nblk, r, c}, w).add_(wrap(src, {1, r, c}, w));
}

void sum_blocks(const Where &w, int64_t nblk, int64_t r, int64_t c, bool first, const float *src, float *dst) {
    StreamScope scope(w);
    auto s = wrap(src, {nblk, r, c}, w);
    auto d = wrap(dst, {r, c}, w);
    // block by block, so the order of the additions is fixed whatever the device
    if (first)
        d.copy_(s.select(0, 0));
    else
        d.add_(s.select(0, 0));
    for (int64_t b = 1; b < nblk; ++b) d.add_(s.select(0, b));
}

}  // namespace nntile::kernels
