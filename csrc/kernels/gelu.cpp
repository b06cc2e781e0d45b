// GELU through ATen on tiles (CPU and CUDA).
#include "gelu.h"

#include "convert.h"

namespace nntile::kernels {

namespace {
// A float32 tensor for the fp32 result: the tile itself, or on CPUs scratch that to_bf16 then rounds into the bf16
// tile (GPUs write bf16 in one pass: gelu_cuda.cu).
at::Tensor fp32_out(const Where &w, int64_t n, void *out, bool out_bf16) {
    if (!out_bf16) return wrap(out, {n}, w);
    return at::empty({n}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
}

void to_bf16(int64_t n, const at::Tensor &src, void *dst) {
    convert_cpu(n, DType::f32, src.data_ptr<float>(), DType::bf16, dst);
}
}  // namespace

void gelu_forward(const Where &w, int64_t n, bool tanh_approx, const float *x, void *y, bool out_bf16) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda && out_bf16) {
        gelu_forward_bf16_cuda(static_cast<cudaStream_t>(w.stream), n, tanh_approx, x, y);
        return;
    }
#endif
    StreamScope scope(w);
    auto out = fp32_out(w, n, y, out_bf16);
    at::gelu_out(out, wrap(x, {n}, w), tanh_approx ? "tanh" : "none");
    if (out_bf16) to_bf16(n, out, y);
}

void gelu_backward(const Where &w, int64_t n, bool tanh_approx, const float *dy, const float *x, void *dx,
                   bool out_bf16) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda && out_bf16) {
        gelu_backward_bf16_cuda(static_cast<cudaStream_t>(w.stream), n, tanh_approx, dy, x, dx);
        return;
    }
#endif
    StreamScope scope(w);
    auto out = fp32_out(w, n, dx, out_bf16);
    at::gelu_backward_out(out, wrap(dy, {n}, w), wrap(x, {n}, w), tanh_approx ? "tanh" : "none");
    if (out_bf16) to_bf16(n, out, dx);
}

}  // namespace nntile::kernels
