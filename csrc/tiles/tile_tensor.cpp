// Tiled tensor: handle registration and the copies between tiles and dense tensors. The registry of live tensors and
// their bytes: registry.cpp; home buffers: host_homes.cpp; the monitor of host waits: host_waits.cpp.
#include "tile_tensor.h"

#include <cstring>
#include <exception>
#include <mutex>

#include "../codelets/zero_fill.h"
#include "../cuda_device.h"
#include "../runtime.h"
#include "host_waits.h"
#include "registry.h"
#ifdef NNTILE_USE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace nntile {

using namespace detail;

namespace {

at::ScalarType scalar_type(DType t) { return t == DType::f32 ? at::kFloat : t == DType::bf16 ? at::kBFloat16 : at::kLong; }

// Waits for torch's current stream on t's device (not the whole device: StarPU's streams run on).
void sync_torch_stream(const at::Tensor &t) {
#ifdef NNTILE_USE_CUDA
    if (t.is_cuda()) c10::cuda::getCurrentCUDAStream(t.device().index()).synchronize();
#else
    (void)t;
#endif
}

// StarPU memory node of CUDA device `dev`, or -1 when no CUDA worker drives it.
int cuda_node_of(int dev) {
#ifdef NNTILE_USE_CUDA
    int worker = starpu_worker_get_by_devid(STARPU_CUDA_WORKER, dev);
    if (worker >= 0) return (int)starpu_worker_get_memory_node(worker);
#else
    (void)dev;
#endif
    return -1;
}

// Copies between a tile and a dense block, on `node` (main RAM or the GPU of `device`), with the tile acquired
// in `mode`. GPU copies run on torch's current stream, synchronized before the tile is released. Returns whether
// the acquisition had to wait for tasks still using the tile (writing into a tile that tasks read or write).
template <class F>
bool with_tile(starpu_data_handle_t h, int node, starpu_data_access_mode mode, F &&f) {
    KeepCudaDevice keep;  // acquiring may allocate the tile on a GPU from this thread
    bool waited = false;
    if (starpu_data_acquire_on_node_try(h, node, mode) != 0) {  // tasks before it: a blocking wait
        waited = true;
        HostWait wait(node, mode == STARPU_W);
        NNTILE_STARPU_CHECK(starpu_data_acquire_on_node(h, node, mode), "acquiring a tile on node " << node);
    }
    try {
        f(starpu_data_handle_to_pointer(h, node));
    } catch (...) {
        starpu_data_release_on_node(h, node);
        throw;
    }
    starpu_data_release_on_node(h, node);
    return waited;
}

// The dense sub-block that tile `index` covers.
at::Tensor block_of(at::Tensor dense, const std::vector<int64_t> &index, const std::vector<int64_t> &tile_shape,
                       const std::vector<int64_t> &extents) {
    for (size_t d = 0; d < index.size(); ++d) dense = dense.narrow((int64_t)d, index[d] * tile_shape[d], extents[d]);
    return dense;
}

}  // namespace

TileTensor::TileTensor(std::vector<int64_t> shape, std::vector<int64_t> tile_shape, DType dtype, std::string name,
                       bool persistent)
    : shape_(std::move(shape)), tile_shape_(std::move(tile_shape)), dtype_(dtype), name_(std::move(name)),
      persistent_(persistent) {
    NNTILE_CHECK(shape_.size() == tile_shape_.size(), "tile shape must have one entry per dimension (shape has "
                                                          << shape_.size() << ", tile shape " << tile_shape_.size()
                                                          << ")");
    NNTILE_CHECK(!shape_.empty(), "a tile tensor needs at least one dimension");
    for (size_t d = 0; d < shape_.size(); ++d) {
        NNTILE_CHECK(shape_[d] > 0, "every dimension must be positive (got " << shape_[d] << " in dim " << d << ")");
        NNTILE_CHECK(tile_shape_[d] > 0,
                     "every tile size must be positive (got " << tile_shape_[d] << " in dim " << d << ")");
        tile_shape_[d] = std::min(tile_shape_[d], shape_[d]);
        grid_.push_back((shape_[d] + tile_shape_[d] - 1) / tile_shape_[d]);
    }
    int64_t tile_elems = 1;
    for (auto t : tile_shape_) tile_elems *= t;
    NNTILE_CHECK(tile_elems < (int64_t(1) << 32), "a tile must hold fewer than 2^32 elements (got " << tile_elems << ")");
    install_shutdown_hook();
    ensure_handles();
    std::lock_guard<std::mutex> lock(live_mutex());
    live().insert(this);
}

TileTensor::~TileTensor() {
    {
        std::lock_guard<std::mutex> lock(live_mutex());
        live().erase(this);
    }
    if (runtime_running() && !handles_.empty()) {
        if (homes_.empty()) {
            for (auto h : handles_) starpu_data_unregister_submit(h);
        } else {  // the buffers are ours: wait for the tasks using them, then free
            KeepCudaDevice keep;
            for (auto h : handles_) starpu_data_unregister_no_coherency(h);
            free_homes();
        }
        live_bytes().fetch_sub(bytes_of(*this));
    }
}

