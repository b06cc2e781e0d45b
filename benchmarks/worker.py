"""One benchmark attempt, in its own process (launched by benchmarks.run; torchrun launches it once per GPU for
fsdp, fsdp2 and deepspeed). Trains a config of one model family (benchmarks/models.py) for warm-up + timed
steps on synthetic, deterministic batches and writes <result>.rank<R>.json: status ("ok", "oom", "error",
"unavailable"), reason, per-step times and losses, peak memory and the environment. Derived metrics (tokens/s,
TFLOP/s, MFU) are computed by the harness.

    python -m benchmarks.worker --spec attempt.json        # the spec is written by benchmarks.run
    python -m benchmarks.worker --probe out.json           # GPUs, versions, measured matmul peaks
"""
import argparse
import contextlib
import gc
import gzip
import importlib
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
import traceback

import torch

from benchmarks import models
from benchmarks.configs import CONFIGS, MANUAL_NNTILE_FLAGS, TORCHAO_FLAGS, TORCHAO_INSTALL, peer_numerics



class Unavailable(Exception):
    """The backend cannot run here (missing package, no GPU for an offload, ...): recorded, not an error."""


def is_oom(exc):
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in ("out of memory", "cuda_error_out_of_memory", "cannot allocate memory",
                                   "std::bad_alloc", "memoryerror"))


# ---------------------------------------------------------------------------------------------------------------
# Synthetic data: a fixed pool of random sequences (seeded on the CPU, so every backend and device sees the same
# ids); step s draws `batch` of them. A pool rather than fresh noise so the loss goes down and curves compare.

def batch_ids(spec, step, vocab):
    g = torch.Generator().manual_seed(spec["seed"])
    pool = torch.randint(0, vocab, (spec["data_pool"], spec["seq"]), generator=g)
    pick = torch.randint(0, spec["data_pool"], (spec["batch"],),
                         generator=torch.Generator().manual_seed(spec["seed"] * 1_000_003 + step))
    return pool[pick]  # (batch, seq) int64


class PeakGpuMemory:
    """Peak device memory in use (all of it: torch's caching allocator, StarPU's pool, CUDA context), sampled by a
    thread every `period` seconds through cudaMemGetInfo. torch.cuda.max_memory_allocated would miss StarPU."""

    def __init__(self, device, period=0.02):
        self.device, self.period, self.peak = device, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        free, total = torch.cuda.mem_get_info(self.device)
        self.peak = max(self.peak, total - free)

    def _run(self):
        torch.cuda.set_device(self.device)
        while not self._stop.wait(self.period):
            self._sample()

    def start(self):
        self._sample()
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak


def family(spec):
    return spec.get("model", "hf")


def build_model(spec, device):
    """The spec's model family at its config, weights drawn from spec["seed"] on `device` (same seed + device: same
    weights), with activation checkpointing for the ckpt flag."""
    torch.manual_seed(spec["seed"])
    with torch.device(device):
        model = models.build(family(spec), spec["config"], spec["seq"], spec.get("dropout", 0.0),
                             spec.get("dropout_on", "all"))
    BUILT.update(models.describe(family(spec), model))
    if "ckpt" in spec["flags"]:
        BUILT["checkpointing"] = models.enable_checkpointing(model)
    return model


BUILT = {}  # what build_model() built, for the record


def init_device(spec, cuda):
    """Where the dense model is first built: on the GPU when its fp32 weights take under 45% of the GPU's memory
    (fast random init, same weights for every backend), else in host RAM (slow, single-threaded init)."""
    if spec["init_device"] == "meta" and spec["backend"] != "nntile":
        raise Unavailable("--init-device meta builds the model module by module into nntile tiles (nntile only)")
    if spec["init_device"] not in ("auto", "meta"):
        return spec["init_device"]
    if not cuda:
        return "cpu"
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return "cuda" if 4 * spec["params"] <= 0.45 * total else "cpu"


def set_precision(precision):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def train_step(spec, model, opt, clip=None):
    """One plain training step of a (wrapped) model with a torch optimizer; clip(): the gradients' clipping
    between backward and the update (the useropt flag), as nanoGPT's train.py does."""
    name = family(spec)

    def step(ids):
        opt.zero_grad(set_to_none=True)
        loss = models.loss(name, model, ids)
        loss.backward()
        if clip is not None:
            clip()
        opt.step()
        return loss
    return step


def torch_adamw(params, spec):
    # Fused: one pass over each parameter and its states per step, on the GPU and (for offloaded FSDP shards,
    # DTensors included) on the CPU; torch's foreach path makes several.
    return torch.optim.AdamW(params, lr=spec["lr"], weight_decay=spec["weight_decay"], fused=True)


GRAD_CLIP = 1.0  # nanoGPT's train.py's grad_clip


