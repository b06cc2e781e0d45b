// Tiled dropout: one task per tile; tile t's elements are numbered from t * (full tile size), so each element of
// the tensor has its own index for the mask hash.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

void dropout(TileTensor &x, TileTensor &y, float p, int64_t seed) {
    NNTILE_CHECK(x.dtype() == DType::f32 && x.same_tiling(y) && y.dtype() == DType::f32,
                 "dropout: x and y must be float32 with the same shape and tiles");
    NNTILE_CHECK(p >= 0.f && p < 1.f, "dropout: p must be in [0, 1) (got " << p << ")");
    int64_t full = 1;
    for (auto e : x.tile_shape()) full *= e;
    for (int64_t t = 0; t < x.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(x, t)));
        const int64_t n = x.tile_numel(t);
        codelets::submit_dropout(n, t * full, seed, p, x.handle(t), y.handle(t));
    }
    y.bump_version();
}

}  // namespace nntile::ops
