// Codelets for GELU forward (y = gelu(x)) and backward (dx = dy * gelu'(x)) over whole tiles.
#include "../kernels/gelu.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct GeluArgs {
    int64_t n;
    bool tanh_approx;
    bool out_bf16;  // y (forward) or dx (backward) holds bfloat16: a bf16 matmul's input
};

uint32_t gelu_footprint(starpu_task *task) {
    const auto &a = args_of<GeluArgs>(task);
    return hash_ints({a.n, a.tanh_approx, a.out_bf16});
}

template <bool Cuda>
void gelu_fwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GeluArgs *>(cl_arg);
    kernels::Where w = where<Cuda>();
    kernels::gelu_forward(w, a->n, a->tanh_approx, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                          (void *)STARPU_VECTOR_GET_PTR(buffers[1]), a->out_bf16);
}

template <bool Cuda>
void gelu_bwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GeluArgs *>(cl_arg);
    kernels::Where w = where<Cuda>();
    kernels::gelu_backward(w, a->n, a->tanh_approx, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                           (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), (void *)STARPU_VECTOR_GET_PTR(buffers[2]),
                           a->out_bf16);
}

starpu_codelet *cl_gelu_forward() {
    static starpu_codelet *cl =
        new_codelet<gelu_fwd_func<false>, NNTILE_CUDA_IMPL(gelu_fwd_func<true>)>("gelu_forward", "nntile_gelu_forward", gelu_footprint);
    return cl;
}

starpu_codelet *cl_gelu_backward() {
    static starpu_codelet *cl =
        new_codelet<gelu_bwd_func<false>, NNTILE_CUDA_IMPL(gelu_bwd_func<true>)>("gelu_backward", "nntile_gelu_backward", gelu_footprint);
    return cl;
}


}  // namespace

void submit_gelu_forward(int64_t n, bool tanh_approx, starpu_data_handle_t x, starpu_data_handle_t y, bool out_bf16) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gelu_forward(), STARPU_R, x, STARPU_W, y, STARPU_CL_ARGS,
                                           cl_args(GeluArgs{n, tanh_approx, out_bf16}), sizeof(GeluArgs),
                                           STARPU_FLOPS, (double)(20 * n),
                                           STARPU_NAME, "gelu_forward", 0),
                        "submitting gelu_forward n=" << n);
    count_task();
}

void submit_gelu_backward(int64_t n, bool tanh_approx, starpu_data_handle_t dy, starpu_data_handle_t x,
                          starpu_data_handle_t dx, bool out_bf16) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gelu_backward(), STARPU_R, dy, STARPU_R, x, STARPU_W, dx, STARPU_CL_ARGS,
                                           cl_args(GeluArgs{n, tanh_approx, out_bf16}), sizeof(GeluArgs),
                                           STARPU_FLOPS, (double)(30 * n),
                                           STARPU_NAME, "gelu_backward", 0),
                        "submitting gelu_backward n=" << n);
    count_task();
}

}  // namespace nntile::codelets
