// The live tile tensors (registry.cpp): which exist, the bytes their tiles take and what the memory nodes can hold.
// Internal to tiles/: tile_tensor.h declares what the bindings read of it.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "tile_tensor.h"

namespace nntile::detail {

std::unordered_set<TileTensor *> &live();
// Guards live() and the handles_ of every tensor in it: tile tensors come and go on torch's autograd thread as well,
// and the stall report walks their handles from StarPU's watchdog thread (so ensure_handles and release_handles
// change handles_ under it too).
std::mutex &live_mutex();
std::vector<TileTensor *> live_snapshot();
// Bytes of all tiles with registered handles: one copy of each must fit somewhere.
std::atomic<int64_t> &live_bytes();
std::atomic<int64_t> &stream_syncs();
void note_peak(int64_t total);  // the peak of live_bytes()
int64_t bytes_of(const TileTensor &t);

// What the memory nodes can hold together: host limit, disk node, the GPUs' shares. host < 0: no host limit
// (then the operating system decides, and nothing is checked).
struct Capacity {
    int64_t host = -1, disk = 0, gpus = 0;
    int64_t total() const { return host + disk + gpus; }
};
Capacity capacity();
// Once: every live tensor lets go of its handles when the runtime shuts down.
void install_shutdown_hook();

}  // namespace nntile::detail
