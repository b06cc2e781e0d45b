// Dropout on a tile: y = x * keep / (1 - p), keep drawn from a counter-based hash (splitmix64) of (seed, the
// element's row-major index in the whole tensor), so the mask is the same on CPU and GPU and for any tiling, is
// never stored, and the backward (the same op on dy) recomputes it.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "aten_tile.h"

#ifdef __CUDACC__
#define NNTILE_DROPOUT_HD __host__ __device__
#else
#define NNTILE_DROPOUT_HD
#endif

namespace nntile::kernels {

constexpr int kDropoutMaxDims = 8;

// The tile is row-major of extents[0..ndim); its element (i_0, ..., i_{ndim-1}) has the index
// base + sum_d i_d * strides[d] in the whole tensor.
struct DropoutTile {
    int64_t ndim = 0, base = 0;
    int64_t extents[kDropoutMaxDims] = {}, strides[kDropoutMaxDims] = {};
};

// splitmix64's output function: the mixed 64 bits of state z.
NNTILE_DROPOUT_HD inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
// A seed's salt: seed times splitmix64's increment (the golden ratio), wrapping.
inline uint64_t dropout_salt(int64_t seed) { return (uint64_t)seed * 0x9E3779B97F4A7C15ULL; }
// The 24 uniform bits of element `index`'s keep draw for salt = dropout_salt(seed) (splitmix64 of salt + index,
// wrapping); the element is kept when they are below dropout_threshold(p), then scaled by dropout_scale(p).
NNTILE_DROPOUT_HD inline int64_t dropout_hash(uint64_t salt, uint64_t index) {
    return (int64_t)(splitmix64_mix(index + salt) >> 40);
}
inline int64_t dropout_threshold(float p) { return (int64_t)((1.0 - (double)p) * (double)(1 << 24)); }
inline float dropout_scale(float p) { return (float)(1.0 / (1.0 - (double)p)); }

// y = x * (keep ? 1 / (1 - p) : 0) over the tile, in one pass.
void dropout(const Where &w, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y);
#ifdef NNTILE_USE_CUDA
void dropout_cuda(cudaStream_t stream, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y);
#endif
// The keep mask (bool) of int64 element indices `index` (any shape and device), as dropout draws it.
at::Tensor dropout_keep(const at::Tensor &index, int64_t seed, float p);

}  // namespace nntile::kernels
