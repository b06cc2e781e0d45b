"""What one placement of a model's training state costs a step, as nt.plan weighs it (placement.py searches over
placements, plan.py applies and prints the one chosen): bytes per memory tier (GPU, host RAM, disk), PCIe and disk
traffic, and a predicted step time from the rates (rates.py); and the machine's capacities they are weighed against.
"""
import dataclasses
import math
import os

import torch

from .costs import GPT2_BLOCK_ELEMENTWISE, residual_block
from .facts import activation_bytes

GiB = 2**30


def format_bytes(n):
    """12.3 GiB, 40.0 MiB, 512 KiB: sizes as people read them, the small ones of tests and CPU runs included."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def format_count(n):
    """1.56B, 124.4M, 118.5K parameters."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


@dataclasses.dataclass
class Capacity:
    gpu_bytes: int  # StarPU's limit on one GPU (0: no GPU)
    host_bytes: int  # StarPU's host-RAM limit (without one: what nt.init would set with GPUs)
    disk_bytes: int = 0
    gpus: int = 0
    cpu_workers: int = 1


def machine_capacity(disk_limit=None):
    from . import _C, runtime
    if _C.running():
        info = runtime.info()
        split = info.get("cuda_memory_split") or {}
        workers = info.get("workers") or {}
        host = runtime.host_limit() or runtime.default_host_memory_limit()
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


def adamw_state_bytes(params, precision):
    """What training `params` parameters with AdamW needs at least: float32 weights, gradients and two moments (16
    bytes each), 2 more for bf16 matmuls' weight copies. Above the GPUs' memory (machine_capacity), nt.plan is due:
    convert()'s warning and benchmarks/profile_step's --plan auto both ask this."""
    return params * (16 + (2 if precision == "bf16" else 0))


def per_use_copies(precision, checkpointing, master_dtype):
    """Whether GPU-resident block weights can have their bf16 copies made per use (MemoryPlan.bf16_per_use): bf16
    matmuls from fp32 master weights, with checkpointing."""
    return precision == "bf16" and checkpointing and master_dtype != torch.bfloat16


# Bytes both AdamW moments take per parameter element, by AdamW's state_dtype (optim.state_bytes_per_param): fp32,
# bf16, or 8-bit block-wise (one code byte each, one float32 scale each per 256 elements; a tile's partial last block
# and code word add at most 14 bytes per tile, which the plan does not count).
MOMENT_BYTES = {torch.float32: 8, torch.bfloat16: 4, torch.uint8: 2 + 8 / 256}


def moment_bytes(state_dtype):
    return MOMENT_BYTES[state_dtype]


def state_bytes(numel, mm, precision, moment, bf16_master):
    """Persistent bytes of `numel` parameter elements of which `mm` are matmul weights: master weight (fp32, or bf16
    for block matmul weights with bf16 masters), AdamW moments (`moment` bytes per element: MOMENT_BYTES), and the
    bf16 copy a matmul reads in bf16 mode. Per parameter: fp32 master + fp32 moments 12 (+2 copy), + bf16 moments 8
    (+2), bf16 master + bf16 moments 6, fp32 master + 8-bit moments 6.03 (+2), bf16 master + 8-bit moments 4.03."""
    if bf16_master:
        return math.ceil(numel * (4 + moment)) - 2 * mm  # the matmul weights: 2 + moment, no copy
    return math.ceil(numel * (4 + moment)) + (2 * mm if precision == "bf16" else 0)


def evaluate(facts, batch, seq, precision, opt, cap, rates, lookahead):
    """Bytes per tier, traffic and predicted time of one option; None for the tiers when it does not fit, with the
    bytes missing per tier. Arithmetic on per-block sums (ModelFacts.sums): constant time per option."""
    moment = moment_bytes(opt.state_dtype)
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
    block_bytes = state_bytes(block_numel, block_mm, precision, moment, bf16_master)
    # gradients alive at the peak: all of them with step(); with updates inside backward, the block in flight and
    # the tied embedding's (its LM-head gradient waits for the embedding's, at the end of the backward)
    grads = 4 * all_numel if not opt.step_in_backward else 4 * (2 * block_numel + rest_mm)
    weight_bytes = 2 if precision == "bf16" else 4  # what a matmul reads of a weight
    tiers = {"gpu": {}, "host": {}, "disk": {}}
    if cap.gpu_bytes:
        g = tiers["gpu"]
        g["weights + moments (+ bf16 copies)"] = (state_bytes(gpu_numel, gpu_mm, precision, moment, bf16_master)
                                                  - (2 * gpu_mm if per_use else 0)
                                                  + state_bytes(rest_numel, rest_mm, precision, moment, False)) // gpus
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
                # buffer kept until the next forward fetches the new value into it (docs/measurements.md, "Stale
                # bf16 masters")
                g["stale bf16 masters (CPU-updated)"] = 2 * cpu_mm
        g["reserve (allocator, cache)"] = max(cap.gpu_bytes // 25, min(2 * GiB, cap.gpu_bytes // 10))
    h = tiers["host"]
    if not cap.gpu_bytes:
        h["weights + moments (+ bf16 copies)"] = (state_bytes(gpu_numel, gpu_mm, precision, moment, bf16_master)
                                                  + state_bytes(rest_numel, rest_mm, precision, moment, False))
        h["activations"] = act
        h["gradients in flight"] = grads
    elif k:
        h["weights + moments (+ bf16 copies)"] = state_bytes(host_numel, host_mm, precision, moment, bf16_master)
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
    # elementwise tasks by the bytes the blocks' modules say they move, at the rate fitted on GPT-2 blocks; a block
    # whose modules say nothing beyond its residual adds (a form not described) is taken as a GPT-2 block
    full = GPT2_BLOCK_ELEMENTWISE * facts.width
    elementwise = sum(b.elementwise if b.elementwise > residual_block(facts.width).elementwise else full
                      for b in costs.blocks) / GPT2_BLOCK_ELEMENTWISE
    gpu_s = flops / rates.gemm(precision) / gpus \
        + rates.per_layer_token_width_s * elementwise * tokens * (4 / 3 if opt.checkpointing else 1) / gpus
    copy = 2 if precision == "bf16" and not bf16_master else 0  # the new bf16 copy an update writes

    def update_bytes(numel, mm):  # memory an AdamW update touches: gradient; master, moments and copy read/written
        if bf16_master:
            return numel * (4 + 8 + 2 * moment + copy) - mm * 4
        return numel * (4 + 8 + 2 * moment + (6 if precision == "bf16" else 0))
    to_gpu = 2 * weight_bytes * host_numel  # forward and backward
    # GPU updates: master weight and moments to the update (a bf16 master is there already for the backward)...
    to_gpu += math.ceil((4 + moment) * gup_numel) - (4 * gup_mm if bf16_master else 0)
    to_host = state_bytes(gup_numel, gup_mm, precision, moment, bf16_master)  # ... and back, with the new bf16 copy
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
