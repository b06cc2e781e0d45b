"""Patches StarPU 1.3.10's CUDA driver for CUDA 13, which removed cudaDeviceProp::computeMode and the legacy
cublas.h API. Idempotent: an already patched tree is left as it is."""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])


def patch(rel, pairs):
    path = root / rel
    text = path.read_text()
    for old, new in pairs:
        if new in text and old not in text:
            continue
        if old not in text:
            sys.exit(f"patch_starpu_cuda13: {rel}: expected text not found: {old!r}")
        text = text.replace(old, new)
    path.write_text(text)


patch("src/drivers/cuda/driver_cuda.c", [(
    "props[devid].computeMode == cudaComputeModeExclusive",
    "({ int mode_ = 0; cudaDeviceGetAttribute(&mode_, cudaDevAttrComputeMode, devid); mode_; })"
    " == cudaComputeModeExclusive",
)])
patch("src/drivers/cuda/driver_cuda.h", [("#include <cublas.h>", "#include <cublas_v2.h>")])
patch("src/drivers/cuda/starpu_cublas.c", [
    ("#include <cublas.h>\n", "#include <cublas_v2.h>\n"),
    ("cublasStatus cublasst = cublasInit();", "cublasStatus_t cublasst = CUBLAS_STATUS_SUCCESS;"),
    ("\t\tcublasShutdown();", "\t\t;"),
    ("cublasSetKernelStream(starpu_cuda_get_local_stream());",
     "cublasSetStream(cublas_handles[starpu_worker_get_id_check()], starpu_cuda_get_local_stream());"),
])
print("patched StarPU sources for CUDA 13")
