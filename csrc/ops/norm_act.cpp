// Tiled GELU and LayerNorm.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void require_f32(std::initializer_list<TileTensor *> ts, const char *op) {
    for (auto *t : ts)
        NNTILE_CHECK(t->dtype() == DType::f32, op << " needs float32 tiles (got " << dtype_name(t->dtype()) << ")");
}

// An output that a bf16 matmul reads may hold bfloat16 (docs/fusion.md: the producer writes the GEMM's input).
bool out_bf16(const TileTensor &out, const char *op) {
    NNTILE_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::bf16,
                 op << ": the output holds float32 or bfloat16 (got " << dtype_name(out.dtype()) << ")");
    return out.dtype() == DType::bf16;
}

bool same_shape(const TileTensor &a, const TileTensor &b) {
    return a.shape() == b.shape() && a.tile_shape() == b.tile_shape();
}
}  // namespace

void gelu_forward(TileTensor &x, TileTensor &y, bool tanh_approx) {
    require_f32({&x}, "gelu");
    const bool bf16 = out_bf16(y, "gelu");
    NNTILE_CHECK(same_shape(x, y), "gelu: x and y must have the same shape and tiles");
    for (int64_t t = 0; t < x.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(x, t)));
        codelets::submit_gelu_forward(x.tile_numel(t), tanh_approx, x.handle(t), y.handle(t), bf16);
    }
    y.bump_version();
}

void gelu_backward(TileTensor &dy, TileTensor &x, TileTensor &dx, bool tanh_approx) {
    require_f32({&dy, &x}, "gelu_backward");
    const bool bf16 = out_bf16(dx, "gelu_backward");
    NNTILE_CHECK(x.same_tiling(dy) && same_shape(x, dx), "gelu_backward: dy, x and dx must have the same tiles");
    for (int64_t t = 0; t < x.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(x, t)));
        codelets::submit_gelu_backward(x.tile_numel(t), tanh_approx, dy.handle(t), x.handle(t), dx.handle(t), bf16);
    }
    dx.bump_version();
}

namespace {
void check_ln(TileTensor &x, TileTensor &weight, TileTensor &other, TileTensor &mean, TileTensor &rstd,
              const char *op) {
    NNTILE_CHECK(x.ndim() == 2 && x.grid()[1] == 1,
                 op << ": x must be 2-d with tiles holding whole rows (got " << x.ndim() << "-d, "
                    << (x.ndim() == 2 ? x.grid()[1] : 0) << " column tiles)");
    int64_t c = x.shape()[1];
    NNTILE_CHECK(weight.ntiles() == 1 && weight.shape() == std::vector<int64_t>{c},
                 op << ": weight must be one tile of " << c << " values");
    NNTILE_CHECK(other.shape() == x.shape() && other.tile_shape() == x.tile_shape(), op << ": tiles must match x's");
    std::vector<int64_t> rows{x.shape()[0]}, row_tile{x.tile_shape()[0]};
    NNTILE_CHECK(mean.shape() == rows && mean.tile_shape() == row_tile && rstd.shape() == rows &&
                     rstd.tile_shape() == row_tile,
                 op << ": mean and rstd must be (" << rows[0] << ",) in tiles of " << row_tile[0]);
}
}  // namespace

void layer_norm_forward(TileTensor &x, TileTensor &weight, TileTensor &bias, float eps, TileTensor &y,
                        TileTensor &mean, TileTensor &rstd) {
    require_f32({&x, &weight, &bias, &mean, &rstd}, "layer_norm");
    const bool bf16 = out_bf16(y, "layer_norm");
    check_ln(x, weight, y, mean, rstd, "layer_norm");
    NNTILE_CHECK(bias.same_tiling(weight), "layer_norm: bias must be tiled like weight");
    for (int64_t i = 0; i < x.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_layer_norm_forward(x.tile_extent(0, i), x.shape()[1], eps, x.handle(i), weight.handle(0),
                                            bias.handle(0), y.handle(i), mean.handle(i), rstd.handle(i), bf16);
    }
    y.bump_version();
    mean.bump_version();
    rstd.bump_version();
}

void layer_norm_backward(TileTensor &dy, TileTensor &x, TileTensor &mean, TileTensor &rstd, TileTensor &weight,
                         TileTensor &dx, TileTensor &dweight, TileTensor &dbias) {
    require_f32({&dy, &x, &mean, &rstd, &weight, &dx, &dweight, &dbias}, "layer_norm_backward");
    check_ln(x, weight, dx, mean, rstd, "layer_norm_backward");
    NNTILE_CHECK(dy.same_tiling(x) && dweight.same_tiling(weight) && dbias.same_tiling(weight),
                 "layer_norm_backward: dy must be tiled like x, dweight and dbias like weight");
    for (int64_t i = 0; i < x.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_layer_norm_backward(x.tile_extent(0, i), x.shape()[1], dy.handle(i), x.handle(i),
                                             mean.handle(i), rstd.handle(i), weight.handle(0), dx.handle(i),
                                             dweight.handle(0), dbias.handle(0), i == 0 ? 0.f : 1.f);
    }
    dx.bump_version();
    dweight.bump_version();
    dbias.bump_version();
}

}  // namespace nntile::ops
