// CPU float32 <-> bfloat16 conversion.
#include "convert.h"

#include "cpu_clones.h"

#include <cstring>

namespace nntile::kernels {

namespace {
uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a (quiet) NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);                  // round to nearest, ties to even
    return (uint16_t)(bits >> 16);
}
float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
}  // namespace

NNTILE_CPU_CLONES void convert_cpu(int64_t n, DType src_type, const void *src, DType dst_type, void *dst) {
    if (src_type == dst_type) {
        std::memcpy(dst, src, n * dtype_size(src_type));
    } else if (src_type == DType::f32) {
        auto *s = static_cast<const float *>(src);
        auto *d = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    } else {
        auto *s = static_cast<const uint16_t *>(src);
        auto *d = static_cast<float *>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    }
}

}  // namespace nntile::kernels
