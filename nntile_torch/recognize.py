"""Recognizing what a module computes by running it, not by its class name: a module whose forward is a layer
norm (nn.LayerNorm, or any class holding a weight and an optional bias that calls F.layer_norm, as nanoGPT's
LayerNorm(bias=False) does), or an activation that is GELU (nn.GELU, F.gelu in a module, the tanh formula
written out as Hugging Face's NewGELUActivation or nanoGPT's new_gelu).

Each probe runs the module once on a small input before anything is converted (under no_grad; on the meta
device for modules whose parameters are there), so any code that computes the same thing is recognized."""
import inspect

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

F = torch.nn.functional
_LAYER_NORMS = (F.layer_norm, torch.layer_norm)
_LN_SIGNATURE = inspect.signature(lambda input, normalized_shape, weight=None, bias=None, eps=1e-5,
                                  cudnn_enable=True: None)


class _Calls(TorchFunctionMode):
    """Records the layer norms called while it is active, with their results."""

    def __init__(self):
        super().__init__()
        self.layer_norms = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _LAYER_NORMS:
            self.layer_norms.append((_LN_SIGNATURE.bind(*args, **(kwargs or {})).arguments, out))
        return out


def _leaf(m):
    return next(iter(m.children()), None) is None


def layer_norm_like(m):
    """(width, eps, has_bias) when m's forward returns F.layer_norm(input, (C,), m.weight, m.bias or None, eps) of
    its input, with no parameters other than weight (C,) and bias (C,); else None."""
    params = dict(m.named_parameters(recurse=False))
    w = params.get("weight")
    if not _leaf(m) or w is None or w.dim() != 1 or set(params) - {"weight", "bias"} \
            or w.dtype != torch.float32 or next(iter(m.buffers(recurse=False)), None) is not None:
        return None
    b = params.get("bias")
    if b is not None and tuple(b.shape) != tuple(w.shape):
        return None
    c = w.shape[0]
    x = torch.randn(2, c, device=w.device) if not w.is_meta else torch.empty(2, c, device="meta")
    calls = _Calls()
    try:
        with torch.no_grad(), calls:
            y = m(x)
    except Exception:  # a module that does not take one tensor: not a layer norm
        return None
    if len(calls.layer_norms) != 1:
        return None
    a, out = calls.layer_norms[0]
    shape = a["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if y is not out or a["input"] is not x or shape != (c,) or a["weight"] is not w or a.get("bias") is not b:
        return None
    return c, float(a.get("eps", 1e-5)), b is not None


def gelu_like(m):
    """"tanh" or "none" when m (no parameters, buffers or children) computes GELU, tanh approximation or erf
    form, on a probe input to float32 rounding; else None."""
    if not _leaf(m) or next(iter(m.parameters(recurse=False)), None) is not None \
            or next(iter(m.buffers(recurse=False)), None) is not None or isinstance(m, (nn.Identity, nn.Dropout)):
        return None
    x = torch.linspace(-6.0, 6.0, 241).reshape(1, 241)
    try:
        with torch.no_grad():
            y = m(x.clone())
    except Exception:
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != torch.float32:
        return None
    for approximate in ("tanh", "none"):
        ref = F.gelu(x.double(), approximate=approximate)
        if (y.double() - ref).abs().max().item() <= 8 * torch.finfo(torch.float32).eps * 6.0:
            return approximate
    return None


__all__ = ["layer_norm_like", "gelu_like"]