int64_t TileTensor::ntiles() const {
    int64_t n = 1;
    for (auto g : grid_) n *= g;
    return n;
}

int64_t TileTensor::numel() const {
    int64_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
}

int64_t TileTensor::tile_extent(int64_t d, int64_t index) const {
    return std::min(tile_shape_[d], shape_[d] - index * tile_shape_[d]);
}

std::vector<int64_t> TileTensor::tile_index(int64_t linear) const {
    std::vector<int64_t> idx(grid_.size());
    for (int64_t d = (int64_t)grid_.size() - 1; d >= 0; --d) {
        idx[d] = linear % grid_[d];
        linear /= grid_[d];
    }
    return idx;
}

int64_t TileTensor::tile_numel(int64_t linear) const {
    int64_t n = 1;
    for (auto e : tile_extents(linear)) n *= e;
    return n;
}

std::vector<int64_t> TileTensor::tile_extents(int64_t linear) const {
    auto idx = tile_index(linear);
    std::vector<int64_t> ext(idx.size());
    for (size_t d = 0; d < idx.size(); ++d) ext[d] = tile_extent((int64_t)d, idx[d]);
    return ext;
}

void TileTensor::ensure_handles() {
    if (!handles_.empty()) return;
    NNTILE_CHECK(runtime_running(), "the nntile_torch runtime is not running (call nntile_torch.init() first)");
    // StarPU would wait forever for memory that no node can give (a hang, not an error): refuse up front when
    // one copy of every live tile cannot fit in all the memory nodes together. (Necessary, not sufficient:
    // near the limit StarPU may still stall.)
    const int64_t bytes = bytes_of(*this);
    const int64_t total = live_bytes().fetch_add(bytes) + bytes;
    const Capacity cap = capacity();
    if (cap.host > 0 && total > cap.total()) {
        live_bytes().fetch_sub(bytes);
        NNTILE_CHECK(false, "out of memory: live tiles would take "
                                << (total >> 20) << " MiB (this tensor" << (name_.empty() ? "" : " '" + name_ + "'")
                                << ": " << (bytes >> 20) << " MiB), more than all memory nodes hold: "
                                << (cap.total() >> 20) << " MiB (host limit " << (cap.host >> 20) << " MiB"
                                << (cap.disk ? ", disk node " + std::to_string(cap.disk >> 20) + " MiB"
                                             : std::string(", no disk node"))
                                << (cap.gpus ? ", GPUs " + std::to_string(cap.gpus >> 20) + " MiB" : std::string())
                                << "). Raise host_memory_limit, add a disk node (disk_path, disk_limit) or free "
                                   "tensors");
    }
    note_peak(total);
    const bool homed = persistent_ && allocate_homes();
    std::vector<starpu_data_handle_t> handles(ntiles());
    for (int64_t t = 0; t < ntiles(); ++t) {
        const int64_t n = tile_numel(t);
        if (homed)
            starpu_vector_data_register(&handles[t], STARPU_MAIN_RAM, (uintptr_t)homes_[t], (uint32_t)n,
                                        dtype_size(dtype_));
        else
            starpu_vector_data_register(&handles[t], -1, 0, (uint32_t)n, dtype_size(dtype_));
        starpu_data_set_reduction_methods(handles[t], nullptr, zero_fill_codelet());  // initializer only
    }
    {
        // Whole, under the lock the stall report walks handles_ with (it read null handles of a tensor being
        // registered again after a restart).
        std::lock_guard<std::mutex> lock(live_mutex());
        handles_ = std::move(handles);
    }
    if (saved_.defined()) {
        at::Tensor saved = saved_;
        saved_ = at::Tensor();
        from_dense(saved);
    }
}

starpu_data_handle_t TileTensor::handle(int64_t linear) {
    ensure_handles();
    NNTILE_CHECK(linear >= 0 && linear < ntiles(), "tile index out of range (got " << linear << ", tensor has "
                                                                                     << ntiles() << " tiles)");
    return handles_[linear];
}

bool TileTensor::same_tiling(const TileTensor &o) const {
    return shape_ == o.shape_ && tile_shape_ == o.tile_shape_ && dtype_ == o.dtype_;
}

