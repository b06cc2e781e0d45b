"""The search over placements behind nt.plan(): which blocks keep their state in host RAM and where they are
updated, the moments' and master weights' dtypes, activation checkpointing, updates inside backward; each option
costed by accounting.evaluate, the fastest that fits chosen (the more exact one on a near tie); and, when none fits,
the error that says by how much and what would make it fit (each fix checked by searching again with it).
"""
import dataclasses

import torch

from .accounting import evaluate, format_bytes, format_count, machine_capacity, per_use_copies
from .facts import model_facts
from .rates import cpu_rates as _cpu_rates, machine_rates


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


def choose(model, batch, seq, precision="bf16", *, state_dtype=None, step_in_backward=None, checkpointing=None,
         host_blocks=None, host_update=None, cpu_update_blocks=None, master_dtype=None, bf16_per_use=None,
         host_checkpoints=None, gpu_memory=None, host_memory=None, disk_limit=None, lookahead=2, rates=None,
         _facts=None, _cap=None, _explain_failure=True):
    """The placement nt.plan() chooses (its arguments, plan.py says what they mean), as (facts, capacity, rates,
    (option, tiers, traffic, times), alternatives); None when _explain_failure is False (a fix being checked) and
    one fits. Raises InsufficientMemoryError, before anything is allocated, when none fits, naming what would."""
    from .config import check_precision
    from .runtime import parse_bytes
    check_precision(precision)
    for name, v in (("batch", batch), ("seq", seq), ("lookahead", lookahead)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "lookahead" else 1):
            raise ValueError(f"{name} must be a positive int (got {v!r})")
    if host_update not in (None, "cpu", "gpu", "mixed"):
        raise ValueError(f"host_update must be 'cpu', 'gpu', 'mixed' or None (got {host_update!r})")
    if state_dtype not in (None, torch.float32, torch.bfloat16, torch.uint8):
        raise ValueError("state_dtype must be torch.float32, torch.bfloat16, torch.uint8 or None "
                         f"(got {state_dtype!r})")
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
        raise ValueError("master_dtype=torch.bfloat16 keeps compact moments, bf16 or 8-bit (state_dtype=torch.float32 "
                         "given)")
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
        cap = machine_capacity(parse_bytes(disk_limit, "disk_limit"))
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

    def search(rungs, in_host=(False,), tiers_cap=cap):
        """The placements of the state rungs [(master dtype, moments dtype)] under the pins, costed against
        tiers_cap: (considered [(option, tiers, missing, disk bytes counted on)], feasible [(option, tiers, traffic,
        times)])."""
        considered, feasible = [], []
        masters = list(dict.fromkeys(m for m, _ in rungs))
        for master, hc in ((m, h) for h in in_host for m in masters):
            for ckpt in choices(checkpointing, [False, True]):
                if hc and not ckpt:
                    continue
                for sd in [d for m, d in rungs if m == master]:
                    for sib in choices(step_in_backward, [False, True]):
                        counts = [host_blocks] if host_blocks is not None else \
                            (range(facts.n_layer + 1) if cap.gpu_bytes and facts.n_layer else [0])
                        for k in counts:
                            if k and not sib:
                                continue  # host blocks' gradients go straight to their update
                            for c in cpu_counts(k):
                                pu = per_use_copies(precision, ckpt, master) and bf16_per_use is not False
                                opt = Option(sd, sib, ckpt, k, c, master, pu, hc)
                                tiers, traffic, times, missing = evaluate(facts, batch, seq, precision, opt,
                                                                           tiers_cap, rates, lookahead)
                                considered.append((opt, tiers, missing, tiers_cap.disk_bytes))
                                if not missing:
                                    feasible.append((opt, tiers, traffic, times))
                                    if not _explain_failure:  # a fix being checked: whether any fits is enough
                                        return considered, feasible
        return considered, feasible

    # The state only as compact as it must be to fit (docs/memory_plan.md, "Compact state"): the ladder's rungs under
    # the pins in order, each without the disk node, then the last (most compact) one with it. fp32 and bf16 moments
    # (fp32 masters) are searched together so that their placements are the alternatives of each other, but one with
    # bf16 moments is taken only when none with fp32 moments fits.
    bf16_masters = master_dtype == torch.bfloat16 or bool(precision == "bf16" and facts.n_layer)
    rungs = state_rungs(state_dtype, master_dtype, bf16_masters)
    hc_first = [True] if host_checkpoints else [False]
    no_disk = dataclasses.replace(cap, disk_bytes=0)
    tries = [(r, False) for r in rungs] + ([(rungs[-1], True)] if rungs and cap.disk_bytes else [])
    together = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16)]
    considered, feasible, pool = [], [], []
    steps = []  # the tries that fit nowhere, in order: (rung, with the disk node, closest (option, tiers, missing))
    i = 0
    while i < len(tries) and not feasible:
        rung, disk = tries[i]
        group = [rung] + ([together[1]] if [rung] == together[:1] and tries[i + 1:i + 2] == [(together[1], False)]
                          else [])
        more, found = search(group, hc_first, cap if disk else no_disk)
        considered += more
        for r in group:
            mine = [e for e in found if (e[0].master_dtype, e[0].state_dtype) == r]
            if mine:
                feasible, pool = mine, found
                break
            steps.append((r, disk, _closest([e for e in more if (e[0].master_dtype, e[0].state_dtype) == r])))
        i += len(group)
    if not considered:
        raise ValueError("no placement has the pinned choices (host_blocks, host_update, cpu_update_blocks): "
                         f"{host_blocks}, {host_update}, {cpu_update_blocks}")
    if not _explain_failure:  # a fix being checked (_fixes): fits or not
        if not feasible:
            raise InsufficientMemoryError("no placement fits")
        return None
    if not feasible:
        # Checkpoints in host RAM are not taken by default: the one run that needed them stalled in its first step
        # with the GPU full of freed activation buffers (docs/measurements.md, "Checkpoints in host RAM"). The
        # error names them when they would make it fit by the arithmetic.
        hc_fits = False
        if host_checkpoints is None and cap.gpu_bytes and checkpointing is not False and facts.n_layer:
            hc_fits = bool(search(rungs, [True])[1])
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
                choose(model, _facts=facts, _cap=tried, _explain_failure=False, **kw)
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
    def ordered(entries):
        fastest = min(t["step_s"] for _, _, _, t in entries)

        def key(entry):
            opt, tiers, _, times = entry
            exactness = (opt.state_dtype != torch.float32, opt.step_in_backward, opt.checkpointing)
            return (times["step_s"] > 1.03 * fastest, exactness, -slack(tiers), times["step_s"])
        return sorted(entries, key=key)
    best = ordered(feasible)[0]
    # the next ones in that order, of the rungs searched last (with fp32 moments, the bf16-moment ones beside them)
    alternatives = [(o, t["step_s"]) for o, _, _, t in ordered(pool) if o is not best[0]][:5]
    return facts, cap, rates, best, alternatives, steps


