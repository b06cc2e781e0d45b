"""Project-wide defaults."""
import functools
import math
import os

import torch

# Tile edge in elements for weight dimensions of modules built directly (nt.nn.Linear(...); convert() picks its
# own from the model's width: weight_tile): 1024 x 1024 fp32 is a 4 MiB tile, about the size from which PCIe copies
# run near full speed (docs/measurements.md, "Tile sizes").
DEFAULT_TILE_SIZE = 1024
# Rows (batch x sequence positions) per activation tile.
DEFAULT_BATCH_TILE_SIZE = 1024
PRECISIONS = ("fp32", "tf32", "bf16")


def cpu_workers_beside_gpus():
    """CPU workers to start next to the GPUs when CPU tasks are wanted (AdamW(offload=...)): every core but one
    per GPU driver thread and one for the submitting thread."""
    return max(1, (os.cpu_count() or 2) - torch.cuda.device_count() - 1)


def weight_tile(width, cuda, beyond_gpu=False):
    """Default weight tile edge for a GPT-2 of hidden size `width` (convert()'s, when none is given): 3 x width at
    least, so that LayerNorm's rows and attention's q, k, v rows sit in one tile and run as tile tasks. On GPUs,
    when every tile stays there (no memory plan beyond GPU memory), 4 x width: the MLP's weights (4 width x width)
    are then one tile each, so each MLP matmul, its bias and its casts are one task instead of two. Beyond GPU memory the plan's
    streaming was measured with 3 x width, which it keeps (docs/measurements.md, "Tile sizes")."""
    return max(1024, (4 if cuda and not beyond_gpu else 3) * width)


def rows_per_tile(batch, seq, cuda, places=1):
    """Default rows per activation tile for training on (batch, seq) token batches: whole sequences always
    (attention needs them). On GPUs the batch is split only once per place: a GPU runs one task at a time and
    each costs tens of microseconds around its kernels, so GEMMs must be large (GPT-2 XL, batch 8 x 1024: one
    sequence per tile made 23k tasks and a 3.5 s step; the whole batch per tile 3.8k tasks and 0.7 s). On CPUs
    one sequence per tile, so that every core gets tasks."""
    if cuda:
        return seq * -(-batch // max(1, places))
    return seq


def sequence_rows(shape, batch_tile):
    """Rows per activation tile for a tensor of `shape` (..., T, C) seen as the matrix (prod(...), C): batch_tile,
    or where T does not divide it, the whole sequences of T rows that fit in batch_tile (attention takes tiles of
    whole sequences: generation without a cache grows T by one per token, and 8 sequences of 129 in tiles of 1024
    would cut one). Never more than batch_tile rows, so plans' tile sizes still bound it."""
    m = math.prod(shape[:-1])
    if len(shape) >= 3 and 0 < shape[-2] <= batch_tile and batch_tile % shape[-2]:
        batch_tile -= batch_tile % shape[-2]
    return min(batch_tile, m)


def check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} (got {precision!r})")
    return precision


def check_tile(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (got {value!r})")
    return value


# docs/fusion.md: the dW GEMM's bias gradient; pending bf16 producers; a Linear's GEMM adding the residual its
# output joins
FUSIONS = ("bias_grad", "bf16_outputs", "residual")
# The fusions on by default: those measured faster on GPT-2 XL (benchmarks/results/h100/fusion_v1: bias_grad +6%
# on HF, +19% on nanoGPT; bf16_outputs on top of it -9% and -15% there, a wash with the one-pass bf16 GELU in
# h100/ab_5cadbed_v1: 0.96x HF's step time, 1.01x nanoGPT's); residual within the spread (h100/residual_v1: HF 1.02x,
# nanoGPT 0.96x the step time).
DEFAULT_FUSIONS = ("bias_grad",)


def fusion_enabled(name=None):
    """Whether bf16 training fuses `name` (one of FUSIONS) into its neighbours (docs/fusion.md); name None:
    whether any fusion is on. Unset, the fusions of DEFAULT_FUSIONS. NNTILE_FUSION=0 turns every fusion off, 1 (or
    all) turns every one on, a comma list keeps those only (e.g. NNTILE_FUSION=bias_grad): for measuring a fusion
    against the unfused graph in one process and one build (benchmarks) and for bisecting a numerical difference;
    read at each op, so a test can switch it."""
    names = _fusions(os.environ.get("NNTILE_FUSION", ""))
    return bool(names) if name is None else name in names


@functools.lru_cache(maxsize=8)
def _fusions(value):
    value = value.strip().lower()
    if value in ("1", "on", "true", "all"):
        names = set(FUSIONS)
    elif value in ("0", "off", "false", "none"):
        names = set()
    elif not value:
        names = set(DEFAULT_FUSIONS)
    else:
        names = {v.strip() for v in value.split(",") if v.strip()}
        unknown = names - set(FUSIONS)
        if unknown:
            raise ValueError(f"NNTILE_FUSION: unknown fusion(s) {sorted(unknown)} (known: {', '.join(FUSIONS)}; "
                             f"0, 1 or all)")
    return frozenset(names)
