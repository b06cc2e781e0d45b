// Tiled embedding: one task per (row tile, vocabulary tile).
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check(TileTensor &ids, TileTensor &table, TileTensor &rows_c, const char *op) {
    NNTILE_CHECK(ids.dtype() == DType::i64 && ids.ndim() == 1, op << ": ids must be 1-d int64 tiles");
    NNTILE_CHECK(table.dtype() == DType::f32 && table.ndim() == 2 && table.grid()[1] == 1,
                 op << ": the table must be (V, C) float32 in tiles of whole rows");
    int64_t c = table.shape()[1];
    NNTILE_CHECK(rows_c.dtype() == DType::f32 && rows_c.ndim() == 2 && rows_c.shape()[0] == ids.shape()[0] &&
                     rows_c.shape()[1] == c && rows_c.tile_shape()[0] == ids.tile_shape()[0] && rows_c.grid()[1] == 1,
                 op << ": activations must be (" << ids.shape()[0] << ", " << c << ") tiled by the ids' "
                    << ids.tile_shape()[0] << " rows");
}
}  // namespace

void embedding_forward(TileTensor &ids, TileTensor &table, TileTensor &out) {
    check(ids, table, out, "embedding");
    int64_t c = table.shape()[1], tv = table.tile_shape()[0];
    for (int64_t i = 0; i < ids.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        for (int64_t v = 0; v < table.grid()[0]; ++v)
            codelets::submit_embedding_forward(ids.tile_extent(0, i), table.tile_extent(0, v), c, v * tv, v == 0,
                                               ids.handle(i), table.handle(v), out.handle(i));
    }
    out.bump_version();
}

void embedding_backward(TileTensor &ids, TileTensor &dy, TileTensor &dtable, bool accumulate) {
    check(ids, dtable, dy, "embedding_backward");
    int64_t c = dtable.shape()[1], tv = dtable.tile_shape()[0];
    for (int64_t v = 0; v < dtable.grid()[0]; ++v)
        for (int64_t i = 0; i < ids.grid()[0]; ++i) {
            OnWorker on(placement_worker(i));
            codelets::submit_embedding_backward(ids.tile_extent(0, i), dtable.tile_extent(0, v), c, v * tv, i == 0 && !accumulate,
                                                ids.handle(i), dy.handle(i), dtable.handle(v));
        }
    dtable.bump_version();
}

}  // namespace nntile::ops
