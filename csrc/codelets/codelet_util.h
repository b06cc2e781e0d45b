// Helpers shared by the codelet files: codelet/perf-model construction and the task counter.
#pragma once
#include <starpu.h>

#include <cstring>

#include "../runtime.h"

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

inline starpu_codelet *new_codelet(const char *name, const char *symbol, starpu_cpu_func_t cpu,
                                   starpu_cuda_func_t cuda, uint32_t (*footprint)(starpu_task *)) {
    auto *d = new CodeletDef;
    init_perfmodel(d->model, symbol, footprint);
    init_codelet(d->cl, name, cpu, cuda, &d->model);
    return &d->cl;
}

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
