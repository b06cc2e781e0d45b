// Bias kernels: the CPU ones, and the bias gradient on either device.
#include "bias.h"

#include <vector>

namespace nntile::kernels {

void bias_add_cpu(int64_t m, int64_t n, const float *b, float *y) {
    for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) y[r * n + j] += b[j];
}

void bias_grad_cpu(int64_t m, int64_t n, const float *dy, float beta, float *db) {
    // Row-wise sweep keeps memory access contiguous; double accumulators keep long sums at fp32 rounding.
    std::vector<double> acc(n, 0.0);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) acc[j] += dy[r * n + j];
    for (int64_t j = 0; j < n; ++j) db[j] = (beta == 0.f ? 0.f : beta * db[j]) + (float)acc[j];
}

void bias_grad(const Where &w, int64_t m, int64_t n, const float *dy, float beta, float *db) {
    if (!w.cuda) {
        bias_grad_cpu(m, n, dy, beta, db);
        return;
    }
    // A hand kernel with one block per column strip kept too few blocks busy on a 132-SM GPU (a 1600-wide
    // gradient is 50-200 blocks); ATen splits the rows across blocks as well.
    StreamScope scope(w);
    auto out = wrap(db, {n}, w), grad = wrap(dy, {m, n}, w);
    if (beta == 0.f) {
        at::sum_out(out, grad, {0});
        return;
    }
    auto sum = grad.sum(0);
    if (beta != 1.f) out.mul_(beta);
    out.add_(sum);
}

void bias_grad_bf16(const Where &w, int64_t m, int64_t n, const void *dy, bool accumulate, float *db) {
    // ATen's column reduction (as bias_grad's), reading the bf16 values and summing in fp32
    StreamScope scope(w);
    auto out = wrap(db, {n}, w), grad = wrap(dy, {m, n}, w, at::kBFloat16);
    if (accumulate)
        out.add_(grad.sum(0, false, at::kFloat));
    else
        at::sum_out(out, grad, {0}, false, at::kFloat);
}

}  // namespace nntile::kernels
