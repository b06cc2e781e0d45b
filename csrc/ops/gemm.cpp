// Tiled GEMM: C[i, j] = sum_k op(A)[i, k] op(B)[k, j], one task per (i, j, k).
#include "../codelets/codelets.h"
#include "../runtime.h"
#include "ops.h"

namespace nntile::ops {

namespace {
// Tiling of op(X) along its rows (which = 0) or columns (which = 1) as (extent, tile size).
std::pair<int64_t, int64_t> op_dim(const TileTensor &x, bool trans, int which) {
    int d = trans ? 1 - which : which;
    return {x.shape()[d], x.tile_shape()[d]};
}
}  // namespace

void gemm(bool trans_a, TileTensor &a, bool trans_b, TileTensor &b, TileTensor &c, float alpha, float beta,
          Precision precision) {
    NNTILE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
                 "gemm takes 2-d tile tensors (got " << a.ndim() << ", " << b.ndim() << ", " << c.ndim() << " dims)");
    NNTILE_CHECK(a.dtype() != DType::i64 && b.dtype() != DType::i64 && c.dtype() != DType::i64,
                 "gemm takes float32 or bfloat16 tiles");
    auto m = op_dim(a, trans_a, 0), ka = op_dim(a, trans_a, 1);
    auto kb = op_dim(b, trans_b, 0), n = op_dim(b, trans_b, 1);
    NNTILE_CHECK(ka == kb, "gemm: inner dimensions or their tiles differ (op(A) has " << ka.first << " columns in tiles of "
                                                                                      << ka.second << ", op(B) " << kb.first
                                                                                      << " rows in tiles of " << kb.second
                                                                                      << ")");
    NNTILE_CHECK(c.shape()[0] == m.first && c.shape()[1] == n.first && c.tile_shape()[0] == m.second &&
                     c.tile_shape()[1] == n.second,
                 "gemm: C's shape/tiles (" << c.shape()[0] << "x" << c.shape()[1] << " in " << c.tile_shape()[0] << "x"
                                           << c.tile_shape()[1] << ") do not match op(A) op(B) (" << m.first << "x"
                                           << n.first << " in " << m.second << "x" << n.second << ")");
    NNTILE_CHECK(c.dtype() == DType::f32 || precision != Precision::fp32 || a.dtype() == c.dtype(),
                 "gemm: output dtype " << dtype_name(c.dtype()) << " needs a reduced-precision mode");
    int64_t gm = c.grid()[0], gn = c.grid()[1], gk = (ka.first + ka.second - 1) / ka.second;
    for (int64_t i = 0; i < gm; ++i) {
        for (int64_t j = 0; j < gn; ++j) {
            for (int64_t k = 0; k < gk; ++k) {
                kernels::GemmShape s{c.tile_extent(0, i), c.tile_extent(1, j),
                                     std::min(ka.second, ka.first - k * ka.second), trans_a, trans_b, alpha,
                                     k == 0 ? beta : 1.f};
                auto ha = trans_a ? a.handle2(k, i) : a.handle2(i, k);
                auto hb = trans_b ? b.handle2(j, k) : b.handle2(k, j);
                codelets::submit_gemm(s, precision, a.dtype(), ha, b.dtype(), hb, c.dtype(), c.handle2(i, j));
            }
        }
    }
    c.bump_version();
}

}  // namespace nntile::ops
