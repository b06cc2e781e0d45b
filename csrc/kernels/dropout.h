// Dropout on a tile: y = x * keep / (1 - p), keep drawn from a counter-based hash (splitmix64) of (seed, the
// element's row-major index in the whole tensor), so the mask is the same on CPU and GPU and for any tiling, is
// never stored, and the backward (the same op on dy) recomputes it.
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

constexpr int kDropoutMaxDims = 8;

// The tile is row-major of extents[0..ndim); its element (i_0, ..., i_{ndim-1}) has the index
// base + sum_d i_d * strides[d] in the whole tensor.
struct DropoutTile {
    int64_t ndim = 0, base = 0;
    int64_t extents[kDropoutMaxDims] = {}, strides[kDropoutMaxDims] = {};
};

void dropout(const Where &w, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y);
// The keep mask (bool) of int64 element indices `index` (any shape and device), as dropout draws it.
at::Tensor dropout_keep(const at::Tensor &index, int64_t seed, float p);

}  // namespace nntile::kernels
