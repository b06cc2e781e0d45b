// Multi-head self-attention on a tile of whole sequences, with ATen's fused kernels (flash /
// memory-efficient on GPUs): no seq x seq score matrix per head is kept.
// qkv: row-major (nseq * seq, 3 * c), each row [q | k | v], heads of hd = c / nheads contiguous inside each;
// y: (nseq * seq, c) with heads side by side (what GPT-2's c_proj reads).
// mask: nullptr for causal attention, else an additive float bias (nseq * seq, seq): row s * seq + i holds query
// i's bias against each key of sequence s (0 to attend, -inf or a large negative value not to; causality is then
// the mask's: Hugging Face's 4-d masks hold it). The same for every head.
// bf16: q, k, v (and the output gradient) are rounded to bfloat16 and the kernel runs in bfloat16 with float32
// softmax statistics, as torch does under bf16 autocast; results are written back as float32.
#pragma once
#include <cstdint>

#include "aten_tile.h"

namespace nntile::kernels {

void attention_forward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                       const float *qkv, const float *mask, float *y);
// Recomputes the forward (activation recomputation) and writes dqkv (nseq * seq, 3 * c). No autograd inside.
void attention_backward(const Where &w, int64_t nseq, int64_t seq, int64_t c, int64_t nheads, float scale, bool bf16,
                        const float *dy, const float *qkv, const float *mask, float *dqkv);
// Whether bf16 attention on GPUs uses ATen's FlashAttention (NNTILE_FLASH_ATTENTION=1, read by runtime_init).
void set_flash_attention(bool enabled);

}  // namespace nntile::kernels