def torchao_optimizer(spec, params, cuda):
    """(optimizer, its description) for the torchao variants (configs.TORCHAO_FLAGS): AdamW8bit / AdamW4bit /
    AdamWFp8, their bf16_stochastic_round with aobf16sr (_AdamW alone), or CPUOffloadOptimizer around the fused
    torch.optim.AdamW. Unavailable when torchao does not import or cannot run here."""
    flags = set(spec["flags"])
    try:
        import torchao
        import torchao.optim as ao
    except Exception as e:  # noqa: BLE001  (a missing or mismatched torchao: recorded, not an error)
        raise Unavailable(f"torchao not importable ({type(e).__name__}: {str(e).splitlines()[0][:200]}): "
                          f"{TORCHAO_INSTALL}") from e
    kw = {"lr": spec["lr"], "weight_decay": spec["weight_decay"]}
    version = getattr(torchao, "__version__", "?")
    if "aooffload" in flags:
        if not cuda:
            raise Unavailable("torchao's CPUOffloadOptimizer needs a GPU to offload from (none here)")
        return (ao.CPUOffloadOptimizer(params, torch.optim.AdamW, fused=True, **kw),
                f"torchao {version} CPUOffloadOptimizer(torch.optim.AdamW, fused=True)")
    sr = "aobf16sr" in flags
    if sr and spec["precision"] != "bf16":
        raise Unavailable(f"aobf16sr trains bf16 weights: --precision bf16 only (got {spec['precision']})")
    name = next((n for f, n in (("ao8bit", "AdamW8bit"), ("ao4bit", "AdamW4bit"), ("aofp8", "AdamWFp8"))
                 if f in flags), "_AdamW")
    opt = getattr(ao, name)(params, bf16_stochastic_round=sr, **kw)
    return opt, f"torchao {version} {name}" + ("(bf16_stochastic_round=True), bf16 weights" if sr else "")


def peer_optimizer(spec, model, cuda):
    """(optimizer, its description) for torch, fsdp and fsdp2: the harness's fused AdamW over every parameter, or
    with the useropt flag a training script's own (models.user_optimizer: nanoGPT's weight-decay groups), or with a
    torchao flag torchao's (torchao_optimizer)."""
    if set(spec["flags"]) & TORCHAO_FLAGS:
        return torchao_optimizer(spec, model.parameters(), cuda)
    if "useropt" in spec["flags"]:
        opt = models.user_optimizer(family(spec), model, spec["lr"], spec["weight_decay"], fused=cuda)
        return opt, ("torch.optim.AdamW (nanoGPT's weight-decay groups" + (", fused)" if cuda else ")") +
                     f", clip_grad_norm_ {GRAD_CLIP}")
    return torch_adamw(model.parameters(), spec), "torch.optim.AdamW (fused)"


def numerics(spec, master="fp32", moments="fp32"):
    """The numerics of a row: matmul precision, master weights' and AdamW moments' dtypes; a peer's from its variant
    flags (configs.peer_numerics), with where its optimizer state lives (state_on: gpu, cpu or nvme)."""
    if spec["backend"] != "nntile":
        n = peer_numerics(spec["backend"], spec["flags"])
        if spec.get("cpu") and n["state_on"] == "gpu":  # a CPU-only run: with the parameters, in host RAM
            n["state_on"] = "cpu"
        return {"matmul": spec["precision"], **n}
    return {"matmul": spec["precision"], "master": master, "moments": moments}


def inductor_cache():
    """Where torch.compile keeps its compiled kernels (TORCHINDUCTOR_CACHE_DIR, else inductor's own default)."""
    import getpass
    import tempfile
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


def compile_blocks(model):
    """torch.compile of each transformer block, put back in its ModuleList (as torchtitan compiles before
    fully_shard): the sharding hooks stay outside the compiled code."""
    h = models.blocks(model)
    for i, block in enumerate(h):
        h[i] = torch.compile(block)


# ---------------------------------------------------------------------------------------------------------------
# Backends. Each returns (step(ids) -> loss tensor or float, sync(), env dict, gpus).

