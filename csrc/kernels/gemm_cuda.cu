// CUDA tile GEMM through cuBLAS; row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. With a bias,
// cuBLASLt adds it in the GEMM's epilogue (a Linear's forward: one kernel instead of a GEMM and a bias pass); with
// a bias gradient, cuBLASLt's epilogue sums dy while the GEMM reads it (a Linear's dW GEMM).
#include "add.h"
#include "bias.h"
#include "gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <tuple>

namespace nntile::kernels {

static cudaDataType cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

static cublasComputeType_t compute_type(DType ta, DType tb, Precision precision) {
    // fp32 tiles in tf32/bf16 mode: cuBLAS rounds the inputs itself and accumulates in fp32.
    if (ta == DType::f32 && tb == DType::f32) {
        if (precision == Precision::tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
        if (precision == Precision::bf16) return CUBLAS_COMPUTE_32F_FAST_16BF;
    }
    return CUBLAS_COMPUTE_32F;
}

#define NNTILE_LT_CHECK(call)                                                                                  \
    do {                                                                                                       \
        cublasStatus_t st_ = (call);                                                                           \
        NNTILE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #call " failed with status " << (int)st_ << " for m=" << s.m \
                                                                               << " n=" << s.n << " k=" << s.k); \
    } while (0)

namespace {

// One cuBLASLt handle and workspace per CUDA worker thread (each thread drives one GPU), and per GEMM shape the
// descriptors and the algorithm the heuristic chose: asking for it costs tens of microseconds of the worker's time,
// which the GPU would spend idle.
constexpr size_t kLtWorkspaceBytes = 32 << 20;

struct LtPlan {
    bool ok = false;  // cuBLASLt found an algorithm (else: cuBLAS's GEMM, then the bias as its own pass)
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

struct LtThread {
    cublasLtHandle_t handle = nullptr;
    void *workspace = nullptr;
    std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, int, int, int, int, int, int>, LtPlan>
        plans;
    LtThread() = default;
    LtThread(const LtThread &) = delete;
    LtThread &operator=(const LtThread &) = delete;
    // A worker thread ends at every runtime shutdown: without this, each start of the runtime left its workers'
    // handles, descriptors and 32 MiB workspaces on the GPU for the rest of the process.
    ~LtThread() {
        for (auto &kv : plans) {
            LtPlan &p = kv.second;
            for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
                if (l) cublasLtMatrixLayoutDestroy(l);
            if (p.desc) cublasLtMatmulDescDestroy(p.desc);
        }
        if (workspace) cudaFree(workspace);
        if (handle) cublasLtDestroy(handle);
    }
};

LtThread &lt_thread(const GemmShape &s) {
    thread_local std::map<int, LtThread> per_device;  // a worker thread drives one GPU; keyed to be sure
    int dev = -1;
    NNTILE_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
    LtThread &t = per_device[dev];
    if (!t.handle) {
        NNTILE_LT_CHECK(cublasLtCreate(&t.handle));
        cudaError_t err = cudaMalloc(&t.workspace, kLtWorkspaceBytes);
        NNTILE_CHECK(err == cudaSuccess, "cudaMalloc of cuBLASLt's " << kLtWorkspaceBytes << "-byte workspace failed: "
                                                                    << cudaGetErrorString(err));
    }
    return t;
}

// The alignment (up to 256 bytes) of a pointer: cuBLASLt's algorithms may assume it, so it is part of the plan.
int alignment(const void *p) {
    auto v = reinterpret_cast<uintptr_t>(p);
    int a = 1;
    while (a < 256 && v % (2 * a) == 0) a *= 2;
    return a;
}

// epilogue: CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS (the bias pointer is set per call), or BGRADA / BGRADB
// with the bias gradient vector `vec`, whose alignment the heuristic reads from the pointer set on the descriptor.
// c_in: the matmul's C input where it is not D (a residual), whose alignment the plan must hold too.
const LtPlan &lt_plan(LtThread &t, const GemmShape &s, DType ta, const void *a, DType tb, const void *b, DType tc,
                      const void *c, cublasComputeType_t compute, cublasLtEpilogue_t epilogue,
                      const void *vec = nullptr, const void *c_in = nullptr) {
    // cuBLAS's A is our b, its B our a
    int align_a = alignment(b), align_b = alignment(a), align_vec = vec ? alignment(vec) : 0;
    int align_c = c_in ? std::min(alignment(c), alignment(c_in)) : alignment(c);
    auto key = std::make_tuple(s.m, s.n, s.k, s.trans_a, s.trans_b, (int)ta, (int)tb, (int)tc, (int)compute, align_a,
                               align_b, align_c, (int)epilogue, align_vec);
    auto it = t.plans.find(key);
    if (it != t.plans.end()) return it->second;
    LtPlan p;
    // cuBLAS's A is our B (n x k after its op), its B our A (k x m after its op), its D our C^T (n x m).
    cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    NNTILE_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
    NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // the vector (bias or bias gradient) is float32, C's and D's type: the default for a bias, set for a gradient
    NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (epilogue == CUBLASLT_EPILOGUE_BGRADA || epilogue == CUBLASLT_EPILOGUE_BGRADB) {
        int32_t vec_type = CUDA_R_32F;
        NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vec_type,
                                                       sizeof(vec_type)));
        NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
    }
    // Stored (column-major) shapes: rows, columns, leading dimension.
    if (s.trans_b)
        NNTILE_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(tb), s.k, s.n, s.k));
    else
        NNTILE_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(tb), s.n, s.k, s.n));
    if (s.trans_a)
        NNTILE_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(ta), s.m, s.k, s.m));
    else
        NNTILE_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(ta), s.k, s.m, s.k));
    NNTILE_LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(tc), s.n, s.m, s.n));
    cublasLtMatmulPreference_t pref;
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kLtWorkspaceBytes;
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof(ws)));
    uint32_t aligns[] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_c};
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aligns[0],
                                                         sizeof(uint32_t)));
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligns[1],
                                                         sizeof(uint32_t)));
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligns[2],
                                                         sizeof(uint32_t)));
    NNTILE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligns[2],
                                                         sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t found{};
    int count = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(t.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &found, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    p.ok = st == CUBLAS_STATUS_SUCCESS && count > 0;
    p.algo = found.algo;
    return t.plans.emplace(key, p).first->second;
}

}  // namespace