void TileTensor::from_dense(const at::Tensor &src) {
    NNTILE_CHECK(src.sizes().vec() == shape_, "dense tensor of shape " << src.sizes() << " does not match tile tensor "
                                                                        << "shape " << c10::IntArrayRef(shape_));
    if (dtype_ == DType::i64)
        NNTILE_CHECK(!src.is_floating_point() && !src.is_complex(),
                     "int64 tiles take an integer tensor (got " << src.scalar_type() << ")");
    else
        NNTILE_CHECK(src.is_floating_point(), "expected a floating-point tensor (got " << src.scalar_type() << ")");
    ensure_handles();
    // A CUDA tensor goes straight into tiles on its GPU when a worker drives that GPU; else through host RAM.
    int node = src.is_cuda() ? cuda_node_of(src.device().index()) : -1;
    auto opts = at::TensorOptions().dtype(scalar_type(dtype_));
    at::Tensor dense = src.detach().to(scalar_type(dtype_));
    if (node < 0) {
        node = STARPU_MAIN_RAM;
        dense = dense.to(at::kCPU);
    } else {
        opts = opts.device(src.device());
    }
    // A host wait when a tile is still used by tasks (a write into a live tensor, not into fresh tiles): counted once
    // per call, as to_dense is. A CUDA source synchronizes torch's stream: counted in torch_stream_syncs.
    bool waited = false;
    if (src.is_cuda()) stream_syncs().fetch_add(1, std::memory_order_relaxed);
    for (int64_t t = 0; t < ntiles(); ++t) {
        auto ext = tile_extents(t);
        auto block = block_of(dense, tile_index(t), tile_shape_, ext);
        waited |= with_tile(handles_[t], node, STARPU_W, [&](void *ptr) {
            at::from_blob(ptr, ext, opts).copy_(block);
            sync_torch_stream(dense);
        });
    }
    if (waited) count_wait();
    bump_version();
}

at::Tensor TileTensor::to_dense(c10::optional<at::Device> device) {
    ensure_handles();
    count_wait();
    int node = device && device->is_cuda() ? cuda_node_of(device->index()) : -1;
    auto opts = at::TensorOptions().dtype(scalar_type(dtype_));
    if (node >= 0)
        opts = opts.device(*device);
    else
        node = STARPU_MAIN_RAM;
    at::Tensor out = at::empty(shape_, opts);
    for (int64_t t = 0; t < ntiles(); ++t) {
        auto ext = tile_extents(t);
        with_tile(handles_[t], node, STARPU_R, [&](void *ptr) {
            block_of(out, tile_index(t), tile_shape_, ext).copy_(at::from_blob(ptr, ext, opts));
            sync_torch_stream(out);
        });
    }
    raise_task_error();
    if (device && out.device() != *device) out = out.to(*device);  // a GPU no worker drives: via the host
    return out;
}

void TileTensor::wont_use() {
    for (auto h : handles_) starpu_data_wont_use(h);
}

namespace {
struct PrefetchArg {
    starpu_data_handle_t handle;
    int node;
};
// The tile is on the node now: let go at once (the acquisition only orders the move after the writers).
void release_prefetched(void *arg) {
    auto *a = static_cast<PrefetchArg *>(arg);
    starpu_data_release_on_node(a->handle, a->node);
    delete a;
}
}  // namespace

void TileTensor::prefetch(int node) {
    NNTILE_CHECK(node >= 0 && node < (int)starpu_memory_nodes_get_count(),
                 "prefetch: no memory node " << node << " (there are " << starpu_memory_nodes_get_count() << ")");
    for (auto h : handles_) {
        auto *a = new PrefetchArg{h, node};
        int rc = starpu_data_acquire_on_node_cb_sequential_consistency(h, node, STARPU_R, release_prefetched, a, 1);
        if (rc != 0) {
            delete a;
            NNTILE_STARPU_CHECK(rc, "prefetch of a tile of '" << name_ << "' to node " << node);
        }
    }
}

void TileTensor::fetch(int node) {
    NNTILE_CHECK(node >= 0 && node < (int)starpu_memory_nodes_get_count(),
                 "fetch: no memory node " << node << " (there are " << starpu_memory_nodes_get_count() << ")");
    for (auto h : handles_)
        NNTILE_STARPU_CHECK(starpu_data_fetch_on_node(h, node, 1), "fetch of a tile of '" << name_ << "' to node " << node);
}

void TileTensor::wait_written() {
    for (auto h : handles_) {
        NNTILE_STARPU_CHECK(starpu_data_acquire_on_node(h, STARPU_ACQUIRE_NO_NODE, STARPU_R),
                            "waiting for the writers of '" << name_ << "'");
        starpu_data_release_on_node(h, STARPU_ACQUIRE_NO_NODE);
    }
}

void TileTensor::invalidate() {
    for (auto h : handles_) starpu_data_invalidate_submit(h);
}


void TileTensor::release_handles(bool keep_data) {
    if (handles_.empty()) return;
    std::exception_ptr failed;  // the values could not be saved: the handles go all the same, then it is raised
    if (keep_data) {
        try {
            saved_ = to_dense();  // on the host: the GPU's memory goes with StarPU
        } catch (...) {
            failed = std::current_exception();
        }
    }
    KeepCudaDevice keep;  // unregistering frees GPU buffers from this thread
    std::vector<starpu_data_handle_t> handles;
    {
        std::lock_guard<std::mutex> lock(live_mutex());  // see live_mutex()
        handles.swap(handles_);
    }
    for (auto h : handles) starpu_data_unregister(h);
    free_homes();
    live_bytes().fetch_sub(bytes_of(*this));
    if (failed) std::rethrow_exception(failed);
}

}  // namespace nntile
