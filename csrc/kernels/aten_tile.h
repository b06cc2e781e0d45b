// Running an ATen kernel on raw tile pointers: wraps them as tensors on the right device and makes StarPU's
// worker stream torch's current stream for the call, so ATen's kernels (layer norm, GELU, ...) run inside the
// task, asynchronously, writing into the tiles.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#ifdef NNTILE_USE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace nntile::kernels {

// Where a kernel runs: the CPU, or CUDA device `device` on `stream` (a cudaStream_t).
struct Where {
    bool cuda = false;
    int device = 0;
    void *stream = nullptr;
};

inline at::Tensor wrap(const void *ptr, at::IntArrayRef sizes, const Where &w, at::ScalarType t = at::kFloat) {
    auto opts = at::TensorOptions().dtype(t);
    opts = w.cuda ? opts.device(at::kCUDA, w.device) : opts.device(at::kCPU);
    return at::from_blob(const_cast<void *>(ptr), sizes, opts);
}

// Holds StarPU's stream as torch's current stream (and the device) while alive.
class StreamScope {
  public:
    explicit StreamScope(const Where &w) {
#ifdef NNTILE_USE_CUDA
        if (w.cuda)
            guard_.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(w.stream), w.device));
#else
        (void)w;
#endif
    }

  private:
#ifdef NNTILE_USE_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> guard_;
#endif
};

}  // namespace nntile::kernels
