// Codelet for dtype conversion of a whole tile.
#include "../kernels/convert.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct ConvertArgs {
    int64_t n;
    DType src, dst;
};

uint32_t convert_footprint(starpu_task *task) {
    const auto &a = args_of<ConvertArgs>(task);
    return hash_ints({a.n, (int64_t)a.src, (int64_t)a.dst});
}

void convert_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<ConvertArgs *>(cl_arg);
    kernels::convert_cpu(a->n, a->src, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]), a->dst,
                         (void *)STARPU_VECTOR_GET_PTR(buffers[1]));
}

#ifdef NNTILE_USE_CUDA
void convert_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<ConvertArgs *>(cl_arg);
    kernels::convert_cuda(starpu_cuda_get_local_stream(), a->n, a->src, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]),
                          a->dst, (void *)STARPU_VECTOR_GET_PTR(buffers[1]));
}
#else
constexpr starpu_cuda_func_t convert_cuda_func = nullptr;
#endif

starpu_codelet *cl_convert() {
    static starpu_codelet *cl =
        new_codelet<convert_cpu_func, convert_cuda_func>("convert", "nntile_convert", convert_footprint);
    return cl;
}

}  // namespace

void submit_convert(int64_t n, DType src_type, starpu_data_handle_t src, DType dst_type, starpu_data_handle_t dst) {
    auto *args = cl_args(ConvertArgs{n, src_type, dst_type});
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_convert(), STARPU_R, src, STARPU_W, dst, STARPU_CL_ARGS, args,
                                           sizeof(ConvertArgs), STARPU_NAME, "convert", 0),
                        "submitting convert n=" << n);
    count_task();
}

}  // namespace nntile::codelets
