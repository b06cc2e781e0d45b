// Bias and add ops over tiles.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void require_f32(const TileTensor &t, const char *op) {
    NNTILE_CHECK(t.dtype() == DType::f32, op << " needs float32 tiles (got " << dtype_name(t.dtype()) << ")");
}
void check_bias(TileTensor &b, TileTensor &y, const char *op) {
    require_f32(b, op);
    require_f32(y, op);
    NNTILE_CHECK(y.ndim() == 2 && b.ndim() == 1 && b.shape()[0] == y.shape()[1] && b.tile_shape()[0] == y.tile_shape()[1],
                 op << ": bias of " << b.shape()[0] << " in tiles of " << b.tile_shape()[0]
                    << " does not match the columns of a " << y.ndim() << "-d tensor");
}
}  // namespace

void bias_grad(TileTensor &dy, TileTensor &db, float beta) {
    check_bias(db, dy, "bias_grad");
    for (int64_t j = 0; j < dy.grid()[1]; ++j)
        for (int64_t i = 0; i < dy.grid()[0]; ++i) {
            OnWorker on(placement_worker(i));
            codelets::submit_bias_grad(dy.tile_extent(0, i), dy.tile_extent(1, j), dy.handle2(i, j),
                                       i == 0 ? beta : 1.f, db.handle(j));
        }
    db.bump_version();
}

void add(float alpha, TileTensor &x, float beta, TileTensor &y) {
    require_f32(x, "add");
    NNTILE_CHECK(x.same_tiling(y), "add: tensors must have the same shape and tiles");
    for (int64_t t = 0; t < y.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(y, t)));
        const int64_t n = y.tile_numel(t);
        codelets::submit_add(n, alpha, x.handle(t), beta, y.handle(t));
    }
    y.bump_version();
}

void add_into(float alpha, TileTensor &x, float beta, TileTensor &y, TileTensor &z) {
    require_f32(x, "add_into");
    require_f32(y, "add_into");
    require_f32(z, "add_into");
    NNTILE_CHECK(x.same_tiling(z) && y.same_tiling(z), "add_into: tensors must have the same shape and tiles");
    for (int64_t t = 0; t < z.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(z, t)));
        codelets::submit_add_into(z.tile_numel(t), alpha, x.handle(t), beta, y.handle(t), z.handle(t));
    }
    z.bump_version();
}

void convert(TileTensor &src, TileTensor &dst) {
    NNTILE_CHECK(src.shape() == dst.shape() && src.tile_shape() == dst.tile_shape(),
                 "convert: tensors must have the same shape and tiles");
    NNTILE_CHECK(src.dtype() != DType::i64 && dst.dtype() != DType::i64, "convert: float32 <-> bfloat16 only");
    for (int64_t t = 0; t < dst.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(dst, t)));
        const int64_t n = dst.tile_numel(t);
        codelets::submit_convert(n, src.dtype(), src.handle(t), dst.dtype(), dst.handle(t));
    }
    dst.bump_version();
}

}  // namespace nntile::ops
