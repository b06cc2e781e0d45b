"""What convert() did to a model and what still runs as dense torch code: the report (convert_report), the
strict mode and the warnings.

convert() records, per module, what it swapped, what it tiled in place and what it left dense and why. While
the model runs, any torch op that meets a TileTensor without a tile version (it materializes the tiles: a
host wait and a dense tensor the memory plan does not know) is recorded against the innermost module of the
model on the Python stack: strict=True raises there, naming module and op; the default warns once per kind of
op, with the modules' names. The backward pass runs from autograd's engine, with no module of the model on the
stack: there an op is the model's when its graph task (one backward call) went through the model's outputs, and is
recorded against "(backward)" with the autograd node that ran it (AddBackward0, ...).
"""
import sys
import warnings
import weakref

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .owners import module_record
from .pending import at_forward_end

_owners = weakref.WeakKeyDictionary()  # module -> (report, its name in the converted model)
# graph task id of a backward call -> the report of the converted model whose outputs it went through; the newest
# few only (a graph task ends with its backward call, and its id is never reused)
_backward_owners = {}
_MAX_BACKWARD_OWNERS = 64


class DenseFallbackError(RuntimeError):
    """A converted model (strict=True) would run a piece of itself as dense torch code."""


class ConvertReport:
    """What convert() made of a model. swapped: (name, old type, new type); tiled: (name, type, what) for modules
    kept whose parameters became tiles (their forward's functions run as tile tasks); patched: (name, type, what);
    dense: (name, type, why) for modules left as torch code with parameters or without a tile version; dense_ops:
    {(module name, op): count} of torch ops that ran on materialized tiles inside the model's forward or backward
    since conversion; outside_ops: the same for the model's own methods outside any module call (generate()'s
    sampling on the logits it read: the caller's code in the model's class, which strict mode lets run)."""

    def __init__(self, strict):
        self.strict = strict
        self.swapped, self.tiled, self.patched, self.dense = [], [], [], []
        self.dense_ops, self.outside_ops = {}, {}
        self._warned = set()

    def __str__(self):
        lines = [f"nntile_torch.convert: {len(self.swapped)} modules swapped, {len(self.tiled)} tiled in place, "
                 f"{len(self.patched)} patched, {len(self.dense)} left dense, "
                 f"{sum(self.dense_ops.values())} dense op calls seen"]
        for title, rows in (("swapped", self.swapped), ("tiled in place", self.tiled), ("patched", self.patched),
                            ("dense", self.dense)):
            if rows:
                lines.append(f"{title}:")
                lines += [f"  {r[0] or '(model)'}: {' -> '.join(r[1:])}" for r in rows]
        if self.dense_ops:
            lines.append("dense ops seen while running:")
            lines += [f"  {m or '(model)'}: {op} x{n}" for (m, op), n in self.dense_ops.items()]
        if self.outside_ops:
            lines.append("torch code on the model's outputs in its own methods, outside forward (not a fallback):")
            lines += [f"  {m}: {op} x{n}" for (m, op), n in self.outside_ops.items()]
        return "\n".join(lines)

    __repr__ = __str__

    @property
    def all_tiled(self):
        """Whether nothing of the model is known to run dense (no module left dense, no dense op seen)."""
        return not self.dense and not self.dense_ops

    def check(self):
        """Raises DenseFallbackError naming what stays dense (strict mode calls it in convert())."""
        if self.dense:
            names = "; ".join(f"{n or '(model)'} ({t}: {why})" for n, t, why in self.dense)
            raise DenseFallbackError(f"nntile_torch.convert(strict=True): these modules would run as dense torch code: "
                                     f"{names}")


def register(model, report):
    record = module_record(model)
    record.report = report
    for name, m in model.named_modules():
        _owners[m] = (report, name)
    if not record.backward_marked:  # convert() of a converted model: one hook
        model.register_forward_hook(_mark_backward)
        model.register_forward_hook(at_forward_end)  # nothing stays pending past the forward (docs/fusion.md)
        record.backward_marked = True


