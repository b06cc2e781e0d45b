"""Runtime lifetime: init/shutdown of StarPU with the project's defaults, info() and stats()."""
import atexit
import contextlib
import os
import re
import shutil

import torch

from . import _C

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

# What the running runtime was started with (the normalized arguments of init), or None.
_current = None
_cuda_split = None
_host_limit = None  # StarPU's host-RAM limit in bytes (given or default), None without one


def parse_bytes(value, name):
    """Bytes from an int or a string like '8GiB', '512 MB', '1.5GiB'. None passes through."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be a number of bytes or a string like '8GiB' (got {value!r})")
    if isinstance(value, int):
        result = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must be a number of bytes or a string like '8GiB' "
                             f"(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; got {value!r})")
        result = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if result < 2**20:
        raise ValueError(f"{name} must be at least 1 MiB (got {value!r} = {result} bytes)")
    return result


def _count(value, name):
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int or None for StarPU's default (got {value!r})")
    return value


DISK_LIMIT_MIN = 16 << 20  # StarPU's STARPU_DISK_SIZE_MIN


def _normalize(ncpus, ncuda, cuda_memory_limit, host_memory_limit, disk_path, disk_limit, scheduler, cpu_tasks=None,
               places=None, max_submitted_tasks=None, streams_per_gpu=None):
    if streams_per_gpu is not None and (isinstance(streams_per_gpu, bool) or not isinstance(streams_per_gpu, int)
                                        or streams_per_gpu < 1):
        raise ValueError(f"streams_per_gpu must be a positive int or None for the default (got {streams_per_gpu!r})")
    args = dict(
        ncpus=_count(ncpus, "ncpus"),
        ncuda=_count(ncuda, "ncuda"),
        cuda_memory_limit=parse_bytes(cuda_memory_limit, "cuda_memory_limit"),
        host_memory_limit=parse_bytes(host_memory_limit, "host_memory_limit"),
        disk_path=None if disk_path is None else os.fspath(disk_path),
        disk_limit=parse_bytes(disk_limit, "disk_limit"),
        scheduler=scheduler,
        cpu_tasks=cpu_tasks,
        places=places,
        max_submitted_tasks=max_submitted_tasks,
        streams_per_gpu=streams_per_gpu,
    )
    if max_submitted_tasks is not None and (isinstance(max_submitted_tasks, bool) or
                                            not isinstance(max_submitted_tasks, int) or max_submitted_tasks < 0):
        raise ValueError("max_submitted_tasks must be a non-negative int (0: no window) or None for the default "
                         f"(got {max_submitted_tasks!r})")
    if places is not None and (isinstance(places, bool) or not isinstance(places, int) or places < 1):
        raise ValueError(f"places must be a positive int or None for the default (got {places!r})")
    if cpu_tasks is not None and not isinstance(cpu_tasks, bool):
        raise ValueError(f"cpu_tasks must be True, False or None for the default (got {cpu_tasks!r})")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler):
        raise ValueError(f"scheduler must be a StarPU policy name such as 'dmdas' or 'lws' (got {scheduler!r})")
    if (args["disk_path"] is None) != (args["disk_limit"] is None):
        raise ValueError("disk_path and disk_limit go together (got disk_path="
                         f"{disk_path!r}, disk_limit={disk_limit!r})")
    if args["disk_path"] is not None and not os.path.isdir(args["disk_path"]):
        raise ValueError(f"disk_path must be an existing directory (got {disk_path!r})")
    if args["disk_limit"] is not None and args["disk_limit"] < DISK_LIMIT_MIN:  # StarPU asserts (an abort) below it
        raise ValueError(f"disk_limit must be at least 16 MiB, StarPU's smallest disk node (got {disk_limit!r})")
    if args["disk_path"] is not None:
        free = shutil.disk_usage(args["disk_path"]).free
        if args["disk_limit"] > free:  # StarPU would write tiles there until the disk is full
            raise ValueError(f"disk_limit {args['disk_limit'] / 2**30:.1f} GiB is more than the "
                             f"{free / 2**30:.1f} GiB free in {disk_path!r}")
    if args["ncpus"] == 0 and args["ncuda"] == 0:
        raise ValueError("at least one worker is needed (got ncpus=0 and ncuda=0)")
    attention = os.environ.get("NNTILE_ATTENTION", "")
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"NNTILE_ATTENTION must be one of {', '.join(k for k in ATTENTION_KERNELS if k)} "
                         f"(got {attention!r}); unset, bf16 attention on GPUs uses the kernel torch's "
                         "scaled_dot_product_attention picks")
    if args["ncuda"] > 0 and not _C.built_with_cuda:
        raise ValueError(f"ncuda={ncuda} asked for, but nntile_torch was built without CUDA")
    return args


# NNTILE_ATTENTION (read by init): bf16 causal attention on GPUs with torch's choice of fused kernel ("" or "auto",
# cuDNN's on Hopper), or with the one named (an A/B between them in one call; csrc/kernels/attention.cpp).
ATTENTION_KERNELS = ("", "auto", "cudnn", "flash", "efficient")


def attention_forwards():
    """Attention forward passes (the backward's recomputations included) per fused kernel since the process
    started: {"flash": n, "efficient": n, "cudnn": n, "cpu": n}."""
    n = _C.attention_forwards()
    return {"flash": n[1], "efficient": n[2], "cudnn": n[3], "cpu": n[4]}


def default_host_memory_limit(total=None):
    """StarPU's host-RAM node when GPUs run and init gets no host_memory_limit: the machine's RAM (or its cgroup's
    limit, if lower) less max(16 GiB, 1/8 of it), at least half of it. The rest is the process's own (torch,
    Python, CUDA's pinned buffers) and the system's. With a limit, tiles beyond every memory node raise "out of
    memory" when created; without one, StarPU fills the RAM and the kernel's OOM killer ends the process (docs/measurements.md,
    "Host memory limit"). 125.8 GiB of RAM -> 109.8 GiB."""
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            with open("/sys/fs/cgroup/memory.max") as f:
                cap = f.read().strip()
            if cap.isdigit():
                total = min(total, int(cap))
        except OSError:
            pass
    return max(total // 2, total - max(16 * 2**30, total // 8)) >> 20 << 20  # whole MiB, as StarPU takes it


def _cuda_usable(ncuda):
    return _C.built_with_cuda and ncuda != 0 and torch.cuda.is_available()


# The patched StarPU's settings (scripts/patch_starpu.py), on unless the user's environment sets them to 0: a host
# copy of a tile that another node holds too is freed when host RAM runs short (1.3.10 kept every host buffer until
# unregistration: host RAM filled with stale copies beyond the GPU's memory); a tile marked won't-use (the memory
# plan's streamed weights, AdamW's updated moments) is the first one evicted; GPU buffers come from a stream-ordered
# pool that keeps freed memory instead of cudaMalloc / cudaFree (each cudaFree waits for the whole GPU: 781 per 20B
# step). Neither eviction setting acts while memory suffices. Decided here, at the first init, and put into the
# environment StarPU reads them from: the patched StarPU reads each once per process, so they hold until the process
# ends, and nntile's own code (AdamW's won't-use marking) asks patch_setting(), never the environment.
PATCH_SETTINGS = ("NNTILE_DROP_HOST_COPIES", "NNTILE_EVICT_WONT_USE_FIRST", "NNTILE_CUDA_POOL")
_patch_settings = {}  # name -> "0" or "1", fixed at the first init


def _decide_patch_settings():
    if _patch_settings:
        return dict(_patch_settings)
    chosen = {}
    for name in PATCH_SETTINGS:
        value = os.environ.get(name, "1").strip()
        if not value.lstrip("-").isdigit():
            raise ValueError(f"{name} must be 0 (off) or a positive integer (on) (got {value!r})")
        chosen[name] = "1" if int(value) > 0 else "0"
    return chosen


def patch_setting(name):
    """Whether the patched StarPU's setting `name` (PATCH_SETTINGS) is on in this process: the value the first init
    chose from the environment (default on), which StarPU read then and keeps until the process ends."""
    if name not in PATCH_SETTINGS:
        raise ValueError(f"patch_setting: name must be one of {', '.join(PATCH_SETTINGS)} (got {name!r})")
    ensure_init()
    return _patch_settings[name] == "1"


# The level of scripts/patch_starpu.py nntile_torch needs (its PATCH_LEVEL when the patch last changed).
REQUIRED_STARPU_PATCH_LEVEL = 4
_patch_checked = False


def _loaded_starpu_path():
    """The file of the libstarpu this process loaded (through _C), from /proc/self/maps; None where there is none."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)  # address, perms, offset, device, inode, path (absent: anonymous)
                if len(fields) == 6 and re.search(r"/libstarpu-[0-9.]+\.so", fields[5]):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def starpu_patch_level():
    """The level of the project's StarPU patch (scripts/patch_starpu.py) in the StarPU this process loaded: 0 for a
    StarPU built without it (a distribution's, one's own), None where it cannot be read (no /proc)."""
    import ctypes
    path = _loaded_starpu_path()
    if path is None:
        return None
    lib = ctypes.CDLL(path)  # loaded already: the same library, not a second copy
    try:
        fn = lib.starpu_nntile_patch_level
    except AttributeError:
        return 0
    fn.restype = ctypes.c_int
    return int(fn())


