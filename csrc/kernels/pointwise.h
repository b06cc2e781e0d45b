// Elementwise maps and whole-tile reductions over fp32 tiles: the arithmetic torch's own optimizers
// (torch.optim.AdamW / Adam / SGD, for-loop and foreach forms) and clip_grad_norm_ / clip_grad_value_ do, as one
// generic kernel selected by an opcode. Every buffer is n contiguous fp32 values (any tile, row-major); an operand
// of one value (a "scalar tile": a 0-dim result such as a clipping coefficient) is broadcast over the tile.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

namespace nntile::kernels {

// A, B, C are the operands (A may be the destination itself for an in-place op), s0, s1 the float scalars.
enum class PointwiseOp : int32_t {
    fill = 0,        // d = s0
    scale = 1,       // d = A * s0
    div_scalar = 2,  // d = A / s0
    add_scalar = 3,  // d = A + s0
    mul = 4,         // d = A * B
    lerp = 5,        // d = lerp(A, B, s0), as at::lerp (fma(w, B - A, A) for |w| < 0.5, else fma(w - 1, B - A, B))
    addcmul = 6,     // d = fma(s0 * B, C, A) (what torch's CPU kernel computes)
    addcdiv = 7,     // d = A + (s0 * B) / C
    sqrt = 8,        // d = sqrt(A)
    reciprocal = 9,  // d = 1 / A
    clamp = 10,      // d = min(max(A, s0), s1), NaN kept
    pow_scalar = 11, // d = pow(A, s0)
    axpby = 12,      // d = s0 * A + s1 * B
    // Reductions of the whole tile A into d[0] (one value): written, or combined with d[0] when accumulating.
    sumsq = 32,   // sum of A^2
    sumabs = 33,  // sum of |A|
    sumpow = 34,  // sum of |A|^s0
    maxabs = 35,  // max of |A| (NaN if any is NaN)
};

inline bool pointwise_is_reduction(PointwiseOp op) { return (int32_t)op >= 32; }
// How many tile operands (A, B, C) an op reads.
inline int pointwise_arity(PointwiseOp op) {
    switch (op) {
        case PointwiseOp::fill: return 0;
        case PointwiseOp::mul:
        case PointwiseOp::lerp:
        case PointwiseOp::axpby: return 2;
        case PointwiseOp::addcmul:
        case PointwiseOp::addcdiv: return 3;
        default: return 1;
    }
}

struct PointwiseArgs {
    PointwiseOp op;
    int64_t n;               // elements of d (a map) or of A (a reduction)
    int64_t na, nb, nc;      // elements of each operand: n, or 1 (broadcast)
    float s0, s1;
    bool accumulate;         // reductions: combine with d[0] instead of overwriting it
};

void pointwise_cpu(const PointwiseArgs &args, float *d, const float *a, const float *b, const float *c);
// dst[i] = srcs[i][0], i < n: n one-value tiles gathered into one tile (torch.stack of 0-dim results) in one task.
void gather_scalars_cpu(int64_t n, const float *const *srcs, float *dst);
#ifdef NNTILE_USE_CUDA
void pointwise_cuda(cudaStream_t stream, const PointwiseArgs &args, float *d, const float *a, const float *b,
                    const float *c);
// srcs: a host array of n device pointers.
void gather_scalars_cuda(cudaStream_t stream, int64_t n, const float *const *srcs, float *dst);
#endif

}  // namespace nntile::kernels
