// Codelets for RMSNorm forward and backward on a tile of whole rows (m, c).
#include "../kernels/rmsnorm.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct RmsNormArgs {
    int64_t m, c;
    float eps;
    float beta;  // backward: 0 overwrites the weight gradient accumulator, 1 adds
};

uint32_t rmsnorm_footprint(starpu_task *task) {
    const auto &a = args_of<RmsNormArgs>(task);
    return hash_ints({a.m, a.c, a.beta == 0.f});
}

#define NNTILE_PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

// Buffers: x, weight, y, rstd.
template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<RmsNormArgs *>(cl_arg);
    kernels::rmsnorm_forward(where<Cuda>(), a->m, a->c, a->eps, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2),
                             NNTILE_PTR(3));
}

// Buffers: dy, x, rstd, weight, dx, dweight.
template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<RmsNormArgs *>(cl_arg);
    kernels::rmsnorm_backward(where<Cuda>(), a->m, a->c, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2), NNTILE_PTR(3),
                              NNTILE_PTR(4), NNTILE_PTR(5), a->beta);
}
#undef NNTILE_PTR

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl = new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>(
        "rmsnorm_forward", "nntile_rmsnorm_forward", rmsnorm_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl = new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>(
        "rmsnorm_backward", "nntile_rmsnorm_backward", rmsnorm_footprint);
    return cl;
}

}  // namespace

void submit_rmsnorm_forward(int64_t m, int64_t c, float eps, starpu_data_handle_t x, starpu_data_handle_t weight,
                            starpu_data_handle_t y, starpu_data_handle_t rstd) {
    NNTILE_STARPU_CHECK(
        NNTILE_TASK_INSERT(cl_fwd(), STARPU_R, x, STARPU_R, weight, STARPU_W, y, STARPU_W, rstd, STARPU_CL_ARGS,
                           cl_args(RmsNormArgs{m, c, eps, 0.f}), sizeof(RmsNormArgs), STARPU_FLOPS,
                           (double)(4 * m * c), STARPU_NAME, "rmsnorm_forward", 0),
        "submitting rmsnorm_forward m=" << m << " c=" << c);
    count_task();
}

void submit_rmsnorm_backward(int64_t m, int64_t c, starpu_data_handle_t dy, starpu_data_handle_t x,
                             starpu_data_handle_t rstd, starpu_data_handle_t weight, starpu_data_handle_t dx,
                             starpu_data_handle_t dweight, float beta) {
    auto acc = beta == 0.f ? STARPU_W : STARPU_RW;
    NNTILE_STARPU_CHECK(
        NNTILE_TASK_INSERT(cl_bwd(), STARPU_R, dy, STARPU_R, x, STARPU_R, rstd, STARPU_R, weight, STARPU_W, dx, acc,
                           dweight, STARPU_CL_ARGS, cl_args(RmsNormArgs{m, c, 0.f, beta}), sizeof(RmsNormArgs),
                           STARPU_FLOPS, (double)(9 * m * c), STARPU_NAME, "rmsnorm_backward", 0),
        "submitting rmsnorm_backward m=" << m << " c=" << c);
    count_task();
}

}  // namespace nntile::codelets
