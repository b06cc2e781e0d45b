"""Patches StarPU's sources, 1.3.10 or 1.4.10 (the series is read from the tree's STARPU-VERSION):
1. its CUDA driver for CUDA 13, which removed cudaDeviceProp::computeMode (both series) and, in 1.3.10, the
   legacy cublas.h API next to cublas_v2.h (1.4 keeps the two in separate files and builds unchanged);
2. the size of host RAM as a memory node: StarPU takes hwloc's total of the NUMA nodes, which on virtual machines
   can miss much of the RAM (seen: NUMA node 0 reading 14 of a 24 GiB machine's RAM at start, the full 24.7
   later), and then stalls once its tiles in host RAM reach that figure (writing them, or evicting a full GPU
   into host RAM, waits forever). 1.4.10 reads the size the same way (src/core/topology.c).
   The patched StarPU takes the larger of hwloc's total and the physical memory (sysconf).
3. eviction, for models larger than the GPU (docs/DESIGN.md, "Beyond GPU memory"); each part is off unless its
   environment variable is set to 1 when StarPU starts, so that one StarPU build runs both sides of an A/B:
   NNTILE_DROP_HOST_COPIES: a host-RAM buffer of a tile registered without a home node is freed when host memory
   runs short and another node holds the tile's value (1.3.10 and 1.4.10 free one only towards a disk node, so
   host RAM held every tile that was ever there); and an eviction started while this thread is already evicting
   skips tiles that would need a write-back (the allocation fails and is retried) instead of nesting without bound.
   NNTILE_EVICT_WONT_USE_FIRST: starpu_data_wont_use() puts a home-less tile first in its node's eviction order
   (1.3.10 and 1.4.10 do so only for tiles with a home node): AdamW marks the moments (and fp32 weights with a
   bf16 copy) it has just updated, which in a training step's cyclic sweep are the tiles needed last.
4. GPU buffers from a stream-ordered memory pool instead of cudaMalloc / cudaFree, when NNTILE_CUDA_POOL=1
   at StarPU's start: cudaFree waits for everything running on the GPU, and StarPU's CUDA worker, which launches the
   kernels and issues the copies, called it for every buffer it evicted (781 calls, 1.5 s, per 20B step on the H200,
   with 781 cudaMalloc calls, 0.9 s, beside them: the worker stopped, the GPU and the copies with it). A buffer StarPU
   frees is no longer in use by any kernel or copy (it frees after their completion events), so it goes back to a
   pool of this GPU's (cudaFreeAsync on the pool's own stream) that keeps its memory (release threshold: never), and
   allocations come from it (cudaMallocFromPoolAsync, then a synchronization of that stream alone). StarPU's own
   limit (STARPU_LIMIT_CUDA_MEM) still bounds what it allocates; cudaMemGetInfo's check is skipped (the pool's free
   memory is invisible to it). 1.4.10's CUDA driver allocates and frees the same way, and is patched the same.
5. no cudaDeviceReset after measuring the bus (the first start on a machine, or with a new STARPU_HOME): it destroyed
   the GPU's primary context, which torch shares, so a process whose torch had already put tensors on the GPU found
   them gone ("an illegal memory access was encountered" at its next CUDA call). Freeing the measuring buffers, as
   StarPU does before the reset, is all the measurement needs.
6. a marker, int starpu_nntile_patch_level(void), returning PATCH_LEVEL: nntile_torch reads it from the StarPU it
   loaded (runtime.starpu_patch_level) and warns when the patch is missing or older than it needs, instead of
   silently losing 3. and 4. with a StarPU built elsewhere. Bump PATCH_LEVEL, nntile_torch's
   runtime.REQUIRED_STARPU_PATCH_LEVEL and install_starpu.sh's build id together whenever the patch changes.
7. no abort when a task's measured time is negative (driver_common.c asserts measured >= 0): a CUDA worker running
   tasks asynchronously can take one task's end against a later task's start while it calibrates a performance
   model, and the whole process died ("Assertion `0 && \"measured >= 0\"' failed" on a CUDA worker, seen on the H200
   after about 130 GPU tests in one process: each new tile shape is calibrated, so the more shapes, the likelier).
   That sample is dropped from the model and the profile instead.
8. starpu_data_wont_use() on a home-less tile no longer queues a write of it to every disk node (user_interactions.c,
   "Try to push it to some disk": an idle prefetch). Such a request holds a reference on the tile's host buffer, so
   host RAM cannot evict it, and on a disk buffer, allocated and not valid until the write; and a node runs its idle
   requests only while no other request of it is pending. Once one fetch from the disk waits for host memory, the
   host buffers of every tile marked won't-use (AdamW's moments and updated weights, each step; the plan's streamed
   blocks) stay pinned behind it, the fetch never gets its memory, and the training stops with the disk full of
   those requests' buffers (the stall report's "stale": allocated, no valid copy). Seen on CPUs with a 24 MiB host
   limit and an 18 MiB disk node (tests/test_runtime.py, the stale disk training): stopped within 5 s in three runs
   of three, with the stale disk buffers held by such requests (89 of 89 and 55 of 56 in the two runs counted);
   without the won't-use hints (NNTILE_EVICT_WONT_USE_FIRST=0), or with this patch, six steps in 1-2 s. The tile is still put first in its node's eviction order (3., NNTILE_EVICT_WONT_USE_FIRST), so it
   is written to a disk when host memory is needed, by an eviction that waits for its own write. Not behind a
   switch: a deadlock is no trade-off. Where 1.4.10's file differs, nothing is changed there.
9. a full disk node gives up the copies it holds of tiles valid on another node, and its stale buffers, when host RAM
   must make room (memalloc.c, with NNTILE_DROP_HOST_COPIES). 1.3.10 frees a buffer on a node only when an allocation
   on that node fails, and host RAM evicts a tile to a disk only when the disk has room for it already (or a buffer
   of that tile: get_better_disk_can_accept_size tests _starpu_memory_manager_test_allocate_size), so nothing is ever
   allocated on a full disk and its reclaim never runs: a tile read back from the disk keeps its disk buffer (a copy
   while it is not written, stale after) for as long as it lives, and the disk fills with them. And a disk buffer is
   freed only towards host RAM with room (choose_target: "try to push data to RAM if we can before to push on disk"),
   so a disk copy of a tile also valid on a GPU stays while host RAM is full. The 45B run stopped in step 1 with the
   disk full, 14.2 of its 45 GiB such copies, and host RAM full. Now a host-RAM reclaim first frees, on each disk
   node short of the room asked, buffers holding no sole copy (its cache of freed buffers, stale buffers, copies
   valid elsewhere; no disk-held sole copy is moved: the nested-eviction rule of 3. applies), and choose_target lets
   any node's buffer that holds no sole copy go to the node that holds the value (1.3.10 did so only for host RAM,
   3.). 1.3.10 only (1.4.10 keeps these lists per node in another form; not ported). On CPUs, host RAM of 16 MiB
   and a 24 MiB disk node full of the buffers of dropped tiles stopped the next tensor needing the disk, five runs of
   five; with the patch it runs, five of five (tests/test_runtime.py, the full disk rounds).
Idempotent: an already patched tree is left as it is."""
import pathlib
import sys

