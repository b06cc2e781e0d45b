// The task trace of task_trace.h: StarPU's profiling info, read in each task's callback.
#include "task_trace.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "common.h"

namespace nntile {

namespace {

std::atomic<bool> tracing{false};
std::mutex trace_mutex;
std::vector<TaskTraceRecord> records;
// task -> its codelet function's enter and exit (StarPU numbers jobs only in FxT builds; a task's address is unique
// until the callback that takes its entry out)
std::unordered_map<const starpu_task *, std::pair<double, double>> functions;

double us(const struct timespec &t) {
    if (t.tv_sec == 0 && t.tv_nsec == 0) return -1;
    return starpu_timing_timespec_to_us(const_cast<struct timespec *>(&t));
}

void record(void *) {
    starpu_task *task = starpu_task_get_current();
    if (!task || !tracing.load(std::memory_order_relaxed)) return;
    TaskTraceRecord r;
    r.name = task->name ? task->name : (task->cl && task->cl->name ? task->cl->name : "?");
    r.callback = task_trace_now_us();
    if (const auto *p = task->profiling_info) {
        r.worker = p->workerid;
        r.submit = us(p->submit_time);
        r.push_start = us(p->push_start_time);
        r.push_end = us(p->push_end_time);
        r.pop_start = us(p->pop_start_time);
        r.pop_end = us(p->pop_end_time);
        r.acquire_start = us(p->acquire_data_start_time);
        r.acquire_end = us(p->acquire_data_end_time);
        r.start = us(p->start_time);
        r.end = us(p->end_time);
        r.release_start = us(p->release_data_start_time);
        r.release_end = us(p->release_data_end_time);
    }
    std::lock_guard<std::mutex> lock(trace_mutex);
    auto f = functions.find(task);
    if (f != functions.end()) {
        r.func_enter = f->second.first;
        r.func_exit = f->second.second;
        functions.erase(f);
    }
    records.push_back(std::move(r));
}

}  // namespace

double task_trace_now_us() { return starpu_timing_now(); }  // the clock of StarPU's profiling times

void task_trace_start() {
    {
        std::lock_guard<std::mutex> lock(trace_mutex);
        records.clear();
        functions.clear();
    }
    int rc = starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    NNTILE_CHECK(rc >= 0, "starpu_profiling_status_set failed (returned " << rc << ")");
    tracing.store(true);
}

std::vector<TaskTraceRecord> task_trace_stop() {
    tracing.store(false);
    starpu_profiling_status_set(STARPU_PROFILING_DISABLE);
    std::lock_guard<std::mutex> lock(trace_mutex);
    functions.clear();
    std::vector<TaskTraceRecord> out;
    out.swap(records);
    return out;
}

void (*task_trace_callback())(void *) { return tracing.load(std::memory_order_relaxed) ? &record : nullptr; }

bool task_trace_on() { return tracing.load(std::memory_order_relaxed); }

void task_trace_function(double enter_us, double exit_us) {
    starpu_task *task = starpu_task_get_current();
    if (!task) return;
    std::lock_guard<std::mutex> lock(trace_mutex);
    functions[task] = {enter_us, exit_us};
}

}  // namespace nntile
