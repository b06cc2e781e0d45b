// Codelets for self-attention forward and backward on a tile of whole sequences (causal, or with a mask tile).
#include "../kernels/attention.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct AttentionArgs {
    int64_t nseq, seq, c, nheads;
    float scale;
    bool bf16;
    bool masked;  // a mask tile follows qkv in the buffers
    kernels::AttentionDropout drop;
    bool kept;  // the forward writes its statistics into a stats tile (last), the backward reads y and them (last)
};

uint32_t attention_footprint(starpu_task *task) {
    const auto &a = args_of<AttentionArgs>(task);
    return hash_ints({a.nseq, a.seq, a.c, a.nheads, a.bf16 ? 1 : 0, a.masked ? 1 : 0, a.drop.p > 0.0f ? 1 : 0,
                      a.kept ? 1 : 0});
}

template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {  // buffers: qkv, [mask], y, [stats]
    auto *a = static_cast<AttentionArgs *>(cl_arg);
    const int m = a->masked ? 1 : 0;
    const float *mask = m ? (const float *)STARPU_VECTOR_GET_PTR(buffers[1]) : nullptr;
    kernels::attention_forward(where<Cuda>(), a->nseq, a->seq, a->c, a->nheads, a->scale, a->bf16,
                               (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), mask,
                               (float *)STARPU_VECTOR_GET_PTR(buffers[1 + m]), a->drop,
                               a->kept ? (float *)STARPU_VECTOR_GET_PTR(buffers[2 + m]) : nullptr);
}

template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {  // buffers: dy, qkv, [mask], dqkv, [y, stats]
    auto *a = static_cast<AttentionArgs *>(cl_arg);
    const int m = a->masked ? 1 : 0;
    const float *mask = m ? (const float *)STARPU_VECTOR_GET_PTR(buffers[2]) : nullptr;
    kernels::attention_backward(where<Cuda>(), a->nseq, a->seq, a->c, a->nheads, a->scale, a->bf16,
                                (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                                (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), mask,
                                (float *)STARPU_VECTOR_GET_PTR(buffers[2 + m]), a->drop,
                                a->kept ? (const float *)STARPU_VECTOR_GET_PTR(buffers[3 + m]) : nullptr,
                                a->kept ? (const float *)STARPU_VECTOR_GET_PTR(buffers[4 + m]) : nullptr);
}

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl =
        new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>("attention_forward", "nntile_attention_forward", attention_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl =
        new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>("attention_backward", "nntile_attention_backward", attention_footprint);
    return cl;
}

struct GqaArgs {
    int64_t nseq, seq, nheads, kv_heads, hd;
    float scale;
    bool bf16;
    bool masked;  // a mask tile follows v in the buffers
    kernels::AttentionDropout drop;
    bool kept;  // the forward writes its statistics into a stats tile (last), the backward reads y and them (last)
};

uint32_t gqa_footprint(starpu_task *task) {
    const auto &a = args_of<GqaArgs>(task);
    return hash_ints({a.nseq, a.seq, a.nheads, a.kv_heads, a.hd, a.bf16 ? 1 : 0, a.masked ? 1 : 0,
                      a.drop.p > 0.0f ? 1 : 0, a.kept ? 1 : 0});
}

#define NNTILE_PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

template <bool Cuda>
void gqa_fwd_func(void *buffers[], void *cl_arg) {  // buffers: q, k, v, [mask], y, [stats]
    auto *a = static_cast<GqaArgs *>(cl_arg);
    const int m = a->masked ? 1 : 0;
    kernels::gqa_attention_forward(where<Cuda>(), a->nseq, a->seq, a->nheads, a->kv_heads, a->hd, a->scale, a->bf16,
                                   NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2), m ? NNTILE_PTR(3) : nullptr,
                                   NNTILE_PTR(3 + m), a->drop, a->kept ? NNTILE_PTR(4 + m) : nullptr);
}

