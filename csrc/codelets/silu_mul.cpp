// Codelets for the gated MLP's y = silu(g) * u and its backward over whole tiles (n values each).
#include "../kernels/silu_mul.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct SiluMulArgs {
    int64_t n;
};

uint32_t silu_mul_footprint(starpu_task *task) { return hash_ints({args_of<SiluMulArgs>(task).n}); }

#define NNTILE_PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

// Buffers: g, u, y.
template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<SiluMulArgs *>(cl_arg);
    kernels::silu_mul_forward(where<Cuda>(), a->n, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2));
}

// Buffers: dy, g, u, dg, du.
template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<SiluMulArgs *>(cl_arg);
    kernels::silu_mul_backward(where<Cuda>(), a->n, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2), NNTILE_PTR(3),
                               NNTILE_PTR(4));
}
#undef NNTILE_PTR

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl = new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>(
        "silu_mul_forward", "nntile_silu_mul_forward", silu_mul_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl = new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>(
        "silu_mul_backward", "nntile_silu_mul_backward", silu_mul_footprint);
    return cl;
}

}  // namespace

void submit_silu_mul_forward(int64_t n, starpu_data_handle_t g, starpu_data_handle_t u, starpu_data_handle_t y) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_fwd(), STARPU_R, g, STARPU_R, u, STARPU_W, y, STARPU_CL_ARGS,
                                           cl_args(SiluMulArgs{n}), sizeof(SiluMulArgs), STARPU_FLOPS,
                                           (double)(6 * n), STARPU_NAME, "silu_mul_forward", 0),
                        "submitting silu_mul_forward n=" << n);
    count_task();
}

void submit_silu_mul_backward(int64_t n, starpu_data_handle_t dy, starpu_data_handle_t g, starpu_data_handle_t u,
                              starpu_data_handle_t dg, starpu_data_handle_t du) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_bwd(), STARPU_R, dy, STARPU_R, g, STARPU_R, u, STARPU_W, dg, STARPU_W,
                                           du, STARPU_CL_ARGS, cl_args(SiluMulArgs{n}), sizeof(SiluMulArgs),
                                           STARPU_FLOPS, (double)(12 * n), STARPU_NAME, "silu_mul_backward", 0),
                        "submitting silu_mul_backward n=" << n);
    count_task();
}

}  // namespace nntile::codelets