def setup_torch(spec, cuda, rank, world):
    device = "cuda" if cuda else "cpu"
    dev0 = init_device(spec, cuda)
    model = build_model(spec, dev0).to(device, torch.bfloat16 if "aobf16sr" in spec["flags"] else None)
    counted = sum(p.numel() for p in model.parameters())
    opt, opt_name = peer_optimizer(spec, model, cuda)
    bf16 = spec["precision"] == "bf16"
    name = family(spec)
    compiled = torch.compile(model) if "compile" in spec["flags"] else model  # nanoGPT's train.py's compile=True

    def step(ids):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = models.loss(name, compiled, ids)
        loss.backward()
        if "useropt" in spec["flags"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    env = {"init_device": dev0, "optimizer": opt_name, "autocast": "bf16" if bf16 else None,
           "params_counted": counted, "numerics": numerics(spec)}
    if "compile" in spec["flags"]:
        env["compile"] = {"what": "torch.compile(model)", "inductor_cache": inductor_cache()}
    return step, sync, env, 1 if cuda else 0, device


def setup_nntile(spec, cuda, rank, world):
    try:
        import nntile_torch as nt
        from nntile_torch.convert import default_tile_size
    except Exception as e:  # any import failure means the backend is not here
        raise Unavailable(f"nntile_torch not importable: {type(e).__name__}: {e}") from e
    o = spec["nntile"]
    # A stall (StarPU 1.3.10 failing to evict from a full memory node) ends the attempt after a minute, with
    # the runtime's report of each memory node as the reason, instead of using up the whole --timeout.
    os.environ.setdefault("STARPU_SILENT", "0")  # StarPU's own warnings ("Not enough memory left ...") in the log
    os.environ.setdefault("STARPU_WATCHDOG_TIMEOUT", "60000000")
    os.environ.setdefault("STARPU_WATCHDOG_CRASH", "1")
    if cuda and not nt._C.built_with_cuda:
        cuda = False
    ncpus = o["ncpus"]
    if ncpus is None and cuda and "offload" in spec["flags"]:  # the offloaded updates need CPU workers
        ncpus = nt.config.cpu_workers_beside_gpus()
    if o["disk_path"]:  # the harness's folder to make (the library asks for an existing one)
        os.makedirs(o["disk_path"], exist_ok=True)
    # Without variant flags the memory plan chooses (docs/memory_plan.md): checkpointing, moments' dtype, updates
    # inside backward, the blocks kept in host RAM and their CPU workers. Any flag means the settings by hand.
    # useropt: the training script's own optimizer and clipping (torch.optim.AdamW, clip_grad_norm_) in place of
    # nt.optim.AdamW; the plan then picks among placements that optimizer can run: fp32 master weights and moments,
    # updates in step(), every block's state on the GPU.
    plan = None
    useropt = "useropt" in spec["flags"]
    if not set(spec["flags"]) & MANUAL_NNTILE_FLAGS:
        with torch.device("meta"):
            shape_only = models.build(family(spec), spec["config"], spec["seq"], spec.get("dropout", 0.0),
                                      spec.get("dropout_on", "all"))
        pins = dict(state_dtype=torch.float32, step_in_backward=False, host_blocks=0) if useropt else \
            dict(state_dtype=torch.float32) if "fp32state" in spec["flags"] else {}
        plan = nt.plan(shape_only, spec["batch"], spec["seq"], spec["precision"], **pins,
                       gpu_memory=o["cuda_memory_limit"] if cuda else None, host_memory=o["host_memory_limit"],
                       disk_limit=o["disk_limit"] if o["disk_path"] else None,
                       host_update="cpu" if "cpuupdate" in spec["flags"] else "gpu" if "gpuupdate" in spec["flags"]
                       else None, master_dtype=torch.bfloat16 if "bf16master" in spec["flags"] else
                       torch.float32 if useropt or "fp32state" in spec["flags"] else None,
                       bf16_per_use=False if "keptcopies" in spec["flags"] else None,
                       host_checkpoints=True if "hostckpt" in spec["flags"] else None)
        print(plan, flush=True)
        del shape_only
    limits = dict(ncpus=ncpus, ncuda=o["ncuda"] if cuda else 0, cuda_memory_limit=o["cuda_memory_limit"],
                  host_memory_limit=o["host_memory_limit"], disk_path=o["disk_path"], disk_limit=o["disk_limit"],
                  scheduler=o["scheduler"], max_submitted_tasks=o.get("max_submitted_tasks"))
    if plan is not None:  # the plan's workers, window and streams where the options leave them unset (None)
        plan.init(**limits)
    else:
        nt.init(**limits)
    dev0 = init_device(spec, cuda)
    if spec["init_device"] == "meta" or (spec["init_device"] == "auto" and cuda and 4 * spec["params"] > 0.2 * (
            torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)):
        dev0 = "meta"  # built module by module into tiles: a dense copy beside the tiles would crowd StarPU out
    device = "cuda" if cuda else "cpu"  # the tile modules' home: inputs go there (StarPU places tasks on every GPU)
    # Defaults as the training CLI: convert()'s weight tiles (3 or 4 x width), activation tiles whole sequences (on
    # GPUs the batch split once per place). The tile is recorded with the results.
    btile = o["batch_tile_size"] or nt.config.rows_per_tile(spec["batch"], spec["seq"], cuda,
                                                            nt.runtime.num_places())
    dense = build_model(spec, dev0)
    tile = o["tile_size"] or default_tile_size(dense, plan)
    kw = dict(precision=spec["precision"], tile_size=tile, batch_tile_size=btile, plan=plan)
    if dev0 == "meta":
        kw.update(init=models.module_init(family(spec), dense), init_device=device)
        models.real_buffers(family(spec), dense, device)
    model = nt.convert(dense, **kw)
    if "statefetch" in spec["flags"]:  # the streaming's early fetch of the GPU updates' state (off by default)
        nt.streamer(model).state_ahead = 0
    if cuda:
        torch.cuda.empty_cache()  # the dense weights are gone; give their memory back to the device
    counted = sum(p.numel() for p in model.parameters())
    if useropt:
        opt = models.user_optimizer(family(spec), model, spec["lr"], spec["weight_decay"], fused=cuda)
        opt_name = ("torch.optim.AdamW (nanoGPT's weight-decay groups" + (", fused)" if cuda else ")")
                    + f", clip_grad_norm_ {GRAD_CLIP}")
        rows = numerics(spec)  # torch's AdamW keeps its moments in the parameters' dtype
    elif plan is not None:
        opt = plan.optimizer(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
        opt_name = "nntile_torch.optim.AdamW"
        rows = numerics(spec, master="bf16 (blocks' matmul weights)" if plan.master_dtype == torch.bfloat16
                        else "fp32", moments=str(plan.state_dtype).replace("torch.", "").replace("bfloat16", "bf16")
                        .replace("float32", "fp32"))
    else:
        opt = nt.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"],
                             step_in_backward="stepbwd" in spec["flags"],
                             state_dtype=torch.bfloat16 if "bf16state" in spec["flags"] else torch.float32,
                             offload=o.get("offload_fraction", 1.0) if "offload" in spec["flags"] else None)
        opt_name = "nntile_torch.optim.AdamW"
        rows = numerics(spec, moments="bf16" if "bf16state" in spec["flags"] else "fp32")
    if plan is not None:
        rows["by"] = "the memory plan"
    name = family(spec)
    phases = []

    def step(ids):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = models.loss(name, model, ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if useropt:  # the script's own line, as nanoGPT's train.py has it
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        t3 = time.perf_counter()
        phases.append([round((t1 - t0) * 1e3, 1), round((t2 - t1) * 1e3, 1), round((t3 - t2) * 1e3, 1)])
        return loss

    def sync():
        nt.synchronize()
        if cuda:
            torch.cuda.synchronize()

    info = nt.info()
    env = {"init_device": dev0, "optimizer": opt_name, "numerics": rows, "tile_size": tile, "batch_tile_size": btile,
           "starpu": info.get("starpu_version"), "scheduler": info.get("scheduler"), "workers": info.get("workers"),
           "memory_nodes": info.get("memory_nodes"), "cuda_memory_split": info.get("cuda_memory_split"),
           "nntile_settings": info.get("settings"), "submission_window": info.get("submission_window"),
           "params_counted": counted, "_stats": nt.stats, "_phases": phases,
           "_convert_report": lambda: convert_summary(nt.convert_report(model)),
           "plan": plan.summary() if plan is not None else None}
    gpus = info.get("gpus", 0) if cuda else 0
    return step, sync, env, gpus, device


def convert_summary(report):
    """nt.convert_report's counts, what stays dense and the dense ops seen while the model ran."""
    return {"swapped": len(report.swapped), "tiled": len(report.tiled), "patched": len(report.patched),
            "dense": [f"{n or '(model)'} ({t}: {why})" for n, t, why in report.dense],
            "dense_ops": {f"{m or '(model)'}: {op}": n for (m, op), n in report.dense_ops.items()}}


def _dist_init(cuda):
    import torch.distributed as dist
    if not dist.is_available():
        raise Unavailable("torch.distributed is not available in this torch build")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=torch.device("cuda", local) if cuda else None)
    return local


def setup_fsdp(spec, cuda, rank, world):
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    offload = "offload" in spec["flags"]
    if offload and not cuda:
        raise Unavailable("CPU offload needs a GPU to offload from (none here)")
    local = _dist_init(cuda)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dev0 = init_device(spec, cuda)
    model = build_model(spec, dev0)
    bf16 = spec["precision"] == "bf16"
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    block = models.block_class(family(spec))
    # use_orig_params=True: what torch.compile of an FSDP1 model needs (and the fused AdamW sees the original names)
    model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=ModuleWrapPolicy({block}),
                 mixed_precision=mp, cpu_offload=CPUOffload(offload_params=True) if offload else None,
                 device_id=device, use_orig_params=True, limit_all_gathers=True)
    opt, opt_name = peer_optimizer(spec, model, cuda)
    compiled = torch.compile(model) if "compile" in spec["flags"] else model  # the whole FSDP1 model, as its docs

    # FSDP1's own clip_grad_norm_: the norm over every rank's shards
    step = train_step(spec, compiled, opt, clip=(lambda: model.clip_grad_norm_(GRAD_CLIP))
                      if "useropt" in spec["flags"] else None)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # FSDP1 itself turns FULL_SHARD into NO_SHARD for one rank (the same thing there); say so.
    env = {"init_device": dev0, "wrap": block.__name__,
           "sharding": "FULL_SHARD" if world > 1 else "NO_SHARD (1 rank)", "cpu_offload": offload,
           "mixed_precision": "param bf16, reduce fp32" if bf16 else None,
           "optimizer": opt_name + (" (on the CPU when offloaded)" if offload else ""), "numerics": numerics(spec)}
    if "compile" in spec["flags"]:
        env["compile"] = {"what": "torch.compile(FSDP(model, use_orig_params=True))",
                          "inductor_cache": inductor_cache()}
    return step, sync, env, world if cuda else 0, device


