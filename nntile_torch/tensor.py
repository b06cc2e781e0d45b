"""TileTensor: a torch.Tensor wrapper subclass whose storage is a grid of StarPU tiles.

nntile ops read and write the tiles without waiting. Any other torch op sees an ordinary dense tensor: the
tiles are gathered (a blocking wait, counted in stats()) into a dense copy on the tensor's device, cached until
the tiles change. In-place torch ops on a TileTensor are applied to that copy and written back to the tiles.

The tiles have the tensor's shape, except that a matrix op's operand (batch, ..., features) is tiled as its
2-d matrix (batch * ..., features); `shape` is the logical shape and `tiles.shape` the tiled one.
"""
import copy
import functools
import math

import torch
from torch.utils._pytree import tree_map

from . import _C
from .runtime import ensure_init

aten = torch.ops.aten
_disabled_torch_function = torch._C._disabled_torch_function_impl
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
_TILE_DTYPES = {v: k for k, v in _DTYPES.items()}


# torch functions that run as tile tasks when a TileTensor is among their arguments: {function: implementation,
# which returns NotImplemented to decline}. The modules that implement them register here (functional.py:
# F.cross_entropy), so that this module imports none of them: they import it.
_TILE_FUNCTIONS = {}


def register_tile_function(func, impl):
    """Calls of `func` (a torch function) with a TileTensor argument go to `impl` first."""
    _TILE_FUNCTIONS[func] = impl


