// Codelet for the AdamW update of one parameter tile whose moments are 8-bit block-wise (kernels/adamw_q8.h).
#include <cstring>

#include "../kernels/adamw_q8.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

struct AdamWQ8Args {
    int64_t n;
    kernels::AdamWScalars s;
    bool init_state;  // first step: the state tiles are written, not read (all-zero words: zero moments)
    bool copy;        // a fifth buffer takes the updated parameter in bf16
    bool bf16_param;  // the parameter is bf16 (a bf16 master weight: rounded stochastically from hash(seed, element))
    uint64_t seed;
};

uint32_t adamw_q8_footprint(starpu_task *task) {
    auto &a = args_of<AdamWQ8Args>(task);
    return hash_ints({a.n, (int64_t)a.copy, (int64_t)a.bf16_param});
}

size_t state_bytes(void *buffer) { return STARPU_VECTOR_GET_NX(buffer) * STARPU_VECTOR_GET_ELEMSIZE(buffer); }

void adamw_q8_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWQ8Args *>(cl_arg);
    auto *m = (float *)STARPU_VECTOR_GET_PTR(buffers[2]), *v = (float *)STARPU_VECTOR_GET_PTR(buffers[3]);
    if (a->init_state) {
        std::memset(m, 0, state_bytes(buffers[2]));
        std::memset(v, 0, state_bytes(buffers[3]));
    }
    auto *g = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    void *p = (void *)STARPU_VECTOR_GET_PTR(buffers[1]);
    if (a->bf16_param) {
        kernels::adamw_q8_bf16_cpu(a->n, a->s, a->seed, g, (uint16_t *)p, m, v);
        return;
    }
    auto *c = a->copy ? (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[4]) : nullptr;
    kernels::adamw_q8_cpu(a->n, a->s, g, (float *)p, m, v, c);
}

#ifdef NNTILE_USE_CUDA
void adamw_q8_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<AdamWQ8Args *>(cl_arg);
    auto stream = starpu_cuda_get_local_stream();
    auto *m = (float *)STARPU_VECTOR_GET_PTR(buffers[2]), *v = (float *)STARPU_VECTOR_GET_PTR(buffers[3]);
    if (a->init_state) {
        cudaError_t e1 = cudaMemsetAsync(m, 0, state_bytes(buffers[2]), stream);
        cudaError_t e2 = cudaMemsetAsync(v, 0, state_bytes(buffers[3]), stream);
        NNTILE_CHECK(e1 == cudaSuccess && e2 == cudaSuccess, "cudaMemsetAsync of 8-bit AdamW state failed");
    }
    auto *g = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    void *p = (void *)STARPU_VECTOR_GET_PTR(buffers[1]);
    if (a->bf16_param) {
        kernels::adamw_q8_bf16_cuda(stream, a->n, a->s, a->seed, g, (uint16_t *)p, m, v);
        return;
    }
    auto *c = a->copy ? (uint16_t *)STARPU_VECTOR_GET_PTR(buffers[4]) : nullptr;
    kernels::adamw_q8_cuda(stream, a->n, a->s, g, (float *)p, m, v, c);
}
#else
constexpr starpu_cuda_func_t adamw_q8_cuda_func = nullptr;
#endif

starpu_codelet *cl_adamw_q8() {
    static starpu_codelet *cl =
        new_codelet<adamw_q8_cpu_func, adamw_q8_cuda_func>("adamw_q8", "nntile_adamw_q8", adamw_q8_footprint);
    return cl;
}

}  // namespace

void submit_adamw_q8(int64_t n, const kernels::AdamWScalars &s, bool init_state, starpu_data_handle_t grad,
                     starpu_data_handle_t param, starpu_data_handle_t exp_avg, starpu_data_handle_t exp_avg_sq,
                     starpu_data_handle_t copy, bool bf16_param, uint64_t seed) {
    NNTILE_CHECK(!(bf16_param && copy), "adamw_q8: a bf16 master weight is its own bf16 copy (no copy tile)");
    auto *args = cl_args(AdamWQ8Args{n, s, init_state, copy != nullptr, bf16_param, seed});
    auto state_mode = init_state ? STARPU_W : STARPU_RW;
    // ~14 flops of the update and ~2 x 8 compares of the two binary searches per element
    const double flops = (double)(30 * n);
    int rc = copy ? NNTILE_TASK_INSERT(cl_adamw_q8(), STARPU_R, grad, STARPU_RW, param, state_mode, exp_avg,
                                       state_mode, exp_avg_sq, STARPU_W, copy, STARPU_CL_ARGS, args,
                                       sizeof(AdamWQ8Args), STARPU_FLOPS, flops, STARPU_NAME, "adamw_q8+bf16", 0)
                  : NNTILE_TASK_INSERT(cl_adamw_q8(), STARPU_R, grad, STARPU_RW, param, state_mode, exp_avg,
                                       state_mode, exp_avg_sq, STARPU_CL_ARGS, args, sizeof(AdamWQ8Args),
                                       STARPU_FLOPS, flops, STARPU_NAME,
                                       bf16_param ? "adamw_q8.bf16" : "adamw_q8", 0);
    NNTILE_STARPU_CHECK(rc, "submitting adamw_q8 n=" << n);
    count_task();
}

}  // namespace nntile::codelets