def setup_fsdp2(spec, cuda, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )
    offload = "offload" in spec["flags"]
    if offload and not cuda:
        raise Unavailable("CPU offload needs a GPU to offload from (none here)")
    local = _dist_init(cuda)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dev0 = init_device(spec, cuda)
    model = build_model(spec, dev0)
    bf16 = spec["precision"] == "bf16"
    if "aobf16sr" in spec["flags"]:  # torchao's bf16 stochastic rounding updates bf16 parameters: no fp32 master
        model.to(torch.bfloat16)
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    kw = {"mesh": mesh,
          "mp_policy": (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
                        else MixedPrecisionPolicy()),
          "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    if "compile" in spec["flags"]:
        compile_blocks(model)  # per block, then fully_shard per (compiled) block: torchtitan's order
    for block in models.blocks(model):
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    if not offload:
        model.to(device)
    opt, opt_name = peer_optimizer(spec, model, cuda)

    step = train_step(spec, model, opt, clip=(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP))
                      if "useropt" in spec["flags"] else None)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    env = {"init_device": dev0, "wrap": f"fully_shard per {models.block_class(family(spec)).__name__} + root",
           "cpu_offload": offload, "mixed_precision": "param bf16, reduce fp32" if bf16 else None,
           "optimizer": opt_name + (" (on the CPU when offloaded)" if offload else ""), "numerics": numerics(spec)}
    if "compile" in spec["flags"]:
        env["compile"] = {"what": "torch.compile per block, then fully_shard per block + root",
                          "inductor_cache": inductor_cache()}
    return step, sync, env, world if cuda else 0, device


