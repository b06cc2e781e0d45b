"""What convert() did to a model and what still runs as dense torch code: the report (convert_report), the
strict mode and the warnings.

convert() records, per module, what it swapped, what it tiled in place and what it left dense and why. While
the model runs, any torch op that meets a TileTensor without a tile version (it materializes the tiles: a
host wait and a dense tensor the memory plan does not know) is recorded against the innermost module of the
model on the Python stack: strict=True raises there, naming module and op; the default warns once per kind of
op, with the modules' names.
"""
import sys
import warnings
import weakref

from torch import nn

_owners = weakref.WeakKeyDictionary()  # module -> (report, its name in the converted model)


class DenseFallbackError(RuntimeError):
    """A converted model (strict=True) would run a piece of itself as dense torch code."""


class ConvertReport:
    """What convert() made of a model. swapped: (name, old type, new type); tiled: (name, type, what) for modules
    kept whose parameters became tiles (their forward's functions run as tile tasks); patched: (name, type, what);
    dense: (name, type, why) for modules left as torch code with parameters or without a tile version; dense_ops:
    {(module name, op): count} of torch ops that ran on materialized tiles inside the model since conversion."""

    def __init__(self, strict):
        self.strict = strict
        self.swapped, self.tiled, self.patched, self.dense = [], [], [], []
        self.dense_ops = {}
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
    model._nntile_report = report
    for name, m in model.named_modules():
        _owners[m] = (report, name)


def convert_report(model):
    """The ConvertReport of a converted model (what was swapped, what stays dense and why, dense ops seen)."""
    report = getattr(model, "_nntile_report", None)
    if report is None:
        raise ValueError(f"{type(model).__name__} was not converted by nntile_torch.convert()")
    return report


def _innermost_module():
    """(report, name, module) of the innermost converted model's module whose code is on the stack, or None."""
    if not _owners:
        return None
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        owner = f.f_locals.get("self") if "self" in code.co_varnames or "self" in code.co_cellvars else None
        if isinstance(owner, nn.Module):
            found = _owners.get(owner)
            if found is not None:
                return found[0], found[1], owner
        f = f.f_back
    return None


def note_dense(op, why=None):
    """Records that `op` (an aten op or a description) ran as dense torch code on tiles, if inside a converted
    model; raises in strict mode, else warns once per kind of op."""
    found = _innermost_module()
    if found is None:
        return  # outside any converted model: the caller reading values (loss.item(), printing a weight)
    report, name, module = found
    kind = op if isinstance(op, str) else str(getattr(op, "__name__", op))
    what = kind if why is None else f"{kind} ({why})"
    key = (name, what)
    report.dense_ops[key] = report.dense_ops.get(key, 0) + 1
    where = f"{name or '(model)'} ({type(module).__name__})"
    if report.strict:
        raise DenseFallbackError(f"nntile_torch.convert(strict=True): {what} would run as dense torch code on "
                                 f"materialized tiles in {where}")
    if kind not in report._warned:
        report._warned.add(kind)
        warnings.warn(f"nntile_torch: {what} ran as dense torch code on materialized tiles (host waits, memory the "
                      f"tiles do not plan for) in {where}; nt.convert_report(model) lists every such op",
                      stacklevel=3)
