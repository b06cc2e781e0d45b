// Tiled self-attention (causal, or with a mask), packed qkv (GPT-2) or grouped-query q, k, v (Llama): one task per row
// tile (a whole number of sequences).
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {
void check(TileTensor &qkv, TileTensor &y, int64_t seq, int64_t nheads, const char *op) {
    NNTILE_CHECK(qkv.dtype() == DType::f32 && y.dtype() == DType::f32, op << " needs float32 tiles");
    NNTILE_CHECK(qkv.ndim() == 2 && qkv.grid()[1] == 1 && qkv.shape()[1] % 3 == 0,
                 op << ": qkv must be (M, 3C) in tiles of whole rows");
    int64_t c = qkv.shape()[1] / 3;
    NNTILE_CHECK(nheads > 0 && c % nheads == 0, op << ": width " << c << " is not a multiple of " << nheads << " heads");
    NNTILE_CHECK(seq > 0 && qkv.tile_shape()[0] % seq == 0 && qkv.shape()[0] % seq == 0,
                 op << ": row tiles (" << qkv.tile_shape()[0] << ") and rows (" << qkv.shape()[0]
                    << ") must hold whole sequences of " << seq);
    NNTILE_CHECK(y.ndim() == 2 && y.shape()[0] == qkv.shape()[0] && y.shape()[1] == c &&
                     y.tile_shape()[0] == qkv.tile_shape()[0] && y.grid()[1] == 1,
                 op << ": output must be (" << qkv.shape()[0] << ", " << c << ") tiled by qkv's rows");
}

void check_mask(TileTensor &qkv, TileTensor *mask, int64_t seq, const char *op) {
    if (!mask) return;
    NNTILE_CHECK(mask->dtype() == DType::f32 && mask->ndim() == 2 && mask->shape()[0] == qkv.shape()[0] &&
                     mask->shape()[1] == seq && mask->tile_shape()[0] == qkv.tile_shape()[0] && mask->grid()[1] == 1,
                 op << ": the mask must be float32 (" << qkv.shape()[0] << ", " << seq << ") tiled by qkv's "
                    << qkv.tile_shape()[0] << " rows (got shape " << c10::IntArrayRef(mask->shape()) << ", tiles "
                    << c10::IntArrayRef(mask->tile_shape()) << ")");
}
void check_gqa(TileTensor &q, TileTensor &k, TileTensor &v, TileTensor &y, int64_t seq, int64_t nheads,
               int64_t kv_heads, const char *op) {
    for (auto *t : {&q, &k, &v, &y})
        NNTILE_CHECK(t->dtype() == DType::f32 && t->ndim() == 2 && t->grid()[1] == 1,
                     op << ": q, k, v and the output must be float32 matrices in tiles of whole rows");
    NNTILE_CHECK(nheads > 0 && kv_heads > 0 && nheads % kv_heads == 0,
                 op << ": query heads (" << nheads << ") must be a multiple of key/value heads (" << kv_heads << ")");
    NNTILE_CHECK(q.shape()[1] % nheads == 0,
                 op << ": q's width " << q.shape()[1] << " is not a multiple of " << nheads << " heads");
    const int64_t hd = q.shape()[1] / nheads;
    for (auto *t : {&k, &v})
        NNTILE_CHECK(t->shape()[0] == q.shape()[0] && t->shape()[1] == kv_heads * hd &&
                         t->tile_shape()[0] == q.tile_shape()[0],
                     op << ": k and v must be (" << q.shape()[0] << ", " << kv_heads * hd << ") tiled by q's "
                        << q.tile_shape()[0] << " rows (got shape " << c10::IntArrayRef(t->shape()) << ", tiles "
                        << c10::IntArrayRef(t->tile_shape()) << ")");
    NNTILE_CHECK(y.same_tiling(q), op << ": the output must be shaped and tiled like q");
    NNTILE_CHECK(seq > 0 && q.tile_shape()[0] % seq == 0 && q.shape()[0] % seq == 0,
                 op << ": row tiles (" << q.tile_shape()[0] << ") and rows (" << q.shape()[0]
                    << ") must hold whole sequences of " << seq);
}

void check_dropout(float p, const char *op) {
    NNTILE_CHECK(p >= 0.0f && p < 1.0f, op << ": dropout_p must be in [0, 1) (got " << p << ")");
}

// The statistics tile of qkv's attention, or nullptr where nothing is kept: tasks that may run on CPU and CUDA
// workers alike (a forward and its backward could run different kernels).
TileTensor *kept_stats(TileTensor *stats, TileTensor &qkv, int64_t seq, int64_t nheads, const char *op) {
    if (!stats) return nullptr;
    NNTILE_CHECK(stats->dtype() == DType::f32 && stats->ndim() == 2 && stats->grid()[1] == 1 &&
                     stats->shape()[0] * seq == qkv.shape()[0] && stats->shape()[1] == nheads * seq &&
                     stats->tile_shape()[0] * seq == qkv.tile_shape()[0],
                 op << ": the statistics must be float32 (" << qkv.shape()[0] / seq << ", " << nheads * seq
                    << ") in tiles of " << qkv.tile_shape()[0] / seq << " sequences (got shape "
                    << c10::IntArrayRef(stats->shape()) << ", tiles " << c10::IntArrayRef(stats->tile_shape()) << ")");
    if (cpu_tasks_allowed() && starpu_cuda_worker_get_count() > 0) return nullptr;
    return stats;
}
}  // namespace

