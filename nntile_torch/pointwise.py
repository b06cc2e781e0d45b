"""Pointwise arithmetic and norms of TileTensors as tile tasks (one generic `_C.pointwise` task per tile).

What torch's own optimizers and gradient clipping compute, intercepted by the aten ops they call, not by who calls
them: torch.optim.AdamW / Adam / SGD in their for-loop form (mul_, lerp_, addcmul_, sqrt, div, add_, addcdiv_ with
scalars; the default for a TileTensor, which is not one of torch's foreach types), their foreach form (the
`_foreach_*` list ops, taken apart into those), and torch.nn.utils.clip_grad_norm_ / clip_grad_value_
(linalg_vector_norm, stack, add, reciprocal, mul, clamp on 0-dim results, then mul_ of each gradient by that 0-dim
coefficient). A 0-dim result is a TileTensor over a one-value "scalar tile" that later tasks read and broadcast, so
nothing waits; reading it (`.item()`) does, as for any TileTensor. The arithmetic is torch's CPU kernels', in the
same float operations (kernels/pointwise_impl.h), so fp32 results match torch's.

Anything else (other dtypes, strided views, dense operands, broadcasting other than a one-value operand) returns
NotImplemented, and TileTensor's dense fallback runs torch's own code, correct but waiting."""
import torch

from . import _C
from .tensor import TileTensor, add_tiles, add_tiles_, fp32_tiles, new_tiles, register_tile_op, same_tiling, tiles_like

aten = torch.ops.aten


def _ok(x):
    return isinstance(x, TileTensor) and not x.is_view and fp32_tiles(x)


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _operand(like, x):
    """x's C++ tiles when it can be an operand of a pointwise op writing `like`'s tiles (tiled the same, or one value
    of at most like's dims, broadcast), else None."""
    if not _ok(x) or x.device != like.device:
        return None
    if x.numel() == 1 and x.dim() <= like.dim():
        return x.tiles
    if same_tiling(x, like):
        return x.tiles
    return None


def _new_like(x):
    """Fresh (unwritten) float32 tiles tiled like x: a temporary, so neither named nor persistent."""
    t = x.tiles
    return tiles_like(t)


def scalar_tile(device):
    """A 0-dim float32 TileTensor over one fresh, unwritten one-value tile."""
    return TileTensor(new_tiles([1], [1]), (), device)


def _map(op, self, operands=(), s0=0.0, s1=0.0, inplace=False):
    """self (in place) or a new TileTensor like it = op(operands...); NotImplemented when an operand does not fit."""
    if not _ok(self):
        return NotImplemented
    tiles = []
    for x in operands:
        t = _operand(self, x)
        if t is None:
            return NotImplemented
        tiles.append(t)
    if inplace:
        _C.pointwise(op, self.tiles, *tiles, s0=float(s0), s1=float(s1))
        return self
    out = _new_like(self)
    _C.pointwise(op, out, *tiles, s0=float(s0), s1=float(s1))
    return TileTensor(out, self.shape, self.device)


def _scaled(other, alpha):
    """other * alpha as torch computes a Scalar operand's alpha in a float32 op: both rounded to float32 first."""
    if alpha == 1:
        return other
    return float(torch.tensor(float(other), dtype=torch.float32) * torch.tensor(float(alpha), dtype=torch.float32))


def _mul(inplace):
    def handler(self, other):
        if not isinstance(self, TileTensor):  # a dense tensor or number times a TileTensor
            if inplace:
                return NotImplemented
            self, other = other, self  # elementwise products commute, bit for bit
        if _number(other):
            return _map("scale", self, (self,), other, inplace=inplace)
        if not inplace and isinstance(other, TileTensor) and self.numel() == 1 and other.numel() > 1:
            self, other = other, self  # a one-value factor broadcast over the other
        return _map("mul", self, (self, other), inplace=inplace)
    return handler


def _div(inplace):
    def handler(self, other, rounding_mode=None):
        if rounding_mode is not None or not _number(other):
            return NotImplemented
        return _map("div_scalar", self, (self,), other, inplace=inplace)
    return handler


def _add_number(inplace):
    tiled = add_tiles_ if inplace else add_tiles

    def handler(self, other, alpha=1):
        if _number(other) and _number(alpha) and isinstance(self, TileTensor):
            return _map("add_scalar", self, (self,), _scaled(other, alpha), inplace=inplace)
        return tiled(self, other, alpha=alpha)
    return handler


