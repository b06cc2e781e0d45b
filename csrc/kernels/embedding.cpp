// Embedding through ATen on tiles (CPU and CUDA); no host synchronization (masks, not boolean indexing).
#include "embedding.h"

namespace nntile::kernels {

namespace {
// Local row of each id in this tile (clamped) and whether it belongs here, as an (m, 1) mask.
std::pair<at::Tensor, at::Tensor> local_rows(const at::Tensor &ids, int64_t lo, int64_t rows) {
    auto local = ids - lo;
    auto mask = local.ge(0).logical_and(local.lt(rows)).unsqueeze(1);
    return {local.clamp(0, rows - 1), mask};
}
}  // namespace

void embedding_forward(const Where &w, int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, const int64_t *ids,
                       const float *table, float *out) {
    StreamScope scope(w);
    auto [idx, mask] = local_rows(wrap(ids, {m}, w, at::kLong), lo, rows);
    auto vals = at::where(mask, wrap(table, {rows, c}, w).index_select(0, idx), 0.0f);
    auto o = wrap(out, {m, c}, w);
    if (first)
        o.copy_(vals);
    else
        o.add_(vals);
}

void embedding_backward(const Where &w, int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, const int64_t *ids,
                        const float *dy, float *dtable) {
    StreamScope scope(w);
    auto [idx, mask] = local_rows(wrap(ids, {m}, w, at::kLong), lo, rows);
    auto g = wrap(dtable, {rows, c}, w);
    if (first) g.zero_();
    g.index_add_(0, idx, at::where(mask, wrap(dy, {m, c}, w), 0.0f));
}

}  // namespace nntile::kernels
