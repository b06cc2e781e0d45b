// StarPU runtime lifetime (init/shutdown), task placement, task errors and the counters that prove the task stream
// stays asynchronous. The environment it reads and sets: settings.h; the crash report: crash_report.h.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "settings.h"

struct starpu_codelet;

namespace nntile {

// Negative numbers mean "StarPU's default"; limits are bytes.
struct RuntimeConfig {
    int ncpus = -1;
    int ncuda = -1;
    int64_t cuda_memory_limit = -1;
    int64_t host_memory_limit = -1;
    std::string disk_path;
    int64_t disk_limit = -1;
    std::string scheduler;
    // Whether tasks that have a CUDA implementation may also run on CPU workers: -1 = only when there is no
    // CUDA worker (the default: with history-based models, StarPU would otherwise calibrate every new tile
    // size on the CPU first, e.g. 30 s for a GPT-2 XL GEMM tile), 0 = never, 1 = always.
    int cpu_tasks = -1;
    // Places the row tiles are spread over (docs/DESIGN.md, "Several devices"): row tile i runs on place
    // i % places, place p on worker p % (workers of the kind that computes: CUDA workers, else CPU ones).
    // -1 = the number of CUDA workers when there are two or more, else 1 (no pinning: the scheduler decides).
    // The task graph depends on `places` only, never on the worker count, so results do not either.
    int places = -1;
    // The submission window (docs/DESIGN.md, "Runtime and memory"): the submitting thread waits while more than
    // this many tasks are pending, until 4/5 of it remain. -1 = the user's STARPU_LIMIT_MAX_SUBMITTED_TASKS
    // (and _MIN) if set, else kDefaultSubmissionWindow; 0 = no window.
    int max_submitted_tasks = -1;
};

void runtime_init(const RuntimeConfig &cfg);
// keep_data: tile tensors still alive keep a dense copy and get their tiles back after the next init.
void runtime_shutdown(bool keep_data = true);
bool runtime_running();
const RuntimeConfig &runtime_config();
// The running submission window as StarPU read it: {max, min} pending tasks, {-1, -1} without one.
std::pair<int, int> submission_window();
int disk_node();  // -1 without a disk node

// Every codelet registers itself once; its placement (cl->where) follows the running config's cpu_tasks.
void register_codelet(starpu_codelet *cl);
bool cpu_tasks_allowed();

// Placement of tile tasks: number of places (1 = none) and the worker of row index i (-1 = anywhere).
int placement_count();
int placement_worker(int64_t i);
// While alive, tasks this thread submits run on `worker` (-1: wherever the scheduler puts them; a GPU's worker is
// ignored under set_host_tasks, whose tasks run on CPU workers).
class OnWorker {
  public:
    explicit OnWorker(int worker);
    ~OnWorker();
    OnWorker(const OnWorker &) = delete;
    OnWorker &operator=(const OnWorker &) = delete;

  private:
    int previous_;
};
int hinted_worker();
// While `host` is set, tasks this thread submits run on CPU workers (AdamW(offload=...) keeps those parameters'
// master weights and states in host RAM that way). Returns the previous setting.
bool set_host_tasks(bool host);
// The STARPU_EXECUTE_WHERE of the next task: STARPU_CPU under set_host_tasks(true), else the codelet's own.
unsigned long long hinted_where();

// Called first thing in runtime_shutdown(), while StarPU still runs (tile tensors save and drop handles).
void add_shutdown_hook(std::function<void(bool keep_data)> hook);
// What StarPU's watchdog calls when no task finishes while tasks are pending (tiles/stall_report.cpp sets it, so the
// runtime needs nothing of the tiles); set as the watchdog's hook at every init.
void set_stall_report(void (*report)(void *));
void (*&stall_report())(void *);

// A task that failed records its error here (the first since the last raise); the next submission or wait of the
// submitting thread raises it and clears it, and so does runtime_shutdown(), so an error never outlives the
// runtime it happened in. A failed allocation (torch's CUDA allocator's "out of memory", its CPU allocator's "can't
// allocate memory", std::bad_alloc) is raised as c10::OutOfMemoryError (torch.OutOfMemoryError in Python), naming
// the task, with what to change.
void record_task_error(const char *op, const char *what);
void raise_task_error();

void count_task();
void count_wait();
int64_t tasks_submitted();
int64_t blocking_waits();
void wait_all();  // waits for every submitted task (counted as a blocking wait)

}  // namespace nntile
