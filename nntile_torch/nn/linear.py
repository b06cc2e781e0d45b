"""nntile_torch.nn.Linear: a drop-in for torch.nn.Linear whose parameters are tiles and whose forward and
backward are tile tasks."""
import math

import torch
from torch import nn

from .. import config
from ..costs import Costs, matmul_input_bytes, register_form
from ..functional import LinearFunction, apply_tiled
from ..runtime import ensure_init
from ..tensor import TileTensor, without_torch_function
from . import _init


def linear_costs(in_features, out_features, precision):
    """What a matmul layer costs the memory plan per token: it keeps its input (the bf16 copy in bf16 mode) for the
    weight's gradient; 2 x in x out forward FLOPs; its weight is read by a matmul (bias: not)."""
    return Costs(kept=matmul_input_bytes(precision) * in_features, matmul_flops=2 * in_features * out_features,
                 matmul_weights=("weight",))


class Linear(nn.Module):
    _w_in_out = False  # weight stored (out_features, in_features), as torch.nn.Linear
    """y = x @ weight.T + bias, like torch.nn.Linear.

    Args as torch.nn.Linear (in_features, out_features, bias, device, dtype; only float32 parameters), plus
    tile_size: edge of weight tiles in elements (default config.DEFAULT_TILE_SIZE),
    batch_tile_size: rows of x (all leading dims flattened) per activation tile,
    precision: "fp32" (exact), "tf32", or "bf16" (bf16 inputs, fp32 accumulation); weights stay fp32.
    Shapes: x (*, in_features) -> y (*, out_features); weight (out_features, in_features); bias (out_features,).
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, tile_size=None,
                 batch_tile_size=None, precision="fp32"):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int (got {v!r})")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.Linear keeps float32 parameters (got dtype={dtype}); "
                            "use precision='bf16' or 'tf32' for reduced-precision matmuls")
        self.in_features = in_features
        self.out_features = out_features
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        self.precision = config.check_precision(precision)
        t = self.tile_size
        self.weight = nn.Parameter(TileTensor.empty((out_features, in_features), (t, t), device, name="weight",
                                                    persistent=True))
        if bias:
            self.bias = nn.Parameter(TileTensor.empty((out_features,), (t,), device, name="bias",
                                                      persistent=True))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        # Same draws, in the same order, as torch.nn.Linear: equal seeds give equal weights.
        if _init.skipping():  # convert() writes the values
            return
        w = torch.empty(self.out_features, self.in_features)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        with torch.no_grad():
            self.weight.copy_(w)
            if self.bias is not None:
                bound = 1 / math.sqrt(self.in_features)
                self.bias.copy_(torch.empty(self.out_features).uniform_(-bound, bound))

    @without_torch_function
    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Linear expects a torch.Tensor (got {type(x).__name__})")
        if not x.is_floating_point():
            raise TypeError(f"Linear expects a floating-point input (got dtype {x.dtype})")
        if x.dtype != torch.float32:
            raise TypeError(f"Linear expects float32 input like its weight (got {x.dtype}); the matmul precision is "
                            f"set by precision= (this layer: {self.precision!r})")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects input of shape (*, {self.in_features}) (got {tuple(x.shape)})")
        if x.numel() == 0:
            raise ValueError(f"Linear got an empty input of shape {tuple(x.shape)}")
        ensure_init()
        y = apply_tiled(LinearFunction, x, self.weight, self.bias, self.batch_tile_size, self.precision, self._w_in_out)
        if self.precision == "bf16":
            y.made_in_bf16 = True  # attention on this output (F.scaled_dot_product_attention) computes in bf16 too
        return y

    def plan_costs(self, precision, seq):
        return linear_costs(self.in_features, self.out_features, precision)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"tile_size={self.tile_size}, precision={self.precision!r}")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # Ordinary tensors under torch.nn.Linear's keys, so a state_dict loads into either module.
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.materialize().clone()


class Conv1D(Linear):
    """Drop-in for Hugging Face's transformers Conv1D (GPT-2's projections): y = x @ weight + bias with
    weight (nx, nf) = (in, out), i.e. the transpose of nn.Linear's layout; bias (nf,). Constructor
    Conv1D(nf, nx) as in transformers, plus the tile/precision keywords of Linear.
    """
    _w_in_out = True

    def __init__(self, nf, nx, device=None, dtype=None, *, tile_size=None, batch_tile_size=None, precision="fp32"):
        nn.Module.__init__(self)
        for name, v in (("nf", nf), ("nx", nx)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int (got {v!r})")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.Conv1D keeps float32 parameters (got dtype={dtype})")
        self.nf, self.nx = nf, nx
        self.in_features, self.out_features = nx, nf
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        self.precision = config.check_precision(precision)
        t = self.tile_size
        self.weight = nn.Parameter(TileTensor.empty((nx, nf), (t, t), device, name="weight", persistent=True))
        self.bias = nn.Parameter(TileTensor.empty((nf,), (t,), device, name="bias", persistent=True))
        self.reset_parameters()

    def reset_parameters(self):
        # As transformers' Conv1D: weight ~ N(0, 0.02), bias 0.
        if _init.skipping():  # convert() writes the values
            return
        w = torch.empty(self.nx, self.nf)
        nn.init.normal_(w, std=0.02)
        with torch.no_grad():
            self.weight.copy_(w)
            self.bias.copy_(torch.zeros(self.nf))

    def extra_repr(self):
        return f"nf={self.nf}, nx={self.nx}, tile_size={self.tile_size}, precision={self.precision!r}"


def _weight_2d(m):
    w = getattr(m, "weight", None)
    return w is not None and w.dim() == 2


# The modules convert() swaps for these, described the same before the swap (a plan is made on the model as built):
# torch.nn.Linear (weight (out, in)), transformers' Conv1D (weight (in, out)), and other classes named Linear.
register_form(lambda m: type(m).__name__ == "Linear" and _weight_2d(m),
              lambda m, precision, seq: linear_costs(m.weight.shape[1], m.weight.shape[0], precision))
register_form(lambda m: type(m).__name__ == "Conv1D" and _weight_2d(m),
              lambda m, precision, seq: linear_costs(m.weight.shape[0], m.weight.shape[1], precision))
register_form(lambda m: isinstance(m, nn.Linear),
              lambda m, precision, seq: linear_costs(m.in_features, m.out_features, precision))
