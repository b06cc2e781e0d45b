// Codelet for the tile GEMM: CPU (ATen BLAS) and CUDA (cuBLAS on StarPU's worker stream and handle).
#include "codelet_util.h"
#include "codelets.h"
#ifdef NNTILE_USE_CUDA
#include <starpu_cublas_v2.h>
#endif

namespace nntile::codelets {

namespace {

struct GemmArgs {
    kernels::GemmShape shape;
    Precision precision;
    DType ta, tb, tc;
    bool bias;  // a fourth buffer: float32 bias (n,) added to every row of C
};

const float *bias_of(void *buffers[], const GemmArgs *a) {
    return a->bias ? (const float *)STARPU_VECTOR_GET_PTR(buffers[3]) : nullptr;
}

void gemm_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GemmArgs *>(cl_arg);
    kernels::gemm_cpu(a->shape, a->ta, (void *)STARPU_VECTOR_GET_PTR(buffers[0]), a->tb,
                      (void *)STARPU_VECTOR_GET_PTR(buffers[1]), a->tc, (void *)STARPU_VECTOR_GET_PTR(buffers[2]),
                      a->precision, bias_of(buffers, a));
}

#ifdef NNTILE_USE_CUDA
void gemm_cuda_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GemmArgs *>(cl_arg);
    // StarPU's handle already queues on this worker's stream; asking for the stream here as well tells StarPU so,
    // which it checks once per worker: otherwise a first task that is a GEMM prints a false warning that kernels go
    // to another stream ("CUDA will thus introduce a lot of useless synchronizations").
    cublasHandle_t handle = starpu_cublas_get_local_handle();
    NNTILE_CHECK(cublasSetStream(handle, starpu_cuda_get_local_stream()) == CUBLAS_STATUS_SUCCESS,
                 "cublasSetStream failed");
    kernels::gemm_cuda(handle, starpu_cuda_get_local_stream(), a->shape, a->ta,
                       (void *)STARPU_VECTOR_GET_PTR(buffers[0]), a->tb, (void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                       a->tc, (void *)STARPU_VECTOR_GET_PTR(buffers[2]), a->precision, bias_of(buffers, a));
}
#else
constexpr starpu_cuda_func_t gemm_cuda_func = nullptr;
#endif

uint32_t gemm_footprint(starpu_task *task) {
    const auto &a = args_of<GemmArgs>(task);
    return hash_ints({a.shape.m, a.shape.n, a.shape.k, a.shape.trans_a, a.shape.trans_b, (int64_t)a.precision,
                      (int64_t)a.ta, (int64_t)a.tb, (int64_t)a.tc, a.shape.beta == 0.f, a.bias});
}

starpu_codelet *cl_gemm() {
    static starpu_codelet *cl = new_codelet<gemm_cpu_func, gemm_cuda_func>("gemm", "nntile_gemm", gemm_footprint);
    return cl;
}

}  // namespace

void submit_gemm(const kernels::GemmShape &s, Precision precision, DType ta, starpu_data_handle_t a, DType tb,
                 starpu_data_handle_t b, DType tc, starpu_data_handle_t c, int priority, starpu_data_handle_t bias) {
    auto *args = cl_args(GemmArgs{s, precision, ta, tb, tc, bias != nullptr});
    double flops = 2.0 * s.m * s.n * s.k;
    starpu_data_access_mode c_mode = s.beta == 0.f ? STARPU_W : STARPU_RW;
    if (bias)
        NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gemm(), STARPU_R, a, STARPU_R, b, c_mode, c, STARPU_R, bias,
                                               STARPU_CL_ARGS, args, sizeof(GemmArgs), STARPU_FLOPS, flops,
                                               STARPU_PRIORITY, priority, STARPU_NAME, "gemm+bias", 0),
                            "submitting gemm+bias m=" << s.m << " n=" << s.n << " k=" << s.k);
    else
        NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gemm(), STARPU_R, a, STARPU_R, b, c_mode, c, STARPU_CL_ARGS, args,
                                               sizeof(GemmArgs), STARPU_FLOPS, flops, STARPU_PRIORITY, priority,
                                               STARPU_NAME, "gemm", 0),
                            "submitting gemm m=" << s.m << " n=" << s.n << " k=" << s.k);
    count_task();
}

}  // namespace nntile::codelets
