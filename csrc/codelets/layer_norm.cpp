// Codelets for LayerNorm forward and backward on a tile of whole rows (m, c).
#include "../kernels/layer_norm.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct LayerNormArgs {
    int64_t m, c;
    float eps;
    float beta;  // backward: 0 overwrites the weight/bias gradient accumulators, 1 adds
    bool y_bf16;  // forward: y holds bfloat16 (a bf16 matmul's input)
};

uint32_t layer_norm_footprint(starpu_task *task) {
    const auto &a = args_of<LayerNormArgs>(task);
    return hash_ints({a.m, a.c, a.beta == 0.f, a.y_bf16});
}

#define NNTILE_PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

// Buffers: x, weight, bias, y, mean, rstd.
template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<LayerNormArgs *>(cl_arg);
    kernels::Where w = where<Cuda>();
    kernels::layer_norm_forward(w, a->m, a->c, a->eps, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2),
                                (void *)STARPU_VECTOR_GET_PTR(buffers[3]), a->y_bf16, NNTILE_PTR(4), NNTILE_PTR(5));
}

// Buffers: dy, x, mean, rstd, weight, dx, dweight, dbias.
template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<LayerNormArgs *>(cl_arg);
    kernels::Where w = where<Cuda>();
    kernels::layer_norm_backward(w, a->m, a->c, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2), NNTILE_PTR(3),
                                 NNTILE_PTR(4), NNTILE_PTR(5), NNTILE_PTR(6), NNTILE_PTR(7), a->beta);
}
#undef NNTILE_PTR

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl =
        new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>("layer_norm_forward", "nntile_layer_norm_forward", layer_norm_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl = new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>("layer_norm_backward", "nntile_layer_norm_backward", layer_norm_footprint);
    return cl;
}


}  // namespace

void submit_layer_norm_forward(int64_t m, int64_t c, float eps, starpu_data_handle_t x, starpu_data_handle_t weight,
                               starpu_data_handle_t bias, starpu_data_handle_t y, starpu_data_handle_t mean,
                               starpu_data_handle_t rstd, bool y_bf16) {
    NNTILE_STARPU_CHECK(
        NNTILE_TASK_INSERT(cl_fwd(), STARPU_R, x, STARPU_R, weight, STARPU_R, bias, STARPU_W, y, STARPU_W, mean,
                           STARPU_W, rstd, STARPU_CL_ARGS, cl_args(LayerNormArgs{m, c, eps, 0.f, y_bf16}),
                           sizeof(LayerNormArgs),
                           STARPU_FLOPS, (double)(8 * m * c), STARPU_NAME, "layer_norm_forward", 0),
        "submitting layer_norm_forward m=" << m << " c=" << c);
    count_task();
}

void submit_layer_norm_backward(int64_t m, int64_t c, starpu_data_handle_t dy, starpu_data_handle_t x,
                                starpu_data_handle_t mean, starpu_data_handle_t rstd, starpu_data_handle_t weight,
                                starpu_data_handle_t dx, starpu_data_handle_t dweight, starpu_data_handle_t dbias,
                                float beta) {
    auto acc = beta == 0.f ? STARPU_W : STARPU_RW;
    NNTILE_STARPU_CHECK(
        NNTILE_TASK_INSERT(cl_bwd(), STARPU_R, dy, STARPU_R, x, STARPU_R, mean, STARPU_R, rstd, STARPU_R, weight,
                           STARPU_W, dx, acc, dweight, acc, dbias, STARPU_CL_ARGS, cl_args(LayerNormArgs{m, c, 0.f, beta, false}),
                           sizeof(LayerNormArgs), STARPU_FLOPS, (double)(12 * m * c), STARPU_NAME,
                           "layer_norm_backward", 0),
        "submitting layer_norm_backward m=" << m << " c=" << c);
    count_task();
}

}  // namespace nntile::codelets
