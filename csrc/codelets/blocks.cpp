// Codelets for broadcasting a block over a tile's row blocks and summing them (kernels/blocks.h).
#include "../kernels/blocks.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct BlocksArgs {
    int64_t nblk, r, c;
    bool first;
};

uint32_t blocks_footprint(starpu_task *task) {
    const auto &a = args_of<BlocksArgs>(task);
    return hash_ints({a.nblk, a.r, a.c, a.first});
}

template <bool Cuda>
void add_func(void *b[], void *cl_arg) {  // src, dst
    auto *a = static_cast<BlocksArgs *>(cl_arg);
    kernels::add_blocks(where<Cuda>(), a->nblk, a->r, a->c, (const float *)STARPU_VECTOR_GET_PTR(b[0]),
                        (float *)STARPU_VECTOR_GET_PTR(b[1]));
}

template <bool Cuda>
void sum_func(void *b[], void *cl_arg) {  // src, dst
    auto *a = static_cast<BlocksArgs *>(cl_arg);
    kernels::sum_blocks(where<Cuda>(), a->nblk, a->r, a->c, a->first, (const float *)STARPU_VECTOR_GET_PTR(b[0]),
                        (float *)STARPU_VECTOR_GET_PTR(b[1]));
}

starpu_codelet *cl_add() {
    static starpu_codelet *cl = new_codelet<add_func<false>, NNTILE_CUDA_IMPL(add_func<true>)>(
        "add_blocks", "nntile_add_blocks", blocks_footprint);
    return cl;
}
starpu_codelet *cl_sum() {
    static starpu_codelet *cl = new_codelet<sum_func<false>, NNTILE_CUDA_IMPL(sum_func<true>)>(
        "sum_blocks", "nntile_sum_blocks", blocks_footprint);
    return cl;
}

}  // namespace

void submit_add_blocks(int64_t nblk, int64_t r, int64_t c, starpu_data_handle_t src, starpu_data_handle_t dst) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_add(), STARPU_R, src, STARPU_RW, dst, STARPU_CL_ARGS,
                                           cl_args(BlocksArgs{nblk, r, c, false}), sizeof(BlocksArgs), STARPU_NAME,
                                           "add_blocks", 0),
                        "submitting add_blocks nblk=" << nblk << " r=" << r << " c=" << c);
    count_task();
}

void submit_sum_blocks(int64_t nblk, int64_t r, int64_t c, bool first, starpu_data_handle_t src,
                       starpu_data_handle_t dst) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_sum(), STARPU_R, src, first ? STARPU_W : STARPU_RW, dst, STARPU_CL_ARGS,
                                           cl_args(BlocksArgs{nblk, r, c, first}), sizeof(BlocksArgs), STARPU_NAME,
                                           "sum_blocks", 0),
                        "submitting sum_blocks nblk=" << nblk << " r=" << r << " c=" << c);
    count_task();
}

}  // namespace nntile::codelets
