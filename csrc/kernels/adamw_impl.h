// The per-element AdamW update shared by the CPU and CUDA kernels (same float operations, same order).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "adamw.h"

#ifdef __CUDACC__
#define NNTILE_HD __host__ __device__ __forceinline__
#else
#define NNTILE_HD inline
#endif

namespace nntile::kernels {

// SmallW: which of at::lerp's two forms the moment's lerp takes (w = 1 - beta1 < 0.5 or not), fixed for a whole
// tile: the CPU loops are instantiated for each, since a choice inside the loop kept GCC from vectorizing it for AVX2.
template <bool SmallW>
NNTILE_HD void adamw_element_w(const AdamWScalars &s, float g, float &p, float &m, float &v) {
    p = p * s.decay;
    // at::lerp: self + w (end - self) for w < 0.5, else end - (end - self)(1 - w)
    if (SmallW)
        m = m + s.one_minus_b1 * (g - m);
    else
        m = g - (g - m) * (1.f - s.one_minus_b1);
    v = v * s.beta2;
    v = v + s.one_minus_b2 * g * g;
    float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
    p = p + (-s.step_size) * (m / denom);
}

NNTILE_HD bool lerp_small_weight(const AdamWScalars &s) { return s.one_minus_b1 < 0.5f; }

NNTILE_HD void adamw_element(const AdamWScalars &s, float g, float &p, float &m, float &v) {
    if (lerp_small_weight(s))
        adamw_element_w<true>(s, g, p, m, v);
    else
        adamw_element_w<false>(s, g, p, m, v);
}

NNTILE_HD uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

NNTILE_HD float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// x rounded to bf16 up or down, up with probability (dropped bits) / 2^16: r16 is 16 uniform random bits.
NNTILE_HD uint16_t float_to_bf16_stochastic(float x, uint32_t r16) {
    uint32_t u = float_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));  // inf, nan
    return (uint16_t)((u + (r16 & 0xffffu)) >> 16);
}

// x rounded to bf16, to nearest with ties to even (NaN stays a quiet NaN): what the convert kernels compute.
NNTILE_HD uint16_t float_to_bf16_rne(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// splitmix64's finalizer of seed + i: 64 random bits per element, the same on every device.
NNTILE_HD uint64_t hash64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A master weight as an update reads and writes it: float32 as it is; bf16 (bf16 master weights) widened, and stored
// rounded stochastically with bits 32..47 of hash(seed, i), the bits adamw_element_bf16_w rounds its weight with, so
// the 8-bit-moment update of a bf16 master rounds it as the bf16-moment one does.
NNTILE_HD float master_load(float p) { return p; }
NNTILE_HD float master_load(uint16_t p) { return bf16_to_float(p); }
NNTILE_HD void master_store(float &dst, float p, uint64_t, int64_t) { dst = p; }
NNTILE_HD void master_store(uint16_t &dst, float p, uint64_t seed, int64_t i) {
    dst = float_to_bf16_stochastic(p, (uint32_t)(hash64(seed, (uint64_t)i) >> 32));
}

template <bool SmallW>
NNTILE_HD void adamw_element_bf16state_w(const AdamWScalars &s, uint64_t seed, int64_t i, float g, float &p,
                                         uint16_t &mb, uint16_t &vb) {
    float m = bf16_to_float(mb), v = bf16_to_float(vb);
    adamw_element_w<SmallW>(s, g, p, m, v);
    uint64_t r = hash64(seed, (uint64_t)i);
    mb = float_to_bf16_stochastic(m, (uint32_t)r);
    vb = float_to_bf16_stochastic(v, (uint32_t)(r >> 16));
}

// bf16 master weights (the memory plan's master_dtype=torch.bfloat16): the parameter too is bf16, computed in fp32
// and stored rounded stochastically with 16 more of the element's hash bits (the moments use the first 32), so an
// update smaller than bf16's spacing moves the weight by it with the right probability instead of never.
template <bool SmallW>
NNTILE_HD void adamw_element_bf16_w(const AdamWScalars &s, uint64_t seed, int64_t i, float g, uint16_t &pb,
                                    uint16_t &mb, uint16_t &vb) {
    float p = bf16_to_float(pb), m = bf16_to_float(mb), v = bf16_to_float(vb);
    adamw_element_w<SmallW>(s, g, p, m, v);
    uint64_t r = hash64(seed, (uint64_t)i);
    mb = float_to_bf16_stochastic(m, (uint32_t)r);
    vb = float_to_bf16_stochastic(v, (uint32_t)(r >> 16));
    pb = float_to_bf16_stochastic(p, (uint32_t)(r >> 32));
}

NNTILE_HD void adamw_element_bf16(const AdamWScalars &s, uint64_t seed, int64_t i, float g, uint16_t &pb,
                                  uint16_t &mb, uint16_t &vb) {
    if (lerp_small_weight(s))
        adamw_element_bf16_w<true>(s, seed, i, g, pb, mb, vb);
    else
        adamw_element_bf16_w<false>(s, seed, i, g, pb, mb, vb);
}

NNTILE_HD void adamw_element_bf16state(const AdamWScalars &s, uint64_t seed, int64_t i, float g, float &p,
                                       uint16_t &mb, uint16_t &vb) {
    if (lerp_small_weight(s))
        adamw_element_bf16state_w<true>(s, seed, i, g, p, mb, vb);
    else
        adamw_element_bf16state_w<false>(s, seed, i, g, p, mb, vb);
}

}  // namespace nntile::kernels