template <bool Cuda>
void gqa_bwd_func(void *buffers[], void *cl_arg) {  // buffers: dy, q, k, v, [mask], dq, dk, dv, [y, stats]
    auto *a = static_cast<GqaArgs *>(cl_arg);
    const int m = a->masked ? 1 : 0;
    kernels::gqa_attention_backward(where<Cuda>(), a->nseq, a->seq, a->nheads, a->kv_heads, a->hd, a->scale, a->bf16,
                                    NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2), NNTILE_PTR(3),
                                    m ? NNTILE_PTR(4) : nullptr, NNTILE_PTR(4 + m), NNTILE_PTR(5 + m),
                                    NNTILE_PTR(6 + m), a->drop, a->kept ? NNTILE_PTR(7 + m) : nullptr,
                                    a->kept ? NNTILE_PTR(8 + m) : nullptr);
}
#undef NNTILE_PTR

starpu_codelet *cl_gqa_fwd() {
    static starpu_codelet *cl = new_codelet<gqa_fwd_func<false>, NNTILE_CUDA_IMPL(gqa_fwd_func<true>)>(
        "gqa_attention_forward", "nntile_gqa_attention_forward", gqa_footprint);
    return cl;
}

starpu_codelet *cl_gqa_bwd() {
    static starpu_codelet *cl = new_codelet<gqa_bwd_func<false>, NNTILE_CUDA_IMPL(gqa_bwd_func<true>)>(
        "gqa_attention_backward", "nntile_gqa_attention_backward", gqa_footprint);
    return cl;
}

struct CachedArgs {
    int64_t nseq, q_len, kv_len, kv_rows, nheads, kv_heads, hd;  // kv_rows: rows per sequence in k's and v's tiles
    int64_t q_col, k_col, v_col;  // where q's, k's and v's heads start in their rows
    float scale;
    bool bf16;
    bool v_in_k;  // v is a column range of k's tile (GPT-2's packed qkv rows): no v buffer
};

uint32_t cached_footprint(starpu_task *task) {
    const auto &a = args_of<CachedArgs>(task);
    return hash_ints({a.nseq, a.q_len, a.kv_len, a.kv_rows, a.nheads, a.kv_heads, a.hd, a.bf16 ? 1 : 0});
}

template <bool Cuda>
void cached_fwd_func(void *buffers[], void *cl_arg) {  // buffers: q, k, [v], mask, y
    auto *a = static_cast<CachedArgs *>(cl_arg);
    const int n = a->v_in_k ? 0 : 1;
    auto row = [&](int i) {  // a buffer's row length: a vector of nseq * len rows
        const int64_t len = i == 0 ? a->q_len : a->kv_rows;
        return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]) / (a->nseq * len);
    };
    const float *q = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), *k = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const float *v = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + n]);
    kernels::cached_attention_forward(where<Cuda>(), a->nseq, a->q_len, a->kv_len, a->kv_rows, a->nheads, a->kv_heads, a->hd,
                                      a->scale, a->bf16, q + a->q_col, row(0), k + a->k_col, row(1), v + a->v_col,
                                      row(1 + n), (const float *)STARPU_VECTOR_GET_PTR(buffers[2 + n]),
                                      (float *)STARPU_VECTOR_GET_PTR(buffers[3 + n]));
}

starpu_codelet *cl_cached_fwd() {
    static starpu_codelet *cl = new_codelet<cached_fwd_func<false>, NNTILE_CUDA_IMPL(cached_fwd_func<true>)>(
        "cached_attention_forward", "nntile_cached_attention_forward", cached_footprint);
    return cl;
}

}  // namespace

