// Codelets for embedding lookup and gradient against one vocabulary tile.
#include "../kernels/embedding.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct EmbeddingArgs {
    int64_t m, rows, c, lo;
    bool first;
};

uint32_t embedding_footprint(starpu_task *task) {
    const auto &a = args_of<EmbeddingArgs>(task);
    return hash_ints({a.m, a.rows, a.c, a.first});
}

template <bool Cuda>
void fwd_func(void *buffers[], void *cl_arg) {  // buffers: ids, table, out
    auto *a = static_cast<EmbeddingArgs *>(cl_arg);
    kernels::embedding_forward(where<Cuda>(), a->m, a->rows, a->c, a->lo, a->first,
                               (const int64_t *)STARPU_VECTOR_GET_PTR(buffers[0]),
                               (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), (float *)STARPU_VECTOR_GET_PTR(buffers[2]));
}

template <bool Cuda>
void bwd_func(void *buffers[], void *cl_arg) {  // buffers: ids, dy, dtable
    auto *a = static_cast<EmbeddingArgs *>(cl_arg);
    kernels::embedding_backward(where<Cuda>(), a->m, a->rows, a->c, a->lo, a->first,
                                (const int64_t *)STARPU_VECTOR_GET_PTR(buffers[0]),
                                (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), (float *)STARPU_VECTOR_GET_PTR(buffers[2]));
}

starpu_codelet *cl_fwd() {
    static starpu_codelet *cl =
        new_codelet<fwd_func<false>, NNTILE_CUDA_IMPL(fwd_func<true>)>("embedding_forward", "nntile_embedding_forward", embedding_footprint);
    return cl;
}

starpu_codelet *cl_bwd() {
    static starpu_codelet *cl =
        new_codelet<bwd_func<false>, NNTILE_CUDA_IMPL(bwd_func<true>)>("embedding_backward", "nntile_embedding_backward", embedding_footprint);
    return cl;
}


}  // namespace

void submit_embedding_forward(int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, starpu_data_handle_t ids,
                              starpu_data_handle_t table, starpu_data_handle_t out) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_fwd(), STARPU_R, ids, STARPU_R, table, first ? STARPU_W : STARPU_RW, out,
                                           STARPU_CL_ARGS, cl_args(EmbeddingArgs{m, rows, c, lo, first}), sizeof(EmbeddingArgs),
                                           STARPU_NAME, "embedding_forward", 0),
                        "submitting embedding_forward m=" << m << " rows=" << rows);
    count_task();
}

void submit_embedding_backward(int64_t m, int64_t rows, int64_t c, int64_t lo, bool first, starpu_data_handle_t ids,
                               starpu_data_handle_t dy, starpu_data_handle_t dtable) {
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_bwd(), STARPU_R, ids, STARPU_R, dy, first ? STARPU_W : STARPU_RW, dtable,
                                           STARPU_CL_ARGS, cl_args(EmbeddingArgs{m, rows, c, lo, first}), sizeof(EmbeddingArgs),
                                           STARPU_NAME, "embedding_backward", 0),
                        "submitting embedding_backward m=" << m << " rows=" << rows);
    count_task();
}

}  // namespace nntile::codelets
