// Range check of integer ids on a tile (token ids before an embedding lookup, labels before a loss): the first
// value outside [lo, hi) that is not `ignore`, found without leaving the device. The caller records it as a task
// error, raised at the host's next wait on anything computed from the ids, so the check needs no host read
// inside a step.
#pragma once
#include <cstdint>
#include <optional>

#include "aten_tile.h"

namespace nntile::kernels {

// ids: n int64 values. Returns the first bad value, if any. On a GPU the answer is read back on the worker's
// stream (the worker waits, the submitting thread does not).
std::optional<int64_t> index_check(const Where &w, int64_t n, int64_t lo, int64_t hi, int64_t ignore,
                                   const int64_t *ids);

}  // namespace nntile::kernels
