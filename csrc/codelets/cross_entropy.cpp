// Codelets for cross-entropy over vocabulary tiles: per-row stats, per-row-tile sums, the loss, the gradient.
#include "../kernels/cross_entropy.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct CeArgs {
    int64_t m, vj, lo;
    bool flag;  // stats, sum: first in the chain; loss, backward: mean reduction
};

uint32_t ce_footprint(starpu_task *task) {
    const auto &a = args_of<CeArgs>(task);
    return hash_ints({a.m, a.vj, a.flag});
}

template <class T>
T *ptr(void *buffer) {
    return reinterpret_cast<T *>(STARPU_VECTOR_GET_PTR(buffer));
}

template <bool Cuda>
void stats_func(void *b[], void *cl_arg) {  // labels, x, stats
    auto *a = static_cast<CeArgs *>(cl_arg);
    kernels::cross_entropy_stats(where<Cuda>(), a->m, a->vj, a->lo, a->flag, ptr<const int64_t>(b[0]),
                                 ptr<const float>(b[1]), ptr<float>(b[2]));
}

template <bool Cuda>
void sum_func(void *b[], void *cl_arg) {  // labels, stats, acc
    auto *a = static_cast<CeArgs *>(cl_arg);
    kernels::cross_entropy_sum(where<Cuda>(), a->m, a->flag, ptr<const int64_t>(b[0]), ptr<const float>(b[1]),
                               ptr<float>(b[2]));
}

template <bool Cuda>
void loss_func(void *b[], void *cl_arg) {  // acc, loss
    auto *a = static_cast<CeArgs *>(cl_arg);
    kernels::cross_entropy_loss(where<Cuda>(), a->flag, ptr<const float>(b[0]), ptr<float>(b[1]));
}

template <bool Cuda>
void bwd_func(void *b[], void *cl_arg) {  // labels, x, stats, acc, gout, dx
    auto *a = static_cast<CeArgs *>(cl_arg);
    kernels::cross_entropy_backward(where<Cuda>(), a->m, a->vj, a->lo, a->flag, ptr<const int64_t>(b[0]),
                                    ptr<const float>(b[1]), ptr<const float>(b[2]), ptr<const float>(b[3]),
                                    ptr<const float>(b[4]), ptr<float>(b[5]));
}

starpu_codelet *cl_stats() {
    static starpu_codelet *cl = new_codelet<stats_func<false>, NNTILE_CUDA_IMPL(stats_func<true>)>(
        "cross_entropy_stats", "nntile_cross_entropy_stats", ce_footprint);
    return cl;
}
starpu_codelet *cl_sum() {
    static starpu_codelet *cl = new_codelet<sum_func<false>, NNTILE_CUDA_IMPL(sum_func<true>)>(
        "cross_entropy_sum", "nntile_cross_entropy_sum", ce_footprint);
    return cl;
}
starpu_codelet *cl_loss() {
    static starpu_codelet *cl = new_codelet<loss_func<false>, NNTILE_CUDA_IMPL(loss_func<true>)>(
        "cross_entropy_loss", "nntile_cross_entropy_loss", ce_footprint);
    return cl;
}
starpu_codelet *cl_bwd() {
    static starpu_codelet *cl = new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>(
        "cross_entropy_backward", "nntile_cross_entropy_backward", ce_footprint);
    return cl;
}

}  // namespace

void submit_cross_entropy_stats(int64_t m, int64_t vj, int64_t lo, bool first, starpu_data_handle_t labels,
                                starpu_data_handle_t x, starpu_data_handle_t stats) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_stats(), STARPU_R, labels, STARPU_R, x, first ? STARPU_W : STARPU_RW,
                                           stats, STARPU_CL_ARGS, cl_args(CeArgs{m, vj, lo, first}), sizeof(CeArgs),
                                           STARPU_NAME, "cross_entropy_stats", 0),
                        "submitting cross_entropy_stats m=" << m << " vj=" << vj);
    count_task();
}

void submit_cross_entropy_sum(int64_t m, bool first, starpu_data_handle_t labels, starpu_data_handle_t stats,
                              starpu_data_handle_t acc) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_sum(), STARPU_R, labels, STARPU_R, stats, first ? STARPU_W : STARPU_RW,
                                           acc, STARPU_CL_ARGS, cl_args(CeArgs{m, 0, 0, first}), sizeof(CeArgs),
                                           STARPU_NAME, "cross_entropy_sum", 0),
                        "submitting cross_entropy_sum m=" << m);
    count_task();
}

void submit_cross_entropy_loss(bool mean, starpu_data_handle_t acc, starpu_data_handle_t loss) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_loss(), STARPU_R, acc, STARPU_W, loss, STARPU_CL_ARGS,
                                           cl_args(CeArgs{0, 0, 0, mean}), sizeof(CeArgs), STARPU_NAME,
                                           "cross_entropy_loss", 0),
                        "submitting cross_entropy_loss");
    count_task();
}

void submit_cross_entropy_backward(int64_t m, int64_t vj, int64_t lo, bool mean, starpu_data_handle_t labels,
                                   starpu_data_handle_t x, starpu_data_handle_t stats, starpu_data_handle_t acc,
                                   starpu_data_handle_t gout, starpu_data_handle_t dx) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_bwd(), STARPU_R, labels, STARPU_R, x, STARPU_R, stats, STARPU_R, acc,
                                           STARPU_R, gout, STARPU_W, dx, STARPU_CL_ARGS,
                                           cl_args(CeArgs{m, vj, lo, mean}), sizeof(CeArgs), STARPU_NAME,
                                           "cross_entropy_backward", 0),
                        "submitting cross_entropy_backward m=" << m << " vj=" << vj);
    count_task();
}

}  // namespace nntile::codelets
