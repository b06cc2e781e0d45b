// Causal self-attention through ATen's scaled_dot_product_attention on tiles (CPU and CUDA).
#include "attention.h"

#include <torch/csrc/autograd/autograd.h>

namespace nntile::kernels {

namespace {
// (nseq * seq, 3c) -> q, k, v each (nseq, nheads, seq, hd) views.
std::array<at::Tensor, 3> split_heads(const at::Tensor &qkv, int64_t nseq, int64_t seq, int64_t c, int64_t nheads) {
    auto t = qkv.view({nseq, seq, 3, nheads, c / nheads});
    return {t.select(2, 0).transpose(1, 2), t.select(2, 1).transpose(1, 2), t.select(2, 2).transpose(1, 2)};
}

at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, float scale) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*scale=*/(double)scale);
}
}  // namespace

void attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale,
                       const float *qkv, float *y) {
    StreamScope scope(w);
    at::NoGradGuard no_grad;
    auto [q, k, v] = split_heads(wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads);
    auto out = attend(q, k, v, scale);  // (nseq, nheads, seq, hd)
    wrap(y, {nseq, seq, nheads, c / nheads}, w).copy_(out.transpose(1, 2));
}

void attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale,
                        const float *dy, const float *qkv, float *dqkv) {
    StreamScope scope(w);
    at::AutoGradMode grad_mode(true);
    auto [q0, k0, v0] = split_heads(wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads);
    auto q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true),
         v = v0.detach().requires_grad_(true);
    auto out = attend(q, k, v, scale);
    auto g = wrap(dy, {nseq, seq, nheads, c / nheads}, w).transpose(1, 2);
    auto grads = torch::autograd::grad({out}, {q, k, v}, {g});
    auto [dq, dk, dv] = split_heads(wrap(dqkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads);
    dq.copy_(grads[0]);
    dk.copy_(grads[1]);
    dv.copy_(grads[2]);
}

}  // namespace nntile::kernels
