// Helpers shared by the codelet files: codelet/perf-model construction and the task counter.
#pragma once
#include <starpu.h>

#include <cstdlib>
#include <cstring>

#include "../kernels/aten_tile.h"
#include "../runtime.h"
#include "../task_trace.h"

namespace nntile::codelets {

// A history-based perf model keyed by `footprint` (a hash of the sizes in the task's arguments).
inline void init_perfmodel(starpu_perfmodel &model, const char *symbol, uint32_t (*footprint)(starpu_task *)) {
    std::memset(&model, 0, sizeof(model));
    model.type = STARPU_HISTORY_BASED;
    model.symbol = symbol;
    model.footprint = footprint;
}

// Access modes are given per task (a buffer may be W in one task and RW in the next, e.g. beta == 0), so
// every codelet takes a variable number of buffers; StarPU would otherwise pin the first mode it saw.
inline void init_codelet(starpu_codelet &cl, const char *name, starpu_cpu_func_t cpu, starpu_cuda_func_t cuda,
                         starpu_perfmodel *model) {
    std::memset(&cl, 0, sizeof(cl));
    cl.name = name;
    cl.cpu_funcs[0] = cpu;
#ifdef NNTILE_USE_CUDA
    cl.cuda_funcs[0] = cuda;
    cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
#else
    (void)cuda;
#endif
    cl.nbuffers = STARPU_VARIABLE_NBUFFERS;
    cl.model = model;
}

// A codelet and its perf model, built once and kept for the process (StarPU holds pointers to both).
struct CodeletDef {
    starpu_perfmodel model;
    starpu_codelet cl;
};

// Runs a codelet function; an exception (which would end the process on a worker thread) is recorded instead
// and raised by the submitting thread's next submission or wait (runtime.h: record_task_error).
template <void (*F)(void **, void *)>
void guarded(void *buffers[], void *cl_arg) {
    try {
        if (task_trace_on()) {
            double enter = task_trace_now_us();
            F(buffers, cl_arg);
            task_trace_function(enter, task_trace_now_us());
        } else {
            F(buffers, cl_arg);
        }
    } catch (const std::exception &e) {
        starpu_task *task = starpu_task_get_current();
        record_task_error(task && task->cl && task->cl->name ? task->cl->name : "nntile", e.what());
    }
}

template <void (*F)(void **, void *)>
constexpr void (*guarded_or_null())(void **, void *) {
    if constexpr (F == nullptr)
        return nullptr;
    else
        return guarded<F>;
}

// new_codelet<cpu, cuda>(name, symbol, footprint): CUDA function may be nullptr (CPU-only builds).
template <starpu_cpu_func_t Cpu, starpu_cuda_func_t Cuda>
starpu_codelet *new_codelet(const char *name, const char *symbol, uint32_t (*footprint)(starpu_task *)) {
    auto *d = new CodeletDef;
    init_perfmodel(d->model, symbol, footprint);
    init_codelet(d->cl, name, guarded_or_null<Cpu>(), guarded_or_null<Cuda>(), &d->model);
    register_codelet(&d->cl);
    return &d->cl;
}

// Where a task's ATen-based kernel runs: where<true>() is this CUDA worker's device and stream, where<false>()
// the CPU.
template <bool Cuda>
kernels::Where where() {
#ifdef NNTILE_USE_CUDA
    if (Cuda)
        return kernels::Where{true, starpu_worker_get_devid(starpu_worker_get_id()),
                              (void *)starpu_cuda_get_local_stream()};
#endif
    return kernels::Where{};
}

// Task arguments in malloc'd memory, as STARPU_CL_ARGS wants (StarPU frees them after the task).
template <class Args>
Args *cl_args(const Args &a) {
    auto *p = static_cast<Args *>(std::malloc(sizeof(Args)));
    *p = a;
    return p;
}

// The CUDA implementation of a codelet, or nullptr in a CPU-only build.
#ifdef NNTILE_USE_CUDA
#define NNTILE_CUDA_IMPL(f) f
#else
#define NNTILE_CUDA_IMPL(f) nullptr
#endif

// starpu_task_insert with the placement hints of the submitting thread (runtime.h: OnWorker, set_host_tasks) and,
// while a task trace is on, its recorder as the task's callback (task_trace.h).
#define NNTILE_TASK_INSERT(cl, ...)                                                                         \
    starpu_task_insert(cl, STARPU_EXECUTE_ON_WORKER, hinted_worker(), STARPU_EXECUTE_WHERE, hinted_where(), \
                       STARPU_CALLBACK, task_trace_callback(), __VA_ARGS__)

template <class Args>
inline const Args &args_of(starpu_task *task) {
    return *static_cast<const Args *>(task->cl_arg);
}

inline uint32_t hash_ints(std::initializer_list<int64_t> values) {
    uint32_t h = 0;
    for (int64_t v : values) h = starpu_hash_crc32c_be_n(&v, sizeof(v), h);
    return h;
}

}  // namespace nntile::codelets
