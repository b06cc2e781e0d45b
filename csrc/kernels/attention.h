// Multi-head self-attention on a tile of whole sequences, with ATen's fused kernels (on GPUs cuDNN's, flash or
// memory-efficient: the one torch's scaled_dot_product_attention would pick): no seq x seq score matrix is kept.
// qkv: row-major (nseq * seq, 3 * c), each row [q | k | v], heads of hd = c / nheads contiguous inside each;
// y: (nseq * seq, c) with heads side by side (what GPT-2's c_proj reads).
// mask: nullptr for causal attention, else an additive float bias (nseq * seq, seq): row s * seq + i holds query
// i's bias against each key of sequence s (0 to attend, -inf or a large negative value not to; causality is then
// the mask's: Hugging Face's 4-d masks hold it). The same for every head.
// bf16: q, k, v (and the output gradient) are rounded to bfloat16 and the kernel runs in bfloat16 with float32
// softmax statistics, as torch does under bf16 autocast; results are written back as float32.
#pragma once
#include <array>
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

// Dropout on the attention probabilities: p = 0 for none. Kept entries are scaled by 1 / (1 - p); the backward
// recomputes the mask, which is never stored. On CPUs probability (s, h, i, j) of global sequence s = first_seq + the
// tile's sequence, head h, query i, key j is kept where the splitmix64 hash of (seed, ((s * nheads + h) * seq + i) *
// seq + j) says so, as kernels::dropout draws its masks: the same for any tiling. On GPUs the fused kernel drops with
// its own Philox generator set from (seed, first_seq) for the launch: deterministic for a seed and a tiling, another
// mask than the CPU's (attention.cpp, PhiloxScope).
struct AttentionDropout {
    float p = 0.0f;
    int64_t seed = 0, first_seq = 0;
};

// stats: where the forward keeps its softmax statistics for the backward (nullptr: nothing kept), float32
// (nseq, nheads, seq): the log-sum-exp (natural log) of each query's scaled scores, whichever kernel computed them.
// The CPU's explicit dropout path keeps none (its backward recomputes the probabilities) and leaves stats unwritten.
void attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                       const float *qkv, const float *mask, float *y, const AttentionDropout &drop = {},
                       float *stats = nullptr);
// Writes dqkv (nseq * seq, 3 * c). No autograd inside. With y (the forward's output) and stats (its statistics) the
// fused kernels' backward reads them; else, or where a kernel refuses them, the forward is recomputed first (and
// with dropout the same mask is drawn again).
void attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                        const float *dy, const float *qkv, const float *mask, float *dqkv,
                        const AttentionDropout &drop = {}, const float *y = nullptr, const float *stats = nullptr);
// Grouped-query attention (Llama, Mistral, Qwen2) on separate tiles of whole sequences: q (nseq * seq, nheads * hd),
// k and v (nseq * seq, kv_heads * hd), heads side by side in each row; query head h attends with k/v head
// h / (nheads / kv_heads) (Hugging Face's repeat_kv, done inside the task) -> y (nseq * seq, nheads * hd). mask and
// bf16 and dropout as attention_forward's (the keep mask hashed per query head); stats, y: as attention_forward's
// and attention_backward's (the forward keeps each query head's log-sum-exp, the backward reads it with y instead of
// recomputing the forward). The backward writes dq, dk, dv, a k/v head's gradient summed over its group of query
// heads.
void gqa_attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                           float scale, bool bf16, const float *q, const float *k, const float *v, const float *mask,
                           float *y, const AttentionDropout &drop = {}, float *stats = nullptr);
void gqa_attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                            float scale, bool bf16, const float *dy, const float *q, const float *k, const float *v,
                            const float *mask, float *dq, float *dk, float *dv, const AttentionDropout &drop = {},
                            const float *y = nullptr, const float *stats = nullptr);
// Attention of q_len new queries per sequence over kv_len keys (generation's key/value cache: the new positions over
// the cached ones and themselves), forward only: q (nseq * q_len rows), k and v (nseq * kv_len rows), each row of q
// holding nheads heads of hd (k and v kv_heads heads) from the pointer on, rows ld_q / ld_k / ld_v floats apart
// (so q, k and v may be column ranges of GPT-2's packed qkv rows). mask: additive float (nseq * q_len, kv_len), row
// s * q_len + i the bias of query i of sequence s against each key (causality is the mask's). y: (nseq * q_len,
// nheads * hd). bf16 as attention_forward's.
void cached_attention_forward(const Where &w, int64_t nseq, int64_t q_len, int64_t kv_len, int64_t kv_rows,
                              int64_t nheads, int64_t kv_heads, int64_t hd, float scale, bool bf16, const float *q,
                              int64_t ld_q, const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                              const float *mask, float *y);
// The keep mask (nseq, nheads, seq, seq) of `drop` as a CPU bool tensor: for tests' references.
at::Tensor attention_dropout_keep(int64_t nseq, int64_t nheads, int64_t seq, float p, int64_t seed, int64_t first_seq);
// The fused kernels, numbered as ATen's SDPBackend numbers the GPU's (kCpu is ours: the CPU's flash kernel).
constexpr int kFlash = 1, kEfficient = 2, kCudnn = 3, kCpu = 4;
// bf16 causal attention on GPUs: -1 (default) the kernel torch's scaled_dot_product_attention picks, else kFlash,
// kEfficient or kCudnn (NNTILE_ATTENTION=auto|flash|efficient|cudnn, read by runtime_init).
void set_attention_backend(int backend);
// Forward passes (a backward's recomputation included) per kernel since the process started, indexed as above.
std::array<int64_t, 5> attention_forwards();

}  // namespace nntile::kernels