def nvme_param_swap(name, seq, buffer_count=24):
    """DeepSpeed settings for parameters offloaded to NVMe, from the model's shapes (its defaults fail on the H200).

    Each parameter read back from NVMe takes one pinned buffer of `buffer_size` elements until it is released, and
    there are `buffer_count` of them: DeepSpeed's 1e8 elements is smaller than the 2.7B token embedding (128.7M:
    "More elements ... than buffer size"), and with its 1e9 live parameters, 5e8 prefetched and parameters kept
    when reused within 1e9 (the last blocks of the forward are reused by the backward), every buffer was taken
    ("Not enough buffers 0 for swapping 1"; DeepSpeed issue 3062). So: buffers as large as the largest
    parameter, and live, prefetched and kept-for-reuse parameters limited to about four blocks (each block's four weight
    matrices, 12h^2 elements, are the swapped ones; biases and norms under the persistence threshold of 10h stay
    on the GPU), i.e. about 16 matrices, with the embeddings, in 24 buffers. Pinned host memory: 2 bytes x
    buffer_count x buffer_size (XL 4.8 GB, 6.7B 9.9 GB). The Llama family: its blocks' seven matrices (the largest
    an MLP matrix, h x mlp) the same way."""
    from benchmarks.configs import CONFIGS, block_params, positions
    s = CONFIGS[name]
    h = s.hidden
    largest = max(s.vocab * h, positions(name, seq) * h, 4 * h * h) if s.family == "gpt2" else \
        max(s.vocab * h, s.mlp * h)
    block = block_params(name) - 13 * h if s.family == "gpt2" else block_params(name)
    return {"offload_param": {"buffer_count": buffer_count, "buffer_size": max(int(1e8), largest),
                              "max_in_cpu": int(1e9)},
            "zero": {"stage3_max_live_parameters": 2 * block, "stage3_prefetch_bucket_size": block,
                     "stage3_max_reuse_distance": block, "stage3_param_persistence_threshold": 10 * h}}