def _check_starpu_patch(level=None):
    """Warns (NNTILE_REQUIRE_PATCHED_STARPU=1: raises) when the loaded StarPU lacks the patch this code relies on."""
    if level is None:
        level = starpu_patch_level()
    if level is None or level >= REQUIRED_STARPU_PATCH_LEVEL:
        return
    found = "without the patch" if level == 0 else f"with patch level {level}"
    msg = (f"nntile_torch: the StarPU loaded ({_loaded_starpu_path() or 'libstarpu'}) was built {found}; nntile_torch "
           f"needs level {REQUIRED_STARPU_PATCH_LEVEL} of scripts/patch_starpu.py. Without it: host copies of tiles are "
           "never dropped and won't-use tiles are not evicted first (models beyond GPU memory fill host RAM and can "
           "stall), GPU buffers come from cudaMalloc / cudaFree (each free waits for the whole GPU), and torch's GPU "
           "memory can be lost to a device reset at StarPU's first start, and a CUDA worker can abort the process while it "
           "calibrates a performance model (a negative task time), and with a disk node the won't-use hints can stop "
           "the training (a queued write to the disk pins a host buffer), and a disk node at its limit never frees the "
           "buffers of dropped tiles nor copies valid elsewhere. Build it with scripts/install_starpu.sh "
           "(STARPU_PREFIX=... for a prefix of your own) and rebuild nntile_torch against it.")
    if os.environ.get("NNTILE_REQUIRE_PATCHED_STARPU", "0") not in ("", "0"):
        raise RuntimeError(msg + " (NNTILE_REQUIRE_PATCHED_STARPU is set: an error, not a warning)")
    import warnings
    warnings.warn(msg + " (NNTILE_REQUIRE_PATCHED_STARPU=1 makes this an error)", RuntimeWarning, stacklevel=3)


