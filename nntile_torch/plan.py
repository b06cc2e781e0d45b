"""The memory plan (docs/memory_plan.md): before step 1, from the model's shapes, the batch, the precision and
the capacity of each memory node, decide where every persistent tile lives (fp32 master weights, AdamW moments,
bf16 compute copies), what the GPU keeps as its working set, and the settings that follow; and say, before
anything is allocated, when a model fits nowhere.

    plan = nt.plan(model, batch=16, seq=1024, precision="bf16")   # the model as built, converted or not (meta too)
    print(plan)                                                    # bytes per tier, traffic, predicted step time
    model = plan.apply(model, init=model._init_weights)            # nt.init with the plan's limits and workers,
                                                                   # nt.convert, checkpointing, the streaming hooks
    opt = plan.optimizer(model.parameters(), lr=3e-4)              # AdamW: state dtype, in-backward, host updates

(The same by parts, as before plan.apply: plan.init(); nt.convert(model, plan=plan); nt.optim.AdamW(..., plan=plan).)

Placement is by whole blocks: the last blocks of the model are the ones whose state (fp32 master weights, AdamW
moments, bf16 copies) lives in host RAM between steps (their gradients arrive first in the backward and the next
forward needs them last); the GPU keeps the first blocks' state, the embeddings, the activations and a streaming
window of the host blocks' tiles. A host block is updated either by CPU workers where its state lives (its fp32
gradient crosses PCIe; ZeRO-Offload's split) or on the GPU (its master weight and moments cross PCIe both ways
around the update; the CPU does nothing), whichever the plan predicts faster.
"""
import dataclasses
import os

import torch

from .facts import ModelFacts, ParamInfo, StepCosts, activation_bytes, model_facts  # noqa: F401 (their home was here)
from .rates import Rates, cpu_rates as _cpu_rates, machine_rates  # noqa: F401 (nt.plan's Rates)

GiB = 2**30


class InsufficientMemoryError(MemoryError):
    """The model, at this batch and sequence length, fits in no placement over the memory nodes. Raised by
    nt.plan() (and convert()) before anything is allocated (the model and optimizer are untouched); .missing maps each
    memory tier to the bytes it lacks in the closest placement; .fixes lists what would make it fit."""

    def __init__(self, message, missing=None, fixes=None):
        super().__init__(message)
        self.missing = dict(missing or {})
        # each a change of nt.plan's arguments (batch, state_dtype, checkpointing, master_dtype, precision,
        # disk_limit / host_memory / gpu_memory in bytes) with which the plan was made again and fits
        self.fixes = list(fixes or [])


@dataclasses.dataclass
class Capacity:
    gpu_bytes: int  # StarPU's limit on one GPU (0: no GPU)
    host_bytes: int  # StarPU's host-RAM limit (without one: what nt.init would set with GPUs)
    disk_bytes: int = 0
    gpus: int = 0
    cpu_workers: int = 1


