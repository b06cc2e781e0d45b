// Self-attention through ATen's scaled_dot_product_attention on tiles (CPU and CUDA): causal, or with an additive
// float mask (padding masks from Hugging Face, causality included in the mask).
#include "attention.h"
#include "dropout.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#ifdef NNTILE_USE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace nntile::kernels {

// The fused ATen kernels are called directly, forward and backward: calling autograd from a StarPU worker would
// need torch's per-device autograd thread, which may be waiting for this very task (a deadlock seen on the GPU).
namespace {
// (nseq * seq, 3c) -> q, k, v each (nseq, nheads, seq, hd): views of one tensor (nseq, seq, 3, nheads, hd), the
// strides scaled_dot_product_attention gets from Hugging Face's GPT-2 (its qkv split, heads transposed in front),
// which every fused kernel takes. At most one kernel for the three (the bf16 cast, or the copy that pads) where
// there were three casts and three copies, launched by the worker while the GPU waited.
// On GPUs the head size is zero-padded to a multiple of 8 (the memory-efficient kernel's alignment): zero
// columns change neither q.k nor the first hd columns of the output, so the result is exact.
int64_t padded_hd(const Where &w, int64_t hd) { return w.cuda ? (hd + 7) / 8 * 8 : hd; }

std::array<at::Tensor, 3> split_heads(const Where &w, const at::Tensor &qkv, int64_t nseq, int64_t seq, int64_t c,
                                      int64_t nheads, bool bf16) {
    int64_t hd = c / nheads, hp = padded_hd(w, hd);
    auto t = qkv.view({nseq, seq, 3, nheads, hd});
    if (hp != hd) {
        auto padded = at::zeros({nseq, seq, 3, nheads, hp}, t.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
        padded.narrow(4, 0, hd).copy_(t);
        t = padded;
    } else if (bf16) {
        t = t.to(at::kBFloat16);
    }
    return {t.select(2, 0).transpose(1, 2), t.select(2, 1).transpose(1, 2), t.select(2, 2).transpose(1, 2)};
}

// The output's gradient g (nseq, nheads, seq, hd), float32, as the kernels read it: (.., hp) of q's dtype, itself
// when that changes nothing, else one copy kernel (and a fill of the zero columns); in like's strides when like
// is given.
at::Tensor grad_as(const at::Tensor &g, int64_t hp, at::ScalarType dtype, const at::Tensor &like) {
    const int64_t hd = g.size(3);
    if (!like.defined() && hp == hd && dtype == g.scalar_type()) return g;
    at::Tensor out = like.defined() ? at::empty_like(like)
                                    : at::empty({g.size(0), g.size(1), g.size(2), hp}, g.options().dtype(dtype));
    if (hp != hd) out.narrow(3, hd, hp - hd).zero_();
    out.narrow(3, 0, hd).copy_(g);
    return out;
}

// (nseq, nheads, seq, hp) -> (nseq, seq, nheads, hd)
at::Tensor unpad(const at::Tensor &x, int64_t hd) { return x.transpose(1, 2).narrow(3, 0, hd); }

// Output (nseq, nheads, seq, hd) and what the backward needs.
struct Forward {
    at::Tensor out, logsumexp, philox_seed, philox_offset;
    int backend = kEfficient;  // the fused kernel that computed it (its backward then)
    at::Tensor cum_seq_q, cum_seq_k;
    int64_t max_q = 0, max_k = 0;
};

// bf16 on GPUs: the fused kernel torch's own scaled_dot_product_attention picks for these tensors
// (at::_fused_sdp_choice: cuDNN's on Hopper with recent torch, FlashAttention or the memory-efficient one
// elsewhere), or the one NNTILE_ATTENTION names (read by the runtime at its start: set_attention_backend). Why
// torch's choice and not always the memory-efficient kernel: docs/measurements.md, "LayerNorm and attention kernels".
// A kernel ATen refuses once (an old GPU, a build without it, a layout it rejects) is not tried again: the
// memory-efficient one from then on, with one line on stderr. fp32 and masks: the memory-efficient kernel. Each
// kernel draws a dropout mask from the generator state PhiloxScope sets (its backward replays it).
std::atomic<int> setting{-1};  // -1 auto, else kFlash / kEfficient / kCudnn
std::atomic<bool> refused[4] = {false, false, false, false};
std::atomic<int64_t> forwards[5] = {0, 0, 0, 0, 0};  // per kernel (index kCpu for the CPU's), for tests

int choose(const Where &w, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, float scale,
           bool causal, float dropout_p) {
    if (!w.cuda) return kCpu;
    if (!causal || q.scalar_type() != at::kBFloat16) return kEfficient;
    int b = setting.load(std::memory_order_relaxed);
    if (b < 0) {
        // torch's choice for this geometry, asked once per process (its checks cost tens of microseconds of launch
        // time per tile): q's and k's sizes and strides, the device, the scale and the dropout probability say it
        // (v is laid out as k). One answer for every worker: with dropout, a backward on another CUDA worker must
        // run the kernel whose mask the forward drew.
        static std::mutex guard;
        static std::vector<std::pair<std::vector<int64_t>, int>> known;
        std::vector<int64_t> key(q.sizes().begin(), q.sizes().end());
        key.insert(key.end(), q.strides().begin(), q.strides().end());
        key.insert(key.end(), k.strides().begin(), k.strides().end());  // grouped-query k, v: tensors of their own
        key.push_back(q.get_device());
        int64_t scale_bits = 0;
        std::memcpy(&scale_bits, &scale, sizeof scale);
        key.push_back(scale_bits);
        int64_t p_bits = 0;
        std::memcpy(&p_bits, &dropout_p, sizeof dropout_p);
        key.push_back(p_bits);
        std::lock_guard<std::mutex> lock(guard);
        auto it = std::find_if(known.begin(), known.end(), [&](const auto &kv) { return kv.first == key; });
        if (it != known.end()) {
            b = it->second;
        } else {
            try {
                b = (int)at::_fused_sdp_choice(q, k, v, std::nullopt, dropout_p, /*is_causal=*/true,
                                               (double)scale);
            } catch (const c10::Error &) {
                b = kEfficient;
            }
            known.emplace_back(std::move(key), b);
        }
    }
    if ((b != kFlash && b != kCudnn) || refused[b].load()) return kEfficient;
    return b;
}

void refuse(int backend, const char *what, const c10::Error &e) {
    if (!refused[backend].exchange(true))
        std::fprintf(stderr, "nntile_torch: %s attention %s failed, using the memory-efficient kernel: %s\n",
                     backend == kCudnn ? "cuDNN" : "flash", what, e.what_without_backtrace());
}

// The memory-efficient kernel's backward refused the kept output and statistics: this backward recomputes the
// forward (one line on stderr, the first time).
std::atomic<bool> kept_refused{false};
void refuse_kept(const c10::Error &e) {
    if (!kept_refused.exchange(true))
        std::fprintf(stderr, "nntile_torch: the attention backward refused the forward's kept output, recomputing "
                             "it: %s\n", e.what_without_backtrace());
}

// The mask (nseq * seq, seq) as the attention bias (nseq, nheads, seq, seq) each kernel takes, in q's dtype. The
// memory-efficient CUDA kernel wants the bias rows 16-aligned: padded then narrowed, as torch's own
// scaled_dot_product_attention prepares it (a broadcast over heads, not a copy).
at::Tensor attention_bias(const Where &w, const float *mask, int64_t nseq, int64_t seq, int64_t nheads,
                          const at::Tensor &q) {
    if (!mask) return at::Tensor();
    auto m = wrap(mask, {nseq, 1, seq, seq}, w).to(q.scalar_type());
    if (!w.cuda) return m;
    const int64_t pad = (16 - seq % 16) % 16;
    if (pad) m = at::constant_pad_nd(m, {0, pad}).narrow(3, 0, seq);
    return m.expand({nseq, nheads, seq, seq});
}

// PhiloxScope's (seed, offset) for a launch of the fused kernel on q, k (what its backward replays).
std::pair<uint64_t, uint64_t> philox_of(const AttentionDropout &drop, const at::Tensor &q, const at::Tensor &k) {
    const uint64_t first = (uint64_t)drop.first_seq * q.size(1) * q.size(2) * k.size(2);
    return {splitmix64_mix(dropout_salt(1) + (uint64_t)drop.seed), (first + 3) / 4 * 4};  // splitmix64(seed)
}

// Attention dropout on GPUs, inside the fused kernel choose() picks (cuDNN's, flash or the memory-efficient one),
// which draws its Philox seed and offset from the device's default CUDA generator when launched. So that a task's
// mask is a function of nntile's seed and the tile's place alone (the forward task and the backward task's
// recomputation drop alike, whatever ran in between on either CUDA worker), the generator is set around the launch
// to (splitmix64(seed), the tile's first element index first_seq * H * Tq * Tk rounded up to a multiple of 4) and put
// back after: the user's random stream goes on where it was. A backward from the kept statistics builds the same
// pair (kept_forward). The memory-efficient kernel adds (b * H + h) * Tq * Tk to the offset for the tile's sequence b
// and head h, so its masks are the same for any tiling when H * Tq * Tk is a multiple of 4; cuDNN's and flash's
// depend on the tiling too (the same for a seed and a tiling). One scope at a time in the process (launches are
// asynchronous: the lock is held for microseconds). Torch code drawing CUDA random numbers on another thread during
// that moment would draw from this stream instead of its own.
class PhiloxScope {
  public:
    PhiloxScope(const Where &w, const AttentionDropout &drop, const at::Tensor &q, const at::Tensor &k) {
#ifdef NNTILE_USE_CUDA
        if (!w.cuda || drop.p <= 0.0f) return;
        static std::mutex one_at_a_time;
        lock_ = std::unique_lock<std::mutex>(one_at_a_time);
        gen_ = at::cuda::detail::getDefaultCUDAGenerator(w.device);
        std::lock_guard<std::mutex> g(gen_.mutex());
        auto *impl = gen_.get<at::CUDAGeneratorImpl>();
        seed_ = impl->current_seed();
        offset_ = impl->get_offset();
        const auto [seed, offset] = philox_of(drop, q, k);
        impl->set_current_seed(seed);
        impl->set_offset(offset);
        active_ = true;
#else
        (void)w, (void)drop, (void)q, (void)k;
#endif
    }
    ~PhiloxScope() {
#ifdef NNTILE_USE_CUDA
        if (!active_) return;
        std::lock_guard<std::mutex> g(gen_.mutex());
        auto *impl = gen_.get<at::CUDAGeneratorImpl>();
        impl->set_current_seed(seed_);
        impl->set_offset(offset_);
#endif
    }
    PhiloxScope(const PhiloxScope &) = delete;
    PhiloxScope &operator=(const PhiloxScope &) = delete;

  private:
#ifdef NNTILE_USE_CUDA
    std::unique_lock<std::mutex> lock_;
    at::Generator gen_;
    uint64_t seed_ = 0, offset_ = 0;
    bool active_ = false;
#endif
};

// drop.p > 0: dropout on the probabilities, on GPUs only (the CPU's tasks take the explicit path below).
Forward attend(const Where &w, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, float scale,
               const at::Tensor &bias, const AttentionDropout &drop = {}) {
    const bool causal = !bias.defined();
    const std::optional<at::Tensor> mask = causal ? std::nullopt : std::optional<at::Tensor>(bias);
    const double p = w.cuda ? drop.p : 0.0;
    const int backend = choose(w, q, k, v, scale, causal, (float)p);
    forwards[backend].fetch_add(1, std::memory_order_relaxed);
    PhiloxScope rng(w, drop, q, k);
    if (backend == kCudnn) {
        try {
            auto [out, lse, cq, ck, mq, mk, seed, offset, dbg] = at::_scaled_dot_product_cudnn_attention(
                q, k, v, std::nullopt, /*compute_log_sumexp=*/true, p, /*is_causal=*/true,
                /*return_debug_mask=*/false, (double)scale);
            Forward f{out, lse, seed, offset, kCudnn, cq, ck};
            f.max_q = mq.expect_int();
            f.max_k = mk.expect_int();
            return f;
        } catch (const c10::Error &e) {
            refuse(kCudnn, "forward", e);
        }
    } else if (backend == kFlash) {
        try {
            auto [out, lse, cq, ck, mq, mk, rng_state, unused, dbg] = at::_scaled_dot_product_flash_attention(
                q, k, v, p, /*is_causal=*/true, /*return_debug_mask=*/false, (double)scale);
            Forward f{out, lse, rng_state, unused, kFlash, cq, ck};
            f.max_q = mq.expect_int();
            f.max_k = mk.expect_int();
            return f;
        } catch (const c10::Error &e) {
            refuse(kFlash, "forward", e);
        }
    }
    if (w.cuda) {
        auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
            q, k, v, mask, /*compute_log_sumexp=*/true, p, causal, (double)scale);
        return {out, lse, seed, offset, kEfficient};
    }
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, mask, (double)scale);
    return {out, lse, {}, {}, kCpu};
}

