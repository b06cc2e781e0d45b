// CPU AdamW kernel.
#include "adamw_impl.h"
#include "cpu_clones.h"

namespace nntile::kernels {

// __restrict__ (tiles never overlap) and -fno-math-errno (setup.py) let the compiler vectorize the loops: 2.4x
// per core on an x86 build machine, same bits. Each loop is also compiled for AVX2 and AVX-512 (x86-64-v3/v4) and
// the best the processor has is picked at load time: beyond GPU memory the memory plan runs the updates of the host
// blocks on CPU workers, where they are on the step's critical path (NNTILE_CPU_CLONES, cpu_clones.h).

// Two loops each (with and without the bf16 copy), so that neither carries a branch per element, and each for both
// forms of the moment's lerp (adamw_impl.h). The loops are helpers: the clones inline them (`flatten`), or they would
// be compiled for the baseline alone (as they were until benchmarks/cpu_adamw.py showed it: the clones ran SSE2).
namespace {
template <bool SmallW>
void adamw_loop(int64_t n, const AdamWScalars &s, const float *__restrict__ grad, float *__restrict__ param,
                float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq, uint16_t *__restrict__ copy) {
    if (copy) {
        for (int64_t i = 0; i < n; ++i) {
            adamw_element_w<SmallW>(s, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
            copy[i] = float_to_bf16_rne(param[i]);
        }
    } else {
        for (int64_t i = 0; i < n; ++i) adamw_element_w<SmallW>(s, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
    }
}

template <bool SmallW>
void adamw_bf16state_loop(int64_t n, const AdamWScalars &s, uint64_t seed, const float *__restrict__ grad,
                          float *__restrict__ param, uint16_t *__restrict__ exp_avg, uint16_t *__restrict__ exp_avg_sq,
                          uint16_t *__restrict__ copy) {
    if (copy) {
        for (int64_t i = 0; i < n; ++i) {
            adamw_element_bf16state_w<SmallW>(s, seed, i, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
            copy[i] = float_to_bf16_rne(param[i]);
        }
    } else {
        for (int64_t i = 0; i < n; ++i)
            adamw_element_bf16state_w<SmallW>(s, seed, i, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
    }
}
template <bool SmallW>
void adamw_bf16_loop(int64_t n, const AdamWScalars &s, uint64_t seed, const float *__restrict__ grad,
                     uint16_t *__restrict__ param, uint16_t *__restrict__ exp_avg, uint16_t *__restrict__ exp_avg_sq) {
    for (int64_t i = 0; i < n; ++i) adamw_element_bf16_w<SmallW>(s, seed, i, grad[i], param[i], exp_avg[i], exp_avg_sq[i]);
}
}  // namespace

NNTILE_CPU_CLONES void adamw_bf16_cpu(int64_t n, const AdamWScalars &s, uint64_t seed, const float *__restrict__ grad,
                                      uint16_t *__restrict__ param, uint16_t *__restrict__ exp_avg,
                                      uint16_t *__restrict__ exp_avg_sq) {
    if (lerp_small_weight(s))
        adamw_bf16_loop<true>(n, s, seed, grad, param, exp_avg, exp_avg_sq);
    else
        adamw_bf16_loop<false>(n, s, seed, grad, param, exp_avg, exp_avg_sq);
}

NNTILE_CPU_CLONES void adamw_cpu(int64_t n, const AdamWScalars &s, const float *__restrict__ grad,
                                 float *__restrict__ param, float *__restrict__ exp_avg,
                                 float *__restrict__ exp_avg_sq, uint16_t *__restrict__ copy) {
    if (lerp_small_weight(s))
        adamw_loop<true>(n, s, grad, param, exp_avg, exp_avg_sq, copy);
    else
        adamw_loop<false>(n, s, grad, param, exp_avg, exp_avg_sq, copy);
}

NNTILE_CPU_CLONES void adamw_bf16state_cpu(int64_t n, const AdamWScalars &s, uint64_t seed,
                                           const float *__restrict__ grad, float *__restrict__ param,
                                           uint16_t *__restrict__ exp_avg, uint16_t *__restrict__ exp_avg_sq,
                                           uint16_t *__restrict__ copy) {
    if (lerp_small_weight(s))
        adamw_bf16state_loop<true>(n, s, seed, grad, param, exp_avg, exp_avg_sq, copy);
    else
        adamw_bf16state_loop<false>(n, s, seed, grad, param, exp_avg, exp_avg_sq, copy);
}

}  // namespace nntile::kernels
