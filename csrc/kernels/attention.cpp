// Causal self-attention through ATen's scaled_dot_product_attention on tiles (CPU and CUDA).
#include "attention.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <tuple>

namespace nntile::kernels {

// The fused ATen kernels are called directly, forward and backward: calling autograd from a StarPU worker would
// need torch's per-device autograd thread, which may be waiting for this very task (a deadlock seen on the GPU).
namespace {
// (nseq * seq, 3c) -> q, k, v each (nseq, nheads, seq, hd), the layout scaled_dot_product_attention gets from
// Hugging Face's GPT-2 (contiguous per (sequence, position), heads transposed in front).
std::array<at::Tensor, 3> split_heads(const at::Tensor &qkv, int64_t nseq, int64_t seq, int64_t c, int64_t nheads) {
    auto t = qkv.view({nseq, seq, 3, nheads, c / nheads});
    auto part = [&](int64_t i) { return t.select(2, i).contiguous().transpose(1, 2); };
    return {part(0), part(1), part(2)};
}

// Output (nseq, nheads, seq, hd) and what the backward needs.
struct Forward {
    at::Tensor out, logsumexp, philox_seed, philox_offset;
};

Forward attend(const Where &w, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, float scale) {
    if (w.cuda) {
        auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
            q, k, v, /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/true, /*dropout_p=*/0.0,
            /*is_causal=*/true, (double)scale);
        return {out, lse, seed, offset};
    }
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, /*is_causal=*/true,
                                                                      std::nullopt, (double)scale);
    return {out, lse, {}, {}};
}
}  // namespace

void attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale,
                       const float *qkv, float *y) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto [q, k, v] = split_heads(wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads);
    auto f = attend(w, q, k, v, scale);
    wrap(y, {nseq, seq, nheads, c / nheads}, w).copy_(f.out.transpose(1, 2));
}

void attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale,
                        const float *dy, const float *qkv, float *dqkv) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    auto [q, k, v] = split_heads(wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads);
    auto f = attend(w, q, k, v, scale);  // recomputed: nothing of the forward is kept between the passes
    auto g = wrap(dy, {nseq, seq, nheads, c / nheads}, w).transpose(1, 2);
    at::Tensor gq, gk, gv;
    if (w.cuda) {
        std::tie(gq, gk, gv, std::ignore) = at::_scaled_dot_product_efficient_attention_backward(
            g, q, k, v, at::Tensor(), f.out, f.logsumexp, f.philox_seed, f.philox_offset, 0.0,
            {true, true, true, false}, /*is_causal=*/true, (double)scale);
    } else {
        std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, f.out, f.logsumexp, 0.0, /*is_causal=*/true, std::nullopt, (double)scale);
    }
    auto out = wrap(dqkv, {nseq, seq, 3, nheads, c / nheads}, w);
    out.select(2, 0).copy_(gq.transpose(1, 2));
    out.select(2, 1).copy_(gk.transpose(1, 2));
    out.select(2, 2).copy_(gv.transpose(1, 2));
}

}  // namespace nntile::kernels