def _full_device(device):
    """torch.device with an index for CUDA (autograd's engine needs one to pick its device queue)."""
    if type(device) is torch.device and (device.index is not None or device.type != "cuda"):
        return device  # the common case (every new TileTensor asks), without building a new torch.device
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def without_torch_function(fn):
    """fn with TileTensor.__torch_function__ skipped while it runs: every .shape, .dim(), .grad, ... of a TileTensor
    then takes torch's C path (~0.5 us here) instead of a call into Python (~5 us; a GPT-2 XL step made ~7.6k of
    them, in nntile's own modules, Functions and optimizer). For nntile's own code only: it never needs what
    __torch_function__ intercepts (F.cross_entropy on tiled logits), and __torch_dispatch__ still runs."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch._C.DisableTorchFunctionSubclass():
            return fn(*args, **kwargs)
    return run


class TileTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, tiles, shape=None, device=None, requires_grad=False):
        shape = tuple(tiles.shape if shape is None else shape)
        if math.prod(shape) != math.prod(tiles.shape):
            raise ValueError(f"shape {shape} does not hold the {math.prod(tiles.shape)} elements of tiles of "
                             f"shape {tuple(tiles.shape)}")
        r = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=_DTYPES[tiles.dtype],
                                                device=_full_device(device), requires_grad=requires_grad)
        r._tiles = tiles
        r._dense_cache = None
        return r

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Registered functions (F.cross_entropy on tiled logits) become tile tasks; they would otherwise
        # materialize their input. Everything else (every .shape, .dtype, ... too: ~12k calls per GPT-2 step)
        # goes straight to __torch_dispatch__ by torch's own C path.
        impl = _TILE_FUNCTIONS.get(func)
        if impl is not None:
            out = impl(*args, **(kwargs or {}))
            if out is not NotImplemented:
                return out
        return _disabled_torch_function(func, types, args, kwargs or {})

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, tile_shape, device=None, dtype=torch.float32, name="", persistent=False):
        """Uninitialised tiles (write them before reading). persistent: a tensor that lives as long as the model
        (parameters, optimizer states), which may get home buffers in host RAM (NNTILE_HOST_HOMES)."""
        ensure_init()
        if dtype not in _TILE_DTYPES:
            raise TypeError(f"tile dtype must be torch.float32 or torch.bfloat16 (got {dtype})")
        return cls(_C.TileTensor(list(shape), list(tile_shape), _TILE_DTYPES[dtype], name, persistent), device=device)

    @classmethod
    def from_dense(cls, tensor, tile_shape, tiled_shape=None):
        """Copies `tensor` into new tiles of `tile_shape` (tiled as `tiled_shape`, default its own shape)."""
        ensure_init()
        tiled_shape = tuple(tensor.shape if tiled_shape is None else tiled_shape)
        t = _C.TileTensor(list(tiled_shape), list(tile_shape), _TILE_DTYPES.get(tensor.dtype, "float32"), "")
        t.from_dense(tensor.detach().reshape(tiled_shape))
        return cls(t, tensor.shape, tensor.device)

    # --- access -------------------------------------------------------------------------------------------
    @property
    def tiles(self):
        """The C++ tiled tensor (shape, tile_shape, grid, ...)."""
        return self._tiles

    def materialize(self):
        """Dense copy on this tensor's device (waits for the tasks writing the tiles). Do not modify it."""
        ensure_init()
        version = self._tiles.version
        if self._dense_cache is None or self._dense_cache[0] != version:
            dense = self._tiles.to_dense(self.device).reshape(self.shape)
            self._dense_cache = (version, dense)
        return self._dense_cache[1]

    def _write(self, dense):
        ensure_init()
        self._tiles.from_dense(dense.reshape(tuple(self._tiles.shape)))

    def __deepcopy__(self, memo):
        """New tiles with the same values (a copy task per tile, no wait); requires_grad, the parameter flag and
        the gradient are copied too, as torch does (copy.deepcopy of a converted model works)."""
        if id(self) in memo:
            return memo[id(self)]
        ensure_init()
        t = self._tiles
        if t.dtype == "float32":
            tiles = _copy_tiles(self)
        else:
            tiles = _empty_tiles_like(t)
            tiles.from_dense(self.materialize().reshape(tuple(t.shape)))
        new = TileTensor(tiles, self.shape, self.device, requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    def __repr__(self, *, tensor_contents=None):
        t = self._tiles
        return (f"TileTensor(shape={tuple(self.shape)}, tiles={tuple(t.tile_shape)} x {tuple(t.grid)}, "
                f"device={self.device}, dtype={self.dtype})\n{self.materialize()!r}")

    # --- dispatch -----------------------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ensure_init()
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return _dense_fallback(func, args, kwargs)


def _like(src, tiles, device=None):
    return TileTensor(tiles, src.shape, device or src.device)


def _empty_tiles_like(t):
    """New, unwritten C++ tiles with t's shape, tiling, dtype, name and persistence."""
    return _C.TileTensor(list(t.shape), list(t.tile_shape), t.dtype, t.name, t.persistent)


def _copy_tiles(src):
    new = _empty_tiles_like(src._tiles)
    _C.add(1.0, src._tiles, 0.0, new)
    return new


def _same_tiles(a, b):
    return isinstance(a, TileTensor) and isinstance(b, TileTensor) and a.shape == b.shape \
        and a._tiles.same_tiling(b._tiles) and a.dtype == torch.float32


def _detach(self):
    return _like(self, self._tiles)


def _as_tiles_of(like, other):
    """other as a TileTensor tiled like `like` (a TileTensor): itself when it already is, a copy of a dense
    tensor that broadcasts to its shape (no wait: fresh tiles), else None (left to torch)."""
    if _same_tiles(like, other):
        return other
    if isinstance(other, torch.Tensor) and not isinstance(other, TileTensor) and other.dtype == torch.float32 \
            and like.dtype == torch.float32 and other.device == like.device:
        try:
            if torch.broadcast_shapes(other.shape, like.shape) != like.shape:
                return None
        except RuntimeError:
            return None
        t = like._tiles
        tiles = _C.TileTensor(list(t.shape), list(t.tile_shape), "float32", "")
        tiles.from_dense(other.detach().expand(like.shape).reshape(tuple(t.shape)))
        return _like(like, tiles)
    return None


def _add_(self, other, alpha=1):
    # Gradient accumulation lands here (a dense gradient from torch code meeting a tiled one): stays tasks.
    o = _as_tiles_of(self, other) if isinstance(self, TileTensor) else None
    if o is None:
        return NotImplemented
    _C.add(float(alpha), o._tiles, 1.0, self._tiles)
    return self


def _block_operand(big, small):
    """The (r, C) tiles of `small` when it broadcasts over `big`'s leading dimensions in a way add_blocks and
    sum_blocks cover (big's row tiles hold whole blocks of r rows, same column tiles); else None."""
    if not (isinstance(big, TileTensor) and isinstance(small, TileTensor)) or big.device != small.device \
            or big.dtype != torch.float32 or small.dtype != torch.float32:
        return None
    ss = tuple(small.shape)
    while len(ss) > 1 and ss[0] == 1:
        ss = ss[1:]
    bs = tuple(big.shape)
    if len(ss) == 0 or len(ss) > len(bs) or bs[len(bs) - len(ss):] != ss or ss == bs:
        return None
    r, c = math.prod(ss[:-1]), ss[-1]
    bt, st = big.tiles, small.tiles
    if list(bt.shape) != [math.prod(bs[:-1]), c] or list(st.shape) != [r, c] or st.grid[0] != 1 \
            or st.tile_shape[1] != bt.tile_shape[1] or bt.tile_shape[0] % r:
        return None
    return st


def _add(self, other, alpha=1):
    if alpha == 1:  # a tiled operand broadcast over the other's leading dims (GPT-2's position embedding)
        for big, small in ((self, other), (other, self)):
            st = _block_operand(big, small)
            if st is not None:
                new = _copy_tiles(big)
                _C.add_blocks(st, new)
                return _like(big, new)
    if isinstance(self, TileTensor):
        a, b = self, _as_tiles_of(self, other)
    else:
        a, b = _as_tiles_of(other, self), other
    if a is None or b is None:
        return NotImplemented
    new = _empty_tiles_like(a._tiles)
    _C.add_into(1.0, a._tiles, float(alpha), b._tiles, new)  # one task per tile (a copy and an add took two)
    return _like(a, new)


def _copy_(self, src, non_blocking=False):
    if not isinstance(self, TileTensor):
        return NotImplemented
    if _same_tiles(self, src):
        _C.add(1.0, src._tiles, 0.0, self._tiles)
    else:
        dense = src.materialize() if isinstance(src, TileTensor) else src
        self._write(dense.expand(self.shape))
    return self


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # A device move of a float32 TileTensor copies tiles (tasks, no wait); StarPU decides where they live.
    if dtype not in (None, self.dtype) or layout not in (None, torch.strided) or self.dtype != torch.float32:
        return NotImplemented
    return _like(self, _copy_tiles(self), torch.device(device) if device is not None else self.device)


def _clone(self, memory_format=None):
    if self.dtype != torch.float32:
        return NotImplemented
    return _like(self, _copy_tiles(self))


def _slice(self, dim=0, start=None, end=None, step=1):
    # A slice that keeps everything (Hugging Face slices hidden states before the LM head this way).
    size = self.shape[dim]
    if step == 1 and start in (None, 0) and (end is None or end >= size):
        return _like(self, self._tiles)
    return NotImplemented


def _view(self, size):
    # Views that keep the last dimension keep the tiling valid (tiles hold the row-major matrix
    # (prod(leading), last)): an alias with another logical shape, sharing the tiles as a view shares storage.
    size = list(size)
    if -1 in size:
        known = math.prod(v for v in size if v != -1)
        size[size.index(-1)] = self.numel() // known if known else 0
    if math.prod(size) != self.numel() or not size or size[-1] != self.shape[-1]:
        return NotImplemented
    return TileTensor(self._tiles, size, self.device)


def _sum(self, dim=None, keepdim=False, dtype=None):
    """Sums over leading dimensions (autograd's reduction for a broadcast add) as block-sum tasks."""
    if dtype is not None or dim is None or self.dtype != torch.float32:
        return NotImplemented
    nd = self.dim()
    dims = sorted(d % nd for d in (dim if isinstance(dim, (list, tuple)) else [dim]))
    k = len(dims)
    shape = tuple(self.shape)
    if k == 0 or dims != list(range(k)) or k > nd - 1:
        return NotImplemented
    r, c = math.prod(shape[k:-1]), shape[-1]
    t = self.tiles
    if list(t.shape) != [math.prod(shape[:-1]), c] or t.tile_shape[0] % r:
        return NotImplemented
    dst = _C.TileTensor([r, c], [r, t.tile_shape[1]], "float32", "")
    _C.sum_blocks(t, dst)
    return TileTensor(dst, (1,) * k + shape[k:] if keepdim else shape[k:], self.device)


def _factory_like(fill):
    """ones_like & co. need no values: a dense result, without waiting for the tiles (autograd's default
    gradient of a tiled loss is ones_like(loss))."""
    def handler(x, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        value = args[0] if fill is None else fill
        return torch.full(tuple(x.shape), value, dtype=dtype or x.dtype, device=device or x.device)
    return handler


_HANDLERS = {
    aten.sum.dim_IntList: _sum,
    aten.ones_like.default: _factory_like(1),
    aten.zeros_like.default: _factory_like(0),
    aten.full_like.default: _factory_like(None),
    aten.slice.Tensor: _slice,
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.detach.default: _detach,
    aten.alias.default: _detach,
    aten.add_.Tensor: _add_,
    aten.add.Tensor: _add,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten.clone.default: _clone,
}


def _dense_fallback(func, args, kwargs):
    """Runs `func` on dense copies; TileTensors that `func` writes get the result written back."""
    mutated = set()
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            mutated.add(i if not a.kwarg_only else a.name)
    back = {}  # id(dense copy) -> TileTensor it stands for, for arguments func writes

    def unwrap(key):
        def f(x):
            if not isinstance(x, TileTensor):
                return x
            if key in mutated:
                d = x.materialize().clone()
                back[id(d)] = (d, x)
                return d
            return x.materialize()
        return f

    dargs = [tree_map(unwrap(i), a) for i, a in enumerate(args)]
    dkwargs = {k: tree_map(unwrap(k), v) for k, v in kwargs.items()}
    out = func(*dargs, **dkwargs)
    for d, t in back.values():
        t._write(d)

    def rewrap(x):
        if isinstance(x, torch.Tensor) and id(x) in back:
            return back[id(x)][1]
        return x
    return tree_map(rewrap, out)
