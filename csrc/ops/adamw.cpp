// Tiled AdamW step: one task per parameter tile.
#include <cmath>

#include "../codelets/codelets.h"
#include "../kernels/adamw_impl.h"
#include "ops.h"

namespace nntile::ops {

kernels::AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t step) {
    kernels::AdamWScalars s;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.one_minus_b1 = (float)(1.0 - beta1);
    s.beta2 = (float)beta2;
    s.one_minus_b2 = (float)(1.0 - beta2);
    s.step_size = (float)(lr / (1.0 - std::pow(beta1, (double)step)));
    s.bc2_sqrt = (float)std::sqrt(1.0 - std::pow(beta2, (double)step));
    s.eps = (float)eps;
    return s;
}

void adamw(TileTensor &grad, TileTensor &param, TileTensor &exp_avg, TileTensor &exp_avg_sq, double lr, double beta1,
           double beta2, double eps, double weight_decay, int64_t step, bool init_state, int64_t seed, TileTensor *copy) {
    NNTILE_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::bf16,
                 "AdamW updates float32 or bfloat16 parameters (got " << dtype_name(param.dtype()) << ")");
    NNTILE_CHECK(grad.dtype() == DType::f32, "AdamW takes a float32 gradient (got " << dtype_name(grad.dtype()) << ")");
    NNTILE_CHECK(exp_avg.dtype() == exp_avg_sq.dtype() &&
                     (exp_avg.dtype() == DType::f32 || exp_avg.dtype() == DType::bf16),
                 "AdamW states must be both float32 or both bfloat16 (got " << dtype_name(exp_avg.dtype()) << " and "
                                                                          << dtype_name(exp_avg_sq.dtype()) << ")");
    bool bf16_state = exp_avg.dtype() == DType::bf16;
    bool bf16_param = param.dtype() == DType::bf16;  // bf16 master weights
    NNTILE_CHECK(!bf16_param || (bf16_state && !copy),
                 "AdamW on a bfloat16 parameter needs bfloat16 states and no copy (the parameter is its own bf16 copy)");
    auto tiled_like_param = [&](const TileTensor &t) {
        return t.shape() == param.shape() && t.tile_shape() == param.tile_shape();
    };
    NNTILE_CHECK(tiled_like_param(grad) && tiled_like_param(exp_avg) && tiled_like_param(exp_avg_sq),
                 "AdamW: gradient and state tiles must match the parameter's");
    NNTILE_CHECK(step >= 1, "AdamW step must be >= 1 (got " << step << ")");
    NNTILE_CHECK(!copy || (copy->dtype() == DType::bf16 && tiled_like_param(*copy)),
                 "AdamW's copy must be bfloat16 tiles tiled like the parameter");
    const kernels::AdamWScalars s = adamw_scalars(lr, beta1, beta2, eps, weight_decay, step);
    for (int64_t t = 0; t < param.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(param, t)));
        const int64_t n = param.tile_numel(t);
        // Rounding bits differ per tensor (seed), step and tile, and do not depend on where the task runs.
        uint64_t tile_seed = kernels::hash64(kernels::hash64((uint64_t)seed, (uint64_t)step), (uint64_t)t);
        codelets::submit_adamw(n, s, init_state, bf16_state, tile_seed, grad.handle(t), param.handle(t),
                               exp_avg.handle(t), exp_avg_sq.handle(t), copy ? copy->handle(t) : nullptr, bf16_param);
    }
    if (copy) copy->bump_version();
    param.bump_version();
    exp_avg.bump_version();
    exp_avg_sq.bump_version();
}

}  // namespace nntile::ops