# StarPU's own setting as the user's environment had it when nntile_torch was imported (init sets it each time).
_USER_WORKERS_PER_CUDA = os.environ.get("STARPU_NWORKER_PER_CUDA")
_env_before = {}  # the variables init set for StarPU and their values before it, put back by shutdown
DEFAULT_STREAMS_PER_GPU = 2


def streams_per_gpu_setting(asked, environ=None):
    """CUDA workers per GPU that init starts: `asked`, else the user's STARPU_NWORKER_PER_CUDA, else
    DEFAULT_STREAMS_PER_GPU; and the environment StarPU then needs (each worker its own stream and its own thread:
    a thread driving two streams would share the GEMM's cuBLASLt workspace between them). ValueError for a
    setting that cannot work."""
    environ = os.environ if environ is None else environ
    n = asked
    if n is None:
        user = _USER_WORKERS_PER_CUDA if environ is os.environ else environ.get("STARPU_NWORKER_PER_CUDA")
        if user is not None and not (user.isdigit() and int(user) >= 1):
            raise ValueError(f"STARPU_NWORKER_PER_CUDA must be a positive integer (got {user!r})")
        n = int(user) if user is not None else DEFAULT_STREAMS_PER_GPU
    if n > 1 and environ.get("STARPU_CUDA_THREAD_PER_DEV", "0") != "0":
        raise ValueError(f"{n} streams per GPU need a thread per CUDA worker (each GEMM's cuBLASLt workspace is its "
                         "thread's), but STARPU_CUDA_THREAD_PER_DEV asks for one thread per GPU: unset it")
    return n, {"STARPU_NWORKER_PER_CUDA": str(n), "STARPU_CUDA_THREAD_PER_WORKER": "1" if n > 1 else "0"}