PATCH_LEVEL = 4  # what starpu_nntile_patch_level() returns (6. above); 2: with 7.; 3: with 8.; 4: with 9.
root = pathlib.Path(sys.argv[1])
# "1.3" or "1.4": where the two differ, memalloc.c's per-node lists moved into struct _starpu_node (1.4)
series = next(line.split("=", 1)[1].strip() for line in (root / "STARPU-VERSION").read_text().splitlines()
              if line.startswith("STARPU_EFFECTIVE_VERSION="))
if series not in ("1.3", "1.4"):
    sys.exit(f"patch_starpu: StarPU {series} is not a series this script knows (1.3, 1.4)")


def patch(rel, pairs, optional=False):
    """Replaces each (old, new) in root/rel; optional: a pair whose old text is not there is skipped (a series or
    release without that code) instead of an error."""
    path = root / rel
    text = path.read_text()
    for old, new in pairs:
        if new in text and (old in new or old not in text):  # applied already (a replacement may contain its original)
            continue
        if old not in text and optional:
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
if series == "1.3":
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

# 3. Eviction (memalloc.c). Settings read once, at first use. The node's chunk list, its counters and its first
# dirty chunk: arrays indexed by node in 1.3, fields of the node's struct in 1.4.
if series == "1.3":
    settings_after = "static struct _starpu_spinlock mc_lock[STARPU_MAXNODES];\n"
    lst, nb, clean_nb, dirty_head, erase = "&mc_list[node]", "mc_nb[node]", "mc_clean_nb[node]", \
        "mc_dirty_head[node]", "MC_LIST_ERASE(node, mc);"