def _machine_capacity(disk_limit=None):
    from . import _C, runtime
    if _C.running():
        info = runtime.info()
        split = info.get("cuda_memory_split") or {}
        workers = info.get("workers") or {}
        host = runtime._host_limit or runtime.default_host_memory_limit()
        disk = (info.get("settings") or {}).get("disk_limit") or 0
        return Capacity(split.get("starpu_limit_bytes", 0) if workers.get("cuda") else 0, host, disk,
                        info.get("gpus", 0), max(1, workers.get("cpu", 1)))
    gpus = torch.cuda.device_count() if (_C.built_with_cuda and torch.cuda.is_available()) else 0
    gpu = 0
    if gpus:
        total = torch.cuda.get_device_properties(0).total_memory
        gpu = total - max(total // 10, 4 * GiB)
    from .config import cpu_workers_beside_gpus
    host = runtime.default_host_memory_limit()
    return Capacity(gpu, host, disk_limit or 0, gpus, cpu_workers_beside_gpus() if gpus else (os.cpu_count() or 1))


@dataclasses.dataclass
class Option:
    state_dtype: torch.dtype
    step_in_backward: bool
    checkpointing: bool
    host_blocks: int  # the last host_blocks blocks keep their state in host RAM
    cpu_blocks: int = 0  # of those, the last cpu_blocks are updated by CPU workers, the others on the GPU
    master_dtype: torch.dtype = torch.float32  # the blocks' matmul weights (bf16: no separate bf16 copy)
    bf16_per_use: bool = False  # the GPU-resident blocks' bf16 copies made per use (per_use_copies), not kept
    host_checkpoints: bool = False  # checkpointing's block inputs homed in host RAM, fetched back for the recompute

    @property
    def host_update(self):
        """Where the host blocks are updated: "cpu" (CPU workers), "gpu" (state fetched and written back), "mixed"
        (the last cpu_blocks by CPU workers, the others on the GPU), None without host blocks."""
        if not self.host_blocks:
            return None
        return "cpu" if self.cpu_blocks == self.host_blocks else "gpu" if self.cpu_blocks == 0 else "mixed"


class MemoryPlan:
    """Where every persistent tile lives and what each memory node holds at the step's peak, with the settings
    that follow and a predicted step time. Made by nt.plan(); print() it to read it."""

    def __init__(self, facts, batch, seq, precision, option, capacity, rates, tiers, traffic, times, lookahead,
                 alternatives, pinned_master=False):
        self.facts, self.batch, self.seq, self.precision = facts, batch, seq, precision
        self.state_dtype = option.state_dtype
        self.step_in_backward = option.step_in_backward
        self.checkpointing = option.checkpointing
        self.host_blocks = option.host_blocks
        self.cpu_update_blocks = option.cpu_blocks if option.host_blocks else 0
        self.host_update = option.host_update
        self.master_dtype = option.master_dtype
        # the GPU-resident blocks' matmul weights get their bf16 copy made per use instead of kept (per_use_copies:
        # bf16 matmuls with checkpointing; 2 bytes per parameter of GPU memory for two casts per step)
        self.bf16_per_use = option.bf16_per_use
        # every block's input (what checkpointing keeps) copied to host RAM once the GPU is past it, its GPU copy
        # first to be evicted, and fetched back `lookahead` blocks ahead of its recompute in the backward
        self.host_checkpoints = option.host_checkpoints
        self.pinned_master = pinned_master  # master_dtype given to nt.plan (not chosen because fp32 fit nowhere)
        self.capacity, self.rates = capacity, rates
        self.tiers = tiers  # {"gpu": {category: bytes}, "host": {...}, "disk": {...}}
        self.traffic = traffic  # {"pcie_to_gpu": bytes, "pcie_to_host": bytes, "disk": bytes} per step
        self.times = times  # {"gpu_s", "pcie_s", "host_update_s", "disk_s", "step_s"}
        self.lookahead = lookahead
        self.alternatives = alternatives  # [(Option, step_s or None, reason)] the others considered
        self.limits = {}  # nt.init's limits for the capacities given to nt.plan (init_kwargs, init)

    # -- what the plan decided -------------------------------------------------------------------------------
    @property
    def host_block_indices(self):
        return list(range(self.facts.n_layer - self.host_blocks, self.facts.n_layer))

    @property
    def cpu_update_block_indices(self):
        """The host blocks CPU workers update (the last ones: their gradients come first in the backward)."""
        return list(range(self.facts.n_layer - self.cpu_update_blocks, self.facts.n_layer))

    @property
    def gpu_update_block_indices(self):
        """The host blocks updated on the GPU, their master weights and moments fetched and written back."""
        return list(range(self.facts.n_layer - self.host_blocks, self.facts.n_layer - self.cpu_update_blocks))

    def host_parameter_names(self):
        first = self.facts.n_layer - self.host_blocks
        return [p.name for p in self.facts.params if p.block >= first and self.host_blocks]

    def cpu_update_parameter_names(self):
        first = self.facts.n_layer - self.cpu_update_blocks
        return [p.name for p in self.facts.params if p.block >= first and self.cpu_update_blocks]

    def bf16_master_parameter_names(self):
        """The parameters whose only copy is bf16 (master_dtype=torch.bfloat16): the blocks' matmul weights."""
        if self.master_dtype != torch.bfloat16:
            return []
        return [p.name for p in self.facts.params if p.block >= 0 and p.matmul]

    def bf16_per_use_parameter_names(self):
        """The parameters whose bf16 copy is made per use: the matmul weights of the blocks the GPU keeps."""
        if not self.bf16_per_use:
            return []
        first_host = self.facts.n_layer - self.host_blocks
        return [p.name for p in self.facts.params if 0 <= p.block < first_host and p.matmul]

    def in_host_ram(self, module_name):
        """Whether the module of that name (as model.named_modules() gives it) belongs to a host block."""
        first = self.facts.n_layer - self.host_blocks
        path = self.facts.blocks_path
        if not self.host_blocks or not path or not module_name.startswith(path + "."):
            return False
        return int(module_name[len(path) + 1:].split(".", 1)[0]) >= first

    @property
    def submission_window(self):
        """StarPU's task window, a safety net under the plan's own per-block throttle (None: nt.init's default)."""
        return 500 if self.beyond_gpu else None

    @property
    def beyond_gpu(self):
        return self.host_blocks > 0

    def persistent_bytes(self):
        """One copy of every persistent tile by kind, wherever it lives: master weights (parameters: fp32, or bf16
        for the blocks' matmul weights with master_dtype=torch.bfloat16), AdamW moments, bf16 copies (what
        nt.memory_summary() lists as weight/bias, exp_avg/exp_avg_sq, *.bf16)."""
        numel = sum(p.numel for p in self.facts.params)
        moment = 8 if self.state_dtype == torch.float32 else 4
        bf16_masters = set(self.bf16_master_parameter_names())
        in_bf16 = sum(p.numel for p in self.facts.params if p.name in bf16_masters)
        per_use = set(self.bf16_per_use_parameter_names())
        copies = sum(p.numel for p in self.facts.params if p.matmul and p.name not in bf16_masters
                     and p.name not in per_use) if self.precision == "bf16" else 0
        return {"parameters": 4 * numel - 2 * in_bf16, "moments": moment * numel, "bf16 copies": 2 * copies}

    def bytes(self, tier):
        return sum(self.tiers.get(tier, {}).values())

    def predicted_step_s(self):
        return self.times["step_s"]

    def tokens_per_s(self):
        return self.batch * self.seq / self.times["step_s"]

    # -- applying it -----------------------------------------------------------------------------------------
    def init_kwargs(self):
        """nt.init's arguments for this plan: the memory limits given to nt.plan (cuda_memory_limit, host_memory_limit,
        disk_limit), CPU workers for the host blocks' updates, one CUDA worker per GPU and a submission window beyond
        GPU memory."""
        kw = {}
        from . import runtime
        # One worker per GPU beyond GPU memory (two measured 0.90x at 13B), unless the user's STARPU_NWORKER_PER_CUDA
        # asks otherwise (init reads it when not asked).
        if self.beyond_gpu and self.capacity.gpus and runtime._USER_WORKERS_PER_CUDA is None:
            kw["streams_per_gpu"] = 1
        if self.beyond_gpu and self.capacity.gpus and self.cpu_update_blocks:
            kw["ncpus"] = self.capacity.cpu_workers
        if self.submission_window:
            kw["max_submitted_tasks"] = self.submission_window
        kw.update(self.limits)
        return kw

    def init(self, **overrides):
        """Starts the runtime with the plan's settings (nt.init): the memory limits given to nt.plan (gpu_memory,
        host_memory, disk_limit: a disk node needs disk_path=... here), the workers and the submission window;
        `overrides` are nt.init's arguments and win, except those given as None (which leave the plan's value, so
        that a caller can pass its own optional settings through). A running runtime is kept when it has the plan's
        limits; with others, RuntimeError (the plan would count on memory StarPU does not have, or leave unused)."""
        from . import _C, runtime
        kw = {**self.init_kwargs(), **{k: v for k, v in overrides.items() if v is not None}}
        if kw.get("disk_limit") is not None and kw.get("disk_path") is None:
            raise ValueError(f"the plan counts on a disk node of {format_bytes(kw['disk_limit'])} (disk_limit): pass "
                             "its directory, plan.init(disk_path=...)")
        if not _C.running():
            runtime.init(**kw)
            return
        info = runtime.info()
        split = info.get("cuda_memory_split") or {}
        running = {"cuda_memory_limit": split.get("starpu_limit_bytes") if info.get("gpus") else None,
                   "host_memory_limit": runtime._host_limit,
                   "disk_limit": (info.get("settings") or {}).get("disk_limit")}
        differ = {k: (running[k], runtime.parse_bytes(kw[k], k)) for k in running
                  if kw.get(k) is not None and (k != "cuda_memory_limit" or info.get("gpus"))
                  and running[k] != runtime.parse_bytes(kw[k], k)}
        if differ:
            raise RuntimeError("nntile_torch is running with other memory limits than the plan's (running vs plan: "
                               f"{differ}); call nntile_torch.shutdown() before plan.init()")

    def adamw_kwargs(self, params):
        """AdamW's state dtype, in-backward updates, the parameters kept in host RAM and where they are updated
        ("cpu", "gpu", or for a mixed plan the parameters CPU workers update)."""
        from .param import param_state
        params = list(params)
        kw = {"state_dtype": self.state_dtype, "step_in_backward": self.step_in_backward}
        if self.beyond_gpu:
            names = set(self.host_parameter_names())
            kw["offload"] = [p for p in params if param_state(p).name in names]
            kw["offload_update"] = self.host_update
            if self.host_update == "mixed":
                on_cpu = set(self.cpu_update_parameter_names())
                kw["offload_update"] = [p for p in params if param_state(p).name in on_cpu]
        return kw

    def apply(self, model, **convert_kwargs):
        """The one call that puts the plan to work on `model` (as given to nt.plan: dense, on any device, or on meta
        with init=...): starts the runtime with the plan's settings unless it runs already (plan.init(); call it
        first for a disk node's directory or other nt.init arguments), converts the model at the plan's precision
        (nt.convert(model, plan=self, **convert_kwargs): tile_size, batch_tile_size, init, init_device, ...) with the
        plan's checkpointing and streaming hooks, and returns it. Then plan.optimizer(model.parameters(), lr=...)."""
        import nntile_torch  # its public convert: convert.py imports this module (InsufficientMemoryError)
        from . import _C
        if not _C.running():
            self.init()
        return nntile_torch.convert(model, plan=self, **convert_kwargs)

    def optimizer(self, params, **adamw_kwargs):
        """nt.optim.AdamW over `params` (the converted model's parameters) with the plan's choices: moments' dtype,
        updates inside backward, the host blocks' parameters and where they are updated. `adamw_kwargs` are AdamW's
        (lr, betas, weight_decay, ...); a placement argument given must agree with the plan's (ValueError)."""
        from .optim import AdamW
        return AdamW(params, plan=self, **adamw_kwargs)

    def install(self, model):
        """Checkpointing and the streaming hooks on a converted model (nt.convert(..., plan=plan) calls it)."""
        from .param import param_state
        from .streaming import install
        per_use = set(self.bf16_per_use_parameter_names())
        for name, p in model.named_parameters():
            state = param_state(p)
            state.name = name  # what adamw_kwargs finds the plan's parameters by
            # Beyond GPU memory a bf16 matmul's input is cast by a task of its own: cast inside the GEMM (the
            # default) the GEMM's task holds the float32 source and its bf16 copy at once, and 13B at batch 32 took
            # 5 GiB more host RAM (107.4 against 102.2 GiB; benchmarks/results/h200/inside_gpu_v3).
            state.cast_apart = self.beyond_gpu
            if name in per_use:  # its bf16 copy is made per use from now on; the kept one goes
                state.bf16_per_use = True
        if self.checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is not None:
                enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                from .streaming import checkpoint_blocks
                checkpoint_blocks(model, self.facts.blocks_path)
        install(model, self)  # nt.streamer(model).plan is this plan
        return model

    # -- reading it ------------------------------------------------------------------------------------------
    def summary(self):
        """The plan as a dict (what the harness records)."""
        return {"batch": self.batch, "seq": self.seq, "precision": self.precision,
                "state_dtype": str(self.state_dtype).replace("torch.", ""),
                "step_in_backward": self.step_in_backward, "checkpointing": self.checkpointing,
                "host_blocks": self.host_blocks, "host_update": self.host_update,
                "cpu_update_blocks": self.cpu_update_blocks,
                "master_dtype": str(self.master_dtype).replace("torch.", ""), "bf16_per_use": self.bf16_per_use,
                "host_checkpoints": self.host_checkpoints,
                "blocks": self.facts.n_layer,
                "lookahead_blocks": self.lookahead,
                "tiers_bytes": {t: dict(c) for t, c in self.tiers.items()},
                "capacity_bytes": {"gpu": self.capacity.gpu_bytes, "host": self.capacity.host_bytes,
                                   "disk": self.capacity.disk_bytes},
                "traffic_bytes": dict(self.traffic), "predicted": dict(self.times),
                "submission_window": self.submission_window}

    def __repr__(self):
        return f"<MemoryPlan {_count(self.facts.n_params)} parameters, batch {self.batch} x {self.seq}: " \
               f"{self.host_blocks}/{self.facts.n_layer} blocks in host RAM, step {self.times['step_s']:.2f} s>"

    def _where_updated(self):
        f, cap = self.facts, self.capacity
        on_gpu = "on the GPU (state fetched and written back)"
        if self.host_update == "cpu":
            return f"by {cap.cpu_workers} CPU workers"
        if self.host_update == "gpu":
            return on_gpu
        first_cpu = f.n_layer - self.cpu_update_blocks
        return (f"{on_gpu} but the last {self.cpu_update_blocks} (blocks {first_cpu}-{f.n_layer - 1}), updated by "
                f"{cap.cpu_workers} CPU workers")

    def __str__(self):
        f, cap = self.facts, self.capacity
        lines = [f"memory plan: {_count(f.n_params)} parameters ({f.n_layer} blocks, width {f.width}), "
                 f"batch {self.batch} x {self.seq}, {self.precision}",
                 f"  choices: AdamW moments {str(self.state_dtype).replace('torch.', '')}, "
                 f"{'updates inside backward' if self.step_in_backward else 'updates in step()'}, "
                 f"activation checkpointing {'on' if self.checkpointing else 'off'}, "
                 + (f"blocks {f.n_layer - self.host_blocks}-{f.n_layer - 1} ({self.host_blocks}) keep their state "
                    f"in host RAM and are updated {self._where_updated()}"
                    + f", GPU prefetches {self.lookahead} blocks ahead" if self.host_blocks else
                    "every tile on the GPU" if cap.gpu_bytes else "every tile in host RAM")]
        if self.master_dtype == torch.bfloat16:
            lines.append("  master weights: bf16 for the blocks' matmul weights (stochastic rounding, no separate bf16 "
                         "copy)" + ("" if self.pinned_master else ": fp32 master weights fit in no placement"))
        if self.host_checkpoints:
            lines.append("  checkpoints: every block's input in host RAM, fetched back for its recompute "
                         f"{self.lookahead} blocks ahead (host_checkpoints=True)")
        caps = {"gpu": cap.gpu_bytes, "host": cap.host_bytes, "disk": cap.disk_bytes}
        lines.append(f"  {'tier':<5} {'what':<34} {'GiB':>8}")
        for tier in ("gpu", "host", "disk"):
            items = self.tiers.get(tier, {})
            if not items and not caps[tier]:
                continue
            for what, b in items.items():
                if b:
                    lines.append(f"  {tier:<5} {what:<34} {b / GiB:>8.2f}")
            lines.append(f"  {tier:<5} {'= total, of capacity':<34} {self.bytes(tier) / GiB:>8.2f} / "
                         f"{caps[tier] / GiB:.2f}")
        t, tr = self.times, self.traffic
        lines.append(f"  per step: PCIe {tr['pcie_to_gpu'] / 1e9:.1f} GB to the GPU, {tr['pcie_to_host'] / 1e9:.1f} GB "
                     f"back" + (f", disk {tr['disk'] / 1e9:.1f} GB" if tr.get("disk") else ""))
        lines.append(f"  predicted: step {t['step_s']:.2f} s ({self.tokens_per_s():,.0f} tokens/s): GPU "
                     f"{t['gpu_s']:.2f} s, PCIe {t['pcie_s']:.2f} s, host updates {t['host_update_s']:.2f} s"
                     + (f", disk {t['disk_s']:.2f} s" if t.get("disk_s") else ""))
        lines.append(f"  rates: {self.rates.source}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------

def format_bytes(n):
    """12.3 GiB, 40.0 MiB, 512 KiB: sizes as people read them, the small ones of tests and CPU runs included."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def _count(n):
    """1.56B, 124.4M, 118.5K parameters."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def per_use_copies(precision, checkpointing, master_dtype):
    """Whether GPU-resident block weights can have their bf16 copies made per use (MemoryPlan.bf16_per_use): bf16
    matmuls from fp32 master weights, with checkpointing."""
    return precision == "bf16" and checkpointing and master_dtype != torch.bfloat16


def _bytes_of(numel, mm, precision, moment, bf16_master):
    """Persistent bytes of `numel` parameter elements of which `mm` are matmul weights: master weight (fp32, or bf16
    for block matmul weights with bf16 masters), AdamW moments, and the bf16 copy a matmul reads in bf16 mode."""
    if bf16_master:
        return numel * (4 + moment) - 2 * mm  # the matmul weights: 2 + moment, no copy
    return numel * (4 + moment) + (2 * mm if precision == "bf16" else 0)


def _evaluate(facts, batch, seq, precision, opt, cap, rates, lookahead):
    """Bytes per tier, traffic and predicted time of one option; None for the tiers when it does not fit, with the
    bytes missing per tier. Arithmetic on per-block sums (ModelFacts.sums): constant time per option."""
    moment = 8 if opt.state_dtype == torch.float32 else 4
    bf16_master = opt.master_dtype == torch.bfloat16
    per_use = opt.bf16_per_use
    blocks, (rest_numel, rest_mm), tails = facts.sums()
    L = facts.n_layer
    k, c = (opt.host_blocks, opt.cpu_blocks) if cap.gpu_bytes else (0, 0)
    host_numel, host_mm = tails[k]
    cpu_numel, cpu_mm = tails[c]
    gup_numel, gup_mm = host_numel - cpu_numel, host_mm - cpu_mm  # host blocks updated on the GPU
    gpu_numel, gpu_mm = tails[L][0] - host_numel, tails[L][1] - host_mm
    all_numel = gpu_numel + host_numel + rest_numel
    gpus = max(1, cap.gpus)
    act = activation_bytes(facts, -(-batch // gpus), seq, precision, opt.checkpointing)
    # checkpoints homed in host RAM: the GPU keeps those of the blocks around the one computing (lookahead ahead of
    # the recompute, the one in use, the one just done); each crosses PCIe once each way
    costs = facts.costs(precision, seq)
    ckpt_bytes = sum(b.checkpoint for b in costs.blocks) * -(-batch // gpus) * seq \
        if opt.host_checkpoints and opt.checkpointing and cap.gpu_bytes else 0
    if ckpt_bytes:
        act -= ckpt_bytes - (lookahead + 2) * ckpt_bytes // max(1, facts.n_layer)
    block_numel = max([b[0] for b in blocks] or [0])
    block_mm = max([b[1] for b in blocks] or [0])
    block_bytes = _bytes_of(block_numel, block_mm, precision, moment, bf16_master)
    # gradients alive at the peak: all of them with step(); with updates inside backward, the block in flight and
    # the tied embedding's (its LM-head gradient waits for the embedding's, at the end of the backward)
    grads = 4 * all_numel if not opt.step_in_backward else 4 * (2 * block_numel + rest_mm)
    weight_bytes = 2 if precision == "bf16" else 4  # what a matmul reads of a weight
    tiers = {"gpu": {}, "host": {}, "disk": {}}
    if cap.gpu_bytes:
        g = tiers["gpu"]
        g["weights + moments (+ bf16 copies)"] = (_bytes_of(gpu_numel, gpu_mm, precision, moment, bf16_master)
                                                  - (2 * gpu_mm if per_use else 0)
                                                  + _bytes_of(rest_numel, rest_mm, precision, moment, False)) // gpus
        if per_use and gpu_mm:  # the copies of the blocks submitted ahead (made, not yet used and freed)
            g["bf16 copies made per use"] = (lookahead + 2) * 2 * block_mm
        g["activations"] = act
        g["gradients in flight"] = grads
        if k:  # the host blocks' weights being used, plus those prefetched (their gradients are among the two
            # blocks' in flight; once copied to host RAM a GPU copy is clean and evicted as needed)
            g["streamed weights (host blocks)"] = (lookahead + 2) * block_numel * weight_bytes
            if k > c:  # one block's master weights, moments and new bf16 copies: fetched for its update, written
                # back at once (clean copies after that, the first to be evicted: the reserve covers the overlap of one
                # block's write-back and the next fetch)
                g["streamed state (GPU updates)"] = block_bytes
            if bf16_master and c:  # a CPU-updated bf16 master's GPU copy is invalidated by the update and its
                # buffer kept until the next forward fetches the new value into it (30B on the H200: 24.1 GiB of
                # stale buffers measured, these bytes to 0.1 GiB: benchmarks/results/h200/memory_plan_v3)
                g["stale bf16 masters (CPU-updated)"] = 2 * cpu_mm
        g["reserve (allocator, cache)"] = max(cap.gpu_bytes // 25, min(2 * GiB, cap.gpu_bytes // 10))
    h = tiers["host"]
    if not cap.gpu_bytes:
        h["weights + moments (+ bf16 copies)"] = (_bytes_of(gpu_numel, gpu_mm, precision, moment, bf16_master)
                                                  + _bytes_of(rest_numel, rest_mm, precision, moment, False))
        h["activations"] = act
        h["gradients in flight"] = grads
    elif k:
        h["weights + moments (+ bf16 copies)"] = _bytes_of(host_numel, host_mm, precision, moment, bf16_master)
        if c:
            h["gradients arriving"] = 3 * 4 * block_numel
    if ckpt_bytes:
        h["checkpoints (block inputs)"] = ckpt_bytes * gpus
    if h:
        h["reserve (allocator)"] = max(GiB // 4, cap.host_bytes // 50)
    missing = {}
    gpu_need, host_need = sum(tiers["gpu"].values()), sum(h.values())
    if cap.gpu_bytes and gpu_need > cap.gpu_bytes:
        missing["gpu"] = gpu_need - cap.gpu_bytes
    spill = max(0, host_need - cap.host_bytes)
    if spill:
        if spill <= cap.disk_bytes:
            tiers["disk"]["host tiles spilled to the disk node"] = spill
        else:
            missing["host"] = spill - cap.disk_bytes
    # traffic and time per step
    tokens = batch * seq
    # forward, backward (twice the forward), and with checkpointing the recompute (once more)
    flops = (3 + (1 if opt.checkpointing else 0)) * costs.matmul_flops * tokens \
        + 3 * costs.attention_flops * tokens * (4 / 3 if opt.checkpointing else 1)
    gpu_s = flops / rates.gemm(precision) / gpus \
        + rates.per_layer_token_width_s * facts.n_layer * tokens * facts.width * (4 / 3 if opt.checkpointing else 1) / gpus
    copy = 2 if precision == "bf16" and not bf16_master else 0  # the new bf16 copy an update writes

    def update_bytes(numel, mm):  # memory an AdamW update touches: gradient; master, moments and copy read/written
        if bf16_master:
            return numel * (4 + 8 + 2 * moment + copy) - mm * 4
        return numel * (4 + 8 + 2 * moment + (6 if precision == "bf16" else 0))
    to_gpu = 2 * weight_bytes * host_numel  # forward and backward
    # GPU updates: master weight and moments to the update (a bf16 master is there already for the backward)...
    to_gpu += (4 + moment) * gup_numel - (4 * gup_mm if bf16_master else 0)
    to_host = _bytes_of(gup_numel, gup_mm, precision, moment, bf16_master)  # ... and back, with the new bf16 copy
    to_host += 4 * cpu_numel  # CPU updates: fp32 gradients
    to_gpu, to_host = to_gpu + ckpt_bytes, to_host + ckpt_bytes
    gpu_s += update_bytes(gup_numel, gup_mm) / rates.hbm_bytes_s
    if per_use:  # the forward's and the recompute's casts of the GPU blocks' weights: 4 bytes read, 2 written each
        gpu_s += 12 * gpu_mm / rates.hbm_bytes_s / gpus
    host_update_s = update_bytes(cpu_numel, cpu_mm) / rates.host_update_bytes_s
    pcie_s = max(to_gpu, to_host) / rates.pcie_bytes_s
    disk_bytes = 2 * spill if spill and not missing.get("host") else 0
    disk_s = disk_bytes / rates.disk_bytes_s
    # The GPU, PCIe and the CPU updates overlap; the first host block's weights and the last CPU update do not, nor
    # the GPU updates' state fetch of one block and what the overlap does not hide of the rest (fitted).
    exposed = (block_numel * weight_bytes / rates.pcie_bytes_s if k else 0.0) \
        + (host_update_s / c if c else 0.0) \
        + (block_numel * (4 + moment) / rates.pcie_bytes_s + gup_numel * rates.gpu_update_exposed_s if k > c else 0.0)
    step_s = max(gpu_s, pcie_s, host_update_s) + exposed + disk_s
    times = {"gpu_s": gpu_s, "pcie_s": pcie_s, "host_update_s": host_update_s, "disk_s": disk_s, "step_s": step_s}
    traffic = {"pcie_to_gpu": to_gpu, "pcie_to_host": to_host, "disk": disk_bytes}
    return tiers, traffic, times, missing


def plan(model, batch, seq, precision="bf16", *, state_dtype=None, step_in_backward=None, checkpointing=None,
         host_blocks=None, host_update=None, cpu_update_blocks=None, master_dtype=None, bf16_per_use=None,
         host_checkpoints=None, gpu_memory=None, host_memory=None, disk_limit=None, lookahead=2, rates=None,
         _facts=None, _cap=None, _explain_failure=True):
    """The memory plan for training `model` (a torch.nn.Module as built, on any device including meta, converted
    or not) on batches of `batch` sequences of `seq` tokens with nntile_torch.optim.AdamW.

    Capacities default to the running runtime's limits (nt.info()), or to the ones nt.init() would set on this
    machine; gpu_memory / host_memory / disk_limit (bytes or "100GiB") override them. state_dtype,
    step_in_backward, checkpointing, host_blocks, host_update ("cpu", "gpu" or "mixed"), cpu_update_blocks (how many
    of the host blocks, the last ones, CPU workers update; the others are updated on the GPU) and master_dtype pin a
    choice; left as None the plan picks, among the placements that fit, the one with the shortest predicted step,
    the more exact one on a tie (fp32 moments, updates in step(), no checkpointing). Master weights stay fp32 unless
    no placement with them fits: then the blocks' matmul weights are kept in bf16 alone (stochastic rounding in the
    update, 4 bytes per parameter less), and print(plan) says so; master_dtype=torch.float32 refuses that.
    With bf16 matmuls and checkpointing, the GPU-resident blocks' bf16 weight copies are made per use (at each
    forward and recompute) instead of kept between steps, 2 bytes per parameter of GPU memory less;
    bf16_per_use=False keeps them (the same values either way). With checkpointing and a GPU, the blocks' inputs (what
    checkpointing keeps, 4 x width bytes per token and block) can be homed in host RAM, each copied there once the
    GPU is past its block and fetched back ahead of its recompute: host_checkpoints=True asks for it (the same
    values either way); the plan does not choose it by itself (it stalled in the one GPU run that needed it, 13B at
    batch 96 on the H200), but the error names it when it would make the model fit.
    Raises InsufficientMemoryError, before anything is allocated, when none fits, saying how many bytes are missing
    where and what would make it fit (each change it names checked by planning again with it: seconds at 30B)."""
    from .config import check_precision
    from .runtime import parse_bytes
    check_precision(precision)
    for name, v in (("batch", batch), ("seq", seq), ("lookahead", lookahead)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "lookahead" else 1):
            raise ValueError(f"{name} must be a positive int (got {v!r})")
    if host_update not in (None, "cpu", "gpu", "mixed"):
        raise ValueError(f"host_update must be 'cpu', 'gpu', 'mixed' or None (got {host_update!r})")
    if state_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"state_dtype must be torch.float32, torch.bfloat16 or None (got {state_dtype!r})")
    if master_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"master_dtype must be torch.float32, torch.bfloat16 or None (got {master_dtype!r})")
    if bf16_per_use not in (None, True, False):
        raise ValueError(f"bf16_per_use must be True, False or None (got {bf16_per_use!r})")
    if host_checkpoints not in (None, True, False):
        raise ValueError(f"host_checkpoints must be True, False or None (got {host_checkpoints!r})")
    if host_checkpoints and checkpointing is False:
        raise ValueError("host_checkpoints=True homes checkpointing's block inputs in host RAM: not with "
                         "checkpointing=False")
    if master_dtype == torch.bfloat16 and precision != "bf16":
        raise ValueError(f"master_dtype=torch.bfloat16 needs precision='bf16' (got {precision!r})")
    if master_dtype == torch.bfloat16 and state_dtype == torch.float32:
        raise ValueError("master_dtype=torch.bfloat16 keeps the moments in bf16 too (state_dtype=torch.float32 given)")
    if cpu_update_blocks is not None and (isinstance(cpu_update_blocks, bool) or not isinstance(cpu_update_blocks, int)
                                          or cpu_update_blocks < 0):
        raise ValueError(f"cpu_update_blocks must be an int >= 0 (got {cpu_update_blocks!r})")
    facts = _facts
    if facts is None:
        facts = model_facts(model)
        facts.settle(seq)
    if _cap is not None:  # the capacity of the plan being explained, with one change (_fixes)
        cap = _cap
    else:
        cap = _machine_capacity(parse_bytes(disk_limit, "disk_limit"))
        if gpu_memory is not None:
            cap.gpu_bytes = parse_bytes(gpu_memory, "gpu_memory")
            cap.gpus = max(cap.gpus, 1)
        if host_memory is not None:
            cap.host_bytes = parse_bytes(host_memory, "host_memory")
        if disk_limit is not None:
            cap.disk_bytes = parse_bytes(disk_limit, "disk_limit")
    if rates is None:
        rates = machine_rates() if cap.gpu_bytes else _cpu_rates()
    if host_blocks is not None and not (0 <= host_blocks <= facts.n_layer):
        raise ValueError(f"host_blocks must be in [0, {facts.n_layer}] (got {host_blocks!r})")
    if host_blocks and not cap.gpu_bytes:
        raise ValueError("host_blocks needs a GPU tier (this plan has none: everything is in host RAM already)")
    if host_checkpoints and not cap.gpu_bytes:
        raise ValueError("host_checkpoints needs a GPU tier (this plan has none: everything is in host RAM already)")
    if cpu_update_blocks and host_blocks is not None and cpu_update_blocks > host_blocks:
        raise ValueError(f"cpu_update_blocks={cpu_update_blocks} exceeds host_blocks={host_blocks}")
    if host_update == "gpu" and cpu_update_blocks:
        raise ValueError(f"host_update='gpu' updates no host block by CPU workers (cpu_update_blocks={cpu_update_blocks})")
    if host_update == "cpu" and cpu_update_blocks is not None and host_blocks is not None \
            and cpu_update_blocks != host_blocks:
        raise ValueError(f"host_update='cpu' updates all {host_blocks} host blocks by CPU workers "
                         f"(cpu_update_blocks={cpu_update_blocks})")

    def choices(pinned, values):
        return [pinned] if pinned is not None else values

    def cpu_counts(k):
        """How many of k host blocks CPU workers may update under the pins."""
        if not k:
            return [0]
        counts = {"cpu": [k], "gpu": [0], "mixed": range(1, k)}.get(host_update, range(k + 1))
        return [c for c in counts if cpu_update_blocks is None or c == cpu_update_blocks]

    def search(masters, in_host=(False,)):
        considered, feasible = [], []
        for master, hc in ((m, h) for h in in_host for m in masters):
            for ckpt in choices(checkpointing, [False, True]):
                if hc and not ckpt:
                    continue
                for sd in choices(state_dtype, [torch.float32, torch.bfloat16]):
                    if master == torch.bfloat16 and sd != torch.bfloat16:
                        continue
                    for sib in choices(step_in_backward, [False, True]):
                        counts = [host_blocks] if host_blocks is not None else \
                            (range(facts.n_layer + 1) if cap.gpu_bytes and facts.n_layer else [0])
                        for k in counts:
                            if k and not sib:
                                continue  # host blocks' gradients go straight to their update
                            for c in cpu_counts(k):
                                pu = per_use_copies(precision, ckpt, master) and bf16_per_use is not False
                                opt = Option(sd, sib, ckpt, k, c, master, pu, hc)
                                tiers, traffic, times, missing = _evaluate(facts, batch, seq, precision, opt, cap,
                                                                           rates, lookahead)
                                considered.append((opt, tiers, missing))
                                if not missing:
                                    feasible.append((opt, tiers, traffic, times))
                                    if not _explain_failure:  # a fix being checked: whether any fits is enough
                                        return considered, feasible
        return considered, feasible

    bf16_possible = precision == "bf16" and state_dtype != torch.float32 and facts.n_layer
    # The exact placements first; then bf16 master weights; checkpoints in host RAM only when asked for
    hc_first = [True] if host_checkpoints else [False]
    considered, feasible = search(choices(master_dtype, [torch.float32]), hc_first)
    if not feasible and master_dtype is None and bf16_possible:  # fp32 master weights fit nowhere: bf16 ones
        more, feasible = search([torch.bfloat16], hc_first)
        considered += more
    if not considered:
        raise ValueError("no placement has the pinned choices (host_blocks, host_update, cpu_update_blocks): "
                         f"{host_blocks}, {host_update}, {cpu_update_blocks}")
    if not _explain_failure:  # a fix being checked (_fixes): fits or not
        if not feasible:
            raise InsufficientMemoryError("no placement fits")
        return None
    if not feasible:
        # Checkpoints in host RAM are not taken by default: the one run that needed them (13B at batch 96 on the
        # H200, benchmarks/results/h200/capacity_v1) stalled in its first step with the GPU full of freed
        # activation buffers. The error names them when they would make it fit by the arithmetic.
        hc_fits = False
        if host_checkpoints is None and cap.gpu_bytes and checkpointing is not False and facts.n_layer:
            masters = choices(master_dtype, [torch.float32] + ([torch.bfloat16] if bf16_possible else []))
            hc_fits = bool(search(masters, [True])[1])
        pins = dict(state_dtype=state_dtype, step_in_backward=step_in_backward, checkpointing=checkpointing,
                    host_blocks=host_blocks, host_update=host_update, cpu_update_blocks=cpu_update_blocks,
                    master_dtype=master_dtype, bf16_per_use=bf16_per_use, host_checkpoints=host_checkpoints)

        def fits(changes):
            """Whether this plan, with `changes` (nt.plan's arguments; gpu_memory, host_memory, disk_limit in bytes)
            made, has a placement that fits."""
            kw = dict(pins, batch=batch, seq=seq, precision=precision, lookahead=lookahead, rates=rates)
            kw.update({k: v for k, v in changes.items() if k not in _CAPACITY_ARGS})
            tried = dataclasses.replace(cap, **{_CAPACITY_ARGS[k]: v for k, v in changes.items() if k in _CAPACITY_ARGS})
            if tried.gpu_bytes:
                tried.gpus = max(tried.gpus, 1)
            try:
                plan(model, _facts=facts, _cap=tried, _explain_failure=False, **kw)
                return True
            except (InsufficientMemoryError, ValueError):
                return False
        message, missing = _explain(facts, batch, seq, considered, cap, hc_fits)
        fixes = _fixes(batch, precision, pins, cap, missing, fits)
        raise InsufficientMemoryError(message + _say_fixes(fixes, hc_fits), missing, fixes)

    def slack(tiers):
        """The smaller free share of the GPU and host tiers: room for what the arithmetic does not see."""
        shares = [1 - sum(tiers[t].values()) / c for t, c in (("gpu", cap.gpu_bytes), ("host", cap.host_bytes))
                  if c and tiers[t]]
        return min(shares) if shares else 1.0

    # Of the placements within ~3% of the fastest: the most exact (fp32 moments, updates in step(), no
    # checkpointing), then the one that leaves the most room on its fuller tier (more host blocks cost nothing
    # while the GPU, not PCIe or the CPU updates, sets the step time).
    fastest = min(t["step_s"] for _, _, _, t in feasible)

    def key(entry):
        opt, tiers, _, times = entry
        exactness = (opt.state_dtype != torch.float32, opt.step_in_backward, opt.checkpointing)
        return (times["step_s"] > 1.03 * fastest, exactness, -slack(tiers), times["step_s"])
    feasible.sort(key=key)
    best = feasible[0]
    alternatives = [(o, t["step_s"]) for o, _, _, t in feasible[1:6]]  # the next ones in that order
    made = MemoryPlan(facts, batch, seq, precision, best[0], cap, rates, best[1], best[2], best[3], lookahead,
                      alternatives, pinned_master=master_dtype is not None)
    for arg, given, value in (("cuda_memory_limit", gpu_memory, cap.gpu_bytes),
                              ("host_memory_limit", host_memory, cap.host_bytes),
                              ("disk_limit", disk_limit, cap.disk_bytes)):
        if given is not None:
            made.limits[arg] = value
    return made


def _explain(facts, batch, seq, considered, cap, host_checkpoints_fit=False):
    """The message (without what would make it fit: _fixes) and missing bytes of the option closest to fitting."""
    def shortfall(entry):
        return sum(entry[2].values())
    opt, tiers, missing = min(considered, key=shortfall)
    parts = [f"{tier}: {format_bytes(b)} missing (needs {format_bytes(sum(tiers[tier].values()))} of "
             f"{format_bytes(cap.gpu_bytes if tier == 'gpu' else cap.host_bytes + cap.disk_bytes)})"
             for tier, b in missing.items()]
    def tier(b):
        return format_bytes(b) if b else "none"
    msg = (f"{_count(facts.n_params)} parameters at batch {batch} x {seq} fit in no placement over GPU "
           f"{tier(cap.gpu_bytes)}, host {tier(cap.host_bytes)}, disk {tier(cap.disk_bytes)}. "
           f"Closest (moments {str(opt.state_dtype).replace('torch.', '')}, master weights "
           f"{str(opt.master_dtype).replace('torch.', '')}, checkpointing "
           f"{'on' if opt.checkpointing else 'off'}, {opt.host_blocks} of {facts.n_layer} blocks in host RAM): "
           + "; ".join(parts) + ".")
    return msg, missing


# nt.plan's capacity arguments and the Capacity fields they set
_CAPACITY_ARGS = {"gpu_memory": "gpu_bytes", "host_memory": "host_bytes", "disk_limit": "disk_bytes"}


def _least_bytes(fits, arg, base, guess, step=2**20):
    """The least value of capacity `arg`, above `base`, with which the plan fits (within 1/16 of what it adds, in
    whole `step`s), or None; the search starts from base + guess (the closest placement's shortfall)."""
    if not fits({arg: base + 2**50}):
        return None  # another tier lacks memory too
    hi = base + max(step, -(-guess // step) * step)
    while not fits({arg: hi}):
        hi = base + 2 * (hi - base)
    lo = base
    while hi - lo > max(step, (hi - base) // 16):
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if fits({arg: mid}):
            hi = mid
        else:
            lo = mid
    return hi


def _fixes(batch, precision, pins, cap, missing, fits):
    """What would make a plan that fits nowhere fit, each alone, each checked by planning again with it: a list of
    nt.plan argument changes (InsufficientMemoryError.fixes)."""
    fixes = []
    if batch > 1 and fits({"batch": 1}):
        lo, hi = 1, batch  # fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits({"batch": mid}) else (lo, mid)
        fixes.append({"batch": lo})
    # The choices nt.plan searched already cannot help unless pinned otherwise (or precision changes)
    if pins["state_dtype"] == torch.float32 and fits({"state_dtype": torch.bfloat16}):
        fixes.append({"state_dtype": torch.bfloat16})
    for change in ({"checkpointing": True}, {"step_in_backward": True}):
        key = next(iter(change))
        if pins[key] is False and fits(change):
            fixes.append(change)
    if pins["master_dtype"] != torch.bfloat16:
        change = {"master_dtype": torch.bfloat16, "state_dtype": torch.bfloat16}
        if precision != "bf16":
            change["precision"] = "bf16"
        if fits(change):
            fixes.append(change)
    if "host" in missing:
        for arg, base in (("disk_limit", cap.disk_bytes), ("host_memory", cap.host_bytes)):
            least = _least_bytes(fits, arg, base, missing["host"])
            if least is not None:
                fixes.append({arg: least})
    if "gpu" in missing and cap.gpu_bytes:
        least = _least_bytes(fits, "gpu_memory", cap.gpu_bytes, missing["gpu"])
        if least is not None:
            fixes.append({"gpu_memory": least})
    return fixes


def _say_fixes(fixes, host_checkpoints_fit=False):
    said = []
    for f in fixes:
        if "batch" in f:
            said.append(f"batch {f['batch']} or less")
        elif "disk_limit" in f:
            said.append(f"a disk node of at least {format_bytes(f['disk_limit'])} (nt.init(disk_path=..., disk_limit=...))")
        elif "host_memory" in f:
            said.append(f"a host limit of at least {format_bytes(f['host_memory'])} (nt.init(host_memory_limit=...))")
        elif "gpu_memory" in f:
            said.append(f"a GPU limit of at least {format_bytes(f['gpu_memory'])}")
        elif "master_dtype" in f:
            said.append(("precision='bf16' with " if "precision" in f else "")
                        + "master_dtype=torch.bfloat16 (bf16 master weights and moments: 8 bytes per matmul weight less)")
        elif "state_dtype" in f:
            said.append("state_dtype=torch.bfloat16 (bf16 moments: 4 bytes per parameter less)")
        elif "checkpointing" in f:
            said.append("checkpointing=True (activation checkpointing)")
        elif "step_in_backward" in f:
            said.append("step_in_backward=True (updates inside backward: not every gradient at once)")
    if host_checkpoints_fit:
        said.append("host_checkpoints=True (checkpointing's block inputs in host RAM; experimental: it stalled at "
                    "13B batch 96 on the H200)")
    if not said:
        return " No single change of batch, pinned choice or memory tier makes it fit."
    return " What would make it fit, each alone: " + ", or ".join(said) + "."
