"""Drop-ins for torch.nn.LayerNorm and torch.nn.GELU executed as tile tasks."""
import numbers

import torch
from torch import nn

from .. import config
from ..costs import Costs, register_form
from ..functional import DropoutFunction, GeluFunction, LayerNormFunction, apply_tiled
from ..runtime import ensure_init
from ..tensor import TileTensor, without_torch_function
from . import _init


def check_input(x, what):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor (got {type(x).__name__})")
    if x.dtype != torch.float32:
        raise TypeError(f"{what} expects float32 input (got {x.dtype})")
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(f"{what} expects a non-empty input with at least one dimension (got {tuple(x.shape)})")


def layer_norm_costs(width):
    """What a layer norm costs the memory plan per token: it keeps its float32 input for the backward; reads and
    writes a row (elementwise)."""
    return Costs(kept=4 * width, elementwise=8 * width)


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm over the last dimension, as tile tasks: x (*, C) -> y (*, C); weight, bias (C,).

    Same constructor as torch.nn.LayerNorm (normalized_shape must name the last dimension alone; elementwise_affine
    must be True; bias=False: no bias, as nanoGPT's LayerNorm(bias=False)), plus batch_tile_size (rows per tile;
    each tile holds whole rows).
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None, *,
                 batch_tile_size=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1 or normalized_shape[0] <= 0:
            raise ValueError(f"nntile_torch.nn.LayerNorm normalizes the last dimension alone: normalized_shape must "
                             f"be one positive int (got {normalized_shape})")
        if not elementwise_affine:
            raise ValueError("nntile_torch.nn.LayerNorm needs elementwise_affine=True")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.LayerNorm keeps float32 parameters (got dtype={dtype})")
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = True
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        c = normalized_shape[0]
        self.weight = nn.Parameter(TileTensor.empty((c,), (c,), device, name="weight", persistent=True))
        if bias:
            self.bias = nn.Parameter(TileTensor.empty((c,), (c,), device, name="bias", persistent=True))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if _init.skipping():  # convert() writes the values
            return
        with torch.no_grad():
            self.weight.copy_(torch.ones(self.normalized_shape))
            if self.bias is not None:
                self.bias.copy_(torch.zeros(self.normalized_shape))

    @without_torch_function
    def forward(self, x):
        check_input(x, "LayerNorm")
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"LayerNorm expects input of shape (*, {self.normalized_shape[0]}) "
                             f"(got {tuple(x.shape)})")
        ensure_init()
        return apply_tiled(LayerNormFunction, x, self.weight, self.bias, self.eps, self.batch_tile_size)

    def plan_costs(self, precision, seq):
        return layer_norm_costs(self.normalized_shape[0])

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.materialize().clone()


class GELU(nn.Module):
    """torch.nn.GELU as tile tasks (approximate="none" or "tanh", GPT-2's form). Keeps the tiling of a TileTensor
    input; a dense input (*, N) is tiled (batch_tile_size, tile_size)."""

    def __init__(self, approximate="none", *, tile_size=None, batch_tile_size=None):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh' (got {approximate!r})")
        self.approximate = approximate
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE

    @without_torch_function
    def forward(self, x):
        check_input(x, "GELU")
        ensure_init()
        return apply_tiled(GeluFunction, x, self.approximate, self.batch_tile_size, self.tile_size)

    def plan_costs(self, precision, seq):
        return None  # elementwise, of no width of its own: the form around it says (GELU.costs_at)

    @staticmethod
    def costs_at(width):
        """What GELU over `width` features costs the memory plan per token: it keeps its float32 input, and its
        backward makes the input's gradient; reads and writes each value (elementwise)."""
        return Costs(kept=4 * width, backward=4 * width, elementwise=8 * width)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Dropout(nn.Module):
    """torch.nn.Dropout as tile tasks. In training each call draws a seed from torch's default CPU generator
    (so torch.manual_seed makes runs repeatable); the mask is a hash of (seed, element index), the same on CPU
    and GPU, for any tile sizes and any worker count, recomputed in backward rather than stored. It is not torch's mask: the
    same seed gives other elements dropped than torch.nn.Dropout would. Identity in eval mode or for p = 0."""

    def __init__(self, p=0.5, inplace=False, *, tile_size=None, batch_tile_size=None):
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)
        self.inplace = inplace  # accepted for compatibility; the result is always a new tensor
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE

    @without_torch_function
    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        check_input(x, "Dropout")
        if self.p == 1.0:
            return x * 0.0
        ensure_init()
        seed = int(torch.randint(0, 2**62, (1,)).item())
        return apply_tiled(DropoutFunction, x, self.p, seed, self.batch_tile_size, self.tile_size)

    def plan_costs(self, precision, seq):
        return Costs()  # the mask is recomputed in backward from the seed: nothing kept

    def extra_repr(self):
        return f"p={self.p}"


# torch.nn.LayerNorm, which convert() swaps for LayerNorm, described the same before the swap
register_form(lambda m: isinstance(m, nn.LayerNorm),
              lambda m, precision, seq: layer_norm_costs(m.normalized_shape[-1]))