// The forward's statistics into the stats tile (nseq, nheads, seq): each kernel's log-sum-exp in one layout (cuDNN's
// (.., seq, 1), the memory-efficient kernel's rows padded to a multiple of 32).
void save_stats(const Where &w, const Forward &f, int64_t nseq, int64_t nheads, int64_t seq, float *stats) {
    at::Tensor lse = f.logsumexp.dim() == 4 ? f.logsumexp.select(3, 0) : f.logsumexp;
    wrap(stats, {nseq, nheads, seq}, w).copy_(lse.narrow(2, 0, seq));
}

// The forward's output and statistics as the backward of the kernel this worker runs reads them, rebuilt from the
// output tile y (nseq * seq, nheads * hd; float32, the kernel's values exactly: bf16 ones widened) and the stats tile:
// the output in the layout the kernels write it ((nseq, seq, nheads, hp) in q's dtype, heads transposed in front),
// the log-sum-exp in the kernel's own shape, with dropout the Philox seed and offset PhiloxScope set for the forward.
Forward kept_forward(const Where &w, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, float scale,
                     bool causal, const float *y, const float *stats, int64_t hd, const AttentionDropout &drop) {
    const int64_t nseq = q.size(0), nheads = q.size(1), seq = q.size(2), hp = q.size(3);
    const double p = w.cuda ? drop.p : 0.0;
    Forward f;
    f.backend = choose(w, q, k, v, scale, causal, (float)p);
    const auto y4 = wrap(y, {nseq, seq, nheads, hd}, w);
    if (hp == hd && q.scalar_type() == at::kFloat) {
        f.out = y4.transpose(1, 2);
    } else {
        auto o = at::empty({nseq, seq, nheads, hp}, q.options());
        if (hp != hd) o.narrow(3, hd, hp - hd).zero_();
        o.narrow(3, 0, hd).copy_(y4);
        f.out = o.transpose(1, 2);
    }
    const auto lse = wrap(stats, {nseq, nheads, seq}, w);
    const auto on_device = at::TensorOptions().device(q.device());
    if (f.backend == kCudnn || f.backend == kFlash) {
        f.logsumexp = f.backend == kCudnn ? lse.unsqueeze(3) : lse;
        f.max_q = f.max_k = seq;
        // with dropout, the seed and offset PhiloxScope gave the forward's launch, in the form each kernel returns
        // them: cuDNN's zero-dim int64 device tensors; flash's (2,) uint64 device tensor [seed, offset] (its offset
        // tensor unused). Without, the backward reads none: left unwritten (no fill kernels per tile).
        const bool dropped = p > 0.0;
        const auto [seed, offset] = dropped ? philox_of(drop, q, k) : std::pair<uint64_t, uint64_t>{0, 0};
        if (f.backend == kCudnn) {
            f.philox_seed = at::empty({}, on_device.dtype(at::kLong));
            f.philox_offset = at::empty({}, on_device.dtype(at::kLong));
            if (dropped) {
                f.philox_seed.fill_((int64_t)seed);
                f.philox_offset.fill_((int64_t)offset);
            }
        } else {
            auto state = at::empty({2}, on_device.dtype(at::kLong));
            if (dropped) {
                state.select(0, 0).fill_((int64_t)seed);
                state.select(0, 1).fill_((int64_t)offset);
            }
            f.philox_seed = state.view(at::kUInt64);
            f.philox_offset = at::empty({}, on_device.dtype(at::kUInt64));
        }
    } else if (f.backend == kEfficient) {
        auto padded = at::zeros({nseq, nheads, (seq + 31) / 32 * 32}, on_device.dtype(at::kFloat));
        padded.narrow(2, 0, seq).copy_(lse);
        f.logsumexp = padded;
        const auto [seed, offset] = philox_of(drop, q, k);
        f.philox_seed = at::scalar_tensor(at::Scalar((int64_t)seed), at::dtype(at::kLong));
        f.philox_offset = at::scalar_tensor(at::Scalar((int64_t)offset), at::dtype(at::kLong));
    } else {
        f.logsumexp = lse;
    }
    return f;
}

