"""TileTensor: a torch.Tensor wrapper subclass whose storage is a grid of StarPU tiles.

nntile ops read and write the tiles without waiting. Any other torch op sees an ordinary dense tensor: the
tiles are gathered (a blocking wait, counted in stats()) into a dense copy on the tensor's device, cached until
the tiles change. In-place torch ops on a TileTensor are applied to that copy and written back to the tiles.

The tiles have the tensor's shape, except that a matrix op's operand (batch, ..., features) is tiled as its
2-d matrix (batch * ..., features); `shape` is the logical shape and `tiles.shape` the tiled one.
"""
import math

import torch
from torch.utils._pytree import tree_map

from . import _C
from .runtime import ensure_init

aten = torch.ops.aten
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TILE_DTYPES = {v: k for k, v in _DTYPES.items()}


def _full_device(device):
    """torch.device with an index for CUDA (autograd's engine needs one to pick its device queue)."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


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

    __torch_function__ = torch._C._disabled_torch_function_impl

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, tile_shape, device=None, dtype=torch.float32, name=""):
        """Uninitialised tiles (write them before reading)."""
        ensure_init()
        if dtype not in _TILE_DTYPES:
            raise TypeError(f"tile dtype must be torch.float32 or torch.bfloat16 (got {dtype})")
        return cls(_C.TileTensor(list(shape), list(tile_shape), _TILE_DTYPES[dtype], name), device=device)

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


def _copy_tiles(src):
    t = src._tiles
    new = _C.TileTensor(list(t.shape), list(t.tile_shape), t.dtype, t.name)
    _C.add(1.0, t, 0.0, new)
    return new


def _same_tiles(a, b):
    return isinstance(a, TileTensor) and isinstance(b, TileTensor) and a.shape == b.shape \
        and a._tiles.same_tiling(b._tiles) and a.dtype == torch.float32


def _detach(self):
    return _like(self, self._tiles)


def _as_tiles_of(like, other):
    """other as a TileTensor tiled like `like` (a TileTensor): itself when it already is, a copy of a dense
    tensor of the same shape (no wait: fresh tiles), else None (broadcasting, other dtypes: left to torch)."""
    if _same_tiles(like, other):
        return other
    if isinstance(other, torch.Tensor) and not isinstance(other, TileTensor) and other.shape == like.shape \
            and other.dtype == torch.float32 and like.dtype == torch.float32:
        t = like._tiles
        tiles = _C.TileTensor(list(t.shape), list(t.tile_shape), "float32", "")
        tiles.from_dense(other.detach().reshape(tuple(t.shape)))
        return _like(like, tiles)
    return None


def _add_(self, other, alpha=1):
    # Gradient accumulation lands here (a dense gradient from torch code meeting a tiled one): stays tasks.
    o = _as_tiles_of(self, other) if isinstance(self, TileTensor) else None
    if o is None:
        return NotImplemented
    _C.add(float(alpha), o._tiles, 1.0, self._tiles)
    return self


def _add(self, other, alpha=1):
    if isinstance(self, TileTensor):
        a, b = self, _as_tiles_of(self, other)
    else:
        a, b = _as_tiles_of(other, self), other
    if a is None or b is None:
        return NotImplemented
    new = _copy_tiles(a)
    _C.add(float(alpha), b._tiles, 1.0, new)
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


_HANDLERS = {
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
