"""Self-attention written as torch code around F.scaled_dot_product_attention, as nanoGPT's CausalSelfAttention is:
qkv = c_attn(x), split into q, k, v and heads by views and transposes, causal attention, the heads side by side again,
then c_proj and dropouts. On tiles each of those ~11 view ops goes through torch's dispatcher and autograd on the
submitting thread (docs/inside_gpu.md), though the only tasks are the projections' and the attention's.

Recognized by what it computes, on a probe before conversion (a CPU copy with random weights, one per module class
and configuration; torch's random state untouched): a module with no parameters of its own whose children are two
nn.Linear (C -> 3C and C -> C) and any nn.Dropout, which, in training and in evaluation, calls the first Linear on its
input, then the second, then its Dropouts each on the one before's output, returns the last, makes one causal
F.scaled_dot_product_attention call without a mask, and whose output equals the reference written out here (the same
attention on qkv's thirds and heads, with the probability and scale of its own call, from the same random state).
convert() then binds a forward that submits the attention directly (CausalAttentionFunction: the kernel, seed and
dropout of the tiled F.scaled_dot_product_attention, whose tasks the module's own code made) and calls the children
as the module did, their hooks included; an input it does not cover runs the module's own code. The dropout
probabilities and scale are the probe's: a module that changes them after convert() is not followed."""
import copy
import math
import types

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..functional import CausalAttentionFunction, apply_tiled, attention_tiles_ok, dropout_seed
from ..tensor import plain, without_torch_function
from .linear import Linear

F = torch.nn.functional
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
_FORMS = {}  # probe key (sdpa_attention_form) -> the _Form found, or None


class _Form:
    """What the probe showed: the children's names, the heads, the attention's scale and its dropout probability in
    training and in evaluation."""

    def __init__(self, qkv, proj, dropouts, heads, width, scale, dropout_p):
        self.qkv, self.proj, self.dropouts = qkv, proj, dropouts
        self.heads, self.width, self.scale, self.dropout_p = heads, width, scale, dropout_p

    @without_torch_function
    def run(self, module, x):
        """The module's computation on tiles x, or None (nothing submitted) for an input it does not cover."""
        if not plain(x) or x.dim() != 3 or x.shape[-1] != self.width \
                or not isinstance(getattr(module, self.qkv, None), Linear):
            return None
        b, t, _ = x.shape
        p = self.dropout_p[module.training]
        qkv = getattr(module, self.qkv)(x)
        if attention_tiles_ok(qkv) and tuple(qkv.shape) == (b, t, 3 * self.width):
            y = apply_tiled(CausalAttentionFunction, qkv, self.heads, self.scale,
                            bool(getattr(qkv, "made_in_bf16", False)), None, p, dropout_seed() if p > 0.0 else 0)
        else:  # other tiles (a sequence longer than a row tile): the same computation as torch code (dense)
            y = self._attention(qkv, p)
        return self._after(module, y)

    def reference(self, module, x):
        """What the form computes, written out in torch on dense x (the probe's reference)."""
        return self._after(module, self._attention(getattr(module, self.qkv)(x), self.dropout_p[module.training]))

    def _attention(self, qkv, p):
        """Causal attention over qkv (B, T, 3C) split into thirds and heads, as torch code: (B, T, C)."""
        b, t, _ = qkv.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in qkv.split(self.width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=self.scale)
        return y.transpose(1, 2).reshape(b, t, self.width)

    def _after(self, module, y):
        """The projection of y, then the Dropouts."""
        out = getattr(module, self.proj)(y)
        for name in self.dropouts:
            out = getattr(module, name)(out)
        return out


class _Calls(TorchFunctionMode):
    """The F.scaled_dot_product_attention calls made while it is active, their arguments by name."""

    def __init__(self):
        super().__init__()
        self.sdpa = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.sdpa.append(dict(_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **(kwargs or {})))
        return func(*args, **(kwargs or {}))


