// CUDA rotary position embeddings and their transpose: one thread per (row, head, j < hd / 2) pair, grid-stride.
#include "../common.h"
#include "rope.h"

namespace nntile::kernels {

namespace {

// __fmul_rn / __fadd_rn: no contraction into FMAs, so the results are the CPU's and torch's to the bit.
__global__ void rope_kernel(bool transpose, int64_t pairs, int64_t width, int64_t hd, const float *x,
                            const float *cos, const float *sin, float *y) {
    const int64_t half = hd / 2, per_row = width / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per_row, p = i % per_row, h = p / half, j = p % half;
        const int64_t at = r * width + h * hd + j;
        const float *c = cos + r * hd, *s = sin + r * hd;
        const float lo = x[at], hi = x[at + half];
        if (!transpose) {
            y[at] = __fadd_rn(__fmul_rn(lo, c[j]), __fmul_rn(-hi, s[j]));
            y[at + half] = __fadd_rn(__fmul_rn(hi, c[j + half]), __fmul_rn(lo, s[j + half]));
        } else {
            y[at] = __fadd_rn(__fmul_rn(lo, c[j]), __fmul_rn(hi, s[j + half]));
            y[at + half] = __fadd_rn(__fmul_rn(hi, c[j + half]), -__fmul_rn(lo, s[j]));
        }
    }
}

}  // namespace

void rope_cuda(cudaStream_t stream, bool transpose, int64_t rows, int64_t width, int64_t hd, const float *x,
               const float *cos, const float *sin, float *y) {
    const int64_t pairs = rows * width / 2;
    if (pairs == 0) return;
    const int64_t b = (pairs + 255) / 256;
    const unsigned blocks = (unsigned)(b < 65535 ? b : 65535);
    rope_kernel<<<blocks, 256, 0, stream>>>(transpose, pairs, width, hd, x, cos, sin, y);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "rope kernel launch failed (rows=" << rows << " width=" << width << " hd=" << hd
                                                                         << "): " << cudaGetErrorString(err));
}

}  // namespace nntile::kernels
