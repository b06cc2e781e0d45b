// Cross-entropy through ATen on tiles; no host synchronization (masks, no boolean indexing).
#include "cross_entropy.h"

#include <c10/core/GradMode.h>

namespace nntile::kernels {

namespace {
constexpr int64_t kIgnore = -100;

// Column of each row's label inside this tile (clamped) and whether the label falls in the tile.
std::pair<at::Tensor, at::Tensor> local_label(const at::Tensor &labels, int64_t lo, int64_t vj) {
    auto local = labels - lo;
    return {local.clamp(0, vj - 1).unsqueeze(1), local.ge(0).logical_and(local.lt(vj))};
}
}  // namespace

void cross_entropy_stats(const Where &w, int64_t m, int64_t vj, int64_t lo, bool first, const int64_t *labels,
                         const float *x, float *stats) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto X = wrap(x, {m, vj}, w);
    auto S = wrap(stats, {m, 3}, w);
    auto [col, here] = local_label(wrap(labels, {m}, w, at::kLong), lo, vj);
    auto picked = at::where(here, X.gather(1, col).squeeze(1), 0.0f);
    auto mx = X.amax(1);
    if (first) {
        S.select(1, 0).copy_(mx);
        S.select(1, 1).copy_((X - mx.unsqueeze(1)).exp().sum(1));
        S.select(1, 2).copy_(picked);
    } else {
        auto m0 = S.select(1, 0);
        auto mn = at::maximum(m0, mx);
        auto s = S.select(1, 1) * (m0 - mn).exp() + (X - mn.unsqueeze(1)).exp().sum(1);
        S.select(1, 1).copy_(s);
        S.select(1, 0).copy_(mn);
        S.select(1, 2).add_(picked);
    }
}

void cross_entropy_sum(const Where &w, int64_t m, bool first, const int64_t *labels, const float *stats, float *acc) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto S = wrap(stats, {m, 3}, w);
    auto counted = wrap(labels, {m}, w, at::kLong).ne(kIgnore);
    auto row = S.select(1, 0) + S.select(1, 1).log() - S.select(1, 2);
    auto part = at::stack({at::where(counted, row, 0.0f).sum(), counted.sum().to(at::kFloat)});
    auto A = wrap(acc, {2}, w);
    if (first)
        A.copy_(part);
    else
        A.add_(part);
}

void cross_entropy_loss(const Where &w, bool mean, const float *acc, float *loss) {
    StreamScope scope(w);
    auto A = wrap(acc, {2}, w);
    auto L = wrap(loss, {1}, w);
    if (mean)
        at::div_out(L, A.narrow(0, 0, 1), A.narrow(0, 1, 1));
    else
        L.copy_(A.narrow(0, 0, 1));
}

void cross_entropy_backward(const Where &w, int64_t m, int64_t vj, int64_t lo, bool mean, const int64_t *labels,
                            const float *x, const float *stats, const float *acc, const float *gout, float *dx) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto X = wrap(x, {m, vj}, w);
    auto S = wrap(stats, {m, 3}, w);
    auto L = wrap(labels, {m}, w, at::kLong);
    auto g = wrap(gout, {1}, w);
    if (mean) g = g / wrap(acc, {2}, w).narrow(0, 1, 1);
    auto gr = at::where(L.ne(kIgnore), g, 0.0f).unsqueeze(1);  // (m, 1): g on counted rows, 0 on ignored ones
    auto lse = (S.select(1, 0) + S.select(1, 1).log()).unsqueeze(1);
    auto D = wrap(dx, {m, vj}, w);
    at::mul_out(D, (X - lse).exp(), gr);
    auto [col, here] = local_label(L, lo, vj);
    D.scatter_add_(1, col, -at::where(here.unsqueeze(1), gr, 0.0f));
}

}  // namespace nntile::kernels
