"""Patches StarPU 1.3.10's sources:
1. its CUDA driver for CUDA 13, which removed cudaDeviceProp::computeMode and the legacy cublas.h API;
2. the size of host RAM as a memory node: StarPU takes hwloc's total of the NUMA nodes, which on virtual machines
   can miss much of the RAM (seen: NUMA node 0 reading 14 of a 24 GiB machine's RAM at start, the full 24.7 later), and then stalls once its
   tiles in host RAM reach that figure (writing them, or evicting a full GPU into host RAM, waits forever).
   The patched StarPU takes the larger of hwloc's total and the physical memory (sysconf).
Idempotent: an already patched tree is left as it is."""
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
            sys.exit(f"patch_starpu: {rel}: expected text not found: {old!r}")
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
patch("src/core/topology.c", [(
    "global_mem = hwloc_get_root_obj(topology->hwtopology)->total_memory;",
    "global_mem = (size_t) hwloc_get_root_obj(topology->hwtopology)->total_memory;"
    " { /* nntile_torch: RAM outside hwloc's NUMA nodes (virtual machines) */"
    " long pages_ = sysconf(_SC_PHYS_PAGES), page_ = sysconf(_SC_PAGESIZE);"
    " if (pages_ > 0 && page_ > 0 && (size_t) pages_ * (size_t) page_ > global_mem)"
    " global_mem = (size_t) pages_ * (size_t) page_; }",
)])
print("patched StarPU sources (CUDA 13, host memory size)")
