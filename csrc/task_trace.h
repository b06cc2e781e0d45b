// A record of every task's way through StarPU (submitted, pushed to the scheduler, popped by a worker, its data
// acquired, its kernels launched, found finished, its data released) while a trace is on: where the time between
// two dependent tasks goes. StarPU's own per-task profiling supplies the times; the codelet wrapper adds how long
// the codelet's function (our kernels' launches) ran on the worker's thread.
#pragma once
#include <starpu.h>

#include <cstdint>
#include <string>
#include <vector>

namespace nntile {

struct TaskTraceRecord {
    std::string name;
    int worker = -1;
    // Microseconds on StarPU's clock; -1 where StarPU did not record that step.
    double submit = -1, push_start = -1, push_end = -1, pop_start = -1, pop_end = -1, acquire_start = -1,
           acquire_end = -1, start = -1, end = -1, release_start = -1, release_end = -1, callback = -1;
    double func_enter = -1, func_exit = -1;  // the codelet's function on the worker's thread
};

// Starts a trace (StarPU's task profiling on, earlier records dropped); only tasks submitted from now on are
// recorded. stop returns the records of the tasks that finished, in the order they finished, and turns profiling
// off again.
void task_trace_start();
std::vector<TaskTraceRecord> task_trace_stop();
// The callback every submission passes to StarPU: the recorder while a trace is on, else nullptr.
void (*task_trace_callback())(void *);
// Called by the codelet wrapper around each codelet function while a trace is on.
bool task_trace_on();
void task_trace_function(double enter_us, double exit_us);
double task_trace_now_us();

}  // namespace nntile
