// CPU AdamW kernel with 8-bit block-wise moments, the dynamic quantization maps, dense quantize / dequantize.
#include "adamw_q8.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "adamw_impl.h"
#include "cpu_clones.h"

namespace nntile::kernels {

void quant_map8(bool is_signed, float *out) {
    // The k-th midpoint of linspace(0.1, 1, n + 1) is 0.1 + 0.9 (2k + 1) / (2n) = (2n + 18k + 9) / (20n); times
    // 10^(e-6) it is a ratio of integers that doubles hold exactly, so the double division is correctly rounded and
    // Python's float(Fraction(num, den)) gives the same double (tests/test_adamw_q8.py builds the maps that way).
    std::vector<float> v;
    int64_t pow10 = 1000000;  // 10^(6-e)
    for (int e = 0; e <= 6; ++e, pow10 /= 10) {
        int64_t n = is_signed ? (int64_t)1 << e : (int64_t)2 << e;
        for (int64_t k = 0; k < n; ++k) {
            float x = (float)((double)(2 * n + 18 * k + 9) / (double)(20 * n * pow10));
            v.push_back(x);
            if (is_signed) v.push_back(-x);
        }
    }
    v.push_back(0.f);
    v.push_back(1.f);
    if (v.size() != 256) throw std::logic_error("quant_map8: the dynamic map must have 256 entries");
    std::sort(v.begin(), v.end());
    std::copy(v.begin(), v.end(), out);
}

const QuantMaps8 &quant_maps8() {
    static const QuantMaps8 maps = [] {
        QuantMaps8 m;
        quant_map8(true, m.map_signed);
        quant_map8(false, m.map_unsigned);
        return m;
    }();
    return maps;
}

namespace {

// One block of len values x (overwritten by nothing): its absmax as the scale, each value's nearest code.
inline void quantize_block(const float *map, int64_t len, const float *x, float &scale, uint8_t *codes) {
    float absmax = 0.f;
    for (int64_t j = 0; j < len; ++j) absmax = std::max(absmax, std::fabs(x[j]));
    scale = absmax;
    const float d = q8_divisor(absmax);
    for (int64_t j = 0; j < len; ++j) codes[j] = q8_nearest(map, x[j] / d);
}

// Param: float (fp32 master) or uint16_t (bf16 master, rounded stochastically from hash(seed, element): master_store).
template <bool SmallW, class Param>
void adamw_q8_loop(int64_t n, const AdamWScalars &s, uint64_t seed, const float *__restrict__ grad,
                   Param *__restrict__ param, float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq,
                   uint16_t *__restrict__ copy) {
    const QuantMaps8 &maps = quant_maps8();
    const int64_t nb = q8_blocks(n);
    uint8_t *cm = reinterpret_cast<uint8_t *>(exp_avg + nb), *cv = reinterpret_cast<uint8_t *>(exp_avg_sq + nb);
    float m[Q8_BLOCK], v[Q8_BLOCK];
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * Q8_BLOCK, len = std::min<int64_t>(Q8_BLOCK, n - lo);
        const float sm = exp_avg[b], sv = exp_avg_sq[b];
        for (int64_t j = 0; j < len; ++j) {
            m[j] = maps.map_signed[cm[lo + j]] * sm;
            v[j] = maps.map_unsigned[cv[lo + j]] * sv;
        }
        for (int64_t j = 0; j < len; ++j) {
            float p = master_load(param[lo + j]);
            adamw_element_w<SmallW>(s, grad[lo + j], p, m[j], v[j]);
            master_store(param[lo + j], p, seed, lo + j);
        }
        if (copy)  // fp32 masters only (a bf16 master is its own copy)
            for (int64_t j = 0; j < len; ++j) copy[lo + j] = float_to_bf16_rne(master_load(param[lo + j]));
        quantize_block(maps.map_signed, len, m, exp_avg[b], cm + lo);
        quantize_block(maps.map_unsigned, len, v, exp_avg_sq[b], cv + lo);
    }
}

}  // namespace

void q8_quantize_cpu(int64_t n, bool is_signed, const float *x, float *words) {
    const float *map = is_signed ? quant_maps8().map_signed : quant_maps8().map_unsigned;
    const int64_t nb = q8_blocks(n);
    uint8_t *codes = reinterpret_cast<uint8_t *>(words + nb);
    std::fill(codes, reinterpret_cast<uint8_t *>(words + q8_words(n)), (uint8_t)0);  // the last word's padding
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * Q8_BLOCK;
        quantize_block(map, std::min<int64_t>(Q8_BLOCK, n - lo), x + lo, words[b], codes + lo);
    }
}

void q8_dequantize_cpu(int64_t n, bool is_signed, const float *words, float *x) {
    const float *map = is_signed ? quant_maps8().map_signed : quant_maps8().map_unsigned;
    const uint8_t *codes = reinterpret_cast<const uint8_t *>(words + q8_blocks(n));
    for (int64_t i = 0; i < n; ++i) x[i] = map[codes[i]] * words[i / Q8_BLOCK];
}

NNTILE_CPU_CLONES void adamw_q8_cpu(int64_t n, const AdamWScalars &s, const float *__restrict__ grad,
                                    float *__restrict__ param, float *__restrict__ exp_avg,
                                    float *__restrict__ exp_avg_sq, uint16_t *__restrict__ copy) {
    if (lerp_small_weight(s))
        adamw_q8_loop<true>(n, s, 0, grad, param, exp_avg, exp_avg_sq, copy);
    else
        adamw_q8_loop<false>(n, s, 0, grad, param, exp_avg, exp_avg_sq, copy);
}

NNTILE_CPU_CLONES void adamw_q8_bf16_cpu(int64_t n, const AdamWScalars &s, uint64_t seed,
                                         const float *__restrict__ grad, uint16_t *__restrict__ param,
                                         float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq) {
    if (lerp_small_weight(s))
        adamw_q8_loop<true>(n, s, seed, grad, param, exp_avg, exp_avg_sq, (uint16_t *)nullptr);
    else
        adamw_q8_loop<false>(n, s, seed, grad, param, exp_avg, exp_avg_sq, (uint16_t *)nullptr);
}

}  // namespace nntile::kernels
