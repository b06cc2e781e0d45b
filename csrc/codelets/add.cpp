// Codelet for y = alpha x + beta y over whole tiles.
#include "../kernels/add.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct AddArgs {
    int64_t n;
    float alpha, beta;
};

uint32_t add_footprint(starpu_task *task) {
    const auto &a = args_of<AddArgs>(task);
    return hash_ints({a.n, a.beta == 0.f});
}

void add_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AddArgs *>(cl_arg);
    kernels::add_cpu(a->n, a->alpha, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), a->beta,
                     (float *)STARPU_VECTOR_GET_PTR(buffers[1]));
}

#ifdef NNTILE_USE_CUDA
void add_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AddArgs *>(cl_arg);
    kernels::add_cuda(starpu_cuda_get_local_stream(), a->n, a->alpha, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                      a->beta, (float *)STARPU_VECTOR_GET_PTR(buffers[1]));
}
#else
constexpr starpu_cuda_func_t add_cuda_func = nullptr;
#endif

starpu_codelet *cl_add() {
    static starpu_codelet *cl = new_codelet<add_cpu_func, add_cuda_func>("add", "nntile_add", add_footprint);
    return cl;
}

uint32_t add_into_footprint(starpu_task *task) { return hash_ints({args_of<AddArgs>(task).n}); }

void add_into_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AddArgs *>(cl_arg);
    kernels::add_into_cpu(a->n, a->alpha, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), a->beta,
                          (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), (float *)STARPU_VECTOR_GET_PTR(buffers[2]));
}

#ifdef NNTILE_USE_CUDA
void add_into_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AddArgs *>(cl_arg);
    kernels::add_into_cuda(starpu_cuda_get_local_stream(), a->n, a->alpha,
                           (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), a->beta,
                           (const float *)STARPU_VECTOR_GET_PTR(buffers[1]), (float *)STARPU_VECTOR_GET_PTR(buffers[2]));
}
#else
constexpr starpu_cuda_func_t add_into_cuda_func = nullptr;
#endif

starpu_codelet *cl_add_into() {
    static starpu_codelet *cl =
        new_codelet<add_into_cpu_func, add_into_cuda_func>("add_into", "nntile_add_into", add_into_footprint);
    return cl;
}

}  // namespace

void submit_add(int64_t n, float alpha, starpu_data_handle_t x, float beta, starpu_data_handle_t y) {
    auto *args = cl_args(AddArgs{n, alpha, beta});
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_add(), STARPU_R, x, beta == 0.f ? STARPU_W : STARPU_RW, y,
                                           STARPU_CL_ARGS, args, sizeof(AddArgs), STARPU_FLOPS, (double)(2 * n),
                                           STARPU_NAME, "add", 0),
                        "submitting add n=" << n);
    count_task();
}

void submit_add_into(int64_t n, float alpha, starpu_data_handle_t x, float beta, starpu_data_handle_t y,
                     starpu_data_handle_t z) {
    auto *args = cl_args(AddArgs{n, alpha, beta});
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_add_into(), STARPU_R, x, STARPU_R, y, STARPU_W, z, STARPU_CL_ARGS, args,
                                           sizeof(AddArgs), STARPU_FLOPS, (double)(3 * n), STARPU_NAME, "add_into", 0),
                        "submitting add_into n=" << n);
    count_task();
}

}  // namespace nntile::codelets
