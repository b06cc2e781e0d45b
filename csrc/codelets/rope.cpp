// Codelets for rotary position embeddings and their transpose over a tile of rows of whole heads.
#include "../kernels/rope.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct RopeArgs {
    int64_t rows, width, hd;
};

uint32_t rope_footprint(starpu_task *task) {
    const auto &a = args_of<RopeArgs>(task);
    return hash_ints({a.rows, a.width, a.hd});
}

#define NNTILE_PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

// Buffers: x (dy), cos, sin, y (dx).
template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<RopeArgs *>(cl_arg);
    kernels::rope_forward(where<Cuda>(), a->rows, a->width, a->hd, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2),
                          NNTILE_PTR(3));
}

template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<RopeArgs *>(cl_arg);
    kernels::rope_backward(where<Cuda>(), a->rows, a->width, a->hd, NNTILE_PTR(0), NNTILE_PTR(1), NNTILE_PTR(2),
                           NNTILE_PTR(3));
}
#undef NNTILE_PTR

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl = new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>(
        "rope_forward", "nntile_rope_forward", rope_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl = new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>(
        "rope_backward", "nntile_rope_backward", rope_footprint);
    return cl;
}

}  // namespace

void submit_rope(bool backward, int64_t rows, int64_t width, int64_t hd, starpu_data_handle_t x,
                 starpu_data_handle_t cos, starpu_data_handle_t sin, starpu_data_handle_t y) {
    const char *name = backward ? "rope_backward" : "rope_forward";
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(backward ? cl_bwd() : cl_fwd(), STARPU_R, x, STARPU_R, cos, STARPU_R, sin,
                                           STARPU_W, y, STARPU_CL_ARGS, cl_args(RopeArgs{rows, width, hd}),
                                           sizeof(RopeArgs), STARPU_FLOPS, (double)(3 * rows * width), STARPU_NAME,
                                           name, 0),
                        "submitting " << name << " rows=" << rows << " width=" << width << " hd=" << hd);
    count_task();
}

}  // namespace nntile::codelets
