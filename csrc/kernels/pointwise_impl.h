// The per-element functions shared by the CPU and CUDA pointwise kernels (same float operations, same order).
#pragma once
#include <cmath>

#include "pointwise.h"

#ifdef __CUDACC__
#define NNTILE_PW_HD __host__ __device__ __forceinline__
#else
#define NNTILE_PW_HD inline
#endif

namespace nntile::kernels {

NNTILE_PW_HD float pointwise_element(PointwiseOp op, float a, float b, float c, float s0, float s1) {
    switch (op) {
        case PointwiseOp::fill: return s0;
        case PointwiseOp::scale: return a * s0;
        case PointwiseOp::div_scalar: return a / s0;
        case PointwiseOp::add_scalar: return a + s0;
        case PointwiseOp::mul: return a * b;
        case PointwiseOp::lerp: return fabsf(s0) < 0.5f ? fmaf(s0, b - a, a) : fmaf(s0 - 1.f, b - a, b);
        case PointwiseOp::addcmul: return fmaf(s0 * b, c, a);
        case PointwiseOp::addcdiv: return a + (s0 * b) / c;
        case PointwiseOp::sqrt: return sqrtf(a);
        case PointwiseOp::reciprocal: return 1.f / a;
        case PointwiseOp::clamp: {
            float x = a < s0 ? s0 : a;  // comparisons with NaN are false: NaN passes through, as in torch.clamp
            return x > s1 ? s1 : x;
        }
        case PointwiseOp::pow_scalar: return powf(a, s0);
        case PointwiseOp::axpby: return s0 * a + s1 * b;
        default: return a;
    }
}

// One element's contribution to a reduction (in double) and how two partial results combine.
NNTILE_PW_HD double pointwise_term(PointwiseOp op, float a, float s0) {
    switch (op) {
        case PointwiseOp::sumsq: return (double)a * (double)a;
        case PointwiseOp::sumabs: return fabs((double)a);
        case PointwiseOp::sumpow: return pow(fabs((double)a), (double)s0);
        default: return fabs((double)a);  // maxabs
    }
}

NNTILE_PW_HD double pointwise_combine(PointwiseOp op, double x, double y) {
    if (op != PointwiseOp::maxabs) return x + y;
    if (x != x) return x;  // NaN wins, as in torch's max
    if (y != y) return y;
    return x > y ? x : y;
}

}  // namespace nntile::kernels