# The state's ladder (docs/memory_plan.md, "Compact state"): (master weights, moments), from the most exact to the most
# compact. 8-bit moments with fp32 masters only where bf16 masters are out (pinned, or not at this precision): with
# them, bf16 master weights and bf16 moments take less (6 bytes per matmul weight against 4 + 2 + 2).
LADDER = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16),
          (torch.float32, torch.uint8), (torch.bfloat16, torch.uint8)]


def state_rungs(state_dtype, master_dtype, bf16_masters=True):
    """The rungs of LADDER nt.plan tries, in order, under its pins state_dtype and master_dtype (None: free);
    bf16_masters: whether bf16 master weights are possible (precision bf16, a model with blocks)."""
    rungs = [(m, d) for m, d in LADDER if (master_dtype is None or m == master_dtype)
             and (state_dtype is None or d == state_dtype) and (m == torch.float32 or bf16_masters)]
    if (torch.bfloat16, torch.bfloat16) in rungs and (torch.float32, torch.uint8) in rungs:
        rungs.remove((torch.float32, torch.uint8))
    return rungs


def describe_rung(rung):
    """What a rung of the ladder keeps, as print(plan) and the errors say it."""
    return {(torch.float32, torch.float32): "fp32 master weights and moments",
            (torch.float32, torch.bfloat16): "bf16 moments",
            (torch.bfloat16, torch.bfloat16): "bf16 master weights (and bf16 moments)",
            (torch.float32, torch.uint8): "8-bit moments",
            (torch.bfloat16, torch.uint8): "bf16 master weights and 8-bit moments"}[tuple(rung)]