def sdpa_attention_form(m):
    """The _Form of a dense module that computes this attention, else None (module docstring)."""
    if next(iter(m.parameters(recurse=False)), None) is not None or "forward" in vars(m):
        return None  # own parameters, or a forward set on the instance (someone's wrapper, a second convert)
    children = dict(m.named_children())
    linears = [n for n, c in children.items() if type(c) is nn.Linear]
    if len(linears) != 2 or any(type(c) not in (nn.Linear, nn.Dropout) for c in children.values()):
        return None
    shapes = {n: tuple(children[n].weight.shape) for n in linears}  # (out, in)
    qkv = [n for n in linears if shapes[n][0] == 3 * shapes[n][1]]
    if len(qkv) != 1:
        return None
    proj = [n for n in linears if n != qkv[0]][0]
    c = shapes[qkv[0]][1]
    if shapes[proj] != (c, c):
        return None
    settings = tuple(sorted((k, v) for k, v in vars(m).items() if isinstance(v, (bool, int, float, str, type(None)))
                            and k != "training"))
    key = (type(m), tuple((n, type(ch), getattr(ch, "weight", None) is not None and tuple(ch.weight.shape),
                           getattr(ch, "bias", None) is not None, getattr(ch, "p", None))
                          for n, ch in children.items()), settings)
    if key not in _FORMS:
        _FORMS[key] = _probe(m, qkv[0], proj, c)
    return _FORMS[key]


def _probe(m, qkv, proj, c):
    """Runs a CPU copy of m with random weights in training and in evaluation: its _Form, or None."""
    try:
        probe = copy.deepcopy(m)
        probe = probe.to_empty(device="cpu") if any(p.is_meta for p in probe.parameters()) else probe.to("cpu")
    except Exception:  # a module that cannot be copied: not recognized
        return None
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in probe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    x = torch.randn(2, 5, c, generator=gen)
    found = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for training in (True, False):
            probe.train(training)
            got = _run_watched(probe, x)
            if got is None:
                return None
            out, calls, sdpa = got
            names = [n for n, _, _ in calls]
            if len(sdpa) != 1 or names[:2] != [qkv, proj] or len(calls[0][1]) != 1 or calls[0][1][0] is not x:
                return None
            last = calls[1][2]
            for name, args, y in calls[2:]:
                if type(getattr(probe, name)) is not nn.Dropout or len(args) != 1 or args[0] is not last:
                    return None
                last = y
            a = sdpa[0]
            q = a["query"]
            if out is not last or a["attn_mask"] is not None or not a["is_causal"] or a["enable_gqa"] \
                    or q.dim() != 4 or tuple(q.shape[::2]) != (2, 5) or q.shape[1] * q.shape[3] != c:
                return None
            scale = 1.0 / math.sqrt(q.shape[3]) if a["scale"] is None else float(a["scale"])
            found[training] = (names[2:], q.shape[1], scale, float(a["dropout_p"]), out)
        (drops, heads, scale, p_train, _), (drops_eval, heads_eval, scale_eval, p_eval, _) = found[True], found[False]
        if (drops, heads, scale) != (drops_eval, heads_eval, scale_eval):
            return None
        form = _Form(qkv, proj, drops, heads, c, scale, {True: p_train, False: p_eval})
        for training in (True, False):  # the reference from the random state the module's own call started from
            probe.train(training)
            torch.default_generator.manual_seed(1)
            ref = form.reference(probe, x)
            if not torch.allclose(found[training][4], ref, rtol=1e-5, atol=1e-6):
                return None
    return form


def _run_watched(probe, x):
    """probe(x) from a fixed random state: (output, its children's calls (name, args, output) in order, the
    attention calls), or None when it raises."""
    names = {id(ch): n for n, ch in probe.named_children()}
    calls, handles = [], []
    for ch in probe.children():
        handles.append(ch.register_forward_hook(lambda mod, args, out: calls.append((names[id(mod)], args, out))))
    watch = _Calls()
    try:
        torch.default_generator.manual_seed(1)
        with watch:
            out = probe(x)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    return out, calls, watch.sdpa


class _FormForward:
    """The forward convert() binds (types.MethodType; it holds no reference to the module): the form on tiles it
    covers, else the module's own forward."""

    def __init__(self, original, form):
        self.original, self.form = original, form

    def __call__(self, module, *args, **kwargs):
        if len(args) == 1 and not kwargs:
            out = self.form.run(module, args[0])
            if out is not None:
                return out
        return self.original(module, *args, **kwargs)


def patch_sdpa_attention(m, form):
    """Binds the form's forward to m (found dense by sdpa_attention_form, its Linears converted since)."""
    m.forward = types.MethodType(_FormForward(type(m).forward, form), m)