def _mark_backward(model, args, output):
    """Hooks the converted model's outputs: the backward call that reaches them (their gradient is computed before
    any of the model's own backward nodes runs) belongs to the model from there on."""
    record = module_record(model, create=False)
    report = record.report if record is not None else None
    if report is None or not torch.is_grad_enabled():
        return
    ref = weakref.ref(report)
    for t in tree_flatten(output)[0]:
        if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
            t.register_hook(lambda grad, ref=ref: _enter_backward(ref))


def _enter_backward(ref):
    gid = torch._C._current_graph_task_id()
    if gid < 0 or gid in _backward_owners:
        return
    while len(_backward_owners) >= _MAX_BACKWARD_OWNERS:
        _backward_owners.pop(next(iter(_backward_owners)))
    _backward_owners[gid] = ref


def convert_report(model):
    """The ConvertReport of a converted model (what was swapped, what stays dense and why, dense ops seen)."""
    record = module_record(model, create=False)
    report = record.report if record is not None else None
    if report is None:
        raise ValueError(f"{type(model).__name__} was not converted by nntile_torch.convert()")
    return report


_CALLS = frozenset({"forward", "_call_impl", "_wrapped_call_impl", "__call__"})


def _innermost_module():
    """(report, name, module, method) of the innermost converted model's module whose code is on the stack, or None.
    method is None inside a module call (a forward, anything it calls included), else the name of the model's own
    method that runs outside every module call (generate(), nanoGPT's or Hugging Face's)."""
    if not _owners:
        return None
    f, found = sys._getframe(2), None
    while f is not None:
        code = f.f_code
        owner = f.f_locals.get("self") if "self" in code.co_varnames or "self" in code.co_cellvars else None
        if isinstance(owner, nn.Module):
            entry = _owners.get(owner)
            if entry is not None:
                if found is None:
                    found = (entry[0], entry[1], owner)
                if code.co_name in _CALLS:
                    return (*found, None)
                method = code.co_name
        f = f.f_back
    return None if found is None else (*found, method)


def _backward_owner():
    """(report, autograd node name) when this runs inside the backward of a converted model, else None."""
    if not _backward_owners:
        return None
    ref = _backward_owners.get(torch._C._current_graph_task_id())
    report = ref() if ref is not None else None
    if report is None:
        return None
    node = torch._C._current_autograd_node()
    return report, (node.name() if node is not None else "autograd")


def note_dense(op, why=None):
    """Records that `op` (an aten op or a description) ran as dense torch code on tiles, if inside a converted
    model; raises in strict mode, else warns once per kind of op."""
    kind = op if isinstance(op, str) else str(getattr(op, "__name__", op))
    what = kind if why is None else f"{kind} ({why})"
    found = _innermost_module()
    if found is not None and found[3] is not None:  # the model's own method, outside forward: the caller's code
        report, method = found[0], f"{type(found[2]).__name__}.{found[3]}"
        report.outside_ops[(method, what)] = report.outside_ops.get((method, what), 0) + 1
        return
    if found is not None:
        report, name, module, _ = found
        where = f"{name or '(model)'} ({type(module).__name__})"
    else:
        found = _backward_owner()
        if found is None:
            return  # outside any converted model: the caller reading values (loss.item(), printing a weight)
        report, node = found
        name, what = "(backward)", f"{what} in {node}"
        where = "the model's backward"
    key = (name, what)
    report.dense_ops[key] = report.dense_ops.get(key, 0) + 1
    if report.strict:
        raise DenseFallbackError(f"nntile_torch.convert(strict=True): {what} would run as dense torch code on "
                                 f"materialized tiles in {where}")
    if kind not in report._warned:
        report._warned.add(kind)
        warnings.warn(f"nntile_torch: {what} ran as dense torch code on materialized tiles (host waits, memory the "
                      f"tiles do not plan for) in {where}; nt.convert_report(model) lists every such op",
                      stacklevel=3)
