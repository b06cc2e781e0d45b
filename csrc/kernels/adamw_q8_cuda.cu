// CUDA AdamW kernel with 8-bit block-wise moments (adamw_q8.h): one 256-thread block per quantization block.
#include "../common.h"
#include "adamw_impl.h"
#include "adamw_q8.h"
#include "block_sum_cuda.cuh"

namespace nntile::kernels {

namespace {

static_assert(Q8_BLOCK == 256, "one thread per element of a quantization block");

// Param: float (fp32 master) or uint16_t (bf16 master, rounded stochastically from hash(seed, element): master_store).
template <class Param>
__global__ void __launch_bounds__(256) adamw_q8_kernel(int64_t n, AdamWScalars s, uint64_t seed, QuantMaps8 maps,
                                                      const float *grad, Param *param, float *exp_avg,
                                                      float *exp_avg_sq, uint16_t *copy) {
    __shared__ float map_s[256], map_u[256], red[32];
    const int t = threadIdx.x;
    map_s[t] = maps.map_signed[t];
    map_u[t] = maps.map_unsigned[t];
    __syncthreads();
    const int64_t nb = q8_blocks(n), b = blockIdx.x, i = b * Q8_BLOCK + t;
    uint8_t *cm = reinterpret_cast<uint8_t *>(exp_avg + nb), *cv = reinterpret_cast<uint8_t *>(exp_avg_sq + nb);
    const bool in = i < n;
    float m = 0.f, v = 0.f;
    if (in) {
        m = map_s[cm[i]] * exp_avg[b];
        v = map_u[cv[i]] * exp_avg_sq[b];
        float p = master_load(param[i]);
        adamw_element(s, grad[i], p, m, v);
        master_store(param[i], p, seed, i);
        if (copy) copy[i] = float_to_bf16_rne(p);  // fp32 masters only (a bf16 master is its own copy)
    }
    // Every thread has read the old scales before thread 0 writes the new ones (the reductions synchronize).
    const float am = block_max_nonneg(fabsf(m), red);
    const float av = block_max_nonneg(fabsf(v), red);
    if (in) {
        cm[i] = q8_nearest(map_s, __fdiv_rn(m, q8_divisor(am)));
        cv[i] = q8_nearest(map_u, __fdiv_rn(v, q8_divisor(av)));
    }
    if (t == 0) {
        exp_avg[b] = am;
        exp_avg_sq[b] = av;
    }
}

template <class Param>
void launch_q8(const char *what, cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed,
               const float *grad, Param *param, float *exp_avg, float *exp_avg_sq, uint16_t *copy) {
    const int64_t blocks = q8_blocks(n);
    if (blocks == 0) return;
    NNTILE_CHECK(blocks <= 0x7fffffff, what << ": too many blocks in one tile (got " << blocks << ")");
    adamw_q8_kernel<Param><<<(unsigned)blocks, 256, 0, stream>>>(n, s, seed, quant_maps8(), grad, param, exp_avg,
                                                                exp_avg_sq, copy);
    cudaError_t err = cudaGetLastError();
    NNTILE_CHECK(err == cudaSuccess, what << " kernel launch failed: " << cudaGetErrorString(err));
}

}  // namespace

void adamw_q8_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, const float *grad, float *param,
                   float *exp_avg, float *exp_avg_sq, uint16_t *copy) {
    launch_q8("adamw (8-bit state)", stream, n, s, 0, grad, param, exp_avg, exp_avg_sq, copy);
}

void adamw_q8_bf16_cuda(cudaStream_t stream, int64_t n, const AdamWScalars &s, uint64_t seed, const float *grad,
                        uint16_t *param, float *exp_avg, float *exp_avg_sq) {
    launch_q8("adamw (8-bit state, bf16 master)", stream, n, s, seed, grad, param, exp_avg, exp_avg_sq,
              (uint16_t *)nullptr);
}

}  // namespace nntile::kernels
