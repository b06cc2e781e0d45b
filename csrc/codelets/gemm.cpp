// Codelet for the tile GEMM: CPU (ATen BLAS) and CUDA (cuBLAS on StarPU's worker stream and handle).
#include "../kernels/convert.h"
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
    bool bias;  // a buffer after C: float32 bias (n,) added to every row of C
    // a buffer after C: float32 bias gradient, the column sums of dy = A (of_b false) or B (kernels::GemmBiasGrad),
    // written (bias_grad_beta 0) or accumulated (1: the next row tiles of dy)
    bool bias_grad, bias_grad_of_b;
    float bias_grad_beta;
    // A's tile is first written by this task from a float32 source tile of a_elements values (the first buffer;
    // A, B, C, bias follow): the cast of a matmul input to bf16 rides with the first GEMM that reads it, instead of
    // being a task of its own between its producer and this GEMM.
    bool cast_a;
    int64_t a_elements;
    // the last buffer: float32 C-shaped residual added to C last (a Linear's output joining the residual stream;
    // given to the task that finishes C's tile: the K chain's last)
    bool residual;
};

// The buffers in the order the task was given them: (a_source,) a, b, c, (bias or bias_grad).
struct GemmBuffers {
    const float *a_source = nullptr;
    void *a, *b, *c;
    const float *bias = nullptr;
    kernels::GemmBiasGrad bias_grad;
    const float *residual = nullptr;
};

GemmBuffers buffers_of(void *buffers[], const GemmArgs *a) {
    int i = 0;
    GemmBuffers g;
    if (a->cast_a) g.a_source = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    g.a = (void *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    g.b = (void *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    g.c = (void *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    if (a->bias) g.bias = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    if (a->bias_grad)
        g.bias_grad = {(float *)STARPU_VECTOR_GET_PTR(buffers[i++]), a->bias_grad_of_b, a->bias_grad_beta != 0.f};
    if (a->residual) g.residual = (const float *)STARPU_VECTOR_GET_PTR(buffers[i++]);
    return g;
}

void gemm_cpu_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GemmArgs *>(cl_arg);
    auto g = buffers_of(buffers, a);
    if (a->cast_a) kernels::convert_cpu(a->a_elements, DType::f32, g.a_source, a->ta, g.a);
    kernels::gemm_cpu(a->shape, a->ta, g.a, a->tb, g.b, a->tc, g.c, a->precision, g.bias, g.bias_grad, g.residual);
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
    auto g = buffers_of(buffers, a);
    if (a->cast_a)
        kernels::convert_cuda(starpu_cuda_get_local_stream(), a->a_elements, DType::f32, g.a_source, a->ta, g.a);
    kernels::gemm_cuda(handle, starpu_cuda_get_local_stream(), a->shape, a->ta, g.a, a->tb, g.b, a->tc, g.c,
                       a->precision, g.bias, g.bias_grad, g.residual);
}
#else
constexpr starpu_cuda_func_t gemm_cuda_func = nullptr;
#endif

uint32_t gemm_footprint(starpu_task *task) {
    const auto &a = args_of<GemmArgs>(task);
    return hash_ints({a.shape.m, a.shape.n, a.shape.k, a.shape.trans_a, a.shape.trans_b, (int64_t)a.precision,
                      (int64_t)a.ta, (int64_t)a.tb, (int64_t)a.tc, a.shape.beta == 0.f, a.bias, a.cast_a,
                      a.bias_grad, a.bias_grad_of_b});  // a residual: the same history (one C tile read more)
}

starpu_codelet *cl_gemm() {
    static starpu_codelet *cl = new_codelet<gemm_cpu_func, gemm_cuda_func>("gemm", "nntile_gemm", gemm_footprint);
    return cl;
}

}  // namespace

void submit_gemm(const kernels::GemmShape &s, Precision precision, DType ta, starpu_data_handle_t a, DType tb,
                 starpu_data_handle_t b, DType tc, starpu_data_handle_t c, int priority, starpu_data_handle_t bias,
                 starpu_data_handle_t a_source, int64_t a_elements, starpu_data_handle_t bias_grad,
                 bool bias_grad_of_b, float bias_grad_beta, starpu_data_handle_t residual) {
    NNTILE_CHECK(!(bias && bias_grad), "submit_gemm: a bias and a bias gradient in one task");
    NNTILE_CHECK(!(residual && bias_grad), "submit_gemm: a residual and a bias gradient in one task");
    auto *args = cl_args(GemmArgs{s, precision, ta, tb, tc, bias != nullptr, bias_grad != nullptr, bias_grad_of_b,
                                  bias_grad_beta, a_source != nullptr, a_elements, residual != nullptr});
    double flops = 2.0 * s.m * s.n * s.k;
    starpu_data_access_mode c_mode = s.beta == 0.f ? STARPU_W : STARPU_RW;
    starpu_data_descr descr[6];
    int nb = 0;
    if (a_source) descr[nb++] = {a_source, STARPU_R};
    descr[nb++] = {a, a_source ? STARPU_W : STARPU_R};
    descr[nb++] = {b, STARPU_R};
    descr[nb++] = {c, c_mode};
    if (bias) descr[nb++] = {bias, STARPU_R};
    if (bias_grad) descr[nb++] = {bias_grad, bias_grad_beta == 0.f ? STARPU_W : STARPU_RW};
    if (residual) descr[nb++] = {residual, STARPU_R};
    const char *name = a_source ? (bias ? "cast+gemm+bias" : "cast+gemm") : (bias ? "gemm+bias" : "gemm");
    if (bias_grad) name = a_source ? "cast+gemm+bias_grad" : "gemm+bias_grad";
    if (residual)
        name = a_source ? (bias ? "cast+gemm+bias+residual" : "cast+gemm+residual")
                        : (bias ? "gemm+bias+residual" : "gemm+residual");
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gemm(), STARPU_DATA_MODE_ARRAY, descr, nb, STARPU_CL_ARGS, args,
                                           sizeof(GemmArgs), STARPU_FLOPS, flops, STARPU_PRIORITY, priority,
                                           STARPU_NAME, name, 0),
                        "submitting " << name << " m=" << s.m << " n=" << s.n << " k=" << s.k);
    count_task();
}

}  // namespace nntile::codelets
