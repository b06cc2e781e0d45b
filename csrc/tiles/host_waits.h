// Host threads waiting for tiles, watched.
#pragma once
#include <cstdint>

namespace nntile {

// Host threads waiting to acquire a tile. StarPU's watchdog reports only when tasks are pending and none finishes;
// an acquisition that never completes with no task pending stayed silent (e.g. from_dense of a CUDA
// input into a GPU share too small for it). A monitor thread, started with the first wait and idle while
// there is none, reports every wait that lasts past STARPU_WATCHDOG_TIMEOUT, once, with the memory nodes.
// While alive, the calling thread's wait for a tile on `node` is known to the monitor.
class HostWait {
  public:
    HostWait(int node, bool write);
    ~HostWait();
    HostWait(const HostWait &) = delete;
    HostWait &operator=(const HostWait &) = delete;

  private:
    uint64_t id_ = 0;
};

}  // namespace nntile
