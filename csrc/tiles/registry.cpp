// The live tile tensors: the registry, the bytes their tiles take (and the peak), what the memory nodes can hold, and
// per memory node where those bytes are (the stall report's breakdown).
#include "registry.h"

#include <exception>
#include <iomanip>
#include <sstream>

#include "../runtime.h"

namespace nntile {

namespace detail {

std::unordered_set<TileTensor *> &live() {
    static std::unordered_set<TileTensor *> s;
    return s;
}

std::mutex &live_mutex() {
    static std::mutex m;
    return m;
}

std::vector<TileTensor *> live_snapshot() {
    std::lock_guard<std::mutex> lock(live_mutex());
    return {live().begin(), live().end()};
}

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

}  // namespace detail

using namespace detail;

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
                int allocated = 0, valid = 0, requested = 0;
                starpu_data_query_status(h, (int)n, &allocated, &valid, &requested);
                if (allocated) out[n].allocated += bytes;
                if (requested) out[n].requested += bytes;
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
           << gib(n.sole) << ", stale " << gib(n.stale) << ", transfers in " << gib(n.requested)
           << (n.homes ? ", homes " : "");
        if (n.homes) os << gib(n.homes);
        os << ")";
        if (n.total > 0) os << ", other " << gib(n.used - n.allocated) << " GiB";
    }
    return os.str();
}

}  // namespace nntile
