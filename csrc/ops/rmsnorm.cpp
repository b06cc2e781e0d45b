// Tiled RMSNorm over the last dim of a 2-d (M, C) tensor whose tiles hold whole rows.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check_rms(TileTensor &x, TileTensor &weight, TileTensor &other, TileTensor &rstd, const char *op) {
    for (auto *t : {&x, &weight, &other, &rstd})
        NNTILE_CHECK(t->dtype() == DType::f32, op << " needs float32 tiles (got " << dtype_name(t->dtype()) << ")");
    NNTILE_CHECK(x.ndim() == 2 && x.grid()[1] == 1,
                 op << ": x must be 2-d with tiles holding whole rows (got " << x.ndim() << "-d, "
                    << (x.ndim() == 2 ? x.grid()[1] : 0) << " column tiles)");
    int64_t c = x.shape()[1];
    NNTILE_CHECK(weight.ntiles() == 1 && weight.shape() == std::vector<int64_t>{c},
                 op << ": weight must be one tile of " << c << " values (got " << weight.numel() << " in "
                    << weight.ntiles() << " tiles)");
    NNTILE_CHECK(other.shape() == x.shape() && other.tile_shape() == x.tile_shape(), op << ": tiles must match x's");
    std::vector<int64_t> rows{x.shape()[0]}, row_tile{x.tile_shape()[0]};
    NNTILE_CHECK(rstd.shape() == rows && rstd.tile_shape() == row_tile,
                 op << ": rstd must be (" << rows[0] << ",) in tiles of " << row_tile[0]);
}
}  // namespace

void rmsnorm_forward(TileTensor &x, TileTensor &weight, float eps, TileTensor &y, TileTensor &rstd) {
    check_rms(x, weight, y, rstd, "rmsnorm");
    for (int64_t i = 0; i < x.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_rmsnorm_forward(x.tile_extent(0, i), x.shape()[1], eps, x.handle(i), weight.handle(0),
                                         y.handle(i), rstd.handle(i));
    }
    y.bump_version();
    rstd.bump_version();
}

void rmsnorm_backward(TileTensor &dy, TileTensor &x, TileTensor &rstd, TileTensor &weight, TileTensor &dx,
                      TileTensor &dweight) {
    check_rms(x, weight, dx, rstd, "rmsnorm_backward");
    NNTILE_CHECK(dy.same_tiling(x) && dweight.same_tiling(weight),
                 "rmsnorm_backward: dy must be tiled like x, dweight like weight");
    for (int64_t i = 0; i < x.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_rmsnorm_backward(x.tile_extent(0, i), x.shape()[1], dy.handle(i), x.handle(i),
                                          rstd.handle(i), weight.handle(0), dx.handle(i), dweight.handle(0),
                                          i == 0 ? 0.f : 1.f);
    }
    dx.bump_version();
    dweight.bump_version();
}

}  // namespace nntile::ops
