// The tiled tensor: a logical N-d shape cut into a grid of tiles, one StarPU handle per tile.
#pragma once
#include <starpu.h>
#include <ATen/ATen.h>  // tensors only: the Python binding is bindings.cpp's alone

#include <memory>
#include <string>
#include <vector>

#include "../common.h"

namespace nntile {

struct NodeTiles;  // memory_nodes_tiles(), below

// Tile (i0, i1, ...) covers [i_d * tile_shape[d], min((i_d + 1) * tile_shape[d], shape[d])) in every dimension,
// so edge tiles may be partial. Each tile is a contiguous row-major array of its own extent, registered as a
// StarPU vector with home node -1: StarPU allocates it where it is first needed and may move or evict it.
// Handles are unregistered (asynchronously, after the tasks using them) when the tensor dies.
// A persistent tensor (parameters, optimizer states) gets, while NNTILE_HOST_HOMES allows (host_home_budget()),
// a home buffer per tile in pinned host RAM instead: StarPU then evicts its GPU copies into a buffer that is
// always there (a clean copy is just dropped) and never needs a host allocation to do so. Such a tensor's
// handles are unregistered synchronously when it dies (its buffers are freed after).
class TileTensor {
  public:
    TileTensor(std::vector<int64_t> shape, std::vector<int64_t> tile_shape, DType dtype, std::string name = "",
               bool persistent = false);
    ~TileTensor();
    TileTensor(const TileTensor &) = delete;
    TileTensor &operator=(const TileTensor &) = delete;

    const std::vector<int64_t> &shape() const { return shape_; }
    const std::vector<int64_t> &tile_shape() const { return tile_shape_; }
    const std::vector<int64_t> &grid() const { return grid_; }
    DType dtype() const { return dtype_; }
    int64_t ndim() const { return (int64_t)shape_.size(); }
    int64_t ntiles() const;
    int64_t numel() const;
    const std::string &name() const { return name_; }
    bool registered() const { return !handles_.empty(); }
    bool persistent() const { return persistent_; }
    // Whether its tiles have home buffers in host RAM now (persistent, and within the budget when registered).
    bool host_homed() const { return !homes_.empty(); }

    // Extent of one tile along dim d (partial at the edge).
    int64_t tile_extent(int64_t d, int64_t index) const;
    std::vector<int64_t> tile_extents(int64_t linear) const;
    int64_t tile_numel(int64_t linear) const;  // elements of one tile
    std::vector<int64_t> tile_index(int64_t linear) const;
    starpu_data_handle_t handle(int64_t linear);
    starpu_data_handle_t handle2(int64_t i, int64_t j) { return handle(i * grid_[1] + j); }

    // Same logical shape, tile shape and dtype: tiles match one to one.
    bool same_tiling(const TileTensor &other) const;

    // Bumped by every operation that writes the tensor, so Python can cache a materialized copy.
    int64_t version() const { return version_; }
    void bump_version() { ++version_; }

    // Copies a dense tensor (any device, any float dtype) into the tiles. Waits only for tasks still using
    // the tiles. Dense -> tiles.
    void from_dense(const at::Tensor &src);
    // Waits for the tasks writing the tiles (a blocking wait) and gathers them into a dense tensor on `device`
    // (CPU by default; a GPU driven by a CUDA worker is filled from tiles on that GPU).
    at::Tensor to_dense(c10::optional<at::Device> device = c10::nullopt);

    // Hints that no task will read this tensor again soon (StarPU may evict it first).
    void wont_use();
    // Brings every tile onto memory node `node` once the tasks already submitted that write it have run (ordered
    // like a task reading it; asynchronous: the submitting thread does not wait). The memory plan's streaming of
    // weights kept in host RAM (nntile_torch/streaming.py).
    void prefetch(int node);
    // Brings every tile's current value onto memory node `node` now, ordered after nothing (tasks already submitted
    // that will write a tile do not hold it back; a task running on it does): for tiles whose last writer has long
    // run, ahead of a task submitted earlier that will read them (a GPU update's master weight and moments).
    void fetch(int node);
    // Waits (releasing no lock of its own) until the tasks already submitted that write any tile have run, without
    // moving a tile: the streaming throttle's marker of how far execution has got.
    void wait_written();
    // Marks the contents dead: StarPU drops every copy without writing back.
    void invalidate();

    // Runtime shutdown: keep a dense copy (when asked) and drop the handles; they come back on next use.
    void release_handles(bool keep_data);

  private:
    void ensure_handles();
    std::vector<int64_t> shape_, tile_shape_, grid_;
    DType dtype_;
    std::string name_;
    std::vector<starpu_data_handle_t> handles_;
    friend std::vector<NodeTiles> memory_nodes_tiles();
    bool persistent_ = false;
    std::vector<void *> homes_;  // one pinned host buffer per tile when host-homed, else empty
    bool allocate_homes();
    void free_homes();
    at::Tensor saved_;  // dense copy held across a runtime restart
    int64_t version_ = 0;
};

using TileTensorPtr = std::shared_ptr<TileTensor>;

// Bytes of one copy of every registered tile (what the out-of-memory check counts), and the most since the last
// reset_peak_tile_bytes().
int64_t tile_bytes();
int64_t peak_tile_bytes();
void reset_peak_tile_bytes();
// Synchronizations of torch's current CUDA stream before a CUDA tensor's values go into tiles (from_dense of a
// CUDA source): host waits for torch's own queued work, not for nntile's tasks, so counted apart from
// blocking_waits (a GPU step that takes its token ids and labels as CUDA tensors makes one per tensor).
int64_t torch_stream_syncs();
// Name and bytes of every tile tensor whose tiles are registered (where memory goes: nntile_torch.memory_summary).
struct LiveTileTensor {
    std::string name;
    std::string dtype;
    int64_t bytes;
};
std::vector<LiveTileTensor> live_tile_tensors();

// Per StarPU memory node: its limit and use (-1 without a limit), and the bytes of tiles with a buffer there
// (allocated), with a valid copy there (valid), whose only valid copy is there (sole), and with a buffer there
// that holds no valid copy (stale). used - allocated is memory StarPU holds outside live tiles (its cache of freed
// buffers, tiles being unregistered). Where a full node's memory goes: the stall report prints it.
struct NodeTiles {
    std::string name;
    int64_t total = -1, used = -1, allocated = 0, valid = 0, sole = 0, stale = 0;
    int64_t homes = 0;  // of allocated: home buffers (NNTILE_HOST_HOMES), stale while the valid copy is elsewhere
    // tiles with a transfer into this node pending (StarPU's request on the replicate): in a stall, whether a full
    // node's copies are waiting to move, or idle and not dropped
    int64_t requested = 0;
};
std::vector<NodeTiles> memory_nodes_tiles();
// The same as text, node after node joined by "; ", in GiB: the stall report's and memory_nodes_report()'s.
std::string memory_nodes_text();

// Bytes of persistent tiles that may have home buffers in host RAM (NNTILE_HOST_HOMES: unset or 0: none; 1: 85% of
// StarPU's host node; or a size such as 90GiB), and the bytes that have them now.
int64_t host_home_budget();
int64_t host_homed_bytes();

}  // namespace nntile
