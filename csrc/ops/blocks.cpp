// Broadcasting over leading dimensions: big (M, C) in row tiles of whole blocks of r rows, small (r, C) in one
// row tile, the same column tiles.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check(TileTensor &big, TileTensor &small, const char *op) {
    NNTILE_CHECK(big.dtype() == DType::f32 && small.dtype() == DType::f32 && big.ndim() == 2 && small.ndim() == 2,
                 op << ": float32 matrices expected");
    int64_t r = small.shape()[0];
    NNTILE_CHECK(small.grid()[0] == 1 && big.shape()[1] == small.shape()[1] &&
                     big.tile_shape()[1] == small.tile_shape()[1] && r > 0 && big.tile_shape()[0] % r == 0 &&
                     big.shape()[0] % r == 0,
                 op << ": the (" << big.shape()[0] << ", " << big.shape()[1] << ") tiles of " << big.tile_shape()[0]
                    << " rows must hold whole blocks of the " << r << "-row operand, same column tiles");
}
}  // namespace

void add_blocks(TileTensor &src, TileTensor &dst) {
    check(dst, src, "add_blocks");
    int64_t r = src.shape()[0];
    for (int64_t i = 0; i < dst.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        for (int64_t j = 0; j < dst.grid()[1]; ++j)
            codelets::submit_add_blocks(dst.tile_extent(0, i) / r, r, dst.tile_extent(1, j), src.handle2(0, j),
                                        dst.handle2(i, j));
    }
    dst.bump_version();
}

void sum_blocks(TileTensor &src, TileTensor &dst) {
    check(src, dst, "sum_blocks");
    int64_t r = dst.shape()[0];
    for (int64_t j = 0; j < src.grid()[1]; ++j)
        for (int64_t i = 0; i < src.grid()[0]; ++i) {
            OnWorker on(placement_worker(i));
            codelets::submit_sum_blocks(src.tile_extent(0, i) / r, r, src.tile_extent(1, j), i == 0,
                                        src.handle2(i, j), dst.handle2(0, j));
        }
    dst.bump_version();
}

}  // namespace nntile::ops
