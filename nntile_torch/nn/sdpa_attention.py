"""Self-attention written as torch code around F.scaled_dot_product_attention, as nanoGPT's CausalSelfAttention is:
qkv = c_attn(x), split into q, k, v and heads by views and transposes, causal attention, the heads side by side again,
then c_proj and dropouts. On tiles each of those ~11 view ops goes through torch's dispatcher and autograd on the
submitting thread (docs/inside_gpu.md), though the only tasks are the projections' and the attention's.

convert() gives every module shaped for it (no parameters of its own; its children two converted Linears and any
converted Dropouts) a watched forward. The first call in each mode (training or not, grad mode or not) runs the
module's own code and watches what it does on tiles. It is this form only when
- every torch call it made on TileTensors outside its children was a view (split, view, transpose, ...) or
  F.scaled_dot_product_attention taken as tile tasks (no mask, causal);
- the first Linear read the module's input, and the attention read that Linear's output split into thirds and heads
  (the tiled attention checks the views' strides);
- the second Linear read the attention's output as (B, T, C) over the same tiles;
- the module returned the second Linear's output after its Dropouts, each applied to the one before.
Later calls in that mode submit the same tasks directly (CausalAttentionFunction: the kernel, seed and dropout of the
tiled F.scaled_dot_product_attention) and call the children as the module did, their hooks included. A first call
that is anything else keeps the module's own code for that mode. The dropout probability and scale are the ones the
first call passed: a module that changes them later in the same mode is not followed."""
import math
import types

import torch

from ..functional import CausalAttentionFunction, apply_tiled, attention_tiles_ok, dropout_seed
from ..tensor import WATCHES, TileTensor, contiguous_strides, plain, without_torch_function
from .linear import Linear
from .norm_act import Dropout

F = torch.nn.functional
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
# torch calls that only look at a tensor or view it: what the module may call on tiles besides the attention
_LAYOUT = frozenset([getattr(torch.Tensor, n) for n in (
    "split", "chunk", "view", "reshape", "transpose", "permute", "contiguous", "size", "dim", "unflatten", "flatten",
    "is_contiguous", "stride", "storage_offset")] + [getattr(torch.Tensor, n).__get__ for n in (
        "shape", "ndim", "dtype", "device", "requires_grad", "is_cuda")] + [
    torch.split, torch.chunk, torch.transpose, torch.reshape, torch.permute, torch.flatten])


def shaped_for_it(m):
    """Whether m may be this form: no parameters of its own, two converted Linears among its children, the other
    children converted Dropouts; its forward not patched already (Hugging Face's GPT-2 attention, a second convert)."""
    if next(iter(m.parameters(recurse=False)), None) is not None:
        return False
    if isinstance(getattr(m.forward, "__func__", None), _WatchedForward) or "forward" in vars(m):
        return False
    children = list(m.children())
    linears = [c for c in children if isinstance(c, Linear)]
    return len(linears) == 2 and all(isinstance(c, (Linear, Dropout)) for c in children)


def watch_sdpa_attention(m):
    """Gives m (shaped_for_it) the watched forward."""
    m.forward = types.MethodType(_WatchedForward(type(m).forward), m)


class _WatchedForward:
    """The forward convert() binds (types.MethodType; it holds no reference to the module): per mode, None until the
    first call, then the form found (_Form) or False (the module's own code)."""

    def __init__(self, original):
        self.original = original
        self.modes = {}

    def __call__(self, module, *args, **kwargs):
        mode = (module.training, torch.is_grad_enabled())
        form = self.modes.get(mode)
        if form and len(args) == 1 and not kwargs:
            out = form.run(module, args[0])
            if out is not None:
                return out
        if form is not None or len(args) != 1 or kwargs or not plain(args[0]) or args[0].dim() != 3:
            return self.original(module, *args, **kwargs)
        out, self.modes[mode] = _watched_call(module, self.original, args[0])
        return out


