// Codelet for dropout on one tile (kernels/dropout.h); forward and backward are the same task on x or dy.
#include "../kernels/dropout.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct DropoutArgs {
    kernels::DropoutTile tile;
    int64_t n, seed;
    float p;
};

uint32_t dropout_footprint(starpu_task *task) { return hash_ints({args_of<DropoutArgs>(task).n}); }

template <bool Cuda>
void func(void *b[], void *cl_arg) {  // x, y
    auto *a = static_cast<DropoutArgs *>(cl_arg);
    kernels::dropout(where<Cuda>(), a->tile, a->seed, a->p, (const float *)STARPU_VECTOR_GET_PTR(b[0]),
                     (float *)STARPU_VECTOR_GET_PTR(b[1]));
}

starpu_codelet *cl() {
    static starpu_codelet *c =
        new_codelet<func<false>, NNTILE_CUDA_IMPL(func<true>)>("dropout", "nntile_dropout", dropout_footprint);
    return c;
}

}  // namespace

void submit_dropout(const kernels::DropoutTile &tile, int64_t seed, float p, starpu_data_handle_t x,
                    starpu_data_handle_t y) {
    int64_t n = 1;
    for (int64_t d = 0; d < tile.ndim; ++d) n *= tile.extents[d];
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl(), STARPU_R, x, STARPU_W, y, STARPU_CL_ARGS,
                                           cl_args(DropoutArgs{tile, n, seed, p}), sizeof(DropoutArgs), STARPU_NAME,
                                           "dropout", 0),
                        "submitting dropout n=" << n);
    count_task();
}

}  // namespace nntile::codelets
