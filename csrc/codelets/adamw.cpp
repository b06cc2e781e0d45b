// Codelet for the AdamW update of one parameter tile with its gradient and two state tiles.
#include "../kernels/adamw.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct AdamWArgs {
    int64_t n;
    kernels::AdamWScalars s;
    bool init_state;  // first step: the state tiles are written, not read (they start at zero)
};

uint32_t adamw_footprint(starpu_task *task) { return hash_ints({args_of<AdamWArgs>(task).n}); }

void zero_state(const AdamWArgs &a, float *m, float *v) {
    for (int64_t i = 0; i < a.n; ++i) m[i] = v[i] = 0.f;
}

void adamw_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWArgs *>(cl_arg);
    auto *m = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    auto *v = (float *)STARPU_VECTOR_GET_PTR(buffers[3]);
    if (a->init_state) zero_state(*a, m, v);
    kernels::adamw_cpu(a->n, a->s, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                       (float *)STARPU_VECTOR_GET_PTR(buffers[1]), m, v);
}

#ifdef NNTILE_USE_CUDA
void adamw_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWArgs *>(cl_arg);
    auto stream = starpu_cuda_get_local_stream();
    auto *m = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    auto *v = (float *)STARPU_VECTOR_GET_PTR(buffers[3]);
    if (a->init_state) {
        cudaError_t e1 = cudaMemsetAsync(m, 0, a->n * sizeof(float), stream);
        cudaError_t e2 = cudaMemsetAsync(v, 0, a->n * sizeof(float), stream);
        NNTILE_CHECK(e1 == cudaSuccess && e2 == cudaSuccess, "cudaMemsetAsync of AdamW state failed");
    }
    kernels::adamw_cuda(stream, a->n, a->s, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]),
                        (float *)STARPU_VECTOR_GET_PTR(buffers[1]), m, v);
}
#else
constexpr starpu_cuda_func_t adamw_cuda_func = nullptr;
#endif

starpu_codelet *cl_adamw() {
    static starpu_codelet *cl = new_codelet<adamw_cpu_func, adamw_cuda_func>("adamw", "nntile_adamw", adamw_footprint);
    return cl;
}

}  // namespace

void submit_adamw(int64_t n, const kernels::AdamWScalars &s, bool init_state, starpu_data_handle_t grad,
                  starpu_data_handle_t param, starpu_data_handle_t exp_avg, starpu_data_handle_t exp_avg_sq) {
    auto *args = cl_args(AdamWArgs{n, s, init_state});
    auto state_mode = init_state ? STARPU_W : STARPU_RW;
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_adamw(), STARPU_R, grad, STARPU_RW, param, state_mode, exp_avg,
                                           state_mode, exp_avg_sq, STARPU_CL_ARGS, args, sizeof(AdamWArgs),
                                           STARPU_FLOPS, (double)(14 * n), STARPU_NAME, "adamw", 0),
                        "submitting adamw n=" << n);
    count_task();
}

}  // namespace nntile::codelets
