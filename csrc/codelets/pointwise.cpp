// Codelet for the generic pointwise kernel (kernels/pointwise.h): an opcode, a destination tile and up to three
// operand tiles (each a tile like the destination, or a one-value scalar tile), a few float scalars.
#include <vector>

#include "../kernels/pointwise.h"
#include "codelet_util.h"
#include "codelets.h"

namespace nntile::codelets {

namespace {

// buffer[k]: which of the task's buffers holds operand k (A, B, C), or -1 when absent; buffer 0 is the destination.
// An operand that is the destination's own tile (an in-place op) or another operand's tile is passed once.
struct PointwiseTaskArgs {
    kernels::PointwiseArgs k;
    int8_t buffer[3];
};

uint32_t pointwise_footprint(starpu_task *task) {
    const auto &a = args_of<PointwiseTaskArgs>(task);
    return hash_ints({(int64_t)a.k.op, a.k.n, a.k.na, a.k.nb, a.k.nc});
}

template <bool Cuda>
void pointwise_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<PointwiseTaskArgs *>(cl_arg);
    float *d = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *ops[3];
    for (int k = 0; k < 3; ++k)
        ops[k] = a->buffer[k] < 0 ? nullptr : (const float *)STARPU_VECTOR_GET_PTR(buffers[a->buffer[k]]);
#ifdef NNTILE_USE_CUDA
    if (Cuda) {
        kernels::pointwise_cuda(starpu_cuda_get_local_stream(), a->k, d, ops[0], ops[1], ops[2]);
        return;
    }
#endif
    kernels::pointwise_cpu(a->k, d, ops[0], ops[1], ops[2]);
}

void pointwise_cpu_func(void *buffers[], void *cl_arg) { pointwise_func<false>(buffers, cl_arg); }
#ifdef NNTILE_USE_CUDA
void pointwise_cuda_func(void *buffers[], void *cl_arg) { pointwise_func<true>(buffers, cl_arg); }
#else
constexpr starpu_cuda_func_t pointwise_cuda_func = nullptr;
#endif

starpu_codelet *cl_pointwise() {
    static starpu_codelet *cl =
        new_codelet<pointwise_cpu_func, pointwise_cuda_func>("pointwise", "nntile_pointwise", pointwise_footprint);
    return cl;
}

const char *op_name(kernels::PointwiseOp op) {
    using P = kernels::PointwiseOp;
    switch (op) {
        case P::fill: return "pw.fill";
        case P::scale: return "pw.scale";
        case P::div_scalar: return "pw.div_scalar";
        case P::add_scalar: return "pw.add_scalar";
        case P::mul: return "pw.mul";
        case P::lerp: return "pw.lerp";
        case P::addcmul: return "pw.addcmul";
        case P::addcdiv: return "pw.addcdiv";
        case P::sqrt: return "pw.sqrt";
        case P::reciprocal: return "pw.reciprocal";
        case P::clamp: return "pw.clamp";
        case P::pow_scalar: return "pw.pow";
        case P::axpby: return "pw.axpby";
        case P::sumsq: return "pw.sumsq";
        case P::sumabs: return "pw.sumabs";
        case P::sumpow: return "pw.sumpow";
        case P::maxabs: return "pw.maxabs";
    }
    return "pointwise";
}

// Gather: the buffer (1 + k) each output value reads (a source given twice is passed once).
struct GatherArgs {
    int64_t n;
    int32_t buffer[1];  // n of them (allocated with the struct)
};

uint32_t gather_footprint(starpu_task *task) { return hash_ints({args_of<GatherArgs>(task).n}); }

template <bool Cuda>
void gather_func(void *buffers[], void *cl_arg) {
    auto *a = static_cast<GatherArgs *>(cl_arg);
    float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    std::vector<const float *> srcs((size_t)a->n);
    for (int64_t i = 0; i < a->n; ++i) srcs[i] = (const float *)STARPU_VECTOR_GET_PTR(buffers[a->buffer[i]]);
#ifdef NNTILE_USE_CUDA
    if (Cuda) {
        kernels::gather_scalars_cuda(starpu_cuda_get_local_stream(), a->n, srcs.data(), dst);
        return;
    }
#endif
    kernels::gather_scalars_cpu(a->n, srcs.data(), dst);
}

void gather_cpu_func(void *buffers[], void *cl_arg) { gather_func<false>(buffers, cl_arg); }
#ifdef NNTILE_USE_CUDA
void gather_cuda_func(void *buffers[], void *cl_arg) { gather_func<true>(buffers, cl_arg); }
#else
constexpr starpu_cuda_func_t gather_cuda_func = nullptr;
#endif

starpu_codelet *cl_gather() {
    static starpu_codelet *cl =
        new_codelet<gather_cpu_func, gather_cuda_func>("gather_scalars", "nntile_gather_scalars", gather_footprint);
    return cl;
}

}  // namespace

