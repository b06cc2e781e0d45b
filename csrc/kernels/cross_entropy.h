// Cross-entropy over vocabulary tiles, with ATen (CPU and CUDA). logits x: row-major (m, vj), the columns
// lo .. lo + vj - 1 of the vocabulary; labels: int64 (m), -100 = ignored; stats: (m, 3) per row: running max,
// running sum of exp(x - max), the label's logit. acc: [sum of row losses, number of counted rows].
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

// Folds one vocabulary tile into the per-row stats (first: the stats start here).
void cross_entropy_stats(const Where &w, int64_t m, int64_t vj, int64_t lo, bool first, const int64_t *labels,
                         const float *x, float *stats);
// Adds one row tile's losses (max + log(sum) - label logit, counted rows only) and count to acc.
void cross_entropy_sum(const Where &w, int64_t m, bool first, const int64_t *labels, const float *stats, float *acc);
// loss = acc[0] / acc[1] (mean) or acc[0] (sum).
void cross_entropy_loss(const Where &w, bool mean, const float *acc, float *loss);
// dx = (softmax(x) - onehot(label)) * g for counted rows, 0 for ignored ones; g = gout / acc[1] (mean) or gout.
void cross_entropy_backward(const Where &w, int64_t m, int64_t vj, int64_t lo, bool mean, const int64_t *labels,
                            const float *x, const float *stats, const float *acc, const float *gout, float *dx);

}  // namespace nntile::kernels