def init(ncpus=None, ncuda=None, cuda_memory_limit=None, host_memory_limit=None, disk_path=None, disk_limit=None,
         scheduler=None, cpu_tasks=None, places=None, max_submitted_tasks=None, streams_per_gpu=None):
    """Starts StarPU. Limits are bytes or strings like "8GiB"; None means the default.

    Defaults: every GPU; CPU workers on all cores without GPUs, one with GPUs (unless cpu_tasks=True): tile
    ops then run on the GPUs, and idle CPU workers only slow the thread submitting the tasks. GPU memory for StarPU is
    the device's total minus a share kept for torch's caching allocator (10%, at least 4 GiB); host memory for
    StarPU with GPUs default_host_memory_limit() (the RAM less max(16 GiB, 1/8)), on CPUs alone no limit (the
    operating system decides); no disk node; scheduler "dmdas" with GPUs (data-aware, priorities), "lws" on CPUs
    alone. cpu_tasks: whether tile ops that have a GPU kernel may also run on CPU workers; None (default) means
    only when no GPU worker runs. Allowing it with GPUs makes StarPU calibrate each new tile shape on a CPU core
    first (tens of seconds per GEMM shape at GPT-2 XL size) and then rarely pays off. places: how many devices the row tiles of activations are spread
    over (row tile i on place i mod places; default: the CUDA workers when there are two or more, streams_per_gpu
    per GPU, else 1 = the scheduler decides); the results depend on places, never on the worker count. max_submitted_tasks: the submission
    window, how many tasks may be pending before the submitting thread waits (until 4/5 of them remain); None
    (default) means StarPU's STARPU_LIMIT_MAX_SUBMITTED_TASKS (and _MIN) when set in the environment, else
    1000; 0 means no window. Without one, a whole step is submitted ahead of its execution, and a model that
    overfills the GPU stalls; info()
    reports it as submission_window (max, min). streams_per_gpu: CUDA workers per GPU, each with its own stream
    and thread (default 2, or STARPU_NWORKER_PER_CUDA when set): while one worker's task waits for StarPU to see
    its predecessor finished and for its kernels' launch, the other's run, and row tiles alternate between them
    (places). The numbers behind these defaults: docs/measurements.md, "Runtime defaults". A memory
    plan beyond GPU memory asks for 1 (its streaming was measured with one). Calling init again with the same
    arguments does nothing; with other arguments while running raises RuntimeError (call shutdown() first).
    """
    global _current, _cuda_split, _host_limit, _patch_checked
    if not _patch_checked:  # once per process: the library does not change
        _check_starpu_patch()
        _patch_checked = True
    args = _normalize(ncpus, ncuda, cuda_memory_limit, host_memory_limit, disk_path, disk_limit, scheduler,
                      cpu_tasks, places, max_submitted_tasks, streams_per_gpu)
    if _current is not None and _C.running():
        if args != _current:
            diff = {k: (_current[k], v) for k, v in args.items() if _current[k] != v}
            raise RuntimeError("nntile_torch is already running with other settings "
                               f"(running vs asked: {diff}); call nntile_torch.shutdown() first")
        return
    requested = dict(args)
    cuda = _cuda_usable(args["ncuda"])
    cuda_limit = args["cuda_memory_limit"]
    _cuda_split = None
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        if cuda_limit is None:
            cuda_limit = total - max(total // 10, 4 * 2**30)
        _cuda_split = {"device_total_bytes": total, "starpu_limit_bytes": cuda_limit,
                       "left_for_torch_bytes": total - cuda_limit}
    sched = args["scheduler"] or ("dmdas" if cuda else "lws")
    ncpus = args["ncpus"]
    if ncpus < 0 and cuda and cpu_tasks is not True:
        ncpus = 1
    host_limit = args["host_memory_limit"]
    if host_limit is None and cuda:
        host_limit = default_host_memory_limit()
    patch = _decide_patch_settings()
    _host_limit = host_limit
    _env_before.update({k: os.environ.get(k) for k in patch if k not in _env_before})
    os.environ.update(patch)
    if cuda:  # read by starpu_init; the user's values come back at shutdown, as the C++ runtime's own settings do
        _, env = streams_per_gpu_setting(args["streams_per_gpu"])
        _env_before.update({k: os.environ.get(k) for k in env if k not in _env_before})
        os.environ.update(env)
    _C.init(ncpus, args["ncuda"], cuda_limit if cuda_limit is not None else -1,
            host_limit or -1, args["disk_path"] or "", args["disk_limit"] or -1, sched,
            -1 if cpu_tasks is None else int(cpu_tasks), -1 if places is None else places,
            -1 if max_submitted_tasks is None else max_submitted_tasks)
    _patch_settings.update(patch)
    _current = requested


def ensure_init():
    """Starts the runtime with defaults if nobody did."""
    if not _C.running():
        init()


def shutdown():
    """Waits for every task and stops StarPU. Tile tensors still alive keep their values (as a dense copy) and
    get tiles again after the next init. A task error not yet raised (runtime.h: raise_task_error) is raised here,
    after StarPU has stopped: init() works again either way."""
    global _current, _host_limit
    from .pending import flush_all
    if _C.running():
        flush_all()  # what is owed is submitted while StarPU still runs (docs/fusion.md)
    try:
        _C.shutdown(True)
    finally:
        _current = None
        _host_limit = None
        for k, v in _env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _env_before.clear()


def is_running():
    return _C.running()


def host_limit():
    """StarPU's host-RAM limit in bytes as the running runtime has it (given or default); None without one."""
    return _host_limit


def user_workers_per_cuda():
    """The user's own STARPU_NWORKER_PER_CUDA as it was when nntile_torch was imported, None when unset."""
    return _USER_WORKERS_PER_CUDA


def info():
    """StarPU version, workers per kind (CUDA workers: streams_per_gpu per GPU), the GPUs they run on, memory nodes
    with their sizes, scheduler, and how GPU memory was split between StarPU and torch."""
    ensure_init()
    d = _C.info()
    d["cuda_memory_split"] = _cuda_split
    d["host_memory_limit_bytes"] = _host_limit
    d["places"] = _C.places()  # worker id of each place; empty when tasks are not pinned
    d["gpus"] = len(_C.cuda_memory_nodes())  # GPUs with CUDA workers (streams_per_gpu workers each)
    d["settings"] = dict(_current) if _current else None
    d["starpu_patch_settings"] = {k: v == "1" for k, v in _patch_settings.items()}
    d["starpu_patch_level"] = starpu_patch_level()
    return d


def stats():
    """Counters since the process started: tasks submitted and blocking waits (host waits for task results);
    tasks_pending: submitted and not yet finished (at most init's max_submitted_tasks + 1 after a submission);
    tile_bytes: one copy of every live tile (what must fit in GPU, host and disk memory together: init's limits
    are checked against it), peak_tile_bytes: its most since the start or reset_peak_stats()."""
    return {"tasks_submitted": _C.tasks_submitted(), "tasks_pending": _C.tasks_pending() if _C.running() else 0,
            "blocking_waits": _C.blocking_waits(), "running": _C.running(),
            "tile_bytes": _C.tile_bytes(), "peak_tile_bytes": _C.peak_tile_bytes()}


def memory_nodes():
    """Per StarPU memory node (host RAM, each GPU, a disk node): its limit and use in bytes (-1 without a limit) and
    the bytes of live tiles with a buffer there (allocated_bytes), a valid copy there (valid_bytes), their only
    valid copy there (sole_bytes), and a buffer holding no valid copy (stale_bytes); of the allocated, home
    buffers (home_bytes: NNTILE_HOST_HOMES), stale by design while the valid copy is on a GPU; and the tiles with a
    transfer into the node pending (requested_bytes: in a stall, copies waiting to move). used - allocated is
    memory StarPU holds beside live tiles (freed buffers it keeps for reuse, tiles being unregistered). A node full
    of stale buffers (other than homes) or of copies valid elsewhere too is StarPU not evicting what it could."""
    ensure_init()
    return _C.memory_nodes()


def memory_nodes_report():
    """memory_nodes() as text, in GiB, one node after another (the same text as the stall report's)."""
    ensure_init()
    return _C.memory_nodes_report()


def memory_advice():
    """What to do if the training stalls now, read from memory_nodes(): which nodes are at their limit, and whether
    memory outside live tiles fills them (a smaller submission window bounds it) or the only copies of live tiles
    fill every node (the data does not fit with room to move: a disk node, a smaller batch, bf16 optimizer state).
    The stall report (no task finished for STARPU_WATCHDOG_TIMEOUT) prints the same."""
    ensure_init()
    return _C.stall_advice_now()


def memory_summary(top=12):
    """Where the tile bytes go: live tile tensors grouped by name and dtype (names such as "weight", "exp_avg",
    "linear.y" tell parameters, optimizer states and activations apart), largest first, as a table string."""
    groups = {}
    for name, dtype, nbytes in _C.live_tile_tensors():
        key = (name or "(unnamed)", dtype)
        count, total = groups.get(key, (0, 0))
        groups[key] = (count + 1, total + nbytes)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    total = sum(b for _, (_, b) in rows)
    lines = [f"tiles: {total / 2**30:.3f} GiB live, peak {_C.peak_tile_bytes() / 2**30:.3f} GiB",
             f"{'name':<28} {'dtype':<9} {'tensors':>7} {'GiB':>9}"]
    for (name, dtype), (count, nbytes) in rows[:top]:
        lines.append(f"{name:<28} {dtype:<9} {count:>7} {nbytes / 2**30:>9.3f}")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"{'(' + str(len(rest)) + ' more groups)':<28} {'':<9} {sum(c for _, (c, _) in rest):>7} "
                     f"{sum(b for _, (_, b) in rest) / 2**30:>9.3f}")
    return "\n".join(lines)


