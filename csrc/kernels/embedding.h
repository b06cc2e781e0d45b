// Embedding lookup and its gradient against one vocabulary tile (rows lo .. lo + rows - 1 of the table), with
// ATen. ids: int64 (m); table, dtable: row-major (rows, c); out, dy: (m, c). Ids outside the tile add exact zeros.
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

void embedding_forward(const Where &w, int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, const int64_t *ids,
                       const float *table, float *out);
void embedding_backward(const Where &w, int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, const int64_t *ids,
                        const float *dy, float *dtable);

}  // namespace nntile::kernels