void submit_gather_scalars(const std::vector<starpu_data_handle_t> &srcs, starpu_data_handle_t dst) {
    const int64_t n = (int64_t)srcs.size();
    auto *args = static_cast<GatherArgs *>(std::malloc(sizeof(GatherArgs) + sizeof(int32_t) * (size_t)n));
    NNTILE_CHECK(args != nullptr, "gather_scalars: out of memory for " << n << " values");
    args->n = n;
    std::vector<starpu_data_descr> descrs(1);
    descrs[0].handle = dst;
    descrs[0].mode = STARPU_W;
    for (int64_t i = 0; i < n; ++i) {
        NNTILE_CHECK(srcs[i] != dst, "gather_scalars: the result cannot be one of the sources");
        int32_t found = -1;
        for (size_t j = 1; j < descrs.size() && found < 0; ++j)
            if (descrs[j].handle == srcs[i]) found = (int32_t)j;
        if (found < 0) {
            descrs.push_back(starpu_data_descr{srcs[i], STARPU_R});
            found = (int32_t)descrs.size() - 1;
        }
        args->buffer[i] = found;
    }
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_gather(), STARPU_DATA_MODE_ARRAY, descrs.data(), (int)descrs.size(),
                                           STARPU_CL_ARGS, args, sizeof(GatherArgs) + sizeof(int32_t) * (size_t)n,
                                           STARPU_NAME, "gather_scalars", 0),
                        "submitting gather_scalars n=" << n);
    count_task();
}

void submit_pointwise(const kernels::PointwiseArgs &k, starpu_data_handle_t d, starpu_data_handle_t a,
                      starpu_data_handle_t b, starpu_data_handle_t c) {
    const bool reduction = kernels::pointwise_is_reduction(k.op);
    starpu_data_handle_t operands[3] = {a, b, c};
    starpu_data_descr descrs[4];
    int nbuffers = 1;
    bool d_read = reduction && k.accumulate;
    PointwiseTaskArgs args{k, {-1, -1, -1}};
    for (int i = 0; i < 3; ++i) {
        if (!operands[i]) continue;
        if (operands[i] == d) {
            NNTILE_CHECK(!reduction, "pointwise: a reduction cannot read its own result tile");
            args.buffer[i] = 0;
            d_read = true;
            continue;
        }
        for (int j = 0; j < i && args.buffer[i] < 0; ++j)
            if (operands[j] == operands[i]) args.buffer[i] = args.buffer[j];
        if (args.buffer[i] < 0) {
            descrs[nbuffers].handle = operands[i];
            descrs[nbuffers].mode = STARPU_R;
            args.buffer[i] = (int8_t)nbuffers++;
        }
    }
    descrs[0].handle = d;
    descrs[0].mode = d_read ? STARPU_RW : STARPU_W;
    auto *cl_arg = cl_args(args);
    NNTILE_STARPU_CHECK(NNTILE_TASK_INSERT(cl_pointwise(), STARPU_DATA_MODE_ARRAY, descrs, nbuffers, STARPU_CL_ARGS,
                                           cl_arg, sizeof(PointwiseTaskArgs), STARPU_FLOPS, (double)(2 * k.n),
                                           STARPU_NAME, op_name(k.op), 0),
                        "submitting pointwise op " << (int)k.op << " n=" << k.n);
    count_task();
}

}  // namespace nntile::codelets