def setup_deepspeed(spec, cuda, rank, world):
    try:
        import deepspeed
    except Exception as e:
        raise Unavailable(f"deepspeed not importable: {type(e).__name__}: {e}") from e
    flags = spec["flags"]
    nvme = "nvme" in flags
    offload = not ("gpu" in flags)
    if nvme and not spec["nvme_path"]:
        raise Unavailable("the nvme variant needs --nvme-path")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    bf16 = spec["precision"] == "bf16"
    target = {"device": "nvme", "nvme_path": spec["nvme_path"]} if nvme else {"device": "cpu"}
    zero = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
            "stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 5e8}
    if offload:
        zero["offload_param"] = dict(target, pin_memory=True)
        zero["offload_optimizer"] = dict(target, pin_memory=True)
    if nvme:
        swap = nvme_param_swap(spec["config"], spec["seq"])
        zero["offload_param"].update(swap["offload_param"])
        zero.update(swap["zero"])
    ds_opt = spec["ds_optimizer"]
    if ds_opt == "auto":
        ds_opt = "cpuadam" if (offload and cuda) else "torch"
    config = {"train_micro_batch_size_per_gpu": spec["batch"] // world, "gradient_accumulation_steps": 1,
              "zero_optimization": zero, "bf16": {"enabled": bf16}, "steps_per_print": 10**9,
              "wall_clock_breakdown": False, "zero_allow_untested_optimizer": True,
              "zero_force_ds_cpu_optimizer": False}
    zero_init = spec["zero_init"]
    dev0 = "zero.Init" if zero_init else init_device(spec, cuda)
    if zero_init:
        # Parameters are partitioned (and offloaded) as they are created, so no rank ever holds the whole model;
        # HF's initialization then runs per module on gathered parameters (its values differ from the others').
        importlib.import_module("torch._dynamo")  # imported inside zero.Init, its Tensor.__new__ patch breaks it
        with torch.device("meta"):
            models.build(family(spec), spec["config"], spec["seq"], spec.get("dropout", 0.0),
                         spec.get("dropout_on", "all"))  # the lazy imports, done here
        torch.manual_seed(spec["seed"])
        with deepspeed.zero.Init(config_dict_or_path=config, remote_device=target["device"] if offload else None):
            model = models.build(family(spec), spec["config"], spec["seq"], spec.get("dropout", 0.0),
                                 spec.get("dropout_on", "all"))
        BUILT.update(models.describe(family(spec), model))
        for m in model.modules():
            ps = list(m.parameters(recurse=False))
            if ps:
                with deepspeed.zero.GatheredParameters(ps, modifier_rank=0):
                    model._init_weights(m)
        if "ckpt" in flags:
            BUILT["checkpointing"] = models.enable_checkpointing(model)
    else:
        model = build_model(spec, dev0)
    note = None
    if ds_opt == "cpuadam":
        try:
            # On a machine where it was never built, DeepSpeed compiles the op now (minutes; the H200 attempt with
            # a 65 s limit ran out here): say so, so that a timeout in the log is readable.
            print("DeepSpeedCPUAdam: loading (compiled on first use; --ds-optimizer torch skips it)", flush=True)
            t = time.perf_counter()
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            opt = DeepSpeedCPUAdam(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"],
                                   adamw_mode=True)
            print(f"DeepSpeedCPUAdam: ready in {time.perf_counter() - t:.0f} s", flush=True)
        except Exception as e:  # noqa: BLE001  (the op is compiled on first use; fall back when that fails)
            note = f"DeepSpeedCPUAdam unavailable ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            ds_opt = "torch"
    if ds_opt == "torch":
        opt = torch_adamw(model.parameters(), spec)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    name = family(spec)

    def step(ids):
        loss = models.loss(name, engine, ids)
        engine.backward(loss)
        engine.step()
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    env = {"init_device": dev0, "deepspeed": deepspeed.__version__, "zero_stage": 3,
           "offload": target["device"] if offload else None, "optimizer": type(opt).__name__,
           "optimizer_note": note, "ds_config": config, "numerics": numerics(spec)}
    return step, sync, env, world if cuda else 0, device


BACKENDS = {"torch": setup_torch, "nntile": setup_nntile, "fsdp": setup_fsdp, "fsdp2": setup_fsdp2,
            "deepspeed": setup_deepspeed}


# ---------------------------------------------------------------------------------------------------------------

def base_env(cuda):
    import transformers
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "host": platform.node(), "cpus": os.cpu_count()}
    if cuda:
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return env


class SlowStepReport:
    """nntile: while a step runs past `after` seconds, prints where each StarPU memory node's bytes are (live tiles'
    valid copies, their only copies, stale buffers, other), again at 2x, 4x, ... that time. So an attempt cut by
    its timeout says whether its nodes were full of tiles it needs or of copies StarPU could have dropped."""

    def __init__(self, report, after=30.0):
        self.report, self.after = report, after
        self._step, self._t0, self._next = None, None, after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def begin(self, step):
        self._step, self._next, self._t0 = step, self.after, time.perf_counter()

    def end(self):
        self._t0 = None

    def _run(self):
        while not self._stop.wait(1.0):
            t0 = self._t0
            if t0 is None or time.perf_counter() - t0 < self._next:
                continue
            elapsed = time.perf_counter() - t0
            self._next *= 2
            try:
                text = self.report()
            except Exception as e:  # noqa: BLE001  (a report must never end the attempt)
                text = f"unavailable ({type(e).__name__}: {e})"
            print(f"step {self._step} still running after {elapsed:.0f} s; memory nodes: {text}", flush=True)

    def stop(self):
        self._stop.set()


class WarmUp:
    """How many of an attempt's first steps go untimed: at least `steps`, and while the last of them raised the
    process's peak host RAM or the GPU's peak memory by more than `growth`, one more, up to `most`. The first steps
    of a model beyond GPU memory still allocate (host buffers for the tiles StarPU evicts the first time): 13B on the
    H200 took 9-15 s for steps 1-2 against 6.7 s once its host RAM stopped growing, and timing them made one tree
    look 35% slower than another on the same machine."""

    def __init__(self, steps, most, growth=0.01):
        self.steps, self.most, self.growth = steps, max(steps, most), growth
        self._last = None  # the peaks after the previous step

    def after_step(self, s, peaks, any_rank=lambda flag: flag):
        """Step s (0-based) ended with these peaks (GiB, any fixed order); True when warm-up got one step longer.
        any_rank makes the ranks of a distributed attempt agree (each calls it at the same step)."""
        last, self._last = self._last, tuple(peaks)
        if s != self.steps - 1 or self.steps >= self.most:
            return False
        grew = last is None or any(now > before * (1 + self.growth) for now, before in zip(peaks, last))
        if not any_rank(grew):
            return False
        self.steps += 1
        return True