void submit_cached_attention_forward(int64_t nseq, int64_t q_len, int64_t kv_len, int64_t kv_rows, int64_t nheads,
                                     int64_t kv_heads, int64_t hd, int64_t q_col, int64_t k_col, int64_t v_col,
                                     float scale, bool bf16, starpu_data_handle_t q, starpu_data_handle_t k,
                                     starpu_data_handle_t v, starpu_data_handle_t mask, starpu_data_handle_t y) {
    double flops = 4.0 * nseq * q_len * kv_len * nheads * hd;
    auto *args = cl_args(CachedArgs{nseq, q_len, kv_len, kv_rows, nheads, kv_heads, hd, q_col, k_col, v_col, scale, bf16,
                                    v == nullptr});
    int ret = v ? NNTILE_TASK_INSERT(cl_cached_fwd(), STARPU_R, q, STARPU_R, k, STARPU_R, v, STARPU_R, mask, STARPU_W,
                                     y, STARPU_CL_ARGS, args, sizeof(CachedArgs), STARPU_FLOPS, flops, STARPU_NAME,
                                     "cached_attention_forward", 0)
                : NNTILE_TASK_INSERT(cl_cached_fwd(), STARPU_R, q, STARPU_R, k, STARPU_R, mask, STARPU_W, y,
                                     STARPU_CL_ARGS, args, sizeof(CachedArgs), STARPU_FLOPS, flops, STARPU_NAME,
                                     "cached_attention_forward", 0);
    NNTILE_STARPU_CHECK(ret, "submitting cached_attention_forward q_len=" << q_len << " kv_len=" << kv_len
                                                                          << " heads=" << nheads << "/" << kv_heads);
    count_task();
}

void submit_gqa_attention_forward(int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                                  float scale, bool bf16, starpu_data_handle_t q, starpu_data_handle_t k,
                                  starpu_data_handle_t v, starpu_data_handle_t mask, starpu_data_handle_t y,
                                  float dropout_p, int64_t seed, int64_t first_seq, starpu_data_handle_t stats) {
    const bool masked = mask != nullptr, kept = stats != nullptr;
    double flops = 4.0 * nseq * seq * seq * nheads * hd / (masked ? 1 : 2);  // causal: half of QK^T and PV
    auto *args =
        cl_args(GqaArgs{nseq, seq, nheads, kv_heads, hd, scale, bf16, masked, {dropout_p, seed, first_seq}, kept});
    starpu_data_descr d[6];
    int n = 0;
    for (auto h : {q, k, v}) d[n++] = {h, STARPU_R};
    if (masked) d[n++] = {mask, STARPU_R};
    d[n++] = {y, STARPU_W};
    if (kept) d[n++] = {stats, STARPU_W};
    int ret = NNTILE_TASK_INSERT(cl_gqa_fwd(), STARPU_DATA_MODE_ARRAY, d, n, STARPU_CL_ARGS, args, sizeof(GqaArgs),
                                 STARPU_FLOPS, flops, STARPU_NAME,
                                 masked ? "gqa_attention_forward_masked" : "gqa_attention_forward", 0);
    NNTILE_STARPU_CHECK(ret, "submitting gqa_attention_forward seq=" << seq << " heads=" << nheads << "/" << kv_heads
                                                                     << " masked=" << masked);
    count_task();
}

void submit_gqa_attention_backward(int64_t nseq, int64_t seq, int64_t nheads, int64_t kv_heads, int64_t hd,
                                   float scale, bool bf16, starpu_data_handle_t dy, starpu_data_handle_t q,
                                   starpu_data_handle_t k, starpu_data_handle_t v, starpu_data_handle_t mask,
                                   starpu_data_handle_t dq, starpu_data_handle_t dk, starpu_data_handle_t dv,
                                   float dropout_p, int64_t seed, int64_t first_seq, starpu_data_handle_t y,
                                   starpu_data_handle_t stats) {
    const bool masked = mask != nullptr, kept = y != nullptr && stats != nullptr;
    // the backward's products, and without the kept statistics the recomputed forward's
    double flops = (kept ? 2.5 : 3.5) * 4.0 * nseq * seq * seq * nheads * hd / (masked ? 1 : 2);
    auto *args =
        cl_args(GqaArgs{nseq, seq, nheads, kv_heads, hd, scale, bf16, masked, {dropout_p, seed, first_seq}, kept});
    starpu_data_descr d[10];
    int n = 0;
    for (auto h : {dy, q, k, v}) d[n++] = {h, STARPU_R};
    if (masked) d[n++] = {mask, STARPU_R};
    for (auto h : {dq, dk, dv}) d[n++] = {h, STARPU_W};
    if (kept) {
        d[n++] = {y, STARPU_R};
        d[n++] = {stats, STARPU_R};
    }
    int ret = NNTILE_TASK_INSERT(cl_gqa_bwd(), STARPU_DATA_MODE_ARRAY, d, n, STARPU_CL_ARGS, args, sizeof(GqaArgs),
                                 STARPU_FLOPS, flops, STARPU_NAME,
                                 masked ? "gqa_attention_backward_masked" : "gqa_attention_backward", 0);
    NNTILE_STARPU_CHECK(ret, "submitting gqa_attention_backward seq=" << seq << " heads=" << nheads << "/"
                                                                      << kv_heads << " masked=" << masked);
    count_task();
}

