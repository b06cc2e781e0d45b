// AdamW with 8-bit block-wise quantized moments (bitsandbytes' 8-bit AdamW scheme).
//
// A tile's n elements (flattened) are cut into blocks of 256 (the last may be partial). Each moment keeps, per
// block, a float32 scale (the block's absmax; 0 for an all-zero block) and one uint8 code per element, an index into
// a sorted 256-entry map of values in [-1, 1] (exp_avg: signed) or [0, 1] (exp_avg_sq: unsigned): value =
// map[code] * scale. A moment of one tile is stored as q8_words(n) float32 words:
//   [q8_blocks(n) scales][n codes, 4 per word, element i in byte i]
// so all-zero words are a zero moment (every scale 0). Each step dequantizes a block's moments, runs the fp32 AdamW
// element update (adamw_impl.h: the same arithmetic as adamw_cpu) and quantizes them again with the block's new absmax.
#pragma once
#include <cstdint>
#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

#include "adamw.h"

#ifdef __CUDACC__
#define NNTILE_Q8_HD __host__ __device__ __forceinline__
#else
#define NNTILE_Q8_HD inline
#endif

namespace nntile::kernels {

constexpr int64_t Q8_BLOCK = 256;  // elements per quantization block (one scale each)

// Blocks of a tile of n elements, and the float32 words one moment of it takes (scales, then codes 4 per word).
NNTILE_Q8_HD int64_t q8_blocks(int64_t n) { return (n + Q8_BLOCK - 1) / Q8_BLOCK; }
NNTILE_Q8_HD int64_t q8_words(int64_t n) { return q8_blocks(n) + (n + 3) / 4; }

// bitsandbytes' dynamic maps (create_dynamic_map), sorted ascending. Signed: for each decade e = 0..6, the 2^e
// midpoints of linspace(0.1, 1, 2^e + 1) times 10^(e-6), both signs, then 0 and 1 (254 + 2 entries: the smallest is
// -0.99297, there is no -1). Unsigned: 2^(e+1) midpoints per decade, then 0 and 1. Each entry is the exact midpoint
// rounded to float32 (bitsandbytes rounds the linspace to float32 first: entries may differ by an ulp from it).
struct QuantMaps8 {
    float map_signed[256];
    float map_unsigned[256];
};
void quant_map8(bool is_signed, float *out);  // the 256 entries
const QuantMaps8 &quant_maps8();              // both, computed once

// The index of the map entry nearest to x (ties to the lower entry; x beyond the ends goes to the end entry).
NNTILE_Q8_HD uint8_t q8_nearest(const float *map, float x) {
    if (x <= map[0]) return 0;
    if (x >= map[255]) return 255;
    int lo = 0, hi = 255;  // map[lo] <= x < map[hi]
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (map[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return (map[hi] - x) < (x - map[lo]) ? (uint8_t)hi : (uint8_t)lo;
}

// The scale a block is quantized with: its absmax, 1 for an all-zero block (whose codes are then all the 0 entry).
NNTILE_Q8_HD float q8_divisor(float absmax) { return absmax > 0.f ? absmax : 1.f; }

// Dense quantization of n values into one moment's words, and back (tests, state conversion).
void q8_quantize_cpu(int64_t n, bool is_signed, const float *x, float *words);
void q8_dequantize_cpu(int64_t n, bool is_signed, const float *words, float *x);

// One AdamW step of n parameter values with 8-bit moments (exp_avg, exp_avg_sq: q8_words(n) words each; all zero for
// a zero moment). copy (may be null): the updated parameter rounded to bf16, as adamw_cpu's copy.
void adamw_q8_cpu(int64_t n, const AdamWScalars &s, const float *grad, float *param, float *exp_avg, float *exp_avg_sq,
                  uint16_t *copy = nullptr);
// The same step of a bf16 master weight (raw bits; the memory plan's master_dtype=torch.bfloat16): computed in fp32
// from its bf16 value and stored rounded stochastically with bits 32..47 of hash(seed, i), as adamw_bf16_cpu rounds
// it (adamw_impl.h, master_store); the moments exactly as adamw_q8_cpu's.
void adamw_q8_bf16_cpu(int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad, uint16_t *param,
                       float *exp_avg, float *exp_avg_sq);
#ifdef NNTILE_USE_CUDA
// One 256-thread block per quantization block; the maps go by value into shared memory.
void adamw_q8_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, const float *grad, float *param,
                   float *exp_avg, float *exp_avg_sq, uint16_t *copy = nullptr);
void adamw_q8_bf16_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                        uint16_t *param, float *exp_avg, float *exp_avg_sq);
#endif

}  // namespace nntile::kernels
