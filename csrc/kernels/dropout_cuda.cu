// CUDA dropout on a tile: one grid-stride pass, each element's index in the whole tensor from its row-major place
// in the tile, kept by dropout_hash (dropout.h) as the CPU loop keeps it.
#include "../common.h"
#include "dropout.h"

namespace nntile::kernels {

namespace {

__global__ void dropout_kernel(DropoutTile tile, int64_t n, uint64_t salt, int64_t threshold, float scale,
                               const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = i, index = tile.base;
        for (int64_t d = tile.ndim - 1; d >= 0; --d) {
            const int64_t e = tile.extents[d];
            index += (rest % e) * tile.strides[d];
            rest /= e;
        }
        y[i] = x[i] * (dropout_hash(salt, (uint64_t)index) < threshold ? scale : 0.0f);
    }
}

}  // namespace

void dropout_cuda(cudaStream_t stream, const DropoutTile &tile, int64_t seed, float p, const float *x, float *y) {
    int64_t n = 1;
    for (int64_t d = 0; d < tile.ndim; ++d) n *= tile.extents[d];
    if (n == 0) return;
    const int64_t b = (n + 255) / 256;
    const unsigned blocks = (unsigned)(b < 65535 * 8 ? b : 65535 * 8);
    dropout_kernel<<<blocks, 256, 0, stream>>>(tile, n, dropout_salt(seed), dropout_threshold(p), dropout_scale(p),
                                               x, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "dropout kernel launch failed (n=" << n << "): " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
