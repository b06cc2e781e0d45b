// The per-element AdamW update shared by the CPU and CUDA kernels (same float operations, same order).
#pragma once
#include <cmath>

#include "adamw.h"

#ifdef __CUDACC__
#define NNTILE_HD __host__ __device__ __forceinline__
#else
#define NNTILE_HD inline
#endif

namespace nntile::kernels {

NNTILE_HD void adamw_element(const AdamWScalars &s, float g, float &p, float &m, float &v) {
    p = p * s.decay;
    // at::lerp: self + w (end - self) for w < 0.5, else end - (end - self)(1 - w)
    m = s.one_minus_b1 < 0.5f ? m + s.one_minus_b1 * (g - m) : g - (g - m) * (1.f - s.one_minus_b1);
    v = v * s.beta2;
    v = v + s.one_minus_b2 * g * g;
    float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
    p = p + (-s.step_size) * (m / denom);
}

}  // namespace nntile::kernels
