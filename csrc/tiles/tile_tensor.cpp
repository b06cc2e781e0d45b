// Tiled tensor: handle registration, dense conversion and the registry used at runtime shutdown.
#include "tile_tensor.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "../cuda_device.h"
#include "../runtime.h"
#ifdef NNTILE_USE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace nntile {

namespace {

std::unordered_set<TileTensor *> &live() {
    static std::unordered_set<TileTensor *> s;
    return s;
}

// Guards live() and the handles_ of every tensor in it: tile tensors come and go on torch's autograd thread as well,
// and the stall report walks their handles from StarPU's watchdog thread (so ensure_handles and release_handles
// change handles_ under it too).
std::mutex &live_mutex() {
    static std::mutex m;
    return m;
}

std::vector<TileTensor *> live_snapshot() {
    std::lock_guard<std::mutex> lock(live_mutex());
    return {live().begin(), live().end()};
}

// Bytes of all tiles with registered handles: one copy of each must fit somewhere.
std::atomic<int64_t> &live_bytes() {
    static std::atomic<int64_t> b{0};
    return b;
}

std::atomic<int64_t> &stream_syncs() {
    static std::atomic<int64_t> n{0};
    return n;
}

std::atomic<int64_t> &peak_bytes() {
    static std::atomic<int64_t> b{0};
    return b;
}

void note_peak(int64_t total) {
    int64_t seen = peak_bytes().load();
    while (total > seen && !peak_bytes().compare_exchange_weak(seen, total)) {
    }
}

int64_t bytes_of(const TileTensor &t) { return t.numel() * (int64_t)dtype_size(t.dtype()); }

// The value of a tile read before anything wrote it (TileTensor.empty never filled): zeros. Without an
// initializer StarPU aborts the process on such a read ("handle ... is not initialized"), e.g. printing an empty
// tensor or runtime shutdown keeping the values of a live one; with it, a host read runs this codelet first, and
// a task reading the tile gets its buffer as allocated (undefined values, as torch.empty's).
void zero_fill_cpu(void *buffers[], void *) {
    std::memset((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
                (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

#ifdef NNTILE_USE_CUDA
void zero_fill_cuda(void *buffers[], void *) {
    cudaMemsetAsync((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
                    (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]),
                    starpu_cuda_get_local_stream());
}
#endif

starpu_codelet *zero_fill_codelet() {
    static starpu_codelet cl = [] {
        starpu_codelet c;
        std::memset(&c, 0, sizeof(c));
        c.name = "nntile_zero_fill";
        c.cpu_funcs[0] = zero_fill_cpu;
#ifdef NNTILE_USE_CUDA
        c.cuda_funcs[0] = zero_fill_cuda;
        c.cuda_flags[0] = STARPU_CUDA_ASYNC;
#endif
        c.nbuffers = 1;
        c.modes[0] = STARPU_W;
        return c;
    }();
    return &cl;
}

// What the memory nodes can hold together: host limit, disk node, the GPUs' shares. host < 0: no host limit
// (then the operating system decides, and nothing is checked).
struct Capacity {
    int64_t host = -1, disk = 0, gpus = 0;
    int64_t total() const { return host + disk + gpus; }
};

Capacity capacity() {
    const RuntimeConfig &c = runtime_config();
    Capacity cap;
    if (c.host_memory_limit <= 0) return cap;
    cap.host = c.host_memory_limit;
    if (disk_node() >= 0 && c.disk_limit > 0) cap.disk = c.disk_limit;
#ifdef NNTILE_USE_CUDA
    if (c.cuda_memory_limit > 0) cap.gpus = c.cuda_memory_limit * (int64_t)starpu_cuda_worker_get_count();
#endif
    return cap;
}

void install_shutdown_hook() {
    static bool done = [] {
        add_shutdown_hook([](bool keep_data) {
            // Every tensor lets go of its handles before StarPU stops, even when another's values cannot be saved.
            std::exception_ptr failed;
            for (TileTensor *t : live_snapshot()) {
                try {
                    t->release_handles(keep_data);
                } catch (...) {
                    if (!failed) failed = std::current_exception();
                }
            }
            if (failed) std::rethrow_exception(failed);
        });
        return true;
    }();
    (void)done;
}

at::ScalarType scalar_type(DType t) { return t == DType::f32 ? at::kFloat : t == DType::bf16 ? at::kBFloat16 : at::kLong; }

// Waits for torch's current stream on t's device (not the whole device: StarPU's streams run on).
void sync_torch_stream(const torch::Tensor &t) {
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

// Host threads waiting to acquire a tile. StarPU's watchdog reports only when tasks are pending and none finishes;
// an acquisition that never completes with no task pending stayed silent (H200, 2026-12-01: from_dense of a CUDA
// input into a GPU share of 24 MiB). A monitor thread, started with the first wait and idle while
// there is none, reports every wait that lasts past STARPU_WATCHDOG_TIMEOUT, once, with the memory nodes.
struct HostWaitInfo {
    std::chrono::steady_clock::time_point start;
    int node;
    bool write;
};
struct HostWaits {
    std::mutex m;
    std::condition_variable cv;
    std::map<uint64_t, HostWaitInfo> waits;
    uint64_t next = 0;
    bool started = false;
};
HostWaits &host_waits() {
    static auto *w = new HostWaits;  // never destroyed: the monitor thread may outlive main
    return *w;
}

std::chrono::microseconds wait_report_delay() {
    return std::chrono::microseconds(std::max<int64_t>(watchdog_timeout_us(), 1000));  // not getenv: runtime.h
}

void monitor_host_waits() {
    auto &w = host_waits();
    std::unordered_set<uint64_t> reported;
    std::unique_lock<std::mutex> lock(w.m);
    for (;;) {
        if (w.waits.empty()) {
            reported.clear();
            w.cv.wait(lock, [&] { return !w.waits.empty(); });
        }
        const auto delay = wait_report_delay();
        w.cv.wait_for(lock, std::min<std::chrono::microseconds>(delay / 4, std::chrono::seconds(1)));
        std::vector<std::string> late;
        const auto now = std::chrono::steady_clock::now();
        for (auto &[id, wait] : w.waits) {
            if (now - wait.start < delay || !reported.insert(id).second) continue;
            std::ostringstream os;
            os << std::fixed << std::setprecision(1) << "nntile_torch: a host thread has waited "
               << std::chrono::duration<double>(now - wait.start).count() << " s for a tile on memory node "
               << wait.node << (wait.write ? " (to write it)" : " (to read it)");
            late.push_back(os.str());
        }
        if (late.empty()) continue;
        lock.unlock();  // memory_nodes_text takes the live-tensor lock
        const std::string nodes = runtime_running() ? memory_nodes_text() : std::string("(runtime stopped)");
        const int pending = starpu_task_nsubmitted();
        for (auto &msg : late) {
            const char *why = pending == 0 ? ". No task is pending: StarPU cannot make room for the tile on that node."
                                           : ". It waits for the tasks before it.";
            std::string line = msg + " (" + std::to_string(pending) + " tasks pending). Memory nodes: " + nodes + why +
                               " Reported once per wait, after STARPU_WATCHDOG_TIMEOUT.\n";
            std::fputs(line.c_str(), stderr);
        }
        std::fflush(stderr);
        lock.lock();
    }
}

// While alive, the calling thread's wait for a tile on `node` is known to the monitor.
class HostWait {
  public:
    HostWait(int node, bool write) {
        auto &w = host_waits();
        std::lock_guard<std::mutex> lock(w.m);
        if (!w.started) {
            std::thread(monitor_host_waits).detach();
            w.started = true;
        }
        id_ = w.next++;
        w.waits.emplace(id_, HostWaitInfo{std::chrono::steady_clock::now(), node, write});
        w.cv.notify_all();
    }
    ~HostWait() {
        auto &w = host_waits();
        std::lock_guard<std::mutex> lock(w.m);
        w.waits.erase(id_);
    }
    HostWait(const HostWait &) = delete;
    HostWait &operator=(const HostWait &) = delete;

  private:
    uint64_t id_ = 0;
};

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
torch::Tensor block_of(torch::Tensor dense, const std::vector<int64_t> &index, const std::vector<int64_t> &tile_shape,
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
        torch::Tensor saved = saved_;
        saved_ = torch::Tensor();
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

void TileTensor::from_dense(const torch::Tensor &src) {
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
    auto opts = torch::TensorOptions().dtype(scalar_type(dtype_));
    torch::Tensor dense = src.detach().to(scalar_type(dtype_));
    if (node < 0) {
        node = STARPU_MAIN_RAM;
        dense = dense.to(torch::kCPU);
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
            torch::from_blob(ptr, ext, opts).copy_(block);
            sync_torch_stream(dense);
        });
    }
    if (waited) count_wait();
    bump_version();
}

torch::Tensor TileTensor::to_dense(c10::optional<torch::Device> device) {
    ensure_handles();
    count_wait();
    int node = device && device->is_cuda() ? cuda_node_of(device->index()) : -1;
    auto opts = torch::TensorOptions().dtype(scalar_type(dtype_));
    if (node >= 0)
        opts = opts.device(*device);
    else
        node = STARPU_MAIN_RAM;
    torch::Tensor out = torch::empty(shape_, opts);
    for (int64_t t = 0; t < ntiles(); ++t) {
        auto ext = tile_extents(t);
        with_tile(handles_[t], node, STARPU_R, [&](void *ptr) {
            block_of(out, tile_index(t), tile_shape_, ext).copy_(torch::from_blob(ptr, ext, opts));
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

int64_t tile_bytes() { return live_bytes().load(); }
int64_t torch_stream_syncs() { return stream_syncs().load(); }
int64_t peak_tile_bytes() { return peak_bytes().load(); }
void reset_peak_tile_bytes() { peak_bytes().store(live_bytes().load()); }

std::vector<LiveTileTensor> live_tile_tensors() {
    std::vector<LiveTileTensor> out;
    std::lock_guard<std::mutex> lock(live_mutex());
    for (const TileTensor *t : live())
        if (t->registered()) out.push_back({t->name(), dtype_name(t->dtype()), bytes_of(*t)});
    return out;
}

namespace {

std::atomic<int64_t> &homed_bytes() {
    static std::atomic<int64_t> b{0};
    return b;
}

// Pinned (cudaHostAlloc when CUDA workers run: asynchronous copies), counted against StarPU's host limit, and
// failing instead of evicting when that limit is reached (the tensor then goes without homes).
constexpr int kHomeFlags = STARPU_MALLOC_PINNED | STARPU_MALLOC_COUNT | STARPU_MALLOC_NORECLAIM;

size_t tile_bytes_of(const TileTensor &t, int64_t linear) {
    return (size_t)t.tile_numel(linear) * dtype_size(t.dtype());
}

}  // namespace

int64_t host_home_budget() {
    const std::string setting = host_homes_setting();  // read at init (runtime.h), not getenv on this thread
    const char *v = setting.c_str();
    if (!*v) return 0;
    char *end = nullptr;
    double x = std::strtod(v, &end);
    std::string unit = end ? std::string(end) : std::string();
    if (unit.empty() && x == 1.0) {  // 1: most of StarPU's host node, leaving room for tiles without homes
        starpu_ssize_t total = starpu_memory_get_total(STARPU_MAIN_RAM);
        return total > 0 ? (int64_t)(0.85 * (double)total) : 0;
    }
    const std::pair<const char *, double> units[] = {{"", 1.0}, {"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0},
                                                     {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (const auto &u : units)
        if (unit == u.first) return (int64_t)(x * u.second);
    NNTILE_CHECK(false, "NNTILE_HOST_HOMES must be 0, 1 or a size such as 90GiB (got '" << v << "')");
    return 0;
}

int64_t host_homed_bytes() { return homed_bytes().load(); }

bool TileTensor::allocate_homes() {
    const int64_t budget = host_home_budget(), bytes = bytes_of(*this);
    if (budget <= 0) return false;
    if (homed_bytes().fetch_add(bytes) + bytes > budget) {
        homed_bytes().fetch_sub(bytes);
        return false;
    }
    homes_.assign(ntiles(), nullptr);
    for (int64_t t = 0; t < ntiles(); ++t) {
        if (starpu_malloc_flags(&homes_[t], tile_bytes_of(*this, t), kHomeFlags) != 0) {
            homes_[t] = nullptr;
            free_homes();  // the host limit is reached: this tensor goes without homes
            return false;
        }
    }
    return true;
}

void TileTensor::free_homes() {
    if (homes_.empty()) return;
    for (int64_t t = 0; t < (int64_t)homes_.size(); ++t)
        if (homes_[t]) starpu_free_flags(homes_[t], tile_bytes_of(*this, t), kHomeFlags);
    homes_.clear();
    homed_bytes().fetch_sub(bytes_of(*this));
}

std::vector<NodeTiles> memory_nodes_tiles() {
    const unsigned nnodes = starpu_memory_nodes_get_count();
    std::vector<NodeTiles> out(nnodes);
    for (unsigned n = 0; n < nnodes; ++n) {
        char name[64];
        starpu_memory_node_get_name(n, name, sizeof name);
        out[n].name = name;
        out[n].total = starpu_memory_get_total(n);
        if (out[n].total > 0) out[n].used = out[n].total - starpu_memory_get_available(n);
    }
    std::lock_guard<std::mutex> lock(live_mutex());  // a tensor being destroyed waits here, so its handles stay
    for (const TileTensor *t : live()) {
        for (auto h : t->handles_) {
            const int64_t bytes = (int64_t)starpu_data_get_size(h);
            const int home = starpu_data_get_home_node(h);
            if (home >= 0 && home < (int)nnodes) out[home].homes += bytes;
            int nvalid = 0, last = -1;
            for (unsigned n = 0; n < nnodes; ++n) {
                // StarPU reads these without its lock ("just a hint"): exact when nothing moves, as in a stall.
                int allocated = 0, valid = 0;
                starpu_data_query_status(h, (int)n, &allocated, &valid, nullptr);
                if (allocated) out[n].allocated += bytes;
                if (valid) {
                    out[n].valid += bytes;
                    ++nvalid;
                    last = (int)n;
                } else if (allocated) {
                    out[n].stale += bytes;
                }
            }
            if (nvalid == 1) out[last].sole += bytes;
        }
    }
    return out;
}

std::string memory_nodes_text() {
    auto gib = [](int64_t b) { return (double)b / (1 << 30); };
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    bool first = true;
    for (const auto &n : memory_nodes_tiles()) {
        os << (first ? "" : "; ") << n.name << ": ";
        first = false;
        if (n.total > 0)
            os << gib(n.used) << " of " << gib(n.total) << " GiB used";
        else
            os << "no limit";
        os << ", tile buffers " << gib(n.allocated) << " GiB (valid " << gib(n.valid) << ", the only valid copy "
           << gib(n.sole) << ", stale " << gib(n.stale) << (n.homes ? ", homes " : "");
        if (n.homes) os << gib(n.homes);
        os << ")";
        if (n.total > 0) os << ", other " << gib(n.used - n.allocated) << " GiB";
    }
    return os.str();
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
