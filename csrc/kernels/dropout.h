// Dropout on a tile: y = x * keep / (1 - p), keep drawn from a counter-based hash (splitmix64) of (seed, the
// element's index in the whole tensor), so the mask is the same on CPU and GPU, is never stored, and the
// backward (the same op on dy) recomputes it.
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

void dropout(const Where &w, int64_t n, int64_t offset, int64_t seed, float p, const float *x, float *y);

}  // namespace nntile::kernels