// The fused kernels' backward for q, k, v (nseq, nheads, seq, hp) as attend() takes them: the forward's output y and
// statistics when kept (kept_forward), else the forward recomputed (with dropout, the same mask: PhiloxScope); then
// the gradients of q, k, v in their layouts, the mask replayed from the forward's seed and offset. dy_view: the
// output's gradient (nseq, nheads, seq, hd), float32. A kernel that refuses the kept values gets a recomputed forward.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_backward(const Where &w, const at::Tensor &q, const at::Tensor &k,
                                                               const at::Tensor &v, float scale, const at::Tensor &bias,
                                                               const at::Tensor &dy_view,
                                                               const AttentionDropout &drop = {},
                                                               const float *y = nullptr, const float *stats = nullptr) {
    const int64_t hp = q.size(3);
    const bool causal = !bias.defined();
    const std::optional<at::Tensor> opt_bias = causal ? std::nullopt : std::optional<at::Tensor>(bias);
    const double p = w.cuda ? drop.p : 0.0;
    const bool from_kept = y && stats;
    auto f = from_kept ? kept_forward(w, q, k, v, scale, causal, y, stats, dy_view.size(3), drop)
                       : attend(w, q, k, v, scale, bias, drop);
    at::Tensor gq, gk, gv;
    if (f.backend == kCudnn) {
        try {
            // cuDNN reads the output's gradient with the output's strides
            auto g_like_out = grad_as(dy_view, hp, q.scalar_type(), f.out);
            std::tie(gq, gk, gv) = at::_scaled_dot_product_cudnn_attention_backward(
                g_like_out, q, k, v, f.out, f.logsumexp, f.philox_seed, f.philox_offset, at::Tensor(), f.cum_seq_q,
                f.cum_seq_k, f.max_q, f.max_k, p, /*is_causal=*/true, (double)scale);
        } catch (const c10::Error &e) {
            refuse(kCudnn, "backward", e);
            f = attend(w, q, k, v, scale, bias, drop);  // memory-efficient from now on
        }
    }
    const at::Tensor g = gq.defined() ? at::Tensor() : grad_as(dy_view, hp, q.scalar_type(), at::Tensor());
    if (f.backend == kFlash) {
        try {
            std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_backward(
                g, q, k, v, f.out, f.logsumexp, f.cum_seq_q, f.cum_seq_k, f.max_q, f.max_k, p, /*is_causal=*/true,
                f.philox_seed, f.philox_offset, (double)scale);
        } catch (const c10::Error &e) {
            refuse(kFlash, "backward", e);
            f = attend(w, q, k, v, scale, bias, drop);  // memory-efficient from now on
        }
    }
    if (!gq.defined() && w.cuda) {
        auto run = [&] {
            std::tie(gq, gk, gv, std::ignore) = at::_scaled_dot_product_efficient_attention_backward(
                g, q, k, v, bias, f.out, f.logsumexp, f.philox_seed, f.philox_offset, p, {true, true, true, false},
                causal, (double)scale);
        };
        if (from_kept && f.backend == kEfficient) {
            try {
                run();
            } catch (const c10::Error &e) {
                refuse_kept(e);
                f = attend(w, q, k, v, scale, bias, drop);
                run();
            }
        } else {
            run();
        }
    } else if (!gq.defined()) {
        std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, f.out, f.logsumexp, 0.0, causal, opt_bias, (double)scale);
    }
    return {gq, gk, gv};
}