void submit_attention_forward(int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                              starpu_data_handle_t qkv, starpu_data_handle_t mask, starpu_data_handle_t y,
                              float dropout_p, int64_t seed, int64_t first_seq, starpu_data_handle_t stats) {
    const bool masked = mask != nullptr, kept = stats != nullptr;
    double flops = 4.0 * nseq * seq * seq * c / (masked ? 1 : 2);  // causal: half of QK^T and PV
    auto *args = cl_args(AttentionArgs{nseq, seq, c, nheads, scale, bf16, masked, {dropout_p, seed, first_seq}, kept});
    starpu_data_descr d[4];
    int n = 0;
    d[n++] = {qkv, STARPU_R};
    if (masked) d[n++] = {mask, STARPU_R};
    d[n++] = {y, STARPU_W};
    if (kept) d[n++] = {stats, STARPU_W};
    int ret = NNTILE_TASK_INSERT(cl_fwd(), STARPU_DATA_MODE_ARRAY, d, n, STARPU_CL_ARGS, args, sizeof(AttentionArgs),
                                 STARPU_FLOPS, flops, STARPU_NAME, masked ? "attention_forward_masked" : "attention_forward",
                                 0);
    NNTILE_STARPU_CHECK(ret, "submitting attention_forward seq=" << seq << " c=" << c << " masked=" << masked);
    count_task();
}

void submit_attention_backward(int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                               starpu_data_handle_t dy, starpu_data_handle_t qkv, starpu_data_handle_t mask,
                               starpu_data_handle_t dqkv, float dropout_p, int64_t seed, int64_t first_seq,
                               starpu_data_handle_t y, starpu_data_handle_t stats) {
    const bool masked = mask != nullptr, kept = y != nullptr && stats != nullptr;
    // the backward's products, and without the kept statistics the recomputed forward's
    double flops = (kept ? 2.5 : 3.5) * 4.0 * nseq * seq * seq * c / (masked ? 1 : 2);
    auto *args = cl_args(AttentionArgs{nseq, seq, c, nheads, scale, bf16, masked, {dropout_p, seed, first_seq}, kept});
    starpu_data_descr d[6];
    int n = 0;
    d[n++] = {dy, STARPU_R};
    d[n++] = {qkv, STARPU_R};
    if (masked) d[n++] = {mask, STARPU_R};
    d[n++] = {dqkv, STARPU_W};
    if (kept) {
        d[n++] = {y, STARPU_R};
        d[n++] = {stats, STARPU_R};
    }
    int ret = NNTILE_TASK_INSERT(cl_bwd(), STARPU_DATA_MODE_ARRAY, d, n, STARPU_CL_ARGS, args, sizeof(AttentionArgs),
                                 STARPU_FLOPS, flops, STARPU_NAME,
                                 masked ? "attention_backward_masked" : "attention_backward", 0);
    NNTILE_STARPU_CHECK(ret, "submitting attention_backward seq=" << seq << " c=" << c << " masked=" << masked);
    count_task();
}

}  // namespace nntile::codelets
