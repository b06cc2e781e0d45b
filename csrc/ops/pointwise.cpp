// Pointwise maps and reductions over whole tile tensors: one task per tile (the optimizer and clipping arithmetic
// of torch.optim and torch.nn.utils.clip_grad_*, kernels/pointwise.h).
#include "../codelets/codelets.h"
#include "ops.h"

namespace nntile::ops {

namespace {

using kernels::PointwiseOp;

PointwiseOp parse_op(const std::string &name) {
    static const std::pair<const char *, PointwiseOp> names[] = {
        {"fill", PointwiseOp::fill},       {"scale", PointwiseOp::scale},   {"div_scalar", PointwiseOp::div_scalar},
        {"add_scalar", PointwiseOp::add_scalar}, {"mul", PointwiseOp::mul}, {"lerp", PointwiseOp::lerp},
        {"addcmul", PointwiseOp::addcmul}, {"addcdiv", PointwiseOp::addcdiv}, {"sqrt", PointwiseOp::sqrt},
        {"reciprocal", PointwiseOp::reciprocal}, {"clamp", PointwiseOp::clamp}, {"pow", PointwiseOp::pow_scalar},
        {"axpby", PointwiseOp::axpby},     {"sumsq", PointwiseOp::sumsq},   {"sumabs", PointwiseOp::sumabs},
        {"sumpow", PointwiseOp::sumpow},   {"maxabs", PointwiseOp::maxabs}};
    for (const auto &[n, op] : names)
        if (name == n) return op;
    NNTILE_CHECK(false, "unknown pointwise op '" << name << "'");
    return PointwiseOp::fill;
}

void require_f32(const TileTensor &t, const char *what) {
    NNTILE_CHECK(t.dtype() == DType::f32, "pointwise: " << what << " must be float32 tiles (got "
                                                         << dtype_name(t.dtype()) << ")");
}

}  // namespace

void pointwise(const std::string &op_name, TileTensor &dst, TileTensor *a, TileTensor *b, TileTensor *c, float s0,
               float s1) {
    const PointwiseOp op = parse_op(op_name);
    NNTILE_CHECK(!kernels::pointwise_is_reduction(op), "pointwise: '" << op_name << "' is a reduction");
    TileTensor *operands[3] = {a, b, c};
    const int arity = kernels::pointwise_arity(op);
    require_f32(dst, "the destination");
    for (int k = 0; k < 3; ++k) {
        NNTILE_CHECK((operands[k] != nullptr) == (k < arity),
                     "pointwise: '" << op_name << "' takes " << arity << " operand(s)");
        if (!operands[k]) continue;
        require_f32(*operands[k], "an operand");
        NNTILE_CHECK(operands[k]->numel() == 1 || operands[k]->same_tiling(dst),
                     "pointwise: an operand must be tiled like the destination or hold one value (got "
                         << operands[k]->numel() << " values for a destination of " << dst.numel() << ")");
    }
    for (int64_t t = 0; t < dst.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(dst, t)));
        kernels::PointwiseArgs args{op, dst.tile_numel(t), 0, 0, 0, s0, s1, false};
        starpu_data_handle_t h[3] = {nullptr, nullptr, nullptr};
        int64_t *counts[3] = {&args.na, &args.nb, &args.nc};
        for (int k = 0; k < arity; ++k) {
            const bool scalar = operands[k]->numel() == 1;
            h[k] = operands[k]->handle(scalar ? 0 : t);
            *counts[k] = scalar ? 1 : args.n;
        }
        codelets::submit_pointwise(args, dst.handle(t), h[0], h[1], h[2]);
    }
    dst.bump_version();
}

void pointwise_reduce(const std::string &op_name, TileTensor &x, TileTensor &dst, float s0, bool accumulate) {
    const PointwiseOp op = parse_op(op_name);
    NNTILE_CHECK(kernels::pointwise_is_reduction(op), "pointwise_reduce: '" << op_name << "' is not a reduction");
    require_f32(x, "the reduced tensor");
    require_f32(dst, "the result");
    NNTILE_CHECK(dst.numel() == 1, "pointwise_reduce: the result must hold one value (got " << dst.numel() << ")");
    for (int64_t t = 0; t < x.ntiles(); ++t) {
        OnWorker on(placement_worker(row_of(x, t)));
        kernels::PointwiseArgs args{op, x.tile_numel(t), x.tile_numel(t), 0, 0, s0, 0.f, accumulate || t > 0};
        codelets::submit_pointwise(args, dst.handle(0), x.handle(t), nullptr, nullptr);
    }
    dst.bump_version();
}

void gather_scalars(const std::vector<TileTensor *> &srcs, TileTensor &dst) {
    require_f32(dst, "the result");
    NNTILE_CHECK(dst.ntiles() == 1 && dst.numel() == (int64_t)srcs.size() && !srcs.empty(),
                 "gather_scalars: the result must be one tile of " << srcs.size() << " values (got " << dst.ntiles()
                                                                  << " tiles of " << dst.numel() << " values)");
    std::vector<starpu_data_handle_t> handles;
    for (TileTensor *src : srcs) {
        require_f32(*src, "a gathered value");
        NNTILE_CHECK(src->numel() == 1, "gather_scalars: each source must hold one value (got " << src->numel() << ")");
        handles.push_back(src->handle(0));
    }
    codelets::submit_gather_scalars(handles, dst.handle(0));
    dst.bump_version();
}

}  // namespace nntile::ops
