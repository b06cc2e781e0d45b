// CPU bias kernels.
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

}  // namespace nntile::kernels
