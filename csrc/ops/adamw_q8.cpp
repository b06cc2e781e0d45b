// Tiled AdamW step with 8-bit block-wise moments: one task per parameter tile.
#include <algorithm>

#include "../codelets/codelets.h"
#include "../kernels/adamw_impl.h"
#include "../kernels/adamw_q8.h"
#include "ops.h"

namespace nntile::ops {

void adamw_q8(TileTensor &grad, TileTensor &param, TileTensor &exp_avg, TileTensor &exp_avg_sq, double lr,
              double beta1, double beta2, double eps, double weight_decay, int64_t step, bool init_state,
              int64_t seed, TileTensor *copy) {
    NNTILE_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::bf16,
                 "AdamW with 8-bit moments updates float32 or bfloat16 parameters (got " << dtype_name(param.dtype())
                                                                                         << ")");
    const bool bf16_param = param.dtype() == DType::bf16;  // a bf16 master weight
    NNTILE_CHECK(!bf16_param || !copy,
                 "AdamW on a bfloat16 parameter takes no copy (the parameter is its own bf16 copy)");
    NNTILE_CHECK(grad.dtype() == DType::f32, "AdamW takes a float32 gradient (got " << dtype_name(grad.dtype()) << ")");
    NNTILE_CHECK(grad.shape() == param.shape() && grad.tile_shape() == param.tile_shape(),
                 "AdamW: gradient tiles must match the parameter's");
    int64_t max_numel = 0;
    for (int64_t t = 0; t < param.ntiles(); ++t) max_numel = std::max(max_numel, param.tile_numel(t));
    const int64_t need = kernels::q8_words(max_numel);
    for (const TileTensor *st : {&exp_avg, &exp_avg_sq}) {
        NNTILE_CHECK(st->dtype() == DType::f32 && st->shape().size() == 1 && st->tile_shape().size() == 1,
                     "AdamW's 8-bit moments are 1-D float32 word tiles");
        const int64_t w = st->tile_shape()[0];
        NNTILE_CHECK(w >= need && st->shape()[0] == param.ntiles() * w,
                     "AdamW's 8-bit moments need " << param.ntiles() << " tiles of at least q8_words(" << max_numel
                                                   << ") = " << need << " words (got shape " << st->shape()[0]
                                                   << " in tiles of " << w << ")");
    }
    NNTILE_CHECK(step >= 1, "AdamW step must be >= 1 (got " << step << ")");
    NNTILE_CHECK(!copy || (copy->dtype() == DType::bf16 && copy->shape() == param.shape() &&
                           copy->tile_shape() == param.tile_shape()),
                 "AdamW's copy must be bfloat16 tiles tiled like the parameter");
    const kernels::AdamWScalars s = adamw_scalars(lr, beta1, beta2, eps, weight_decay, step);
    for (int64_t t = 0; t < param.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(param, t)));
        // The bf16 master's rounding bits: those of adamw's (the same tile seed from seed, step and tile).
        const uint64_t tile_seed = kernels::hash64(kernels::hash64((uint64_t)seed, (uint64_t)step), (uint64_t)t);
        codelets::submit_adamw_q8(param.tile_numel(t), s, init_state, grad.handle(t), param.handle(t),
                                  exp_avg.handle(t), exp_avg_sq.handle(t), copy ? copy->handle(t) : nullptr,
                                  bf16_param, tile_seed);
    }
    if (copy) copy->bump_version();
    param.bump_version();
    exp_avg.bump_version();
    exp_avg_sq.bump_version();
}

}  // namespace nntile::ops
