// See host_pool.h.
#include "host_pool.h"

#include <starpu.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#ifdef NNTILE_USE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nntile {
namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kSlabRound = size_t(2) << 20;
constexpr int64_t kDefaultSlab = int64_t(1) << 30;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Memory of a slab or a buffer outside them: pinned (cudaHostAlloc, portable) or anonymous pages.
void *system_alloc(size_t bytes, bool pinned) {
#ifdef NNTILE_USE_CUDA
    if (pinned) {
        void *p = nullptr;
        if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        return p;
    }
#else
    (void)pinned;
#endif
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

void system_free(void *p, size_t bytes, bool pinned) {
#ifdef NNTILE_USE_CUDA
    if (pinned) {
        if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
        return;
    }
#else
    (void)pinned;
#endif
    munmap(p, bytes);
}

// Best fit over free blocks of slabs of one kind (pinned or not), neighbours merged on free.
class Pool {
  public:
    explicit Pool(int64_t slab_bytes) : slab_bytes_(slab_bytes) {}
    ~Pool() = default;  // slabs are given back by release() alone (a static pool outlives CUDA's context)

    void set_cap(bool pinned, int64_t cap) {
        std::lock_guard<std::mutex> lock(mu_);
        cap_[pinned] = cap;
    }

    void *alloc(size_t bytes, bool pinned) {
        const size_t len = round_up(std::max<size_t>(bytes, 1), kAlign);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.allocations;
        auto &free = free_[pinned];
        auto it = free.lower_bound(std::make_tuple(len, size_t(0), size_t(0)));
        if (it == free.end()) {
            const size_t want = std::max(round_up(len, kSlabRound), (size_t)slab_bytes_);
            const int64_t held = pinned ? stats_.pinned_slab_bytes : stats_.slab_bytes - stats_.pinned_slab_bytes;
            void *base = nullptr;
            if (cap_[pinned] <= 0 || held + (int64_t)want <= cap_[pinned]) base = system_alloc(want, pinned);
            if (!base) {  // the cap, or the system refused a slab: this buffer alone, as StarPU would
                void *p = system_alloc(len, pinned);
                if (!p) return nullptr;
                outside_[p] = {len, pinned};
                ++stats_.fallbacks;
                count_live(len);
                return p;
            }
            slabs_.push_back({(char *)base, want, pinned, {}});
            const size_t s = slabs_.size() - 1;
            ++stats_.slabs;
            ++stats_.slab_allocations;
            stats_.slab_bytes += (int64_t)want;
            if (pinned) stats_.pinned_slab_bytes += (int64_t)want;
            add_free(s, 0, want);
            it = free.lower_bound(std::make_tuple(len, size_t(0), size_t(0)));
        }
        const auto [blen, s, off] = *it;
        remove_free(s, off, blen);
        if (blen > len) add_free(s, off + len, blen - len);
        char *p = slabs_[s].base + off;
        live_[p] = {s, off, len};
        count_live(len);
        return p;
    }

    // A buffer of its own (the pool switched off, as StarPU would allocate it), freed by free() like the others.
    void *alloc_direct(size_t bytes, bool pinned) {
        const size_t len = round_up(std::max<size_t>(bytes, 1), kAlign);
        void *p = system_alloc(len, pinned);
        if (!p) return nullptr;
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.allocations;
        outside_[p] = {len, pinned};
        count_live(len);
        return p;
    }

    // false: not a buffer of this pool
    bool free(void *p) {
        std::lock_guard<std::mutex> lock(mu_);
        auto out = outside_.find(p);
        if (out != outside_.end()) {
            system_free(p, out->second.first, out->second.second);
            stats_.live_bytes -= (int64_t)out->second.first;
            outside_.erase(out);
            return true;
        }
        auto it = live_.find((char *)p);
        if (it == live_.end()) return false;
        auto [s, off, len] = it->second;
        live_.erase(it);
        stats_.live_bytes -= (int64_t)len;
        auto &slab = slabs_[s];
        auto next = slab.free.find(off + len);  // merge with the free block after, then the one before
        if (next != slab.free.end()) {
            const size_t nlen = next->second;
            remove_free(s, off + len, nlen);
            len += nlen;
        }
        auto after = slab.free.lower_bound(off);
        if (after != slab.free.begin()) {
            auto prev = std::prev(after);
            if (prev->first + prev->second == off) {
                const size_t poff = prev->first, plen = prev->second;
                remove_free(s, poff, plen);
                off = poff;
                len += plen;
            }
        }
        add_free(s, off, len);
        return true;
    }

    // Gives every slab back when no buffer is out; returns whether it did.
    bool release() {
        std::lock_guard<std::mutex> lock(mu_);
        if (!live_.empty() || !outside_.empty()) return false;
        for (auto &slab : slabs_)
            if (slab.base) system_free(slab.base, slab.bytes, slab.pinned);
        slabs_.clear();
        free_[0].clear();
        free_[1].clear();
        stats_.slabs = stats_.slab_bytes = stats_.pinned_slab_bytes = 0;
        return true;
    }

    HostPoolStats stats() {
        std::lock_guard<std::mutex> lock(mu_);
        HostPoolStats s = stats_;
        s.largest_free = 0;
        for (auto &f : free_)
            if (!f.empty()) s.largest_free = std::max<int64_t>(s.largest_free, (int64_t)std::get<0>(*f.rbegin()));
        return s;
    }

    size_t live_count() {
        std::lock_guard<std::mutex> lock(mu_);
        return live_.size() + outside_.size();
    }

  private:
    struct Slab {
        char *base;
        size_t bytes;
        bool pinned;
        std::map<size_t, size_t> free;  // offset -> length, in address order (to merge neighbours)
    };
    struct Live {
        size_t slab, off, len;
    };

    void add_free(size_t s, size_t off, size_t len) {
        slabs_[s].free[off] = len;
        free_[slabs_[s].pinned].insert(std::make_tuple(len, s, off));
    }
    void remove_free(size_t s, size_t off, size_t len) {
        slabs_[s].free.erase(off);
        free_[slabs_[s].pinned].erase(std::make_tuple(len, s, off));
    }
    void count_live(size_t len) {
        stats_.live_bytes += (int64_t)len;
        stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
    }

    std::mutex mu_;
    int64_t slab_bytes_;
    int64_t cap_[2] = {0, 0};
    std::vector<Slab> slabs_;
    std::set<std::tuple<size_t, size_t, size_t>> free_[2];  // (length, slab, offset): best fit is lower_bound
    std::unordered_map<char *, Live> live_;
    std::unordered_map<void *, std::pair<size_t, bool>> outside_;  // buffers beyond the cap: (bytes, pinned)
    HostPoolStats stats_;
};

Pool &runtime_pool() {
    static Pool *pool = new Pool(kDefaultSlab);  // never destroyed: StarPU may free into it at exit
    return *pool;
}
std::atomic<bool> installed{false}, enabled_flag{false}, pin_allowed{false};

bool want_pin(int flags) {
    return (flags & STARPU_MALLOC_PINNED) && pin_allowed.load();
}

int pool_malloc(unsigned, void **A, size_t dim, int flags) {
    const bool pin = want_pin(flags);
    void *p = enabled_flag.load() ? runtime_pool().alloc(dim, pin) : runtime_pool().alloc_direct(dim, pin);
    *A = p;
    return p ? 0 : -ENOMEM;
}

int pool_free(unsigned, void *A, size_t, int) {
    if (!A) return 0;
    if (!runtime_pool().free(A)) {  // allocated before the hooks: cannot happen, they go in before starpu_init
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            std::fprintf(stderr, "nntile_torch: StarPU freed a host buffer the pool did not make (%p): left as it is\n",
                         A);
    }
    return 0;
}

std::unique_ptr<Pool> test_pool;

}  // namespace