// (nseq * len rows, ld floats apart) holding nh heads of hd from x on -> (nseq, nh * groups, len, hp): each head
// repeated for its group of query heads, in the kernels' dtype and padding, one copy (the rows are strided).
at::Tensor strided_heads(const Where &w, const float *x, int64_t nseq, int64_t len, int64_t nh, int64_t groups,
                         int64_t hd, int64_t ld, bool bf16, int64_t seq_rows = 0) {
    const int64_t hp = padded_hd(w, hd);
    auto opts = at::TensorOptions().dtype(at::kFloat);
    opts = w.cuda ? opts.device(at::kCUDA, w.device) : opts.device(at::kCPU);
    // a sequence's rows start seq_rows rows after the one before (len by default; a cache with room to grow: more)
    auto t = at::from_blob(const_cast<float *>(x), {nseq, len, nh, 1, hd}, {(seq_rows ? seq_rows : len) * ld, ld, hd, hd, 1},
                           opts);
    auto out = at::empty({nseq, len, nh, groups, hp}, t.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
    if (hp != hd) out.narrow(4, hd, hp - hd).zero_();
    out.narrow(4, 0, hd).copy_(t.expand({nseq, len, nh, groups, hd}));
    return out.view({nseq, len, nh * groups, hp}).transpose(1, 2);
}

// Rows (nseq * seq, nh * hd) of one of q, k, v as the fused kernels take them: (nseq, nh * groups, seq, hp), each
// head repeated `groups` times side by side (grouped-query attention's k and v: query head h reads k/v head
// h / groups, Hugging Face's repeat_kv), padded to hp and rounded to bf16 where asked. A view of the tile when
// nothing changes, else one copy kernel: the repetition lives inside the task only.
at::Tensor heads_of(const Where &w, const float *x, int64_t nseq, int64_t seq, int64_t nh, int64_t groups, int64_t hd,
                    bool bf16) {
    if (groups == 1 && padded_hd(w, hd) == hd && !bf16)
        return wrap(x, {nseq, seq, nh, hd}, w).transpose(1, 2);  // already what the kernels read: no copy
    return strided_heads(w, x, nseq, seq, nh, groups, hd, nh * hd, bf16);
}

// Attention with dropout on the probabilities on CPUs, as explicit float32 math on (nseq, nheads, seq, seq) scores:
// the mask is nntile's hash of global positions (the same for any tiling), the scores materialized one sequence at a
// time (seq x seq per head). GPUs drop inside the fused kernels instead (PhiloxScope).
struct Dropped {
    at::Tensor q, k, v;  // (nseq, nheads, seq, hd) float32
    at::Tensor probs;    // softmax of the scores, before dropout
    at::Tensor scaled_keep;  // keep / (1 - p), float32
};

// One sequence's dropped attention: q (seq rows, ld_q floats apart, nheads heads of hd), k and v (kv_heads heads,
// each read by its group of nheads / kv_heads query heads) -> q, k, v as (1, nheads, seq, hd), the probabilities and
// the scaled keep mask of drop (drop.first_seq: this sequence's global index).
Dropped dropped_probs(const Where &w, const float *q, int64_t ld_q, const float *k, int64_t ld_k, const float *v,
                      int64_t ld_v, const float *mask, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                      float scale, bool bf16, const AttentionDropout &drop) {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    opts = w.cuda ? opts.device(at::kCUDA, w.device) : opts.device(at::kCPU);
    const int64_t groups = nheads / kv_heads;
    auto heads = [&](const float *x, int64_t ld, int64_t nh, int64_t g) {  // -> (1, nh * g, seq, hd) float32
        auto t = at::from_blob(const_cast<float *>(x), {1, seq, nh, 1, hd}, {seq * ld, ld, hd, hd, 1}, opts)
                     .expand({1, seq, nh, g, hd})
                     .reshape({1, seq, nh * g, hd});
        if (bf16) t = t.to(at::kBFloat16);  // the rounding of bf16 inputs, computed in float32
        return t.to(at::kFloat).transpose(1, 2);
    };
    Dropped d{heads(q, ld_q, nheads, 1), heads(k, ld_k, kv_heads, groups), heads(v, ld_v, kv_heads, groups)};
    auto scores = at::matmul(d.q, d.k.transpose(2, 3)).mul_(scale);
    if (mask) {
        scores.add_(wrap(mask, {1, 1, seq, seq}, w));
    } else {
        auto future = at::ones({seq, seq}, scores.options().dtype(at::kBool)).triu_(1);
        scores.masked_fill_(future, -std::numeric_limits<float>::infinity());
    }
    d.probs = at::softmax(scores, -1);
    auto iopts = at::TensorOptions().dtype(at::kLong).device(scores.device());
    auto index = at::arange(nheads * seq * seq, iopts).add_(drop.first_seq * nheads * seq * seq);
    d.scaled_keep = dropout_keep(index, drop.seed, drop.p)
                        .to(at::kFloat)
                        .mul_((float)(1.0 / (1.0 - (double)drop.p)))
                        .view({1, nheads, seq, seq});
    return d;
}

// The backward of one sequence's dropped attention: out = (P * K) v with P = softmax(S), K the scaled keep mask;
// dS = P * (dP - rowsum(dP * P)), dP = dPk * K. g: the output's gradient (1, nheads, seq, hd). Returns dq, dk, dv
// per query head (1, nheads, seq, hd).
std::tuple<at::Tensor, at::Tensor, at::Tensor> dropped_backward(const Dropped &d, at::Tensor g, float scale, bool bf16) {
    if (bf16) g = g.to(at::kBFloat16).to(at::kFloat);
    auto dropped = d.probs * d.scaled_keep;
    auto gv = at::matmul(dropped.transpose(2, 3), g);
    auto dp = at::matmul(g, d.v.transpose(2, 3)).mul_(d.scaled_keep);
    auto ds = (dp - (dp * d.probs).sum(-1, true)).mul_(d.probs).mul_(scale);
    return {at::matmul(ds, d.k), at::matmul(ds.transpose(2, 3), d.q), gv};
}
}  // namespace

