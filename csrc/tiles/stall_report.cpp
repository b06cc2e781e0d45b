// The stall report: what StarPU's watchdog prints when no task finishes while tasks are pending, with what each
// memory node holds and what to change (stall_advice.h).
#include "stall_advice.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

#include "../runtime.h"
#include "../settings.h"

namespace nntile {

std::string stall_advice(const std::vector<NodeTiles> &nodes, bool has_disk, int max_window) {
    // A node is at its limit within 3%; "outside live tiles" counts when it is over a quarter of the node, "only
    // copies" when they fill over 60% of every node at its limit (thresholds: docs/measurements.md, "Stall advice").
    auto gib = [](int64_t b) { return (double)b / (1 << 30); };
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    std::vector<const NodeTiles *> full;
    for (const auto &n : nodes)
        if (n.total > 0 && n.used >= n.total - n.total / 33) full.push_back(&n);
    if (full.empty())
        return "No memory node is at its limit, so this is not StarPU failing to evict: a task waits for something "
               "else (STARPU_WATCHDOG_CRASH=1 gives a backtrace).";
    std::string outside;
    for (const auto *n : full) {
        const int64_t other = n->used - n->allocated;
        if (other > n->total / 4) {
            std::ostringstream o;
            o << std::fixed << std::setprecision(1) << (outside.empty() ? "" : ", ") << n->name << " " << gib(other)
              << " of " << gib(n->total) << " GiB";
            outside += o.str();
        }
    }
    // full of sole copies: most of it sole, and too few copies valid elsewhere too (which StarPU could drop) to
    // make room: a copy valid on two full nodes is no sole copy on either, but it is room on one of them
    bool all_sole = true;
    for (const auto *n : full)
        all_sole = all_sole && n->sole * 5 > n->total * 3 && (n->valid - n->sole) * 10 < n->total;
    int limited = 0;
    for (const auto &n : nodes) limited += n.total > 0;
    const bool no_room = all_sole && (int)full.size() == limited;  // every limited node full of only copies
    os << "At their limit: ";
    for (size_t i = 0; i < full.size(); ++i) os << (i ? ", " : "") << full[i]->name;
    os << ".";
    if (!outside.empty()) {
        os << " Memory held outside live tiles (buffers of tiles freed while tasks on them are pending, StarPU's "
              "cache of freed buffers): "
           << outside << ". Fewer tasks in flight bound it: a smaller submission window (init(max_submitted_tasks=";
        if (max_window > 0)
            os << max_window / 2 << "), now " << max_window << ").";
        else
            os << "1000), now none).";
    }
    if (no_room) {
        os << " Every limited node is full of the only valid copies of live tiles: the step's data does not fit "
              "with room to move it. ";
        if (!has_disk) os << "Add a disk node (init(disk_path=..., disk_limit=...)) or make";
        else os << "Make";
        os << " it smaller: a smaller batch, AdamW(state_dtype=torch.bfloat16), activation checkpointing.";
    }
    // copies valid on another node too: StarPU may drop them to make room (a tenth of a full node or more is named,
    // with the transfers into that node pending: busy copies, or idle ones it did not drop)
    std::string dups;
    for (const auto *n : full) {
        const int64_t dup = n->valid - n->sole;
        if (dup * 10 >= n->total) {
            std::ostringstream o;
            o << std::fixed << std::setprecision(1) << (dups.empty() ? "" : ", ") << n->name << " " << gib(dup)
              << " GiB (transfers in " << gib(n->requested) << ")";
            dups += o.str();
        }
    }
    if (!dups.empty())
        os << " Copies also valid on another node, which StarPU may drop to make room: " << dups << ".";
    if (outside.empty() && !no_room)
        os << " StarPU 1.3.10 fails to evict there (docs/DESIGN.md, 'Runtime and memory'): use a smaller batch, a "
              "smaller submission window (init(max_submitted_tasks=...)), AdamW(state_dtype=torch.bfloat16) or more "
              "GPUs.";
    return os.str();
}

std::string stall_advice_now() {
    return stall_advice(memory_nodes_tiles(), disk_node() >= 0, submission_window().first);
}

namespace {
// StarPU's watchdog calls this when no task finished for STARPU_WATCHDOG_TIMEOUT while tasks are pending. Models
// that overfill the GPU stalled like that in StarPU 1.3.10 (its eviction of written tiles to host RAM, or an
// allocation in host RAM, never completed; docs/measurements.md): say so, with what each memory node holds, instead
// of hanging in silence.
void report_stall(void *) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "nntile_torch: no StarPU task finished for "
       << (double)watchdog_timeout_us() / 1e6 << " s (" << starpu_task_nsubmitted()
       << " tasks pending, " << starpu_task_nready() << " ready). Memory nodes: " << memory_nodes_text() << ". "
       << stall_advice_now()
       << " STARPU_WATCHDOG_CRASH=1 aborts here instead of waiting; STARPU_WATCHDOG_TIMEOUT (microseconds) sets the "
          "delay.\n";
    std::fputs(os.str().c_str(), stderr);
    std::fflush(stderr);
}
}  // namespace

// Installed when the library loads: the runtime sets it as StarPU's watchdog hook at every init.
const bool stall_report_installed = (set_stall_report(report_stall), true);

}  // namespace nntile