namespace {

void gemm_plain(cublasHandle_t handle, const GemmShape &s, DType ta, const void *a, DType tb, const void *b, DType tc,
                void *c, cublasComputeType_t compute) {
    int64_t lda = s.trans_a ? s.m : s.k;
    int64_t ldb = s.trans_b ? s.k : s.n;
    cublasStatus_t st = cublasGemmEx(
        handle, s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)s.n, (int)s.m,
        (int)s.k, &s.alpha, b, cuda_type(tb), (int)ldb, a, cuda_type(ta), (int)lda, &s.beta, c, cuda_type(tc),
        (int)s.n, compute, CUBLAS_GEMM_DEFAULT);
    NNTILE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmEx failed with status " << (int)st << " for m=" << s.m
                                                                                  << " n=" << s.n << " k=" << s.k);
}

// NNTILE_BGRAD_EPILOGUE=0 takes the path for shapes without a cuBLASLt algorithm, so that a GPU can test it and
// measure it beside the epilogue.
bool bias_grad_epilogue_allowed() {
    const char *v = std::getenv("NNTILE_BGRAD_EPILOGUE");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

// The GEMM with the bias gradient of its input dy. Our B is cuBLAS's A and our A its B, so dy = our B is BGRADA
// (a vector over D's rows: our n) and dy = our A is BGRADB (over D's columns: our m). The epilogue writes its
// vector: with `accumulate`, into a stream-ordered temporary then added to the output.
void gemm_bias_grad_cuda(cublasHandle_t handle, cudaStream_t stream, const GemmShape &s, DType ta, const void *a,
                         DType tb, const void *b, DType tc, void *c, cublasComputeType_t compute,
                         const GemmBiasGrad &g) {
    int64_t width = g.of_b ? s.n : s.m;
    float *vec = g.out, *scratch = nullptr;
    if (g.accumulate) {
        cudaError_t err = cudaMallocAsync(reinterpret_cast<void **>(&scratch), (size_t)width * sizeof(float), stream);
        NNTILE_CHECK(err == cudaSuccess, "cudaMallocAsync of a " << width * sizeof(float)
                                                                 << "-byte bias gradient failed: "
                                                                 << cudaGetErrorString(err));
        vec = scratch;
    }
    LtThread &t = lt_thread(s);
    cublasLtEpilogue_t epilogue = g.of_b ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB;
    // the epilogue's vector: 16-byte aligned (as the bias's; StarPU's tiles and the temporary are)
    const LtPlan *p = alignment(vec) >= 16 && bias_grad_epilogue_allowed()
                          ? &lt_plan(t, s, ta, a, tb, b, tc, c, compute, epilogue, vec)
                          : nullptr;
    if (p && p->ok) {
        NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
        NNTILE_LT_CHECK(cublasLtMatmul(t.handle, p->desc, &s.alpha, b, p->a, a, p->b, &s.beta, c, p->c, c, p->c,
                                       &p->algo, t.workspace, kLtWorkspaceBytes, stream));
        if (scratch) add_cuda(stream, width, 1.f, scratch, 1.f, g.out);
    } else {
        // no algorithm for this shape: the GEMM, then the column sums of the same bf16 dy
        gemm_plain(handle, s, ta, a, tb, b, tc, c, compute);
        int dev = -1;
        NNTILE_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
        bias_grad_bf16(Where{true, dev, stream}, s.k, width, g.of_b ? b : a, g.accumulate, g.out);
    }
    if (scratch) {
        cudaError_t err = cudaFreeAsync(scratch, stream);
        NNTILE_CHECK(err == cudaSuccess, "cudaFreeAsync of a bias gradient failed: " << cudaGetErrorString(err));
    }
}

}  // namespace

