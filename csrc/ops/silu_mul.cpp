// Tiled y = silu(g) * u (the gated MLP's elementwise step) and its backward, tile by tile (the same tiling).
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check_same(std::initializer_list<TileTensor *> ts, const char *op) {
    TileTensor *first = *ts.begin();
    for (auto *t : ts) {
        NNTILE_CHECK(t->dtype() == DType::f32, op << " needs float32 tiles (got " << dtype_name(t->dtype()) << ")");
        NNTILE_CHECK(t->same_tiling(*first), op << ": every tensor must have the same shape and tiles");
    }
}
}  // namespace

void silu_mul_forward(TileTensor &g, TileTensor &u, TileTensor &y) {
    check_same({&g, &u, &y}, "silu_mul");
    for (int64_t t = 0; t < g.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(g, t)));
        codelets::submit_silu_mul_forward(g.tile_numel(t), g.handle(t), u.handle(t), y.handle(t));
    }
    y.bump_version();
}

void silu_mul_backward(TileTensor &dy, TileTensor &g, TileTensor &u, TileTensor &dg, TileTensor &du) {
    check_same({&dy, &g, &u, &dg, &du}, "silu_mul_backward");
    for (int64_t t = 0; t < g.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(g, t)));
        codelets::submit_silu_mul_backward(g.tile_numel(t), dy.handle(t), g.handle(t), u.handle(t), dg.handle(t),
                                           du.handle(t));
    }
    dg.bump_version();
    du.bump_version();
}

}  // namespace nntile::ops