void attention_forward(TileTensor &qkv, TileTensor &y, int64_t seq, int64_t nheads, float scale, bool bf16,
                       TileTensor *mask, float dropout_p, int64_t seed, TileTensor *stats) {
    check(qkv, y, seq, nheads, "attention");
    check_mask(qkv, mask, seq, "attention");
    check_dropout(dropout_p, "attention");
    stats = kept_stats(stats, qkv, seq, nheads, "attention");
    int64_t c = y.shape()[1];
    for (int64_t i = 0; i < qkv.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_attention_forward(qkv.tile_extent(0, i) / seq, seq, c, nheads, scale, bf16, qkv.handle(i),
                                           mask ? mask->handle(i) : nullptr, y.handle(i), dropout_p, seed,
                                           i * qkv.tile_shape()[0] / seq, stats ? stats->handle(i) : nullptr);
    }
    y.bump_version();
    if (stats) stats->bump_version();
}

void attention_backward(TileTensor &dy, TileTensor &qkv, TileTensor &dqkv, int64_t seq, int64_t nheads, float scale,
                        bool bf16, TileTensor *mask, float dropout_p, int64_t seed, TileTensor *y,
                        TileTensor *stats) {
    check(qkv, dy, seq, nheads, "attention_backward");
    check_mask(qkv, mask, seq, "attention_backward");
    check_dropout(dropout_p, "attention_backward");
    NNTILE_CHECK(dqkv.same_tiling(qkv), "attention_backward: dqkv must be tiled like qkv");
    NNTILE_CHECK(!stats || y, "attention_backward: the kept statistics come with the forward's output y");
    if (y) check(qkv, *y, seq, nheads, "attention_backward");
    stats = kept_stats(stats, qkv, seq, nheads, "attention_backward");
    int64_t c = dy.shape()[1];
    for (int64_t i = 0; i < qkv.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_attention_backward(qkv.tile_extent(0, i) / seq, seq, c, nheads, scale, bf16, dy.handle(i),
                                            qkv.handle(i), mask ? mask->handle(i) : nullptr, dqkv.handle(i),
                                            dropout_p, seed, i * qkv.tile_shape()[0] / seq,
                                            stats ? y->handle(i) : nullptr, stats ? stats->handle(i) : nullptr);
    }
    dqkv.bump_version();
}

void cached_attention_forward(TileTensor &q, TileTensor &k, TileTensor *v, TileTensor &mask, TileTensor &y,
                              int64_t q_len, int64_t kv_len, int64_t nheads, int64_t kv_heads, int64_t hd,
                              int64_t q_col, int64_t k_col, int64_t v_col, float scale, bool bf16,
                              int64_t kv_rows) {
    const char *op = "cached_attention";
    if (kv_rows == 0) kv_rows = kv_len;  // k's and v's rows per sequence: the keys, or more (a cache with room)
    TileTensor &vt = v ? *v : k;
    for (auto *t : {&q, &k, &vt, &mask, &y})
        NNTILE_CHECK(t->dtype() == DType::f32 && t->ndim() == 2 && t->grid()[1] == 1,
                     op << ": q, k, v, the mask and the output must be float32 matrices in tiles of whole rows");
    NNTILE_CHECK(kv_rows >= kv_len, op << ": kv_rows (" << kv_rows << ") must be at least kv_len (" << kv_len << ")");
    NNTILE_CHECK(q_len > 0 && kv_len > 0 && hd > 0 && nheads > 0 && kv_heads > 0 && nheads % kv_heads == 0,
                 op << ": q_len " << q_len << ", kv_len " << kv_len << ", head size " << hd << ", heads " << nheads
                    << "/" << kv_heads << " (query heads a multiple of key/value heads)");
    NNTILE_CHECK(q.shape()[0] % q_len == 0 && q.tile_shape()[0] % q_len == 0,
                 op << ": q's rows (" << q.shape()[0] << ") and row tiles (" << q.tile_shape()[0]
                    << ") must hold whole sequences of " << q_len << " queries");
    const int64_t nseq = q.shape()[0] / q_len, per_tile = q.tile_shape()[0] / q_len;
    for (auto *t : {&k, &vt})
        NNTILE_CHECK(t->shape()[0] == nseq * kv_rows && t->tile_shape()[0] == per_tile * kv_rows,
                     op << ": k and v must hold " << nseq << " sequences of " << kv_rows << " rows in tiles of "
                        << per_tile << " sequences, as q's (got " << c10::IntArrayRef(t->shape()) << " in tiles "
                        << c10::IntArrayRef(t->tile_shape()) << ")");
    NNTILE_CHECK(q_col >= 0 && q_col + nheads * hd <= q.shape()[1] && k_col >= 0 &&
                     k_col + kv_heads * hd <= k.shape()[1] && v_col >= 0 && v_col + kv_heads * hd <= vt.shape()[1],
                 op << ": heads past the end of a row (q from column " << q_col << " of " << q.shape()[1] << ", k from "
                    << k_col << " of " << k.shape()[1] << ", v from " << v_col << " of " << vt.shape()[1] << ")");
    NNTILE_CHECK(mask.shape()[0] == q.shape()[0] && mask.shape()[1] == kv_len &&
                     mask.tile_shape()[0] == q.tile_shape()[0],
                 op << ": the mask must be (" << q.shape()[0] << ", " << kv_len << ") tiled by q's rows");
    NNTILE_CHECK(y.shape()[0] == q.shape()[0] && y.shape()[1] == nheads * hd && y.tile_shape()[0] == q.tile_shape()[0],
                 op << ": the output must be (" << q.shape()[0] << ", " << nheads * hd << ") tiled by q's rows");
    for (int64_t i = 0; i < q.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_cached_attention_forward(q.tile_extent(0, i) / q_len, q_len, kv_len, kv_rows, nheads, kv_heads, hd,
                                                  q_col, k_col, v_col, scale, bf16, q.handle(i), k.handle(i),
                                                  v ? v->handle(i) : nullptr, mask.handle(i), y.handle(i));
    }
    y.bump_version();
}

