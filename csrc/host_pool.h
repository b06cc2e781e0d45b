// StarPU's host-RAM buffers (tiles in host RAM) from slabs the runtime keeps for its life, through StarPU's public
// allocation hooks (starpu_malloc_set_hooks): no StarPU patch.
//
// Why: beyond GPU memory, every step makes new host buffers (gradients CPU workers update, new bf16 copies written
// back, host copies dropped and made again when host RAM runs short) and StarPU 1.3 pins each one with
// cudaHostAlloc and unpins it with cudaFreeHost. Both take ~0.1 s per GB and hold CUDA's context, so the CUDA worker
// cannot launch kernels or copies meanwhile (the H200's 20B step had ~2 s of GPU idle time with no copy running,
// benchmarks/results/h200/memory_plan_v4). Here a buffer comes from a slab pinned once (1 GiB, or the buffer's size
// when larger), best fit, neighbours merged when freed; slabs go back to the system at shutdown. Without CUDA
// workers the slabs are plain anonymous memory (the same allocator, which the CPU test suite runs on every tile).
// Pinned slabs stop at the host limit plus 1/8 (fragmentation): beyond it a buffer is allocated and freed as StarPU
// would (counted as a fallback).
#pragma once
#include <cstddef>
#include <cstdint>

namespace nntile {

struct HostPoolStats {
    int64_t slabs = 0;             // slabs held
    int64_t slab_bytes = 0;        // their bytes
    int64_t pinned_slab_bytes = 0;  // of which pinned
    int64_t live_bytes = 0;        // buffers handed out now (rounded to 4 KiB)
    int64_t peak_live_bytes = 0;
    int64_t largest_free = 0;      // the largest free block in any slab
    int64_t allocations = 0;       // since install
    int64_t fallbacks = 0;         // buffers allocated outside the slabs (the cap reached)
    int64_t slab_allocations = 0;  // slabs made since install (each one a cudaHostAlloc when pinned)
};

// Installs the hooks (before starpu_init). cap_bytes: pinned slabs stop there (<= 0: no cap). Idempotent.
void host_pool_install(int64_t cap_bytes, bool enabled);
// Whether pinned buffers may be made (CUDA workers running, STARPU_DISABLE_PINNING not set): StarPU's own test.
void host_pool_allow_pinning(bool allow);
// After starpu_shutdown: gives the slabs back when no buffer is out (else keeps them, and says so on stderr).
void host_pool_release();
HostPoolStats host_pool_stats();
bool host_pool_enabled();

// The allocator itself, for tests: one pool object independent of StarPU (pinned = false: anonymous memory).
void *host_pool_test_alloc(size_t bytes);
bool host_pool_test_free(void *p);  // false: not one of its buffers
HostPoolStats host_pool_test_stats();
void host_pool_test_reset(int64_t slab_bytes);

}  // namespace nntile
