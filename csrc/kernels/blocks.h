// Broadcasting over leading dimensions on tiles, with ATen: a tile of nblk * r rows holds nblk blocks of r
// rows; add_blocks adds one (r, c) block to each of them, sum_blocks adds them all up into one (r, c) block.
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

// dst (nblk * r, c) += src (r, c) to every block.
void add_blocks(const Where &w, int64_t nblk, int64_t r, int64_t c, const float *src, float *dst);
// dst (r, c) = (first ? 0 : dst) + the sum of the nblk blocks of src (nblk * r, c), in block order.
void sum_blocks(const Where &w, int64_t nblk, int64_t r, int64_t c, bool first, const float *src, float *dst);

}  // namespace nntile::kernels
