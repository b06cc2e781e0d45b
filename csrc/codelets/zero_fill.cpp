// The initializer of every tile handle (zero_fill.h).
#include "zero_fill.h"

#include <cstring>

#ifdef NNTILE_USE_CUDA
#include <cuda_runtime.h>
#endif

namespace nntile {

namespace {

// The value of a tile read before anything wrote it (TileTensor.empty never filled): zeros. Without an
// initializer StarPU aborts the process on such a read ("handle ... is not initialized"), e.g. printing an empty
// tensor or runtime shutdown keeping the values of a live one; with it, a host read runs this codelet first, and
// a task reading the tile gets its buffer as allocated (undefined values, as torch.empty's).
void zero_fill_cpu(void *buffers[], void *) {
    std::memset((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
                (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

#ifdef NNTILE_USE_CUDA
void zero_fill_cuda(void *buffers[], void *) {
    cudaMemsetAsync((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
                    (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]),
                    starpu_cuda_get_local_stream());
}
#endif

}  // namespace

starpu_codelet *zero_fill_codelet() {
    static starpu_codelet cl = [] {
        starpu_codelet c;
        std::memset(&c, 0, sizeof(c));
        c.name = "nntile_zero_fill";
        c.cpu_funcs[0] = zero_fill_cpu;
#ifdef NNTILE_USE_CUDA
        c.cuda_funcs[0] = zero_fill_cuda;
        c.cuda_flags[0] = STARPU_CUDA_ASYNC;
#endif
        c.nbuffers = 1;
        c.modes[0] = STARPU_W;
        return c;
    }();
    return &cl;
}

}  // namespace nntile
