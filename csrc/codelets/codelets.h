// StarPU codelets: each submit_<op>() inserts one task over tile handles and throws on any StarPU error.
#pragma once
#include <starpu.h>

#include <vector>

#include "../common.h"
#include "../kernels/adamw.h"
#include "../kernels/dropout.h"
#include "../kernels/gemm.h"
#include "../kernels/pointwise.h"

namespace nntile::codelets {

// C = alpha op(A) op(B) + beta C (+ bias, float32 (n), on every row) over one tile triple; C is written without being
// read when beta == 0. With a_source, the task first writes A's tile (a_elements values of type ta) from that
// float32 tile. With bias_grad (float32), the task also writes (bias_grad_beta 0) or adds to it (1) the column sums
// of dy, its bf16 input A (stored (k, m)) or B when bias_grad_of_b (stored (k, n)): kernels::GemmBiasGrad.
void submit_gemm(const kernels::GemmShape &s, Precision precision, DType ta, starpu_data_handle_t a, DType tb,
                 starpu_data_handle_t b, DType tc, starpu_data_handle_t c, int priority = 0,
                 starpu_data_handle_t bias = nullptr, starpu_data_handle_t a_source = nullptr,
                 int64_t a_elements = 0, starpu_data_handle_t bias_grad = nullptr, bool bias_grad_of_b = false,
                 float bias_grad_beta = 0.f, starpu_data_handle_t residual = nullptr);
// db = beta * db + column sums of dy (m, n).
void submit_bias_grad(int64_t m, int64_t n, starpu_data_handle_t dy, float beta, starpu_data_handle_t db);
// y = alpha x + beta y over n values (y only written when beta == 0).
void submit_add(int64_t n, float alpha, starpu_data_handle_t x, float beta, starpu_data_handle_t y);
// z = alpha x + beta y over n values (z written only).
void submit_add_into(int64_t n, float alpha, starpu_data_handle_t x, float beta, starpu_data_handle_t y,
                     starpu_data_handle_t z);

// d = op(a, b, c) elementwise, or d[0] = a reduction of a (kernels/pointwise.h); absent operands are nullptr. An
// operand that is d itself makes d read-write; d is otherwise only written (unless a reduction accumulates).
void submit_pointwise(const kernels::PointwiseArgs &args, starpu_data_handle_t d, starpu_data_handle_t a,
                      starpu_data_handle_t b, starpu_data_handle_t c);
// dst (one tile of srcs.size() values) = the one-value tiles srcs, in order: one task reading all of them.
void submit_gather_scalars(const std::vector<starpu_data_handle_t> &srcs, starpu_data_handle_t dst);

// dst = src converted to dst_type (float32 <-> bfloat16, round to nearest even), n values.
void submit_convert(int64_t n, DType src_type, starpu_data_handle_t src, DType dst_type, starpu_data_handle_t dst);
// y = gelu(x) and dx = dy * gelu'(x) over n values; tanh_approx selects GPT-2's tanh form; out_bf16: y (dx) holds
// bfloat16 (a bf16 matmul's input), rounded once from the fp32 values.
void submit_gelu_forward(int64_t n, bool tanh_approx, starpu_data_handle_t x, starpu_data_handle_t y,
                         bool out_bf16 = false);
void submit_gelu_backward(int64_t n, bool tanh_approx, starpu_data_handle_t dy, starpu_data_handle_t x,
                          starpu_data_handle_t dx, bool out_bf16 = false);
// LayerNorm of a tile of whole rows (m, c): y (float32, or bfloat16 with y_bf16), mean (m), rstd (m) written.
// Backward writes dx and adds (beta 1) or writes (beta 0) the weight and bias gradients (c).
void submit_layer_norm_forward(int64_t m, int64_t c, float eps, starpu_data_handle_t x, starpu_data_handle_t weight,
                               starpu_data_handle_t bias, starpu_data_handle_t y, starpu_data_handle_t mean,
                               starpu_data_handle_t rstd, bool y_bf16 = false);
void submit_layer_norm_backward(int64_t m, int64_t c, starpu_data_handle_t dy, starpu_data_handle_t x,
                                starpu_data_handle_t mean, starpu_data_handle_t rstd, starpu_data_handle_t weight,
                                starpu_data_handle_t dx, starpu_data_handle_t dweight, starpu_data_handle_t dbias,
                                float beta);
// RMSNorm of a tile of whole rows (m, c): y and rstd (m) written. Backward writes dx and adds (beta 1) or writes
// (beta 0) the weight gradient (c).
void submit_rmsnorm_forward(int64_t m, int64_t c, float eps, starpu_data_handle_t x, starpu_data_handle_t weight,
                            starpu_data_handle_t y, starpu_data_handle_t rstd);
void submit_rmsnorm_backward(int64_t m, int64_t c, starpu_data_handle_t dy, starpu_data_handle_t x,
                             starpu_data_handle_t rstd, starpu_data_handle_t weight, starpu_data_handle_t dx,
                             starpu_data_handle_t dweight, float beta);
// The gated MLP's y = silu(g) * u over n values, and its backward dg, du (written).
void submit_silu_mul_forward(int64_t n, starpu_data_handle_t g, starpu_data_handle_t u, starpu_data_handle_t y);
void submit_silu_mul_backward(int64_t n, starpu_data_handle_t dy, starpu_data_handle_t g, starpu_data_handle_t u,
                              starpu_data_handle_t dg, starpu_data_handle_t du);
// Rotary position embeddings over a tile x (rows, width) of whole heads of hd, cos and sin (rows, hd) -> y; backward:
// the transpose (kernels/rope.h).
void submit_rope(bool backward, int64_t rows, int64_t width, int64_t hd, starpu_data_handle_t x,
                 starpu_data_handle_t cos, starpu_data_handle_t sin, starpu_data_handle_t y);
// Self-attention over nseq whole sequences in one tile: qkv (nseq * seq, 3c) -> y (nseq * seq, c); backward
// writes dqkv. mask: nullptr (causal) or an additive float mask tile (nseq * seq, seq). bf16: computed in
// bfloat16 (float32 tiles in and out). dropout_p > 0: dropout on the attention probabilities, the mask a hash of
// (seed, first_seq + the tile's sequence, head, query, key) (kernels::AttentionDropout). stats: a tile of
// (nseq, nheads * seq) floats the forward writes its softmax statistics into, for the backward (nullptr: none).
void submit_attention_forward(int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                              starpu_data_handle_t qkv, starpu_data_handle_t mask, starpu_data_handle_t y,
                              float dropout_p = 0.0f, int64_t seed = 0, int64_t first_seq = 0,
                              starpu_data_handle_t stats = nullptr);
// With y and stats (the forward's output and the statistics it wrote) the backward does not recompute the forward.
void submit_attention_backward(int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                               starpu_data_handle_t dy, starpu_data_handle_t qkv, starpu_data_handle_t mask,
                               starpu_data_handle_t dqkv, float dropout_p = 0.0f, int64_t seed = 0,
                               int64_t first_seq = 0, starpu_data_handle_t y = nullptr,
                               starpu_data_handle_t stats = nullptr);
// Grouped-query attention over nseq whole sequences: q (nseq * seq, nheads * hd), k, v (nseq * seq, kv_heads * hd)
// -> y (nseq * seq, nheads * hd); backward writes dq, dk, dv. mask, bf16 and dropout as submit_attention_forward's.
// Attention of q_len new queries over kv_len cached keys per sequence (generation), forward only: q (nseq * q_len,
// .), k and v (nseq * kv_len, .) whose heads start at columns q_col, k_col, v_col of their rows (v null: v's columns
// are in k's tile, GPT-2's packed qkv); mask (nseq * q_len, kv_len) additive; y (nseq * q_len, nheads * hd).
void submit_cached_attention_forward(int64_t nseq, int64_t q_len, int64_t kv_len, int64_t kv_rows, int64_t nheads,
                                     int64_t kv_heads, int64_t hd, int64_t q_col, int64_t k_col, int64_t v_col,
                                     float scale, bool bf16, starpu_data_handle_t q, starpu_data_handle_t k,
                                     starpu_data_handle_t v, starpu_data_handle_t mask, starpu_data_handle_t y);
void submit_gqa_attention_forward(int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                                  float scale, bool bf16, starpu_data_handle_t q, starpu_data_handle_t k,
                                  starpu_data_handle_t v, starpu_data_handle_t mask, starpu_data_handle_t y,
                                  float dropout_p = 0.0f, int64_t seed = 0, int64_t first_seq = 0,
                                  starpu_data_handle_t stats = nullptr);
void submit_gqa_attention_backward(int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                                   float scale, bool bf16, starpu_data_handle_t dy, starpu_data_handle_t q,
                                   starpu_data_handle_t k, starpu_data_handle_t v, starpu_data_handle_t mask,
                                   starpu_data_handle_t dq, starpu_data_handle_t dk, starpu_data_handle_t dv,
                                   float dropout_p = 0.0f, int64_t seed = 0, int64_t first_seq = 0,
                                   starpu_data_handle_t y = nullptr, starpu_data_handle_t stats = nullptr);
// Records a task error (raised at the host's next wait) when an integer tile (n values) holds a value outside
// [lo, hi) other than `ignore`; `what` names the check in the message.
void submit_index_check(int64_t n, int64_t lo, int64_t hi, int64_t ignore, const std::string &what,
                        starpu_data_handle_t ids);
// out (m, c) = (first ? 0 : out) + the rows of table (rows, c) picked by ids in [lo, lo + rows); backward:
// dtable (rows, c) = (first ? 0 : dtable) + the dy rows of those ids.
void submit_embedding_forward(int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, starpu_data_handle_t ids,
                              starpu_data_handle_t table, starpu_data_handle_t out);
void submit_embedding_backward(int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, starpu_data_handle_t ids,
                               starpu_data_handle_t dy, starpu_data_handle_t dtable);
// dst (nblk * r, c) += src (r, c) on each block; sum: dst (r, c) = (first ? 0 : dst) + the sum of src's blocks.
void submit_add_blocks(int64_t nblk, int64_t r, int64_t c, starpu_data_handle_t src, starpu_data_handle_t dst);
void submit_sum_blocks(int64_t nblk, int64_t r, int64_t c, bool first, starpu_data_handle_t src,
                       starpu_data_handle_t dst);
// y = x * keep / (1 - p) over one tile; keep hashed from (seed, each element's index in the whole tensor):
// kernels/dropout.h.
void submit_dropout(const kernels::DropoutTile &tile, int64_t seed, float p, starpu_data_handle_t x,
                    starpu_data_handle_t y);
// Cross-entropy over vocabulary tiles (kernels/cross_entropy.h): stats folds one (row tile, vocabulary tile)
// into the rows' stats, sum one row tile's losses into acc, loss = acc's mean (or sum), backward one gradient tile.
void submit_cross_entropy_stats(int64_t m, int64_t vj, int64_t lo, bool first, starpu_data_handle_t labels,
                                starpu_data_handle_t x, starpu_data_handle_t stats);
void submit_cross_entropy_sum(int64_t m, bool first, starpu_data_handle_t labels, starpu_data_handle_t stats,
                              starpu_data_handle_t acc);
void submit_cross_entropy_loss(bool mean, starpu_data_handle_t acc, starpu_data_handle_t loss);
void submit_cross_entropy_backward(int64_t m, int64_t vj, int64_t lo, bool mean, starpu_data_handle_t labels,
                                   starpu_data_handle_t x, starpu_data_handle_t stats, starpu_data_handle_t acc,
                                   starpu_data_handle_t gout, starpu_data_handle_t dx);
// One AdamW step on a parameter tile; init_state zeroes the state tiles first instead of reading them;
// bf16_state: the state tiles are bf16, rounded stochastically with the bits of hash(seed, element); copy (or null):
// a bf16 tile that gets the updated parameter rounded to nearest; bf16_param: the parameter tile is bf16 as well
// (bf16 master weights: bf16 states, no copy), rounded stochastically too.
void submit_adamw(int64_t n, const kernels::AdamWScalars &s, bool init_state, bool bf16_state, uint64_t seed,
                  starpu_data_handle_t grad, starpu_data_handle_t param, starpu_data_handle_t exp_avg,
                  starpu_data_handle_t exp_avg_sq, starpu_data_handle_t copy = nullptr, bool bf16_param = false);
// The same step with 8-bit block-wise moments (kernels/adamw_q8.h): exp_avg, exp_avg_sq are float32 word tiles holding at
// least q8_words(n) words each; init_state zeroes them first (all-zero words: zero moments). bf16_param: the parameter
// tile is bf16 (a bf16 master weight, no copy), rounded stochastically with the bits of hash(seed, element) as
// submit_adamw's bf16 parameters are.
void submit_adamw_q8(int64_t n, const kernels::AdamWScalars &s, bool init_state, starpu_data_handle_t grad,
                     starpu_data_handle_t param, starpu_data_handle_t exp_avg, starpu_data_handle_t exp_avg_sq,
                     starpu_data_handle_t copy = nullptr, bool bf16_param = false, uint64_t seed = 0);

}  // namespace nntile::codelets
