// CPU pointwise maps and tile reductions (pointwise.h).
#include "pointwise_impl.h"

namespace nntile::kernels {

namespace {

const float zero_operand = 0.f;  // absent operands: read at stride 0, never used

// The opcode is a template argument so that each loop compiles without the switch (and can vectorize).
template <PointwiseOp Op>
void map_loop(const PointwiseArgs &s, float *d, const float *a, int64_t sa, const float *b, int64_t sb, const float *c,
              int64_t sc) {
    for (int64_t i = 0; i < s.n; ++i) d[i] = pointwise_element(Op, a[i * sa], b[i * sb], c[i * sc], s.s0, s.s1);
}

}  // namespace

void pointwise_cpu(const PointwiseArgs &s, float *d, const float *a, const float *b, const float *c) {
    const PointwiseOp op = s.op;
    if (pointwise_is_reduction(op)) {
        double acc = 0.0;
        for (int64_t i = 0; i < s.n; ++i) acc = pointwise_combine(op, acc, pointwise_term(op, a[i], s.s0));
        d[0] = (float)(s.accumulate ? pointwise_combine(op, (double)d[0], acc) : acc);
        return;
    }
    // Operands of one value are broadcast (stride 0).
    const int64_t sa = (!a || s.na == 1) ? 0 : 1, sb = (!b || s.nb == 1) ? 0 : 1, sc = (!c || s.nc == 1) ? 0 : 1;
    a = a ? a : &zero_operand;
    b = b ? b : &zero_operand;
    c = c ? c : &zero_operand;
#define NNTILE_PW_CASE(name) \
    case PointwiseOp::name: return map_loop<PointwiseOp::name>(s, d, a, sa, b, sb, c, sc);
    switch (op) {
        NNTILE_PW_CASE(fill)
        NNTILE_PW_CASE(scale)
        NNTILE_PW_CASE(div_scalar)
        NNTILE_PW_CASE(add_scalar)
        NNTILE_PW_CASE(mul)
        NNTILE_PW_CASE(lerp)
        NNTILE_PW_CASE(addcmul)
        NNTILE_PW_CASE(addcdiv)
        NNTILE_PW_CASE(sqrt)
        NNTILE_PW_CASE(reciprocal)
        NNTILE_PW_CASE(clamp)
        NNTILE_PW_CASE(pow_scalar)
        NNTILE_PW_CASE(axpby)
        default: break;
    }
#undef NNTILE_PW_CASE
}

void gather_scalars_cpu(int64_t n, const float *const *srcs, float *dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = srcs[i][0];
}

}  // namespace nntile::kernels
