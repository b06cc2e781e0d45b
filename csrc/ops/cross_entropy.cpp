// Tiled cross-entropy: per-row max / sum-of-exp / label logit folded over vocabulary tiles, then row losses
// summed over row tiles. No logits-sized temporary; the backward recomputes softmax from the stats.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check(TileTensor &labels, TileTensor &logits, TileTensor &stats, TileTensor &acc, const char *op) {
    NNTILE_CHECK(logits.dtype() == DType::f32 && logits.ndim() == 2, op << ": logits must be (M, V) float32 tiles");
    int64_t m = logits.shape()[0], bt = logits.tile_shape()[0];
    NNTILE_CHECK(labels.dtype() == DType::i64 && labels.ndim() == 1 && labels.shape()[0] == m &&
                     labels.tile_shape()[0] == bt,
                 op << ": labels must be (" << m << ") int64 tiled by the logits' " << bt << " rows");
    NNTILE_CHECK(stats.dtype() == DType::f32 && stats.ndim() == 2 && stats.shape()[0] == m && stats.shape()[1] == 3 &&
                     stats.tile_shape()[0] == bt && stats.grid()[1] == 1,
                 op << ": stats must be (" << m << ", 3) float32 tiled (" << bt << ", 3)");
    NNTILE_CHECK(acc.dtype() == DType::f32 && acc.numel() == 2 && acc.ntiles() == 1, op << ": acc must be one tile of 2");
}
}  // namespace

void cross_entropy_forward(TileTensor &labels, TileTensor &logits, TileTensor &stats, TileTensor &acc,
                           TileTensor &loss, bool mean) {
    check(labels, logits, stats, acc, "cross_entropy");
    NNTILE_CHECK(loss.dtype() == DType::f32 && loss.numel() == 1 && loss.ntiles() == 1,
                 "cross_entropy: loss must be one float32 element");
    int64_t tv = logits.tile_shape()[1];
    for (int64_t i = 0; i < logits.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        for (int64_t j = 0; j < logits.grid()[1]; ++j)
            codelets::submit_cross_entropy_stats(logits.tile_extent(0, i), logits.tile_extent(1, j), j * tv, j == 0,
                                                 labels.handle(i), logits.handle2(i, j), stats.handle(i));
        codelets::submit_cross_entropy_sum(logits.tile_extent(0, i), i == 0, labels.handle(i), stats.handle(i),
                                           acc.handle(0));
    }
    codelets::submit_cross_entropy_loss(mean, acc.handle(0), loss.handle(0));
    stats.bump_version();
    acc.bump_version();
    loss.bump_version();
}

void cross_entropy_backward(TileTensor &labels, TileTensor &logits, TileTensor &stats, TileTensor &acc,
                            TileTensor &gout, TileTensor &dlogits, bool mean) {
    check(labels, logits, stats, acc, "cross_entropy_backward");
    NNTILE_CHECK(gout.dtype() == DType::f32 && gout.numel() == 1 && gout.ntiles() == 1,
                 "cross_entropy_backward: the loss gradient must be one float32 element");
    NNTILE_CHECK(dlogits.same_tiling(logits) && dlogits.dtype() == DType::f32,
                 "cross_entropy_backward: dlogits must be tiled like the logits");
    int64_t tv = logits.tile_shape()[1];
    for (int64_t i = 0; i < logits.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        for (int64_t j = 0; j < logits.grid()[1]; ++j)
            codelets::submit_cross_entropy_backward(logits.tile_extent(0, i), logits.tile_extent(1, j), j * tv, mean,
                                                    labels.handle(i), logits.handle2(i, j), stats.handle(i),
                                                    acc.handle(0), gout.handle(0), dlogits.handle2(i, j));
    }
    dlogits.bump_version();
}

}  // namespace nntile::ops