else:
    settings_after = "static int limit_cpu_mem;\n"
    lst, nb, clean_nb, dirty_head, erase = "&node_struct->mc_list", "node_struct->mc_nb", \
        "node_struct->mc_clean_nb", "node_struct->mc_dirty_head", "MC_LIST_ERASE(node_struct, mc);"
patch("src/datawizard/memalloc.c", [
    (settings_after,
     settings_after +
     "/* nntile_torch: eviction settings (scripts/patch_starpu.py) */\n"
     "static int nntile_setting(const char *name, int *cached)\n"
     "{\n\tif (*cached < 0) *cached = starpu_get_env_number_default(name, 0) > 0;\n\treturn *cached;\n}\n"
     "static int nntile_drop_cached = -1, nntile_wont_use_cached = -1;\n"
     "#define NNTILE_DROP_HOST_COPIES() nntile_setting(\"NNTILE_DROP_HOST_COPIES\", &nntile_drop_cached)\n"
     "#define NNTILE_EVICT_WONT_USE_FIRST() nntile_setting(\"NNTILE_EVICT_WONT_USE_FIRST\", &nntile_wont_use_cached)\n"
     "/* Depth of evictions running on this thread: a nested one must not wait for a write-back */\n"
     "static __thread unsigned nntile_evicting;\n"),
    # nested evictions: no write-back from inside another one
    ("\t\t\tif (target != -1 &&\n",
     "\t\t\tif (target != -1 && NNTILE_DROP_HOST_COPIES() && nntile_evicting\n"
     "\t\t\t\t&& handle->per_node[node].state == STARPU_OWNER)\n"
     "\t\t\t\ttarget = -1; /* nntile_torch: would nest a write-back; the allocation is retried */\n"
     "\t\t\tif (target != -1 &&\n"),
    ("\t\t\t\tres = transfer_subtree_to_node(handle, node, target);\n",
     "\t\t\t\tnntile_evicting++;\n"
     "\t\t\t\tres = transfer_subtree_to_node(handle, node, target);\n"
     "\t\t\t\tnntile_evicting--;\n"),
    # host copies of home-less tiles: dropped when another node has the value (or ours is stale)
    ("\t\tif (starpu_node_get_kind(node) == STARPU_CPU_RAM)\n\t\t{\n"
     "\t\t\ttarget = get_better_disk_can_accept_size(handle, node);\n",
     "\t\tif (starpu_node_get_kind(node) == STARPU_CPU_RAM)\n\t\t{\n"
     "\t\t\ttarget = get_better_disk_can_accept_size(handle, node);\n"
     "\t\t\tif (target == -1 && NNTILE_DROP_HOST_COPIES() && handle->nchildren == 0\n"
     "\t\t\t\t&& handle->per_node[node].state != STARPU_OWNER)\n"
     "\t\t\t{\n"
     "\t\t\t\t/* nntile_torch: another node holds the value (SHARED) or ours is stale (INVALID): the\n"
     "\t\t\t\t * transfer only invalidates our copy, and the buffer is freed */\n"
     "\t\t\t\tunsigned i_;\n"
     "\t\t\t\tfor (i_ = 0; i_ < starpu_memory_nodes_get_count(); i_++)\n"
     "\t\t\t\t\tif (i_ != node && (handle->per_node[i_].state != STARPU_INVALID\n"
     "\t\t\t\t\t\t|| handle->per_node[node].state == STARPU_INVALID))\n"
     "\t\t\t\t\t{\n\t\t\t\t\t\ttarget = i_;\n\t\t\t\t\t\tbreak;\n\t\t\t\t\t}\n"
     "\t\t\t}\n"),
    # wont_use on home-less tiles: first in the eviction order
    ("\t/* TODO: else push to head of data to be evicted */\n",
     "\telse if (mc->data && !mc->remove_notify && NNTILE_EVICT_WONT_USE_FIRST())\n"
     "\t{\n"
     "\t\t/* nntile_torch: home-less tile, evicted first (most recently updated first) */\n"
     f"\t\t{erase}\n"
     f"\t\t_starpu_mem_chunk_list_push_front({lst}, mc);\n"
     f"\t\t{nb}++;\n"
     f"\t\tif (mc->clean || mc->home)\n\t\t\t{clean_nb}++;\n"
     f"\t\telse\n\t\t\t{dirty_head} = mc; /* nothing before it is dirty */\n"
     "\t}\n"),
])
# 4. GPU buffers from a stream-ordered pool (the CUDA driver; the same code in both series).
patch("src/drivers/cuda/driver_cuda.c", [
    ("#include <core/task.h>\n",
     "#include <core/task.h>\n"
     "#ifdef STARPU_USE_CUDA\n"
     "/* nntile_torch: GPU buffers from a stream-ordered memory pool (NNTILE_CUDA_POOL=1; scripts/patch_starpu.py) */\n"
     "static int nntile_pool_cached = -1;\n"
     "static int nntile_cuda_pool_enabled(void)\n"
     "{\n\tif (nntile_pool_cached < 0)\n"
     "\t\tnntile_pool_cached = starpu_get_env_number_default(\"NNTILE_CUDA_POOL\", 0) > 0;\n"
     "\treturn nntile_pool_cached;\n}\n"
     "static cudaMemPool_t nntile_pools[STARPU_MAXCUDADEVS];\n"
     "static cudaStream_t nntile_pool_streams[STARPU_MAXCUDADEVS];\n"
     "static starpu_pthread_mutex_t nntile_pool_mutex = STARPU_PTHREAD_MUTEX_INITIALIZER;\n"
     "static void nntile_cuda_pool_get(unsigned devid, cudaMemPool_t *pool, cudaStream_t *stream)\n"
     "{\n"
     "\tSTARPU_PTHREAD_MUTEX_LOCK(&nntile_pool_mutex);\n"
     "\tif (!nntile_pool_streams[devid])\n"
     "\t{\n"
     "\t\tstruct cudaMemPoolProps props;\n"
     "\t\tmemset(&props, 0, sizeof(props));\n"
     "\t\tprops.allocType = cudaMemAllocationTypePinned;\n"
     "\t\tprops.handleTypes = cudaMemHandleTypeNone;\n"
     "\t\tprops.location.type = cudaMemLocationTypeDevice;\n"
     "\t\tprops.location.id = (int) devid;\n"
     "\t\tcudaError_t st = cudaMemPoolCreate(&nntile_pools[devid], &props);\n"
     "\t\tif (st == cudaSuccess)\n"
     "\t\t{\n"
     "\t\t\tuint64_t keep = UINT64_MAX; /* freed memory stays in the pool */\n"
     "\t\t\tst = cudaMemPoolSetAttribute(nntile_pools[devid], cudaMemPoolAttrReleaseThreshold, &keep);\n"
     "\t\t}\n"
     "\t\tif (st == cudaSuccess)\n"
     "\t\t\tst = cudaStreamCreateWithFlags(&nntile_pool_streams[devid], cudaStreamNonBlocking);\n"
     "\t\tif (STARPU_UNLIKELY(st != cudaSuccess))\n"
     "\t\t\tSTARPU_CUDA_REPORT_ERROR(st);\n"
     "\t}\n"
     "\t*pool = nntile_pools[devid];\n"
     "\t*stream = nntile_pool_streams[devid];\n"
     "\tSTARPU_PTHREAD_MUTEX_UNLOCK(&nntile_pool_mutex);\n"
     "}\n"
     "static uintptr_t nntile_cuda_pool_malloc(unsigned devid, size_t size)\n"
     "{\n"
     "\tcudaMemPool_t pool;\n\tcudaStream_t stream;\n\tvoid *ptr = NULL;\n"
     "\tnntile_cuda_pool_get(devid, &pool, &stream);\n"
     "\tcudaError_t st = cudaMallocFromPoolAsync(&ptr, size, pool, stream);\n"
     "\tif (st == cudaSuccess)\n"
     "\t\tst = cudaStreamSynchronize(stream); /* the pool's stream alone: frees and allocations */\n"
     "\tif (st != cudaSuccess)\n"
     "\t{\n"
     "\t\tif (STARPU_UNLIKELY(st != cudaErrorMemoryAllocation))\n"
     "\t\t\tSTARPU_CUDA_REPORT_ERROR(st);\n"
     "\t\t(void) cudaGetLastError();\n"
     "\t\treturn 0;\n"
     "\t}\n"
     "\treturn (uintptr_t) ptr;\n"
     "}\n"
     "static void nntile_cuda_pool_free(unsigned devid, uintptr_t addr)\n"
     "{\n"
     "\tcudaMemPool_t pool;\n\tcudaStream_t stream;\n"
     "\tnntile_cuda_pool_get(devid, &pool, &stream);\n"
     "\tcudaError_t st = cudaFreeAsync((void *) addr, stream);\n"
     "\tif (STARPU_UNLIKELY(st != cudaSuccess))\n"
     "\t\tSTARPU_CUDA_REPORT_ERROR(st);\n"
     "}\n"
     "#endif\n"),
    ("\t/* Check if there is free memory */\n\tsize_t cuda_mem_free, cuda_mem_total;\n",
     "\tif (nntile_cuda_pool_enabled())\n"
     "\t\treturn nntile_cuda_pool_malloc(devid, size); /* nntile_torch */\n"
     "\t/* Check if there is free memory */\n\tsize_t cuda_mem_free, cuda_mem_total;\n"),
    ("#endif /* STARPU_HAVE_CUDA_MEMCPY_PEER */\n\terr = cudaFree((void*)addr);\n",
     "#endif /* STARPU_HAVE_CUDA_MEMCPY_PEER */\n"
     "\tif (nntile_cuda_pool_enabled())\n"
     "\t{\n\t\tnntile_cuda_pool_free(devid, addr); /* nntile_torch */\n\t\treturn;\n\t}\n"
     "\terr = cudaFree((void*)addr);\n"),
])
# 6. The marker: in memalloc.c, before the eviction settings (compiled in every build). Named starpu_* so that it is
# exported like StarPU's own API. Before them, not between their line and their first: 3.'s text stays whole, so a
# second run of this script finds it applied (placed between, 3. was applied twice and memalloc.c did not compile).
patch("src/datawizard/memalloc.c", [(
    settings_after,
    "/* nntile_torch: the level of scripts/patch_starpu.py this StarPU was built with (read by nntile_torch) */\n"
    "int starpu_nntile_patch_level(void);\n"
    f"int starpu_nntile_patch_level(void) {{ return {PATCH_LEVEL}; }}\n" + settings_after,
)])
reset = "#if CUDART_VERSION >= 4000\n\tcudaDeviceReset();\n#else\n\tcudaThreadExit();\n#endif\n"
patch("src/core/perfmodel/perfmodel_bus.c", [(
    reset, "\t/* nntile_torch: no cudaDeviceReset (it frees the CUDA memory of torch in the same process) */\n")],
    optional=series != "1.3")
