// CPU AdamW kernel.
#include "adamw_impl.h"

namespace nntile::kernels {

void adamw_cpu(int64_t n, const AdamWScalars &s, const float *grad, float *param, float *exp_avg, float *exp_avg_sq) {
    for (int64_t i = 0; i < n; ++i) adamw_element(s, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
}

void adamw_bf16state_cpu(int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad, float *param,
                         uint16_t *exp_avg, uint16_t *exp_avg_sq) {
    for (int64_t i = 0; i < n; ++i) adamw_element_bf16state(s, seed, i, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
}

}  // namespace nntile::kernels
