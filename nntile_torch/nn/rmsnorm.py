"""Drop-in for torch.nn.RMSNorm and Hugging Face's LlamaRMSNorm (Mistral's, Qwen2's) executed as tile tasks."""
import numbers

import torch
from torch import nn

from .. import config
from ..costs import Costs, register_form
from ..functional import apply_tiled
from ..functional_llama import RMSNormFunction
from ..runtime import ensure_init
from ..tensor import TileTensor, without_torch_function
from . import _init
from .norm_act import check_input


def rmsnorm_costs(width):
    """What an RMSNorm costs the memory plan per token: it keeps its float32 input (and one float of rstd); reads and
    writes a row (elementwise)."""
    return Costs(kept=4 * width + 4, elementwise=8 * width)


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm over the last dimension, as tile tasks, with Hugging Face's numbers (LlamaRMSNorm: the mean
    of squares in fp32, y = weight * (x * rsqrt(mean(x^2) + eps))): x (*, C) -> y (*, C); weight (C,).

    Same constructor as torch.nn.RMSNorm (normalized_shape must name the last dimension alone; elementwise_affine
    must be True; eps None: torch.finfo(float32).eps, as torch's), plus batch_tile_size (rows per tile; each tile
    holds whole rows).
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 batch_tile_size=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1 or normalized_shape[0] <= 0:
            raise ValueError(f"nntile_torch.nn.RMSNorm normalizes the last dimension alone: normalized_shape must "
                             f"be one positive int (got {normalized_shape})")
        if not elementwise_affine:
            raise ValueError("nntile_torch.nn.RMSNorm needs elementwise_affine=True")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.RMSNorm keeps float32 parameters (got dtype={dtype})")
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = True
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        c = normalized_shape[0]
        self.weight = nn.Parameter(TileTensor.empty((c,), (c,), device, name="weight", persistent=True))
        self.reset_parameters()

    def reset_parameters(self):
        if _init.skipping():  # convert() writes the values
            return
        with torch.no_grad():
            self.weight.copy_(torch.ones(self.normalized_shape))

    @without_torch_function
    def forward(self, x):
        check_input(x, "RMSNorm")
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"RMSNorm expects input of shape (*, {self.normalized_shape[0]}) (got {tuple(x.shape)})")
        ensure_init()
        eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
        return apply_tiled(RMSNormFunction, x, self.weight, eps, self.batch_tile_size)

    def plan_costs(self, precision, seq):
        return rmsnorm_costs(self.normalized_shape[0])

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.materialize().clone()


def _rmsnorm_form(m):
    from ..recognize import rmsnorm_like
    return not isinstance(m, RMSNorm) and rmsnorm_like(m) is not None


# Modules convert() swaps for RMSNorm (torch.nn.RMSNorm, LlamaRMSNorm, ...), described the same before the swap
register_form(_rmsnorm_form, lambda m, precision, seq: rmsnorm_costs(m.weight.shape[0]))
