// CUDA pointwise maps and tile reductions (pointwise.h): the CPU kernel's per-element functions, one thread per
// element (grid-stride); reductions sum in double per thread and block, then combine blocks atomically into d[0].
#include "../common.h"
#include "pointwise_impl.h"

namespace nntile::kernels {

namespace {

__global__ void map_kernel(PointwiseArgs s, float *d, const float *a, const float *b, const float *c) {
    const int64_t sa = s.na == 1 ? 0 : 1, sb = s.nb == 1 ? 0 : 1, sc = s.nc == 1 ? 0 : 1;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < s.n; i += stride)
        d[i] = pointwise_element(s.op, a ? a[i * sa] : 0.f, b ? b[i * sb] : 0.f, c ? c[i * sc] : 0.f, s.s0, s.s1);
}

// d[0] is 0 (or its old value, when accumulating) before the launch; each block adds (sums) or maxes (maxabs, over
// non-negative floats, whose order is their bits' order as integers; NaN's bits are above every number's) into it.
__global__ void reduce_kernel(PointwiseArgs s, float *d, const float *a) {
    __shared__ double part[256];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x)
        acc = pointwise_combine(s.op, acc, pointwise_term(s.op, a[i], s.s0));
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] = pointwise_combine(s.op, part[threadIdx.x], part[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float v = (float)part[0];
        if (s.op == PointwiseOp::maxabs)
            atomicMax((int *)d, __float_as_int(v));
        else
            atomicAdd(d, v);
    }
}

constexpr int kGatherChunk = 256;

struct GatherPointers {
    const float *p[kGatherChunk];
};

__global__ void gather_kernel(GatherPointers ptrs, int n, float *dst) {
    const int i = threadIdx.x;
    if (i < n) dst[i] = ptrs.p[i][0];
}

}  // namespace

void pointwise_cuda(cudaStream_t stream, const PointwiseArgs &s, float *d, const float *a, const float *b,
                    const float *c) {
    if (pointwise_is_reduction(s.op)) {
        if (!s.accumulate) NNTILE_CHECK(cudaMemsetAsync(d, 0, sizeof(float), stream) == cudaSuccess,
                                        "pointwise: clearing a reduction's result failed");
        int blocks = (int)std::min<int64_t>((s.n + 255) / 256, 1024);
        if (blocks > 0) reduce_kernel<<<blocks, 256, 0, stream>>>(s, d, a);
    } else {
        int blocks = (int)std::min<int64_t>((s.n + 255) / 256, 65535);
        if (blocks > 0) map_kernel<<<blocks, 256, 0, stream>>>(s, d, a, b, c);
    }
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, "pointwise kernel launch failed (op " << (int)s.op << ", n=" << s.n
                                                                           << "): " << cudaGetErrorString(err));
}

void gather_scalars_cuda(cudaStream_t stream, int64_t n, const float *const *srcs, float *dst) {
    // The source pointers travel in the kernel's parameters (256 per launch: 2 KiB of the 4 KiB allowed).
    for (int64_t start = 0; start < n; start += kGatherChunk) {
        GatherPointers ptrs;
        const int m = (int)std::min<int64_t>(kGatherChunk, n - start);
        for (int j = 0; j < m; ++j) ptrs.p[j] = srcs[start + j];
        gather_kernel<<<1, kGatherChunk, 0, stream>>>(ptrs, m, dst + start);
        cudaError_t err = cudaGetLastError();
        NNTILE_CHECK(err == cudaSuccess, "gather_scalars kernel launch failed (n=" << n << "): "
                                                                                  << cudaGetErrorString(err));
    }
}

}  // namespace nntile::kernels