void gqa_attention_forward(TileTensor &q, TileTensor &k, TileTensor &v, TileTensor &y, int64_t seq, int64_t nheads,
                           int64_t kv_heads, float scale, bool bf16, TileTensor *mask, float dropout_p, int64_t seed,
                           TileTensor *stats) {
    check_gqa(q, k, v, y, seq, nheads, kv_heads, "gqa_attention");
    check_mask(q, mask, seq, "gqa_attention");
    check_dropout(dropout_p, "gqa_attention");
    stats = kept_stats(stats, q, seq, nheads, "gqa_attention");
    const int64_t hd = q.shape()[1] / nheads;
    for (int64_t i = 0; i < q.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_gqa_attention_forward(q.tile_extent(0, i) / seq, seq, nheads, kv_heads, hd, scale, bf16,
                                               q.handle(i), k.handle(i), v.handle(i),
                                               mask ? mask->handle(i) : nullptr, y.handle(i), dropout_p, seed,
                                               i * q.tile_shape()[0] / seq, stats ? stats->handle(i) : nullptr);
    }
    y.bump_version();
    if (stats) stats->bump_version();
}

void gqa_attention_backward(TileTensor &dy, TileTensor &q, TileTensor &k, TileTensor &v, TileTensor &dq,
                            TileTensor &dk, TileTensor &dv, int64_t seq, int64_t nheads, int64_t kv_heads, float scale,
                            bool bf16, TileTensor *mask, float dropout_p, int64_t seed, TileTensor *y,
                            TileTensor *stats) {
    check_gqa(q, k, v, dy, seq, nheads, kv_heads, "gqa_attention_backward");
    check_mask(q, mask, seq, "gqa_attention_backward");
    check_dropout(dropout_p, "gqa_attention_backward");
    NNTILE_CHECK(dq.same_tiling(q) && dk.same_tiling(k) && dv.same_tiling(v),
                 "gqa_attention_backward: dq, dk, dv must be tiled like q, k, v");
    NNTILE_CHECK(!stats || y, "gqa_attention_backward: the kept statistics come with the forward's output y");
    if (y) check_gqa(q, k, v, *y, seq, nheads, kv_heads, "gqa_attention_backward");
    stats = kept_stats(stats, q, seq, nheads, "gqa_attention_backward");
    const int64_t hd = q.shape()[1] / nheads;
    for (int64_t i = 0; i < q.grid()[0]; ++i) {
        OnWorker on(placement_worker(i));
        codelets::submit_gqa_attention_backward(q.tile_extent(0, i) / seq, seq, nheads, kv_heads, hd, scale, bf16,
                                                dy.handle(i), q.handle(i), k.handle(i), v.handle(i),
                                                mask ? mask->handle(i) : nullptr, dq.handle(i), dk.handle(i),
                                                dv.handle(i), dropout_p, seed, i * q.tile_shape()[0] / seq,
                                                stats ? y->handle(i) : nullptr, stats ? stats->handle(i) : nullptr);
    }
    dq.bump_version();
    dk.bump_version();
    dv.bump_version();
}

}  // namespace nntile::ops
