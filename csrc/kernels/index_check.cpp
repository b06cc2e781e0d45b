// Range check of integer ids through ATen (CPU and CUDA).
#include "index_check.h"

namespace nntile::kernels {

std::optional<int64_t> index_check(const Where &w, int64_t n, int64_t lo, int64_t hi, int64_t ignore,
                                   const int64_t *ids) {
    StreamScope scope(w);
    auto t = wrap(ids, {n}, w, at::kLong);
    auto bad = t.ne(ignore).logical_and(t.lt(lo).logical_or(t.ge(hi)));
    if (!bad.any().item<bool>()) return std::nullopt;
    return t.masked_select(bad)[0].item<int64_t>();
}

}  // namespace nntile::kernels