# 7. a task's measured time below zero is dropped instead of aborting (both series where the assertion is).
patch("src/drivers/driver_common/driver_common.c", [(
    '\t\tSTARPU_ASSERT_MSG(measured >= 0, "measured=%lf\\n", measured);\n',
    "\t\tif (measured < 0)\n\t\t{\n"
    "\t\t\t/* nntile_torch: a CUDA worker running tasks asynchronously can pair one task's end with a later\n"
    "\t\t\t * task's start: not a measurement, so neither the model nor the profile takes it */\n"
    "\t\t\tcalibrate_model = 0;\n\t\t\tprofiling = 0;\n\t\t}\n")], optional=True)
# 8. no idle write to the disks from starpu_data_wont_use (wherever the block is as in 1.3.10).
patch("src/datawizard/user_interactions.c", [(
    "\t\tif (handle->ooc)\n\t\t{\n\t\t\t/* Try to push it to some disk */\n",
    "\t\t/* nntile_torch: no idle write to the disks: it pinned the tile's host buffer until every other\n"
    "\t\t * request of the node was done, and the node could wait for that buffer (scripts/patch_starpu.py, 8.) */\n"
    "\t\tif (0 && handle->ooc)\n\t\t{\n\t\t\t/* Try to push it to some disk */\n")], optional=True)