namespace {

// C = alpha op(A) op(B) + bias + residual with C's old values unread (beta 0): cuBLASLt reads the residual as its C
// input with beta 1 and writes D = our C, the bias (if any) in the same epilogue. False where it has no algorithm.
bool gemm_residual_lt(cudaStream_t stream, const GemmShape &s, DType ta, const void *a, DType tb, const void *b,
                      DType tc, void *c, cublasComputeType_t compute, const float *bias, const float *residual) {
    if (bias && alignment(bias) < 16) return false;
    LtThread &t = lt_thread(s);
    const LtPlan &p = lt_plan(t, s, ta, a, tb, b, tc, c, compute,
                              bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, nullptr, residual);
    if (!p.ok) return false;
    if (bias)
        NNTILE_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const float one = 1.f;
    NNTILE_LT_CHECK(cublasLtMatmul(t.handle, p.desc, &s.alpha, b, p.a, a, p.b, &one, residual, p.c, c, p.c, &p.algo,
                                   t.workspace, kLtWorkspaceBytes, stream));
    return true;
}

}  // namespace

void gemm_cuda(cublasHandle_t handle, cudaStream_t stream, const GemmShape &s, DType ta, const void *a, DType tb,
               const void *b, DType tc, void *c, Precision precision, const float *bias,
               const GemmBiasGrad &bias_grad, const float *residual) {
    cublasComputeType_t compute = compute_type(ta, tb, precision);
    if (residual) {
        NNTILE_CHECK(tc == DType::f32 && !bias_grad.out,
                     "gemm_cuda: a residual needs a float32 C and no bias gradient");
        if (s.beta == 0.f && gemm_residual_lt(stream, s, ta, a, tb, b, tc, c, compute, bias, residual)) return;
        // C holds a partial sum (the K chain's last task), or no algorithm: the GEMM, then the add on its stream
        gemm_cuda(handle, stream, s, ta, a, tb, b, tc, c, precision, bias);
        add_cuda(stream, s.m * s.n, 1.f, residual, 1.f, static_cast<float *>(c));
        return;
    }
    if (bias_grad.out) {
        NNTILE_CHECK(!bias, "gemm_cuda: a bias and a bias gradient in one GEMM");
        NNTILE_CHECK((bias_grad.of_b ? tb : ta) == DType::bf16 && (bias_grad.of_b ? !s.trans_b : s.trans_a) &&
                         tc == DType::f32,
                     "gemm_cuda: a bias gradient needs its dy bfloat16, stored (k, m or n), and C float32");
        gemm_bias_grad_cuda(handle, stream, s, ta, a, tb, b, tc, c, compute, bias_grad);
        return;
    }
    LtThread *t = bias ? &lt_thread(s) : nullptr;
    const LtPlan *p = bias ? &lt_plan(*t, s, ta, a, tb, b, tc, c, compute, CUBLASLT_EPILOGUE_BIAS) : nullptr;
    if (p && p->ok && alignment(bias) >= 16) {
        NNTILE_LT_CHECK(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        NNTILE_LT_CHECK(cublasLtMatmul(t->handle, p->desc, &s.alpha, b, p->a, a, p->b, &s.beta, c, p->c, c, p->c,
                                       &p->algo, t->workspace, kLtWorkspaceBytes, stream));
        return;
    }
    gemm_plain(handle, s, ta, a, tb, b, tc, c, compute);
    if (bias) bias_add_cuda(stream, s.m, s.n, bias, static_cast<float *>(c));
}

}  // namespace nntile::kernels
