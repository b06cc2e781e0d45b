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

The plan's parts, one job each: facts.py reads the model, costs.py is what each module form costs, accounting.py
adds up one placement's bytes, traffic and time, placement.py searches over placements, rates.py holds the rates;
this module is the plan chosen: how it is applied (plan.apply, plan.optimizer) and printed.
"""
import math

import torch

from .accounting import GiB, format_bytes, format_count, moment_bytes
from .placement import choose, describe_rung, say_missing
# What was imported from here before the plan's parts had modules of their own:
from .accounting import Capacity, machine_capacity as _machine_capacity, per_use_copies  # noqa: F401,E402
from .facts import ModelFacts, ParamInfo, StepCosts, activation_bytes, model_facts  # noqa: F401,E402
from .placement import InsufficientMemoryError, Option  # noqa: F401,E402
from .rates import Rates, cpu_rates as _cpu_rates, machine_rates  # noqa: F401,E402


class MemoryPlan:
    """Where every persistent tile lives and what each memory node holds at the step's peak, with the settings
    that follow and a predicted step time. Made by nt.plan(); print() it to read it."""

    def __init__(self, facts, batch, seq, precision, option, capacity, rates, tiers, traffic, times, lookahead,
                 alternatives, pinned_master=False, steps=()):
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
        self.alternatives = alternatives  # [(Option, step_s)] the others considered
        # The state's ladder as nt.plan climbed it (placement.LADDER): each (master, moments) rung that fit in no
        # placement, with or without the disk node, and the closest of its placements (option, tiers, missing, disk)
        self.steps = list(steps)
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
        moment = moment_bytes(self.state_dtype)
        bf16_masters = set(self.bf16_master_parameter_names())
        in_bf16 = sum(p.numel for p in self.facts.params if p.name in bf16_masters)
        per_use = set(self.bf16_per_use_parameter_names())
        copies = sum(p.numel for p in self.facts.params if p.matmul and p.name not in bf16_masters
                     and p.name not in per_use) if self.precision == "bf16" else 0
        return {"parameters": 4 * numel - 2 * in_bf16, "moments": math.ceil(moment * numel), "bf16 copies": 2 * copies}

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
        if self.beyond_gpu and self.capacity.gpus and runtime.user_workers_per_cuda() is None:
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
                   "host_memory_limit": runtime.host_limit(),
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
            # default) the GEMM's task holds the float32 source and its bf16 copy at once, more host RAM
            # (docs/measurements.md, "Casts apart").
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
                "traffic_bytes": dict(self.traffic), "predicted": dict(self.times), "rates": self.rates.source,
                "submission_window": self.submission_window}

    def __repr__(self):
        return f"<MemoryPlan {format_count(self.facts.n_params)} parameters, batch {self.batch} x {self.seq}: " \
               f"{self.host_blocks}/{self.facts.n_layer} blocks in host RAM, step {self.times['step_s']:.2f} s>"

    def reasons(self):
        """One line per step up the state's ladder: what was taken and why (the rung before fit in no placement,
        with how much its closest placement missed), as print(plan) shows them."""
        lines, chosen = [], ((self.master_dtype, self.state_dtype), bool(self.tiers.get("disk")))
        tries = [(rung, disk) for rung, disk, _ in self.steps] + [chosen]
        for (rung, disk, closest), (nxt, nxt_disk) in zip(self.steps, tries[1:]):
            taken = "the disk node" if nxt_disk and not disk else describe_rung(nxt)
            where = "GPU, host RAM and the disk node" if disk else "GPU and host RAM" if self.capacity.gpu_bytes \
                else "host RAM"
            miss = f" (closest: {say_missing(closest[2])})" if closest is not None else ""
            lines.append(f"  why {taken}: {describe_rung(rung)} fit in no placement in {where}{miss}")
        return lines

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
        lines = [f"memory plan: {format_count(f.n_params)} parameters ({f.n_layer} blocks, width {f.width}), "
                 f"batch {self.batch} x {self.seq}, {self.precision}",
                 f"  choices: AdamW moments {str(self.state_dtype).replace('torch.', '')}, "
                 f"{'updates inside backward' if self.step_in_backward else 'updates in step()'}, "
                 f"activation checkpointing {'on' if self.checkpointing else 'off'}, "
                 + (f"blocks {f.n_layer - self.host_blocks}-{f.n_layer - 1} ({self.host_blocks}) keep their state "
                    f"in host RAM and are updated {self._where_updated()}"
                    + f", GPU prefetches {self.lookahead} blocks ahead" if self.host_blocks else
                    "every tile on the GPU" if cap.gpu_bytes else "every tile in host RAM")]
        if self.state_dtype == torch.uint8:
            lines.append("  moments: 8-bit block-wise (bitsandbytes' 8-bit AdamW scheme: a code byte per element, a "
                         "float32 scale per 256)")
        if self.master_dtype == torch.bfloat16:
            lines.append("  master weights: bf16 for the blocks' matmul weights (stochastic rounding, no separate bf16 "
                         "copy)")
        lines += self.reasons()
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


def plan(model, batch, seq, precision="bf16", *, state_dtype=None, step_in_backward=None, checkpointing=None,
         host_blocks=None, host_update=None, cpu_update_blocks=None, master_dtype=None, bf16_per_use=None,
         host_checkpoints=None, gpu_memory=None, host_memory=None, disk_limit=None, lookahead=2, rates=None,
         _facts=None, _cap=None):
    """The memory plan for training `model` (a torch.nn.Module as built, on any device including meta, converted
    or not) on batches of `batch` sequences of `seq` tokens with nntile_torch.optim.AdamW.

    Capacities default to the running runtime's limits (nt.info()), or to the ones nt.init() would set on this
    machine; gpu_memory / host_memory / disk_limit (bytes or "100GiB") override them. state_dtype,
    step_in_backward, checkpointing, host_blocks, host_update ("cpu", "gpu" or "mixed"), cpu_update_blocks (how many
    of the host blocks, the last ones, CPU workers update; the others are updated on the GPU) and master_dtype pin a
    choice; left as None the plan picks, among the placements that fit, the one with the shortest predicted step,
    the more exact one on a tie (fp32 moments, updates in step(), no checkpointing). The state is made compact only as
    far as needed to fit, in order (placement.LADDER, docs/memory_plan.md "Compact state"): fp32 master weights and
    moments, bf16 moments, bf16 master weights for the blocks' matmul weights (stochastic rounding in the update, no
    separate bf16 copy), bf16 master weights with 8-bit moments (state_dtype=torch.uint8), then the disk node;
    print(plan) says why each step was taken. state_dtype and master_dtype pins leave out the steps that disagree
    (master_dtype=torch.float32 refuses bf16 master weights).
    With bf16 matmuls and checkpointing, the GPU-resident blocks' bf16 weight copies are made per use (at each
    forward and recompute) instead of kept between steps, 2 bytes per parameter of GPU memory less;
    bf16_per_use=False keeps them (the same values either way). With checkpointing and a GPU, the blocks' inputs (what
    checkpointing keeps, 4 x width bytes per token and block) can be homed in host RAM, each copied there once the
    GPU is past its block and fetched back ahead of its recompute: host_checkpoints=True asks for it (the same
    values either way); the plan does not choose it by itself (it stalled in the one GPU run that needed it:
    docs/measurements.md), but the error names it when it would make the model fit.
    Raises InsufficientMemoryError, before anything is allocated, when none fits, saying how many bytes are missing
    where and what would make it fit (each change it names checked by planning again with it: seconds at 30B)."""
    facts, cap, rates, (option, tiers, traffic, times), alternatives, steps = choose(
        model, batch, seq, precision, state_dtype=state_dtype, step_in_backward=step_in_backward,
        checkpointing=checkpointing, host_blocks=host_blocks, host_update=host_update,
        cpu_update_blocks=cpu_update_blocks, master_dtype=master_dtype, bf16_per_use=bf16_per_use,
        host_checkpoints=host_checkpoints, gpu_memory=gpu_memory, host_memory=host_memory, disk_limit=disk_limit,
        lookahead=lookahead, rates=rates, _facts=_facts, _cap=_cap)
    made = MemoryPlan(facts, batch, seq, precision, option, cap, rates, tiers, traffic, times, lookahead,
                      alternatives, pinned_master=master_dtype is not None, steps=steps)
    for arg, given, value in (("cuda_memory_limit", gpu_memory, cap.gpu_bytes),
                              ("host_memory_limit", host_memory, cap.host_bytes),
                              ("disk_limit", disk_limit, cap.disk_bytes)):
        if given is not None:
            made.limits[arg] = value
    return made
