// CPU elementwise add.
#include "add.h"

namespace nntile::kernels {

void add_cpu(int64_t n, float alpha, const float *x, float beta, float *y) {
    // beta == 0 overwrites y without reading it, so an uninitialised tile is fine as the target.
    if (beta == 0.f)
        for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
    else
        for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + beta * y[i];
}

void add_into_cpu(int64_t n, float alpha, const float *x, float beta, const float *y, float *z) {
    for (int64_t i = 0; i < n; ++i) z[i] = alpha * x[i] + beta * y[i];
}

}  // namespace nntile::kernels