at::Tensor attention_dropout_keep(int64_t nseq, int64_t nheads, int64_t seq, float p, int64_t seed,
                                  int64_t first_seq) {
    c10::NoGradGuard no_grad;
    auto index = at::arange(nseq * nheads * seq * seq, at::kLong).add_(first_seq * nheads * seq * seq);
    return dropout_keep(index, seed, p).view({nseq, nheads, seq, seq});
}

void attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                       const float *qkv, const float *mask, float *y, const AttentionDropout &drop, float *stats) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    if (drop.p > 0.0f && !w.cuda) {
        // one sequence at a time: the (nheads, seq, seq) temporaries of one, not of the whole tile
        const int64_t hd = c / nheads;
        for (int64_t s = 0; s < nseq; ++s) {
            AttentionDropout one{drop.p, drop.seed, drop.first_seq + s};
            const float *x = qkv + s * seq * 3 * c;
            auto d = dropped_probs(w, x, 3 * c, x + c, 3 * c, x + 2 * c, 3 * c, mask ? mask + s * seq * seq : nullptr,
                                   seq, nheads, nheads, hd, scale, bf16, one);
            auto out = at::matmul(d.probs.mul_(d.scaled_keep), d.v);  // (1, nheads, seq, hd)
            wrap(y + s * seq * c, {1, seq, nheads, c / nheads}, w).copy_(out.transpose(1, 2));
        }
        return;
    }
    auto [q, k, v] = split_heads(w, wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads, bf16);
    auto f = attend(w, q, k, v, scale, attention_bias(w, mask, nseq, seq, nheads, q), drop);
    wrap(y, {nseq, seq, nheads, c / nheads}, w).copy_(unpad(f.out, c / nheads));
    if (stats) save_stats(w, f, nseq, nheads, seq, stats);
}

void attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                        const float *dy, const float *qkv, const float *mask, float *dqkv,
                        const AttentionDropout &drop, const float *y, const float *stats) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    const int64_t hd = c / nheads;
    if (drop.p > 0.0f && !w.cuda) {
        // one sequence at a time, as the forward
        for (int64_t s = 0; s < nseq; ++s) {
            AttentionDropout one{drop.p, drop.seed, drop.first_seq + s};
            const float *x = qkv + s * seq * 3 * c;
            auto d = dropped_probs(w, x, 3 * c, x + c, 3 * c, x + 2 * c, 3 * c, mask ? mask + s * seq * seq : nullptr,
                                   seq, nheads, nheads, hd, scale, bf16, one);
            auto g = wrap(dy + s * seq * c, {1, seq, nheads, hd}, w).transpose(1, 2);  // (1, nheads, seq, hd)
            auto [gq, gk, gv] = dropped_backward(d, g, scale, bf16);
            auto out = wrap(dqkv + s * seq * 3 * c, {1, seq, 3, nheads, hd}, w);
            out.select(2, 0).copy_(gq.transpose(1, 2));
            out.select(2, 1).copy_(gk.transpose(1, 2));
            out.select(2, 2).copy_(gv.transpose(1, 2));
        }
        return;
    }
    auto [q, k, v] = split_heads(w, wrap(qkv, {nseq * seq, 3 * c}, w), nseq, seq, c, nheads, bf16);
    const auto dy_view = wrap(dy, {nseq, seq, nheads, hd}, w).transpose(1, 2);  // (nseq, nheads, seq, hd)
    auto [gq, gk, gv] =
        fused_backward(w, q, k, v, scale, attention_bias(w, mask, nseq, seq, nheads, q), dy_view, drop, y, stats);
    auto out = wrap(dqkv, {nseq, seq, 3, nheads, c / nheads}, w);
    out.select(2, 0).copy_(unpad(gq, hd));
    out.select(2, 1).copy_(unpad(gk, hd));
    out.select(2, 2).copy_(unpad(gv, hd));
}

