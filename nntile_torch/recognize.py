"""Recognizing what a module computes by running it, not by its class name: a module whose forward is a layer
norm (nn.LayerNorm, or any class holding a weight and an optional bias that calls F.layer_norm, as nanoGPT's
LayerNorm(bias=False) does), an RMSNorm (torch.nn.RMSNorm, Hugging Face's LlamaRMSNorm), or an activation that is
GELU (nn.GELU, F.gelu in a module, the tanh formula written out as Hugging Face's NewGELUActivation or nanoGPT's
new_gelu).

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
    x = torch.randn(2, c, generator=torch.Generator().manual_seed(0)).to(w.device) if not w.is_meta \
        else torch.empty(2, c, device="meta")  # a generator of its own: convert() draws nothing from torch's
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


def rmsnorm_like(m):
    """(width, eps) when m (a leaf whose only parameter is weight (C,), float32, no buffers) computes, on probe
    inputs, weight * (x * rsqrt(mean(x^2) + eps)) of its input x (..., C) to float32 rounding, as torch.nn.RMSNorm
    and Hugging Face's LlamaRMSNorm (Mistral's, Qwen2's) do; else None. eps is the module's `variance_epsilon` or
    `eps` attribute, else read off a probe of small inputs (where eps weighs); either way the probes check it. A
    module on the meta device is probed with random real weights (torch.func.functional_call)."""
    params = dict(m.named_parameters(recurse=False))
    w = params.get("weight")
    if not _leaf(m) or w is None or w.dim() != 1 or set(params) != {"weight"} or w.dtype != torch.float32 \
            or next(iter(m.buffers(recurse=False)), None) is not None:
        return None
    c = w.shape[0]
    gen = torch.Generator().manual_seed(0)
    weight = torch.rand(c, generator=gen) + 0.5
    x = torch.randn(3, c, generator=gen, dtype=torch.float64).float()
    small = x * 1e-3  # mean(x^2) ~ 1e-6: typical eps (1e-6, 1e-5) changes the result
    try:
        with torch.no_grad():
            y, y_small = (torch.func.functional_call(m, {"weight": weight}, (v,)) for v in (x, small))
    except Exception:  # a module that does not take one tensor: not an RMSNorm
        return None
    if not all(isinstance(t, torch.Tensor) and t.shape == x.shape and t.dtype == torch.float32
               for t in (y, y_small)):
        return None
    y, y_small = y.detach().cpu().double(), y_small.detach().cpu().double()
    eps = next((getattr(m, a) for a in ("variance_epsilon", "eps") if isinstance(getattr(m, a, None), float)), None)
    if eps is None and isinstance(m, nn.RMSNorm) and m.eps is None:
        eps = torch.finfo(torch.float32).eps  # torch.nn.RMSNorm's default
    if eps is None:  # y = weight * x * r, r = (mean(x^2) + eps)^-1/2: r per row by least squares, then eps
        wx = weight.double() * small.double()
        r = (y_small * wx).sum(-1) / (wx * wx).sum(-1)
        eps = float(f"{float((r.pow(-2) - small.double().pow(2).mean(-1)).mean()):.4g}")
        if not eps >= 0.0:
            return None
    for probe, out in ((x, y), (small, y_small)):
        xd = probe.double()
        ref = weight.double() * (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps))
        if (out - ref).abs().max().item() > 16 * torch.finfo(torch.float32).eps * ref.abs().max().item():
            return None
    return c, float(eps)


__all__ = ["layer_norm_like", "gelu_like", "rmsnorm_like"]