def _closest(considered):
    """Of the (option, tiers, missing, disk bytes) considered, the one that misses the fewest bytes (None if none)."""
    return min(considered, key=lambda e: sum(e[2].values()), default=None)


def say_missing(missing):
    """{"gpu": bytes, "host": bytes} as 'gpu 3.1 GiB, host 120 MiB missing'."""
    return ", ".join(f"{tier} {format_bytes(b)}" for tier, b in missing.items()) + " missing"


def _explain(facts, batch, seq, considered, cap, host_checkpoints_fit=False):
    """The message (without what would make it fit: _fixes) and missing bytes of the option closest to fitting."""
    opt, tiers, missing, disk = _closest(considered)
    parts = [f"{tier}: {format_bytes(b)} missing (needs {format_bytes(sum(tiers[tier].values()))} of "
             f"{format_bytes(cap.gpu_bytes if tier == 'gpu' else cap.host_bytes + disk)})"
             for tier, b in missing.items()]
    def tier(b):
        return format_bytes(b) if b else "none"
    msg = (f"{format_count(facts.n_params)} parameters at batch {batch} x {seq} fit in no placement over GPU "
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
    # A pinned state released one rung of compactness at a time: the first that fits (fp32 -> bf16 -> 8-bit moments)
    compact = [torch.float32, torch.bfloat16, torch.uint8]
    if pins["state_dtype"] in compact[:-1]:
        for sd in compact[compact.index(pins["state_dtype"]) + 1:]:
            if fits({"state_dtype": sd}):
                fixes.append({"state_dtype": sd})
                break
    for change in ({"checkpointing": True}, {"step_in_backward": True}):
        key = next(iter(change))
        if pins[key] is False and fits(change):
            fixes.append(change)
    if pins["master_dtype"] != torch.bfloat16:
        for sd in (torch.bfloat16, torch.uint8):  # the lesser of the two that fits
            change = {"master_dtype": torch.bfloat16, "state_dtype": sd}
            if precision != "bf16":
                change["precision"] = "bf16"
            if fits(change):
                fixes.append(change)
                break
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
        elif "master_dtype" in f and f.get("state_dtype") == torch.uint8:
            said.append(("precision='bf16' with " if "precision" in f else "")
                        + "master_dtype=torch.bfloat16 and state_dtype=torch.uint8 (bf16 master weights and 8-bit "
                        "moments: about 10 bytes per matmul weight less)")
        elif "master_dtype" in f:
            said.append(("precision='bf16' with " if "precision" in f else "")
                        + "master_dtype=torch.bfloat16 (bf16 master weights and moments: 8 bytes per matmul weight less)")
        elif f.get("state_dtype") == torch.uint8:
            said.append("state_dtype=torch.uint8 (8-bit block-wise moments: about 6 bytes per parameter less than fp32)")
        elif "state_dtype" in f:
            said.append("state_dtype=torch.bfloat16 (bf16 moments: 4 bytes per parameter less)")
        elif "checkpointing" in f:
            said.append("checkpointing=True (activation checkpointing)")
        elif "step_in_backward" in f:
            said.append("step_in_backward=True (updates inside backward: not every gradient at once)")
    if host_checkpoints_fit:
        said.append("host_checkpoints=True (checkpointing's block inputs in host RAM; experimental: it stalled in "
                    "a 13B run)")
    if not said:
        return " No single change of batch, pinned choice or memory tier makes it fit."
    return " What would make it fit, each alone: " + ", or ".join(said) + "."