void gqa_attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                           float scale, bool bf16, const float *q, const float *k, const float *v, const float *mask,
                           float *y, const AttentionDropout &drop, float *stats) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    const int64_t groups = nheads / kv_heads;
    if (drop.p > 0.0f && !w.cuda) {  // explicit math, one sequence at a time, as attention_forward's
        const int64_t wq = nheads * hd, wk = kv_heads * hd;
        for (int64_t s = 0; s < nseq; ++s) {
            AttentionDropout one{drop.p, drop.seed, drop.first_seq + s};
            auto d = dropped_probs(w, q + s * seq * wq, wq, k + s * seq * wk, wk, v + s * seq * wk, wk,
                                   mask ? mask + s * seq * seq : nullptr, seq, nheads, kv_heads, hd, scale, bf16, one);
            auto out = at::matmul(d.probs.mul_(d.scaled_keep), d.v);  // (1, nheads, seq, hd)
            wrap(y + s * seq * wq, {1, seq, nheads, hd}, w).copy_(out.transpose(1, 2));
        }
        return;
    }
    auto qh = heads_of(w, q, nseq, seq, nheads, 1, hd, bf16);
    auto f = attend(w, qh, heads_of(w, k, nseq, seq, kv_heads, groups, hd, bf16),
                    heads_of(w, v, nseq, seq, kv_heads, groups, hd, bf16), scale,
                    attention_bias(w, mask, nseq, seq, nheads, qh), drop);
    wrap(y, {nseq, seq, nheads, hd}, w).copy_(unpad(f.out, hd));
    if (stats) save_stats(w, f, nseq, nheads, seq, stats);
}