def reset_peak_stats():
    """Starts stats()["peak_tile_bytes"] again from the bytes live now (as torch.cuda.reset_peak_memory_stats)."""
    _C.reset_peak_tile_bytes()


def synchronize():
    """Waits for every submitted task (counted as a blocking wait); pending producers are submitted first."""
    from .pending import flush_all
    flush_all()
    if _C.running():
        _C.wait_all()


@contextlib.contextmanager
def task_trace():
    """Records the way through StarPU of every task submitted inside the block; yields a list that holds, after the
    block (which waits for those tasks), one dict per task in the order they finished: "name", "worker", "kind" ("cpu", "cuda") and
    StarPU's times in microseconds ("submit", "push_start"/"push_end": into the scheduler, "pop_start"/"pop_end":
    taken by a worker, "acquire_start"/"acquire_end": its data made ready there, "start"/"end": executed (for a
    GPU task, from the launch to the worker seeing it finished), "release_start"/"release_end", "callback"), and
    "func_enter"/"func_exit": the codelet's function on the worker's thread (our kernels' launches). None where StarPU
    kept no time. benchmarks/dispatch.py reads where the time between dependent tasks goes."""
    ensure_init()
    records = []
    _C.task_trace_start()
    try:
        yield records
        synchronize()
    finally:
        records.extend(_C.task_trace_stop())


@contextlib.contextmanager
def host_tasks():
    """Tasks submitted inside run on CPU workers, so the tiles they write live in host RAM (AdamW(offload=...)
    updates those parameters this way). Per thread."""
    ensure_init()
    previous = _C.set_host_tasks(True)
    try:
        yield
    finally:
        _C.set_host_tasks(previous)


def num_places():
    """How many devices row tiles are spread over (1 when tasks are not pinned)."""
    return max(1, len(_C.places())) if _C.running() else 1


@atexit.register
def _exit():
    if _C.running():
        _C.shutdown(False)