class _Form:
    """What the first call showed: the children's names, the heads, the attention's scale and dropout."""

    def __init__(self, qkv, proj, dropouts, heads, width, scale, dropout_p):
        self.qkv, self.proj, self.dropouts = qkv, proj, dropouts
        self.heads, self.width, self.scale, self.dropout_p = heads, width, scale, dropout_p

    @without_torch_function
    def run(self, module, x):
        """The module's computation on x, or None (without submitting anything) when x is not what it was."""
        if not plain(x) or x.dim() != 3 or x.shape[-1] != self.width:
            return None
        b, t, _ = x.shape
        qkv = getattr(module, self.qkv)(x)
        if attention_tiles_ok(qkv) and tuple(qkv.shape) == (b, t, 3 * self.width):
            y = apply_tiled(CausalAttentionFunction, qkv, self.heads, self.scale,
                            bool(getattr(qkv, "made_in_bf16", False)), None, self.dropout_p,
                            dropout_seed() if self.dropout_p > 0.0 else 0)
        else:  # other tiles (a sequence longer than a row tile): the module's computation as torch code (dense)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in qkv.split(self.width, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p, is_causal=True, scale=self.scale)
            y = y.transpose(1, 2).reshape(b, t, self.width)
        out = getattr(module, self.proj)(y)
        for name in self.dropouts:
            out = getattr(module, name)(out)
        return out


class _Watch:
    """The torch calls on TileTensors made outside the module's children (func, args, kwargs, out, taken as tile
    tasks), and the children's calls in order (name, args, output)."""

    def __init__(self):
        self.calls, self.children, self.depth = [], [], 0

    def __call__(self, func, args, kwargs, out, tiled):
        if self.depth == 0:
            self.calls.append((func, args, kwargs or {}, out, tiled))


def _watched_call(module, original, x):
    """(the module's own output on x, its _Form or False)."""
    watch, handles = _Watch(), []
    names = {id(c): n for n, c in module.named_children()}

    def enter(child, args):
        watch.depth += 1

    def leave(child, args, out):
        watch.depth -= 1
        watch.children.append((names[id(child)], args, out))

    for child in module.children():
        handles += [child.register_forward_pre_hook(enter), child.register_forward_hook(leave)]
    WATCHES.append(watch)
    try:
        out = original(module, x)
    finally:
        WATCHES.pop()
        for h in handles:
            h.remove()
    return out, _form(module, watch, x, out) or False


def _form(module, watch, x, out):
    """The _Form of one watched call, or None."""
    if len(watch.children) < 2:
        return None
    (qkv_name, qkv_args, qkv), (proj_name, proj_args, proj) = watch.children[:2]
    if not (isinstance(getattr(module, qkv_name), Linear) and isinstance(getattr(module, proj_name), Linear)) \
            or len(qkv_args) != 1 or qkv_args[0] is not x or len(proj_args) != 1 or not plain(qkv):
        return None
    last = proj
    for name, args, y in watch.children[2:]:
        if not isinstance(getattr(module, name), Dropout) or len(args) != 1 or args[0] is not last:
            return None
        last = y
    if out is not last:
        return None
    sdpa = [c for c in watch.calls if c[0] is F.scaled_dot_product_attention]
    if len(sdpa) != 1 or not sdpa[0][4] or any(c[0] not in _LAYOUT for c in watch.calls if c not in sdpa):
        return None
    _, args, kwargs, y, _ = sdpa[0]
    a = dict(_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs)
    q = a["query"]
    if a["attn_mask"] is not None or not a["is_causal"] or a["enable_gqa"] or q._raw is not qkv._raw:
        return None
    b, h, t, d = q.shape
    if tuple(qkv.shape) != (b, t, 3 * h * d):
        return None
    p = proj_args[0]  # the attention's output as (B, T, C): the same tiles in their own order
    if not isinstance(p, TileTensor) or p._raw is not y._raw or tuple(p.shape) != (b, t, h * d) \
            or (p._view is not None and p._view != (tuple(contiguous_strides((b, t, h * d))), 0)):
        return None
    scale = 1.0 / math.sqrt(d) if a["scale"] is None else float(a["scale"])
    dropouts = [name for name, _, _ in watch.children[2:]]
    return _Form(qkv_name, proj_name, dropouts, h, h * d, scale, float(a["dropout_p"]))