# 9. full disk nodes give up buffers holding no sole copy when host RAM reclaims (1.3.10's memalloc.c).
if series == "1.3":
    patch("src/datawizard/memalloc.c", [
        ("\t/* we haven't the right to write on the disk */\n"
         "\tif (target != -1 && starpu_node_get_kind(target) == STARPU_DISK_RAM && (_starpu_get_disk_flag(target) & STARPU_DISK_NO_RECLAIM))\n"
         "\t\ttarget = -1;\n",
         "\t/* we haven't the right to write on the disk */\n"
         "\tif (target != -1 && starpu_node_get_kind(target) == STARPU_DISK_RAM && (_starpu_get_disk_flag(target) & STARPU_DISK_NO_RECLAIM))\n"
         "\t\ttarget = -1;\n"
         "\tif (target == -1 && NNTILE_DROP_HOST_COPIES() && handle->nchildren == 0\n"
         "\t\t&& handle->per_node[node].state != STARPU_OWNER)\n"
         "\t{\n"
         "\t\t/* nntile_torch (scripts/patch_starpu.py, 9.): no sole copy here (a disk's copy of a tile valid on a\n"
         "\t\t * GPU while host RAM is full): the transfer only invalidates it, and the buffer is freed */\n"
         "\t\tunsigned i_;\n"
         "\t\tfor (i_ = 0; i_ < starpu_memory_nodes_get_count(); i_++)\n"
         "\t\t\tif (i_ != node && (handle->per_node[i_].state != STARPU_INVALID\n"
         "\t\t\t\t|| handle->per_node[node].state == STARPU_INVALID))\n"
         "\t\t\t{\n\t\t\t\ttarget = i_;\n\t\t\t\tbreak;\n\t\t\t}\n"
         "\t}\n"),
        ("size_t _starpu_memory_reclaim_generic(unsigned node, unsigned force, size_t reclaim)\n{\n"
         "\tsize_t freed = 0;\n\n\tSTARPU_ASSERT(node < STARPU_MAXNODES);\n",
         "/* nntile_torch (scripts/patch_starpu.py, 9.): host RAM evicts to a disk only where the disk has room,\n"
         " * and a node frees buffers only when an allocation on it fails, so a full disk never gave up its\n"
         " * stale buffers and copies of tiles valid elsewhere. Before host RAM reclaims, each disk node short\n"
         " * of the room frees those (its sole copies stay: nntile_evicting keeps them from being written into\n"
         " * host RAM, which is what is short). */\n"
         "static void nntile_reclaim_disks(size_t reclaim)\n"
         "{\n"
         "\tunsigned i, nnodes = starpu_memory_nodes_get_count();\n"
         "\tfor (i = 0; i < nnodes; i++)\n"
         "\t\tif (starpu_node_get_kind(i) == STARPU_DISK_RAM\n"
         "\t\t\t&& (_starpu_get_disk_flag(i) & STARPU_DISK_NO_RECLAIM) == 0\n"
         "\t\t\t&& _starpu_memory_manager_test_allocate_size(i, reclaim) != 1)\n"
         "\t\t{\n"
         "\t\t\tsize_t freed = flush_memchunk_cache(i, reclaim);\n"
         "\t\t\tnntile_evicting++;\n"
         "\t\t\tif (freed < reclaim)\n"
         "\t\t\t\tfree_potentially_in_use_mc(i, 0, reclaim - freed);\n"
         "\t\t\tnntile_evicting--;\n"
         "\t\t}\n"
         "}\n\n"
         "size_t _starpu_memory_reclaim_generic(unsigned node, unsigned force, size_t reclaim)\n{\n"
         "\tsize_t freed = 0;\n\n\tSTARPU_ASSERT(node < STARPU_MAXNODES);\n"
         "\tif (!force && reclaim && NNTILE_DROP_HOST_COPIES() && starpu_node_get_kind(node) == STARPU_CPU_RAM)\n"
         "\t\tnntile_reclaim_disks(reclaim);\n"),
    ])
print(f"patched StarPU {series} sources (CUDA 13, host memory size, eviction settings, GPU buffer pool, "
      f"no device reset, no abort on a negative task time, no idle writes to disks on won't-use, "
      f"full disks free what is not a sole copy, "
      f"patch level {PATCH_LEVEL})")
