// Home buffers of persistent tiles in pinned host RAM (NNTILE_HOST_HOMES; tile_tensor.h): the budget and the buffers.
#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

#include "../settings.h"
#include "registry.h"
#include "tile_tensor.h"

namespace nntile {

using namespace detail;

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

}  // namespace nntile