void host_pool_install(int64_t cap_bytes, bool enabled) {
    runtime_pool().set_cap(true, cap_bytes);
    enabled_flag.store(enabled);
    if (!installed.exchange(true)) starpu_malloc_set_hooks(pool_malloc, pool_free);
}

void host_pool_allow_pinning(bool allow) { pin_allowed.store(allow); }

void host_pool_release() {
    pin_allowed.store(false);
    if (!runtime_pool().release() && enabled_flag.load())
        std::fprintf(stderr, "nntile_torch: %zu host buffers still allocated at shutdown; their slabs are kept\n",
                     runtime_pool().live_count());
}

HostPoolStats host_pool_stats() { return runtime_pool().stats(); }
bool host_pool_enabled() { return enabled_flag.load(); }

void host_pool_test_reset(int64_t slab_bytes) {
    if (test_pool) test_pool->release();
    test_pool = std::make_unique<Pool>(slab_bytes);
}
void *host_pool_test_alloc(size_t bytes) {
    if (!test_pool) host_pool_test_reset(kDefaultSlab);
    return test_pool->alloc(bytes, false);
}
bool host_pool_test_free(void *p) { return test_pool && test_pool->free(p); }
HostPoolStats host_pool_test_stats() { return test_pool ? test_pool->stats() : HostPoolStats{}; }

}  // namespace nntile
