// Codelet for the bias gradient (column sums); the forward bias is added by the GEMM (codelets/gemm.cpp).
#include "../kernels/bias.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct BiasArgs {
    int64_t m, n;
    float beta;
};

uint32_t bias_footprint(starpu_task *task) {
    const auto &a = args_of<BiasArgs>(task);
    return hash_ints({a.m, a.n, a.beta == 0.f});
}

// Buffers: dy, db.
template <bool Cuda>
void bias_grad_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<BiasArgs *>(cl_arg);
    kernels::bias_grad(where<Cuda>(), a->m, a->n, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), a->beta,
                       (float *)STARPU_VECTOR_GET_PTR(buffers[1]));
}

starpu_codelet *cl_bias_grad() {
    static starpu_codelet *cl = new_codelet<bias_grad_func<false>, NNTILE_CUDA_IMPL(bias_grad_func<true>)>("bias_grad", "nntile_bias_grad", bias_footprint);
    return cl;
}


}  // namespace

void submit_bias_grad(int64_t m, int64_t n, starpu_data_handle_t dy, float beta, starpu_data_handle_t db) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_bias_grad(), STARPU_R, dy, beta == 0.f ? STARPU_W : STARPU_RW, db,
                                           STARPU_CL_ARGS, cl_args(BiasArgs{m, n, beta}), sizeof(BiasArgs), STARPU_FLOPS,
                                           (double)(m * n), STARPU_NAME, "bias_grad", 0),
                        "submitting bias_grad m=" << m << " n=" << n);
    count_task();
}

}  // namespace nntile::codelets
