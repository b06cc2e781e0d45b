// Keeps the calling thread's current CUDA device across StarPU calls made from it.
#pragma once

#ifdef NNTILE_USE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nntile {

// StarPU allocates (and frees) a tile's buffer on a GPU from whichever thread asks for it, after
// cudaSetDevice(that GPU), and does not switch back. torch reads the current device from CUDA, so after the main
// thread acquired a tile on GPU 1, its "cuda" tensors and streams would silently move to GPU 1. Held around such
// calls, this puts the device back (and clears any error StarPU's calls left in CUDA's per-thread error state).
class KeepCudaDevice {
  public:
    KeepCudaDevice() {
#ifdef NNTILE_USE_CUDA
        if (cudaGetDevice(&dev_) != cudaSuccess) {
            dev_ = -1;
            (void)cudaGetLastError();
        }
#endif
    }
    ~KeepCudaDevice() {
#ifdef NNTILE_USE_CUDA
        int now = -1;
        if (dev_ >= 0 && (cudaGetDevice(&now) != cudaSuccess || now != dev_)) (void)cudaSetDevice(dev_);
        (void)cudaGetLastError();
#endif
    }
    KeepCudaDevice(const KeepCudaDevice &) = delete;
    KeepCudaDevice &operator=(const KeepCudaDevice &) = delete;

  private:
    int dev_ = -1;
};

}  // namespace nntile
