// Codelet for the AdamW update of one parameter tile with its gradient and two state tiles.
#include <cstring>

#include "../kernels/adamw.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct AdamWArgs {
    int64_t n;
    kernels::AdamWScalars s;
    bool init_state;  // first step: the state tiles are written, not read (they start at zero)
    bool bf16_state;  // state tiles hold bf16 (stochastic rounding from hash(seed, element))
    uint64_t seed;
    bool copy;  // a fifth buffer takes the updated parameter in bf16
    bool bf16_param;  // the parameter is bf16 too (bf16 master weights; bf16 states, no copy)
};

uint32_t adamw_footprint(starpu_task *task) {
    auto &a = args_of<AdamWArgs>(task);
    return hash_ints({a.n, (int64_t)a.bf16_state, (int64_t)a.copy, (int64_t)a.bf16_param});
}

void adamw_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWArgs *>(cl_arg);
    auto *m = (void *)STARPU_VECTOR_GET_PTR(buffers[2]), *v = (void *)STARPU_VECTOR_GET_PTR(buffers[3]);
    size_t bytes = a->n * (a->bf16_state ? sizeof(uint16_t) : sizeof(float));
    if (a->init_state) {  // all-zero bits are 0.0 in both types
        std::memset(m, 0, bytes);
        std::memset(v, 0, bytes);
    }
    auto *g = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    auto *p = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    auto *c = a->copy ? (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[4]) : nullptr;
    if (a->bf16_param)
        kernels::adamw_bf16_cpu(a->n, a->s, a->seed, g, (uint16_t *)p, (uint16_t *)m, (uint16_t *)v);
    else if (a->bf16_state)
        kernels::adamw_bf16state_cpu(a->n, a->s, a->seed, g, p, (uint16_t *)m, (uint16_t *)v, c);
    else
        kernels::adamw_cpu(a->n, a->s, g, p, (float *)m, (float *)v, c);
}

#ifdef NNTILE_USE_CUDA
void adamw_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWArgs *>(cl_arg);
    auto stream = starpu_cuda_get_local_stream();
    auto *m = (void *)STARPU_VECTOR_GET_PTR(buffers[2]), *v = (void *)STARPU_VECTOR_GET_PTR(buffers[3]);
    size_t bytes = a->n * (a->bf16_state ? sizeof(uint16_t) : sizeof(float));
    if (a->init_state) {
        cudaError_t e1 = cudaMemsetAsync(m, 0, bytes, stream);
        cudaError_t e2 = cudaMemsetAsync(v, 0, bytes, stream);
        NNTILE_CHECK(e1 == cudaSuccess && e2 == cudaSuccess, "cudaMemsetAsync of AdamW state failed");
    }
    auto *g = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    auto *p = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    auto *c = a->copy ? (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[4]) : nullptr;
    if (a->bf16_param)
        kernels::adamw_bf16_cuda(stream, a->n, a->s, a->seed, g, (uint16_t *)p, (uint16_t *)m, (uint16_t *)v);
    else if (a->bf16_state)
        kernels::adamw_bf16state_cuda(stream, a->n, a->s, a->seed, g, p, (uint16_t *)m, (uint16_t *)v, c);
    else
        kernels::adamw_cuda(stream, a->n, a->s, g, p, (float *)m, (float *)v, c);
}
#else
constexpr starpu_cuda_func_t adamw_cuda_func = nullptr;
#endif

starpu_codelet *cl_adamw() {
    static starpu_codelet *cl = new_codelet<adamw_cpu_func, adamw_cuda_func>("adamw", "nntile_adamw", adamw_footprint);
    return cl;
}

}  // namespace

void submit_adamw(int64_t n, const kernels::AdamWScalars &s, bool init_state, bool bf16_state, uint64_t seed,
                  starpu_data_handle_t grad, starpu_data_handle_t param, starpu_data_handle_t exp_avg,
                  starpu_data_handle_t exp_avg_sq, starpu_data_handle_t copy, bool bf16_param) {
    auto *args = cl_args(AdamWArgs{n, s, init_state, bf16_state, seed, copy != nullptr, bf16_param});
    auto state_mode = init_state ? STARPU_W : STARPU_RW;
    int rc = copy ? NNTILE_TASK_INSERT(cl_adamw(), STARPU_R, grad, STARPU_RW, param, state_mode, exp_avg, state_mode,
                                       exp_avg_sq, STARPU_W, copy, STARPU_CL_ARGS, args, sizeof(AdamWArgs),
                                       STARPU_FLOPS, (double)(14 * n), STARPU_NAME, "adamw+bf16", 0)
                  : NNTILE_TASK_INSERT(cl_adamw(), STARPU_R, grad, STARPU_RW, param, state_mode, exp_avg, state_mode,
                                       exp_avg_sq, STARPU_CL_ARGS, args, sizeof(AdamWArgs), STARPU_FLOPS,
                                       (double)(14 * n), STARPU_NAME, bf16_param ? "adamw.bf16" : "adamw", 0);
    NNTILE_STARPU_CHECK(rc, "submitting adamw n=" << n);
    count_task();
}

}  // namespace nntile::codelets