def _unary(op, inplace):
    def handler(self):
        return _map(op, self, (self,), inplace=inplace)
    return handler


def _neg(inplace):
    def handler(self):
        return _map("scale", self, (self,), -1.0, inplace=inplace)  # x * -1 is -x exactly
    return handler


def _lerp(inplace):
    def handler(self, end, weight):
        if not _number(weight):
            return NotImplemented
        return _map("lerp", self, (self, end), weight, inplace=inplace)
    return handler


def _addc(op, inplace):
    def handler(self, tensor1, tensor2, value=1):
        if not _number(value):
            return NotImplemented
        return _map(op, self, (self, tensor1, tensor2), value, inplace=inplace)
    return handler


def _clamp(inplace):
    def handler(self, min=None, max=None):
        if not all(v is None or _number(v) for v in (min, max)) or (min is None and max is None):
            return NotImplemented
        lo = -float("inf") if min is None else min
        hi = float("inf") if max is None else max
        return _map("clamp", self, (self,), lo, hi, inplace=inplace)
    return handler


def _fill_(self, value):
    if isinstance(value, TileTensor) or isinstance(value, torch.Tensor):
        return NotImplemented
    return _map("fill", self, (), value, inplace=True)


def _zero_(self):
    return _map("fill", self, (), 0.0, inplace=True)


def _vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    """The p-norm of all of self into a scalar tile: a reduction task per tile accumulating into it, then one task
    for the root (the order of torch's own sum differs: equal to float32 rounding, not bitwise)."""
    if dim not in (None, [], ()) or dtype not in (None, self.dtype) or not _ok(self) or not _number(ord) or ord <= 0:
        return NotImplemented
    out = scalar_tile(self.device)
    ord = float(ord)
    if ord == float("inf"):
        _C.pointwise_reduce("maxabs", self.tiles, out.tiles)
    elif ord == 1:
        _C.pointwise_reduce("sumabs", self.tiles, out.tiles)
    elif ord == 2:
        _C.pointwise_reduce("sumsq", self.tiles, out.tiles)
        _C.pointwise("sqrt", out.tiles, out.tiles)
    else:
        _C.pointwise_reduce("sumpow", self.tiles, out.tiles, s0=ord)
        _C.pointwise("pow", out.tiles, out.tiles, s0=1.0 / ord)
    if keepdim:
        return TileTensor(out.tiles, (1,) * self.dim(), self.device)
    return out


def _stack(tensors, dim=0):
    """0-dim TileTensors (the per-gradient norms of clip_grad_norm_) into one (n,) TileTensor of one tile, by one
    task (the norm over it is then one task too, not a chain of n)."""
    if not tensors or dim not in (0, -1) or not all(_ok(t) and t.dim() == 0 for t in tensors) \
            or any(t.device != tensors[0].device for t in tensors):
        return NotImplemented
    n = len(tensors)
    out = new_tiles([n], [n])
    _C.gather_scalars([t.tiles for t in tensors], out)
    return TileTensor(out, (n,), tensors[0].device)


def _full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """Tiles tiled like x filled with fill_value (optimizer states made by torch.optim: torch.zeros_like(p),
    Adagrad's torch.full_like(p, initial_accumulator_value)); a dense tensor otherwise, without waiting for x's
    tiles. ones_like stays dense (autograd's default gradient of a tiled loss)."""
    same_device = device is None or torch.device(device) == x.device or (
        torch.device(device).type == x.device.type and torch.device(device).index is None)
    if _ok(x) and dtype in (None, x.dtype) and layout in (None, torch.strided) and _number(fill_value) \
            and same_device:
        t = x.tiles
        tiles = tiles_like(t, name=t.name and t.name + ".full", persistent=t.persistent)
        _C.pointwise("fill", tiles, s0=float(fill_value))
        return TileTensor(tiles, x.shape, x.device)
    return torch.full(tuple(x.shape), fill_value, dtype=dtype or x.dtype, device=device or x.device)


def _zeros_like(x, **kwargs):
    return _full_like(x, 0.0, **kwargs)


