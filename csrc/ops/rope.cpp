// Tiled rotary position embeddings (and their transpose, the backward): one task per tile of x.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

void rope(TileTensor &x, TileTensor &cos, TileTensor &sin, TileTensor &y, int64_t head_dim, bool backward) {
    const char *op = backward ? "rope_backward" : "rope";
    for (auto *t : {&x, &cos, &sin, &y})
        NNTILE_CHECK(t->dtype() == DType::f32, op << " needs float32 tiles (got " << dtype_name(t->dtype()) << ")");
    NNTILE_CHECK(x.ndim() == 2, op << ": x must be a matrix (rows, heads x head_dim) (got " << x.ndim() << " dims)");
    NNTILE_CHECK(head_dim > 0 && head_dim % 2 == 0, op << ": head_dim must be even (got " << head_dim << ")");
    NNTILE_CHECK(x.shape()[1] % head_dim == 0 && x.tile_shape()[1] % head_dim == 0,
                 op << ": x's width (" << x.shape()[1] << ") and column tiles (" << x.tile_shape()[1]
                    << ") must hold whole heads of " << head_dim);
    NNTILE_CHECK(y.same_tiling(x), op << ": the output must be tiled like x");
    for (auto *t : {&cos, &sin})
        NNTILE_CHECK(t->ndim() == 2 && t->shape()[0] == x.shape()[0] && t->shape()[1] == head_dim &&
                         t->tile_shape()[0] == x.tile_shape()[0] && t->grid()[1] == 1,
                     op << ": cos and sin must be (" << x.shape()[0] << ", " << head_dim << ") tiled by x's "
                        << x.tile_shape()[0] << " rows (got shape " << c10::IntArrayRef(t->shape()) << ", tiles "
                        << c10::IntArrayRef(t->tile_shape()) << ")");
    for (int64_t i = 0; i < x.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        for (int64_t j = 0; j < x.grid()[1]; ++j)
            codelets::submit_rope(backward, x.tile_extent(0, i), x.tile_extent(1, j), head_dim, x.handle2(i, j),
                                  cos.handle(i), sin.handle(i), y.handle2(i, j));
    }
    y.bump_version();
}

}  // namespace nntile::ops
