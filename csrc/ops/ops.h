// Tensor-level ops: loops over tiles that submit one task per tile (pair, triple). Nothing here waits.
#pragma once
#include "../kernels/adamw.h"
#include "../runtime.h"
#include "../tiles/tile_tensor.h"

namespace nntile::ops {

// The row index (first grid coordinate) of tile t: what placement goes by.
inline int64_t row_of(const TileTensor &x, int64_t t) { return x.ndim() == 0 ? 0 : t / (x.ntiles() / x.grid()[0]); }

// C = alpha op(A) op(B) + beta C on 2-d tile tensors; op(A)'s column tiling must match op(B)'s row tiling
// and C's tiling must be op(A)'s rows by op(B)'s columns.
// k_over_places: K runs over row tiles spread over places (a weight gradient): partial sums per place.
// bias (a Linear's, float32 (n) tiled as C's columns): added to every row of C inside the first GEMM task of
// each C tile (on GPUs in cuBLASLt's epilogue), not with k_over_places.
// a_source (float32, A's shape and tiles; A bfloat16): A is written from it inside the first GEMM task that reads
// each of A's tiles (a matmul input cast to bf16 without a task of its own), not with k_over_places.
// bias_grad (float32, tiled as dy's columns): written with the column sums of dy, the GEMM's bfloat16 input A
// (trans_a, so its K runs down the columns) or, bias_grad_of_b, B (not trans_b), summed in fp32 by the GEMM tasks
// themselves (a Linear's dW GEMM: on GPUs cuBLASLt's bias-gradient epilogue); split over places as C is.
// residual (float32, C's shape and tiles, not C): added to C by the task that finishes each C tile (C = op(A) op(B)
// + bias + residual: a Linear's output joining the residual stream, docs/fusion.md pair 3), not with k_over_places.
void gemm(bool trans_a, TileTensor &a, bool trans_b, TileTensor &b, TileTensor &c, float alpha, float beta,
          Precision precision, bool k_over_places = false, TileTensor *bias = nullptr,
          TileTensor *a_source = nullptr, TileTensor *bias_grad = nullptr, bool bias_grad_of_b = false,
          TileTensor *residual = nullptr);
// db = beta * db + sum over rows of dy (M, N).
void bias_grad(TileTensor &dy, TileTensor &db, float beta);
// y = alpha x + beta y, tile by tile (same tiling).
void add(float alpha, TileTensor &x, float beta, TileTensor &y);
// z = alpha x + beta y, tile by tile (same tiling; z only written): one task per tile where a copy and an add took two.
void add_into(float alpha, TileTensor &x, float beta, TileTensor &y, TileTensor &z);

// dst = op(a, b, c) elementwise, tile by tile (kernels/pointwise.h names the ops): each operand tiled like dst or
// holding one value (broadcast); an operand may be dst itself (in place). float32 only.
void pointwise(const std::string &op, TileTensor &dst, TileTensor *a, TileTensor *b, TileTensor *c, float s0,
               float s1);
// dst (one value) = the reduction op ("sumsq", "sumabs", "sumpow" (of |x|^s0), "maxabs") of all of x, one task per
// tile of x accumulating into dst (combined with dst's value too when accumulate).
void pointwise_reduce(const std::string &op, TileTensor &x, TileTensor &dst, float s0, bool accumulate);
// dst (one tile of n values) = the n one-value tensors srcs, in order (torch.stack of 0-dim results), one task.
void gather_scalars(const std::vector<TileTensor *> &srcs, TileTensor &dst);

// y = gelu(x), dx = dy * gelu'(x), tile by tile (same tiling).
void gelu_forward(TileTensor &x, TileTensor &y, bool tanh_approx);
void gelu_backward(TileTensor &dy, TileTensor &x, TileTensor &dx, bool tanh_approx);
// LayerNorm over the last dim of a 2-d (M, C) tensor whose tiles hold whole rows (one column tile).
// mean, rstd: (M,) tiled like x's rows. Backward overwrites dweight and dbias (C,).
void layer_norm_forward(TileTensor &x, TileTensor &weight, TileTensor &bias, float eps, TileTensor &y,
                        TileTensor &mean, TileTensor &rstd);
void layer_norm_backward(TileTensor &dy, TileTensor &x, TileTensor &mean, TileTensor &rstd, TileTensor &weight,
                         TileTensor &dx, TileTensor &dweight, TileTensor &dbias);
// RMSNorm over the last dim of a 2-d (M, C) tensor whose tiles hold whole rows: rstd (M,) tiled like x's rows.
// Backward overwrites dweight (C,).
void rmsnorm_forward(TileTensor &x, TileTensor &weight, float eps, TileTensor &y, TileTensor &rstd);
void rmsnorm_backward(TileTensor &dy, TileTensor &x, TileTensor &rstd, TileTensor &weight, TileTensor &dx,
                      TileTensor &dweight);
// y = silu(g) * u and its backward (dg, du written), tile by tile: every tensor tiled the same.
void silu_mul_forward(TileTensor &g, TileTensor &u, TileTensor &y);
void silu_mul_backward(TileTensor &dy, TileTensor &g, TileTensor &u, TileTensor &dg, TileTensor &du);
// Rotary position embeddings (Hugging Face's q * cos + rotate_half(q) * sin per head): x (M, heads x head_dim) in
// tiles of whole heads, cos and sin (M, head_dim) tiled by x's rows (row r: row r's position) -> y tiled like x.
// backward: the transpose (dy -> dx).
void rope(TileTensor &x, TileTensor &cos, TileTensor &sin, TileTensor &y, int64_t head_dim, bool backward);
// Self-attention: qkv (M, 3C) in tiles of whole rows holding whole sequences of `seq` positions
// (row tile a multiple of seq) -> y (M, C), tiled by the same rows. Backward: dqkv tiled like qkv.
// mask: nullptr for causal attention, else an additive float mask (M, seq) tiled by qkv's rows (row s * seq + i:
// query i of sequence s against each key; causality is then the mask's).
// bf16: the kernel computes in bfloat16 (as torch under bf16 autocast); tiles stay float32.
// dropout_p > 0: dropout on the attention probabilities with a mask that is a hash of (seed, sequence, head,
// query, key), the same for any tiling; the backward with the same seed applies the same mask.
// stats: float32 (M / seq, nheads x seq) tiled by qkv's sequences, where the forward keeps each query's softmax
// log-sum-exp for the backward; the backward given y and stats reads them instead of recomputing the forward. Where
// the tasks may run on CPU and CUDA workers alike (cpu_tasks with GPUs) nothing is kept: a forward and its backward
// could run different kernels.
void attention_forward(TileTensor &qkv, TileTensor &y, int64_t seq, int64_t nheads, float scale, bool bf16,
                       TileTensor *mask = nullptr, float dropout_p = 0.0f, int64_t seed = 0,
                       TileTensor *stats = nullptr);
void attention_backward(TileTensor &dy, TileTensor &qkv, TileTensor &dqkv, int64_t seq, int64_t nheads, float scale,
                        bool bf16, TileTensor *mask = nullptr, float dropout_p = 0.0f, int64_t seed = 0,
                        TileTensor *y = nullptr, TileTensor *stats = nullptr);
// Grouped-query causal attention (Llama, Mistral, Qwen2): q (M, nheads x hd), k and v (M, kv_heads x hd), each in
// tiles of whole rows with the same row tiles holding whole sequences of `seq` -> y (M, nheads x hd) tiled by those
// rows; query head h reads k/v head h / (nheads / kv_heads). mask, bf16, dropout_p, seed, stats (M / seq, nheads x
// seq) and y: as attention_forward's and attention_backward's. Backward: dq, dk, dv tiled like q, k, v.
void gqa_attention_forward(TileTensor &q, TileTensor &k, TileTensor &v, TileTensor &y, int64_t seq, int64_t nheads,
                           int64_t kv_heads, float scale, bool bf16, TileTensor *mask, float dropout_p = 0.0f,
                           int64_t seed = 0, TileTensor *stats = nullptr);
void gqa_attention_backward(TileTensor &dy, TileTensor &q, TileTensor &k, TileTensor &v, TileTensor &dq,
                            TileTensor &dk, TileTensor &dv, int64_t seq, int64_t nheads, int64_t kv_heads, float scale,
                            bool bf16, TileTensor *mask, float dropout_p = 0.0f, int64_t seed = 0,
                            TileTensor *y = nullptr, TileTensor *stats = nullptr);
// Generation's attention of q_len new queries per sequence over kv_len cached keys, forward only (no gradient):
// q (S * q_len, Wq), k (S * kv_len, Wk), v (S * kv_len, Wv) or nullptr (v's heads then in k's rows: GPT-2's packed
// qkv), each in tiles of whole rows, tile i of each holding the same whole sequences; their heads start at columns
// q_col, k_col, v_col (nheads of hd in q, kv_heads in k and v). mask (S * q_len, kv_len): additive float, tiled by
// q's rows (causality is the mask's). y (S * q_len, nheads * hd) tiled by q's rows.
void cached_attention_forward(TileTensor &q, TileTensor &k, TileTensor *v, TileTensor &mask, TileTensor &y,
                              int64_t q_len, int64_t kv_len, int64_t nheads, int64_t kv_heads, int64_t hd,
                              int64_t q_col, int64_t k_col, int64_t v_col, float scale, bool bf16,
                              int64_t kv_rows = 0);
// A task per tile of the integer tensor ids that records an error (raised at the host's next wait, e.g.
// loss.item()) when a value lies outside [lo, hi) and is not `ignore`: index checks without a host read.
void index_check(TileTensor &ids, int64_t lo, int64_t hi, int64_t ignore, const std::string &what);
// Embedding lookup: ids (M) int64 tiled (bt), table (V, C) in tiles of whole rows (tv, C), out (M, C) tiled
// (bt, C). One task per (row tile, vocabulary tile); backward overwrites dtable (tiled like table).
void embedding_forward(TileTensor &ids, TileTensor &table, TileTensor &out);
// accumulate: add into dtable's values (rows of ids outside [0, N) skipped), not into zeros: a scatter of dy's rows
// into a table whose other rows are kept (a key/value cache's new positions)
void embedding_backward(TileTensor &ids, TileTensor &dy, TileTensor &dtable, bool accumulate = false);
// Broadcast over leading dims: dst (M, C) += src (r, C) on every block of r rows; sum_blocks: dst (r, C) = sum of
// src's (M, C) blocks of r rows (in order). Row tiles of the (M, C) side hold whole blocks.
void add_blocks(TileTensor &src, TileTensor &dst);
void sum_blocks(TileTensor &src, TileTensor &dst);
// Dropout with probability p, the mask a function of (seed, element index): y tiled like x. The backward is the
// same call on dy (same seed).
void dropout(TileTensor &x, TileTensor &y, float p, int64_t seed);
// Cross-entropy with ignore_index -100: logits (M, V) float32 in tiles (bt, tv), labels (M) int64 tiled (bt),
// stats (M, 3) tiled (bt, 3), acc (2), loss (1) = mean (or sum) over counted rows. Backward: dlogits tiled
// like logits, gout (1). Reductions run in a fixed order (deterministic).
void cross_entropy_forward(TileTensor &labels, TileTensor &logits, TileTensor &stats, TileTensor &acc,
                           TileTensor &loss, bool mean);
void cross_entropy_backward(TileTensor &labels, TileTensor &logits, TileTensor &stats, TileTensor &acc,
                            TileTensor &gout, TileTensor &dlogits, bool mean);
// dst = src in dst's element type (same shape and tiles).
void convert(TileTensor &src, TileTensor &dst);
// One AdamW step over all tiles of a parameter (grad, exp_avg, exp_avg_sq share its tiling). Scalars are
// those torch.optim.AdamW uses at this step; init_state: the state tensors have never been written. States may
// be float32 or (both) bfloat16, the latter rounded stochastically from bits that depend on seed, step and tile.
// copy (or null): bf16 tiles that get the updated parameter rounded to nearest in the same task (a weight's bf16 copy).
void adamw(TileTensor &grad, TileTensor &param, TileTensor &exp_avg, TileTensor &exp_avg_sq, double lr, double beta1,
           double beta2, double eps, double weight_decay, int64_t step, bool init_state, int64_t seed,
           TileTensor *copy = nullptr);
// The scalars of one AdamW step as torch.optim.AdamW computes them (in double) for its float kernels.
kernels::AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t step);
// One AdamW step of a float32 or bfloat16 parameter (a bf16 master weight) with 8-bit block-wise moments
// (kernels/adamw_q8.h): exp_avg, exp_avg_sq are float32 word tensors of shape [ntiles * W] in tiles of [W],
// W >= q8_words(the largest parameter tile's elements), tile t holding parameter tile t's moment. init_state: never
// written yet (zero moments). A bf16 parameter is rounded stochastically from bits that depend on seed, step, tile and
// element, as adamw's are (no copy: it is its own). copy as adamw's.
void adamw_q8(TileTensor &grad, TileTensor &param, TileTensor &exp_avg, TileTensor &exp_avg_sq, double lr,
              double beta1, double beta2, double eps, double weight_decay, int64_t step, bool init_state,
              int64_t seed = 0, TileTensor *copy = nullptr);

}  // namespace nntile::ops
