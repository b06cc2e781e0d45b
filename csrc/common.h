// Shared definitions: element types, precision modes and the check macros every layer uses.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace nntile {

// Element type of a tile. Tiles hold row-major data of their own extent.
// int64 tiles hold token ids.
enum class DType : int32_t { f32 = 0, bf16 = 1, i64 = 2 };

inline size_t dtype_size(DType t) { return t == DType::f32 ? 4 : t == DType::bf16 ? 2 : 8; }
inline const char *dtype_name(DType t) { return t == DType::f32 ? "float32" : t == DType::bf16 ? "bfloat16" : "int64"; }

// How a GEMM multiplies: exact fp32, tf32 tensor cores, or bf16 inputs with fp32 accumulation.
enum class Precision : int32_t { fp32 = 0, tf32 = 1, bf16 = 2 };

inline Precision parse_precision(const std::string &s) {
    if (s == "fp32") return Precision::fp32;
    if (s == "tf32") return Precision::tf32;
    if (s == "bf16") return Precision::bf16;
    throw std::invalid_argument("precision must be one of 'fp32', 'tf32', 'bf16' (got '" + s + "')");
}

}  // namespace nntile

// NNTILE_CHECK(cond, msg << ...): throws std::runtime_error naming the failed condition and what was found.
#define NNTILE_CHECK(cond, ...)                                                                  \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            std::ostringstream nntile_msg_;                                                      \
            nntile_msg_ << __VA_ARGS__ << " [check '" #cond "' failed at " << __FILE__ << ":"    \
                        << __LINE__ << "]";                                                      \
            throw std::runtime_error(nntile_msg_.str());                                         \
        }                                                                                        \
    } while (0)

// Checks a StarPU return code (0 or -errno on failure).
#define NNTILE_STARPU_CHECK(expr, what)                                                           \
    do {                                                                                         \
        int nntile_rc_ = (expr);                                                                 \
        if (nntile_rc_ != 0) {                                                                   \
            std::ostringstream nntile_msg_;                                                      \
            nntile_msg_ << "StarPU call failed: " << what << " (" #expr " returned " << nntile_rc_ \
                        << (nntile_rc_ == -19 ? ": no worker can run this task (ENODEV)" : "")   \
                        << ")";                                                                  \
            throw std::runtime_error(nntile_msg_.str());                                         \
        }                                                                                        \
    } while (0)