class FullCollections:
    """Milliseconds Python's garbage collector spent in full (generation-2) collections, per step: they scan every
    object of the process (a converted GPT-2 with torch and transformers loaded: ~430k objects, ~0.5 s on a slow
    core) and land inside whichever step runs then. Every nntile XL attempt since inside_gpu_v2 has one step ~0.2 s
    longer than the others (the sixth or seventh of seven), FSDP's none; this says whether it is the collector."""

    def __init__(self):
        self._start, self._ms = None, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self._ms += (time.perf_counter() - self._start) * 1e3
            self._start = None

    def take(self):
        """The milliseconds since the last take."""
        ms, self._ms = self._ms, 0.0
        return ms

    def close(self):
        gc.callbacks.remove(self._callback)


def _on_any_rank(flag, device, world):
    """flag on one rank or more (every rank calls it at the same step, so that all keep the same step count)."""
    if world == 1:
        return flag
    import torch.distributed as dist
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def run_attempt(spec, rank, world):
    cuda = torch.cuda.is_available() and not spec["cpu"]
    res = {"status": "ok", "reason": None, "rank": rank, "world": world}
    monitor = slow = None
    try:
        setup = BACKENDS[spec["backend"]]
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            monitor = PeakGpuMemory(torch.cuda.current_device()).start()
        set_precision(spec["precision"])
        res["env"] = base_env(cuda)
        t0 = time.perf_counter()
        step, sync, env, gpus, device = setup(spec, cuda, rank, world)
        stats = env.pop("_stats", None)
        phases = env.pop("_phases", None)  # nntile: per step, ms until forward, backward and step were submitted
        convert_report = env.pop("_convert_report", None)  # nntile: what convert() made of the model, dense ops seen
        res["env"].update(env)
        if BUILT:
            res["env"]["model"] = dict(BUILT)
        res["gpus"] = gpus
        res["setup_s"] = time.perf_counter() - t0
        tiles = ""  # nntile: one copy of every live tile (what the out-of-memory check counts)
        if stats is not None:
            tiles = f", tiles {stats()['tile_bytes'] / 2**30:.1f} GiB"
        print(f"setup: {res['setup_s']:.1f} s (weights built on {res['env'].get('init_device')}){tiles}", flush=True)
        per_rank = spec["batch"] // world if spec["backend"] in ("fsdp", "fsdp2", "deepspeed") else spec["batch"]
        vocab = CONFIGS[spec["config"]].vocab  # GPT-2's ids in every family (nanoGPT's padded rows never occur)
        times, losses = [], []
        if stats is not None:
            nt_mod = sys.modules["nntile_torch"]
            slow = SlowStepReport(lambda: f"{nt_mod.memory_nodes_report()}. {nt_mod.memory_advice()}")
        tracing = bool(spec.get("trace_steps")) and stats is not None  # nntile: every step under a task trace
        traces = []
        warm = WarmUp(spec["warmup"], spec.get("max_warmup", spec["warmup"]))
        collections = FullCollections()
        gc_ms = []
        s = 0
        while s < warm.steps + spec["steps"]:
            ids = batch_ids(spec, s, vocab)[rank * per_rank:(rank + 1) * per_rank].to(device)
            sync()
            t = time.perf_counter()
            if slow is not None:
                slow.begin(s)
            before = stats() if stats is not None else None
            with nt_mod.task_trace() if tracing else contextlib.nullcontext() as records:
                loss = step(ids)
                value = float(loss.detach()) if torch.is_tensor(loss) else float(loss)  # a host wait, as when logging
            if before is not None:  # nntile: the step's host waits (reading the loss is one) and tasks submitted
                after = stats()
                res.setdefault("host_waits", []).append(after["blocking_waits"] - before["blocking_waits"])
                res.setdefault("tasks", []).append(after["tasks_submitted"] - before["tasks_submitted"])
            sync()
            if slow is not None:
                slow.end()
            times.append(time.perf_counter() - t)
            losses.append(value)
            gc_ms.append(round(collections.take(), 1))
            if tracing:
                from benchmarks import dispatch
                traces.append(records)
                brief = dispatch.step_summary(records)
                print(f"step {s} trace: {json.dumps(brief)}", flush=True)
                res.setdefault("step_traces", []).append(brief)
            # Memory so far on every line: an attempt that is killed later still tells the harness its peaks.
            mem = f", peak GPU {monitor.peak / 2**30:.1f} GiB" if monitor is not None else ""
            host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
            if stats is not None:
                mem += f", peak tiles {stats()['peak_tile_bytes'] / 2**30:.1f} GiB"
            full_gc = f", full gc {gc_ms[-1]:.0f} ms" if gc_ms[-1] else ""
            waits = f", {res['host_waits'][-1]} host waits, {res['tasks'][-1]} tasks" if before is not None else ""
            print(f"step {s}: {times[-1]:.3f} s, loss {value:.4f}{mem}, peak host {host:.1f} GiB{full_gc}{waits}",
                  flush=True)
            peaks = (host, monitor.peak / 2**30 if monitor is not None else 0.0)
            if warm.after_step(s, peaks, lambda flag: _on_any_rank(flag, device, world)):
                print(f"step {s} still raised the peak memory by more than {warm.growth:.0%}: warm-up goes on "
                      f"({warm.steps} steps, at most {warm.most})", flush=True)
            s += 1
        collections.close()
        if traces:  # every step's records, for benchmarks/dispatch.py or a look at what the slow step did
            with gzip.open(spec["trace_steps"] + ".json.gz", "wt") as f:
                json.dump(traces, f)
        if world > 1:
            import torch.distributed as dist
            t = torch.tensor(losses, dtype=torch.float64, device=device)
            dist.all_reduce(t)
            losses = (t / world).tolist()
        if spec.get("timeline") and cuda:  # one more step, untimed, rank 0's under torch.profiler
            from benchmarks.timeline import Timeline, report
            ids = batch_ids(spec, len(times), vocab)[rank * per_rank:(rank + 1) * per_rank].to(device)
            sync()
            with Timeline() if rank == 0 else contextlib.nullcontext() as tl:
                step(ids)
                sync()
            if rank == 0:
                summary = tl.save(spec["timeline"], title=os.path.basename(spec["timeline"]))
                print(report(summary), flush=True)
                res["timeline"] = {k: v for k, v in summary.items() if not isinstance(v, list) or k == "top_kernels"}
        if spec.get("timeline") and cuda and stats is not None:  # and one under a task trace (benchmarks/dispatch.py)
            from benchmarks import dispatch
            nt_mod = sys.modules["nntile_torch"]
            ids = batch_ids(spec, len(times) + 1, vocab)[:per_rank].to(device)
            sync()
            with nt_mod.task_trace() as records:
                step(ids)
            with open(spec["timeline"] + ".tasks.json", "w") as f:
                json.dump(records, f)
            res["dispatch"] = dispatch.summarize(records)
            print(dispatch.report(res["dispatch"]), flush=True)
        timed = times[warm.steps:]
        res.update(step_s=statistics.median(timed), step_mean_s=statistics.mean(timed), step_times=times,
                   gc_ms=gc_ms, losses=losses, loss=losses[-1], warmup_used=warm.steps, first_step_s=times[0])
        if "compile" in spec["flags"]:
            # torch.compile compiles in the first step (forward and backward graphs) and again in any step that
            # recompiles: what the warm-up steps took beyond a timed step is the compile time, kept apart
            res["compile_s"] = round(sum(max(0.0, t - res["step_s"]) for t in times[:warm.steps]), 2)
        if phases is not None:
            res["phase_ms"] = phases[:len(times)]
        if stats is not None:
            res["env"]["nntile_stats"] = stats()
        if convert_report is not None:
            res["env"]["convert"] = convert_report()
    except Unavailable as e:
        res.update(status="unavailable", reason=str(e))
    except BaseException as e:  # noqa: BLE001  (anything else is recorded; the harness reads the file)
        traceback.print_exc()
        if spec["backend"] == "nntile" and is_oom(e) and "nntile_torch" in sys.modules:
            print(sys.modules["nntile_torch"].memory_summary(), flush=True)  # where the tile bytes went
        res.update(status="oom" if is_oom(e) else "error", reason=f"{type(e).__name__}: {e}".splitlines()[0][:500])
    finally:
        if slow is not None:
            slow.stop()
        if monitor is not None:
            res["peak_gpu_bytes"] = monitor.stop()
            res["peak_torch_bytes"] = torch.cuda.max_memory_allocated()
        res["peak_host_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return res


def probe(path):
    """GPU count and name, versions, and matmul peaks (8192^3, median of 10 after 3) for the MFU denominators."""
    cuda = torch.cuda.is_available()
    out = {"gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if cuda else None, "peak_tflops": {}}
    if cuda:
        n = 8192
        for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                                  ("fp32", torch.float32, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            ts = []
            for i in range(13):
                torch.cuda.synchronize()
                t = time.perf_counter()
                torch.matmul(a, b)
                torch.cuda.synchronize()
                if i >= 3:
                    ts.append(time.perf_counter() - t)
            out["peak_tflops"][name] = 2 * n**3 / statistics.median(ts) / 1e12
            del a, b
    with open(path, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--spec", help="attempt spec (JSON) written by benchmarks.run")
    g.add_argument("--probe", help="write GPU count, versions and matmul peaks to this JSON file")
    args = ap.parse_args()
    if args.probe:
        return probe(args.probe)
    with open(args.spec) as f:
        spec = json.load(f)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    res = run_attempt(spec, rank, world)
    with open(f"{spec['result']}.rank{rank}.json", "w") as f:
        json.dump(res, f, default=str)
    print(f"result: {res['status']}" + (f" ({res['reason']})" if res["reason"] else ""), flush=True)
    with contextlib.suppress(Exception):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    nt = sys.modules.get("nntile_torch")
    if nt is not None and nt.is_running():
        nt.runtime._exit()  # stops StarPU (which saves its calibrated performance models), keeps no tile data
    sys.stdout.flush()
    # Skip interpreter teardown (StarPU, NCCL and DeepSpeed threads can make it slow or hang); the result is on disk.
    os._exit(0 if res["status"] in ("ok", "unavailable") else 1)


if __name__ == "__main__":
    main()