def _foreach(single, value_at=None, returns=True):
    """A `_foreach_*` op taken apart into `single` per element (each a tile task where it is a TileTensor, torch's
    own op on a dense tensor): list arguments are indexed, others passed to every call. value_at: the position of a
    foreach op's positional scalar that `single` takes as its keyword `value` (addcmul_, addcdiv_)."""
    def handler(*args, **kwargs):
        n = len(args[0])
        outs = []
        for i in range(n):
            a = [x[i] if isinstance(x, (list, tuple)) else x for x in args]
            kw = {k: (v[i] if isinstance(v, (list, tuple)) else v) for k, v in kwargs.items()}
            if value_at is not None and len(a) > value_at:
                kw["value"] = a.pop(value_at)
            if isinstance(kw.get("value"), torch.Tensor):
                kw["value"] = kw["value"].item()
            outs.append(single(*a, **kw))
        return outs if returns else None
    return handler


def _foreach_norm(tensors, ord=2, dtype=None):
    return [aten.linalg_vector_norm.default(t, ord, None, False, dtype=dtype) for t in tensors]


for _op, _impl in {
    aten.mul_.Tensor: _mul(True),
    aten.mul_.Scalar: _mul(True),
    aten.mul.Tensor: _mul(False),
    aten.mul.Scalar: _mul(False),
    aten.div_.Tensor: _div(True),
    aten.div_.Scalar: _div(True),
    aten.div.Tensor: _div(False),
    aten.div.Scalar: _div(False),
    aten.add_.Tensor: _add_number(True),
    aten.add_.Scalar: _add_number(True),
    aten.add.Tensor: _add_number(False),
    aten.add.Scalar: _add_number(False),
    aten.sqrt.default: _unary("sqrt", False),
    aten.sqrt_.default: _unary("sqrt", True),
    aten.reciprocal.default: _unary("reciprocal", False),
    aten.reciprocal_.default: _unary("reciprocal", True),
    aten.neg.default: _neg(False),
    aten.neg_.default: _neg(True),
    aten._foreach_neg.default: _foreach(aten.neg.default),
    aten._foreach_neg_.default: _foreach(aten.neg_.default, returns=False),
    aten.lerp_.Scalar: _lerp(True),
    aten.lerp.Scalar: _lerp(False),
    aten.addcmul_.default: _addc("addcmul", True),
    aten.addcmul.default: _addc("addcmul", False),
    aten.addcdiv_.default: _addc("addcdiv", True),
    aten.addcdiv.default: _addc("addcdiv", False),
    aten.clamp.default: _clamp(False),
    aten.clamp_.default: _clamp(True),
    aten.fill_.Scalar: _fill_,
    aten.zero_.default: _zero_,
    aten.linalg_vector_norm.default: _vector_norm,
    aten.stack.default: _stack,
    aten.zeros_like.default: _zeros_like,
    aten.full_like.default: _full_like,
    aten._foreach_norm.Scalar: _foreach_norm,
    aten._foreach_zero_.default: _foreach(aten.zero_.default, returns=False),
    aten._foreach_sqrt.default: _foreach(aten.sqrt.default),
    aten._foreach_sqrt_.default: _foreach(aten.sqrt_.default, returns=False),
    aten._foreach_reciprocal.default: _foreach(aten.reciprocal.default),
    aten._foreach_reciprocal_.default: _foreach(aten.reciprocal_.default, returns=False),
    aten._foreach_lerp_.Scalar: _foreach(aten.lerp_.Scalar, returns=False),
    aten._foreach_addcmul_.Scalar: _foreach(aten.addcmul_.default, 3, returns=False),
    aten._foreach_addcmul_.ScalarList: _foreach(aten.addcmul_.default, 3, returns=False),
    aten._foreach_addcmul_.Tensor: _foreach(aten.addcmul_.default, 3, returns=False),
    aten._foreach_addcdiv_.Scalar: _foreach(aten.addcdiv_.default, 3, returns=False),
    aten._foreach_addcdiv_.ScalarList: _foreach(aten.addcdiv_.default, 3, returns=False),
    aten._foreach_addcdiv_.Tensor: _foreach(aten.addcdiv_.default, 3, returns=False),
}.items():
    register_tile_op(_op, _impl)
for _name, _single_ in (("mul", "mul"), ("div", "div"), ("add", "add")):
    for _overload in ("Scalar", "ScalarList", "List", "Tensor"):
        for _inplace in (True, False):
            _op = getattr(aten, f"_foreach_{_name}{'_' if _inplace else ''}", None)
            _op = getattr(_op, _overload, None) if _op is not None else None
            if _op is not None:
                _single = getattr(aten, f"{_single_}{'_' if _inplace else ''}").Tensor
                register_tile_op(_op, _foreach(_single, returns=not _inplace))
