// The monitor of host threads waiting for tiles (host_waits.h).
#include "host_waits.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include <starpu.h>

#include "../runtime.h"
#include "tile_tensor.h"

namespace nntile {

namespace {

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

}  // namespace

HostWait::HostWait(int node, bool write) {
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

HostWait::~HostWait() {
    auto &w = host_waits();
    std::lock_guard<std::mutex> lock(w.m);
    w.waits.erase(id_);
}

}  // namespace nntile
