// LayerNorm on tiles: ATen on the CPU; on GPUs layer_norm_cuda.cu's kernels (the same numbers to rounding).
#include "layer_norm.h"

#include "convert.h"

namespace nntile::kernels {

void layer_norm_forward(const Where &w, int64_t m, int64_t c, float eps, const float *x, const float *weight,
                        const float *bias, void *y, bool y_bf16, float *mean, float *rstd) {
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        layer_norm_forward_cuda(static_cast<cudaStream_t>(w.stream), m, c, eps, x, weight, bias, y, y_bf16, mean,
                                rstd);
        return;
    }
#endif
    StreamScope scope(w);
    std::optional<at::Tensor> wt, bt;
    if (weight) wt = wrap(weight, {c}, w);
    if (bias) bt = wrap(bias, {c}, w);
    // bf16 y: ATen's fp32 values, then the rounding of the unfused path's cast (convert_cpu), bit for bit
    auto out = y_bf16 ? at::empty({m, c}, at::kFloat) : wrap(y, {m, c}, w);
    auto mu = wrap(mean, {m, 1}, w), rs = wrap(rstd, {m, 1}, w);
    at::native_layer_norm_out(out, mu, rs, wrap(x, {m, c}, w), {c}, wt, bt, eps);
    if (y_bf16) convert_cpu(m * c, DType::f32, out.data_ptr<float>(), DType::bf16, y);
}

void layer_norm_backward(const Where &w, int64_t m, int64_t c, const float *dy, const float *x, const float *mean,
                         const float *rstd, const float *weight, float *dx, float *dweight, float *dbias, float beta) {
    StreamScope scope(w);
#ifdef NNTILE_USE_CUDA
    if (w.cuda) {
        // ATen's backward writes new tensors that are then copied into the tiles, and its column sums are slow
        // (docs/measurements.md): one row kernel and a two-stage column sum instead. The scratch comes from
        // torch's caching allocator on this stream.
        at::Tensor partials;
        if (dweight || dbias)
            partials = at::empty({2 * layer_norm_backward_chunks(m) * c},
                                 at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, w.device));
        layer_norm_backward_cuda(static_cast<cudaStream_t>(w.stream), m, c, dy, x, mean, rstd, weight, dx, dweight,
                                 dbias, beta, partials.defined() ? partials.data_ptr<float>() : nullptr);
        return;
    }
#endif
    std::optional<at::Tensor> wt;
    if (weight) wt = wrap(weight, {c}, w);
    // ATen takes the bias only for the shape of its gradient; the weight has that shape.
    auto grads = at::native_layer_norm_backward(wrap(dy, {m, c}, w), wrap(x, {m, c}, w), {c}, wrap(mean, {m, 1}, w),
                                                wrap(rstd, {m, 1}, w), wt, wt,
                                                {true, dweight != nullptr, dbias != nullptr});
    wrap(dx, {m, c}, w).copy_(std::get<0>(grads));
    auto accumulate = [&](float *acc, const at::Tensor &g) {
        if (!acc) return;
        auto a = wrap(acc, {c}, w);
        if (beta == 0.f)
            a.copy_(g);
        else
            a.add_(g);
    };
    accumulate(dweight, std::get<1>(grads));
    accumulate(dbias, std::get<2>(grads));
}

}  // namespace nntile::kernels
