// Tiled dropout: one task per tile; each element's mask bit hashes its row-major index in the whole tensor, so any
// tiling of the same tensor gives the same mask.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

void dropout(TileTensor &x, TileTensor &y, float p, int64_t seed) {
    NNTILE_CHECK(x.dtype() == DType::f32 && x.same_tiling(y) && y.dtype() == DType::f32,
                 "dropout: x and y must be float32 with the same shape and tiles");
    NNTILE_CHECK(p >= 0.f && p < 1.f, "dropout: p must be in [0, 1) (got " << p << ")");
    NNTILE_CHECK(x.ndim() <= kernels::kDropoutMaxDims,
                 "dropout: at most " << kernels::kDropoutMaxDims << " dimensions (got " << x.ndim() << ")");
    std::vector<int64_t> strides(x.ndim(), 1);
    for (int64_t d = x.ndim() - 2; d >= 0; --d) strides[d] = strides[d + 1] * x.shape()[d + 1];
    for (int64_t t = 0; t < x.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(x, t)));
        kernels::DropoutTile tile;
        tile.ndim = x.ndim();
        const auto index = x.tile_index(t);
        for (int64_t d = 0; d < x.ndim(); ++d) {
            tile.extents[d] = x.tile_extent(d, index[d]);
            tile.strides[d] = strides[d];
            tile.base += index[d] * x.tile_shape()[d] * strides[d];
        }
        codelets::submit_dropout(tile, seed, p, x.handle(t), y.handle(t));
    }
    y.bump_version();
}

}  // namespace nntile::ops
