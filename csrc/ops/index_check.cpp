// Tiled range check of integer ids: one task per tile; a bad value is raised at the host's next wait.
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

void index_check(TileTensor &ids, int64_t lo, int64_t hi, int64_t ignore, const std::string &what) {
    NNTILE_CHECK(ids.dtype() == DType::i64, "index_check: ids must be int64 tiles (got " << dtype_name(ids.dtype()) << ")");
    NNTILE_CHECK(lo < hi, "index_check: empty range [" << lo << ", " << hi << ")");
    for (int64_t t = 0; t < ids.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(ids, t)));
        codelets::submit_index_check(ids.tile_numel(t), lo, hi, ignore, what, ids.handle(t));
    }
}

}  // namespace nntile::ops