void gqa_attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                            float scale, bool bf16, const float *dy, const float *q, const float *k, const float *v,
                            const float *mask, float *dq, float *dk, float *dv, const AttentionDropout &drop,
                            const float *y, const float *stats) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    const int64_t groups = nheads / kv_heads;
    if (drop.p > 0.0f && !w.cuda) {
        const int64_t wq = nheads * hd, wk = kv_heads * hd;
        for (int64_t s = 0; s < nseq; ++s) {
            AttentionDropout one{drop.p, drop.seed, drop.first_seq + s};
            auto d = dropped_probs(w, q + s * seq * wq, wq, k + s * seq * wk, wk, v + s * seq * wk, wk,
                                   mask ? mask + s * seq * seq : nullptr, seq, nheads, kv_heads, hd, scale, bf16, one);
            auto g = wrap(dy + s * seq * wq, {1, seq, nheads, hd}, w).transpose(1, 2);
            auto [gq, gk, gv] = dropped_backward(d, g, scale, bf16);
            wrap(dq + s * seq * wq, {1, seq, nheads, hd}, w).copy_(gq.transpose(1, 2));
            // a k/v head's gradient: the sum over its group of query heads
            for (auto [gg, out] : {std::pair{gk, dk}, std::pair{gv, dv}})
                wrap(out + s * seq * wk, {1, seq, kv_heads, hd}, w)
                    .copy_(gg.view({1, kv_heads, groups, seq, hd}).sum(2).transpose(1, 2));
        }
        return;
    }
    auto qh = heads_of(w, q, nseq, seq, nheads, 1, hd, bf16);
    const auto dy_view = wrap(dy, {nseq, seq, nheads, hd}, w).transpose(1, 2);  // (nseq, nheads, seq, hd)
    auto [gq, gk, gv] = fused_backward(w, qh, heads_of(w, k, nseq, seq, kv_heads, groups, hd, bf16),
                                       heads_of(w, v, nseq, seq, kv_heads, groups, hd, bf16), scale,
                                       attention_bias(w, mask, nseq, seq, nheads, qh), dy_view, drop, y, stats);
    wrap(dq, {nseq, seq, nheads, hd}, w).copy_(unpad(gq, hd));
    // a k/v head's gradient is the sum over the query heads of its group (repeat_kv's backward), in float32
    for (auto [g, out] : {std::pair{gk, dk}, std::pair{gv, dv}}) {
        auto per_head = unpad(g, hd).unflatten(2, {kv_heads, groups});  // (nseq, seq, kv_heads, groups, hd)
        wrap(out, {nseq, seq, kv_heads, hd}, w).copy_(groups == 1 ? per_head.select(3, 0)
                                                                   : at::sum(per_head, at::IntArrayRef{3}, false, at::kFloat));
    }
}


void cached_attention_forward(const Where &w, int64_t nseq, int64_t q_len, int64_t kv_len, int64_t kv_rows,
                              int64_t nheads, int64_t kv_heads, int64_t hd, float scale, bool bf16, const float *q,
                              int64_t ld_q, const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                              const float *mask, float *y) {
    StreamScope scope(w);
    c10::NoGradGuard no_grad;
    const int64_t groups = nheads / kv_heads;
    auto qh = strided_heads(w, q, nseq, q_len, nheads, 1, hd, ld_q, bf16);
    // the bias (nseq, 1, q_len, kv_len) in q's dtype; on GPUs its rows 16-aligned and broadcast over heads, as
    // attention_bias prepares the square one
    auto bias = wrap(mask, {nseq, 1, q_len, kv_len}, w).to(qh.scalar_type());
    if (w.cuda) {
        const int64_t pad = (16 - kv_len % 16) % 16;
        if (pad) bias = at::constant_pad_nd(bias, {0, pad}).narrow(3, 0, kv_len);
        bias = bias.expand({nseq, nheads, q_len, kv_len});
    }
    auto f = attend(w, qh, strided_heads(w, k, nseq, kv_len, kv_heads, groups, hd, ld_k, bf16, kv_rows),
                    strided_heads(w, v, nseq, kv_len, kv_heads, groups, hd, ld_v, bf16, kv_rows), scale, bias);
    wrap(y, {nseq, q_len, nheads, hd}, w).copy_(unpad(f.out, hd));
}

void set_attention_backend(int backend) { setting.store(backend); }

std::array<int64_t, 5> attention_forwards() {
    std::array<int64_t, 5> n;
    for (int i = 0; i < 5; ++i) n[i] = forwards[i].load();
    return n;
}

}  // namespace nntile::kernels
