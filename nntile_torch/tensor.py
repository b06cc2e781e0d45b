"""TileTensor: a torch.Tensor wrapper subclass whose storage is a grid of StarPU tiles.

nntile ops read and write the tiles without waiting. Any other torch op sees an ordinary dense tensor: the
tiles are gathered (a blocking wait, counted in stats()) into a dense copy on the tensor's device, cached until
the tiles change. In-place torch ops on a TileTensor are applied to that copy and written back to the tiles.

The tiles have the tensor's shape, except that a matrix op's operand (batch, ..., features) is tiled as its
2-d matrix (batch * ..., features); `shape` is the logical shape and `tiles.shape` the tiled one: the values are
the tiles' row-major elements in order, as a contiguous tensor's are its storage's.

Views (split, view, transpose, select, slice, expand, ...) of a TileTensor are TileTensors over the same tiles with
their own strides and offset into those row-major elements, as a strided view of a dense tensor is: no copy, no
wait. nntile ops read a view's tiles directly where the view is a pattern they know (the q, k, v of an attention
split from one matrix); anything else materializes it like any TileTensor. An in-place write to a view goes
through to the tiles (read, modify, write back: correct, with waits), so a view and its base never disagree.
"""
import copy
import functools
import math

import torch
from torch.utils._pytree import tree_map

from . import _C
from .owners import PENDING
from .pending import flush, flush_all, fusable_with_residual, fuse_residual
from .runtime import ensure_init

aten = torch.ops.aten
_disabled_torch_function = torch._C._disabled_torch_function_impl
# The C++ tiles name their element type by a string; everything in Python speaks torch dtypes, and these two maps
# (through tiles_dtype_name and dtype_of) are the one place they meet.
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
_TILE_DTYPES = {v: k for k, v in _DTYPES.items()}
# torch functions on TileTensors that become tile tasks (functional.py fills it in): the function people call
# (F.layer_norm, F.gelu, F.scaled_dot_product_attention, ...) decides, not the class of the module calling it.
FUNCTIONS = {}


def contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def plain(x):
    """Whether x is a TileTensor whose values are its tiles' elements in order (not a strided view of them): the
    form nntile ops read directly."""
    return isinstance(x, TileTensor) and x._view is None


def register_tile_function(func, impl):
    """Calls of `func` (a torch function) with a TileTensor argument go to `impl` first (FUNCTIONS; the modules that
    implement them register there, so that this module imports none of them: they import it)."""
    FUNCTIONS[func] = impl


def register_tile_op(op, impl):
    """Calls of the aten overload `op` (aten.add_.Tensor, aten._fused_adam_.default, ...) on TileTensors go to
    `impl` first (__torch_dispatch__); it returns NotImplemented for what it does not cover, which then runs on
    dense copies. Like register_tile_function, registered by the module that implements it (pointwise.py,
    optim/torch_optim.py), so that this module imports none of them."""
    _HANDLERS[op] = impl


# --- the C++ tiles, with torch dtypes at the seam ---------------------------------------------------------------
def tiles_dtype_name(dtype):
    """The C++ tiles' name of a torch dtype (torch.float32 -> "float32"): the one conversion."""
    try:
        return _TILE_DTYPES[dtype]
    except KeyError:
        raise TypeError(f"tiles hold torch.float32, torch.bfloat16 or torch.int64 (got {dtype})") from None


def dtype_of(tiles):
    """The torch dtype of the elements C++ `tiles` (or a TileTensor's tiles) hold: torch.bfloat16 for a bf16 master
    weight's tiles, whose TileTensor is float32."""
    if isinstance(tiles, TileTensor):
        tiles = tiles._raw
    return _DTYPES[tiles.dtype]


def new_tiles(shape, tile_shape, dtype=torch.float32, name="", persistent=False, logical_dtype=None):
    """New, unwritten C++ tiles (write them before reading) of `shape` in tiles of `tile_shape` (edge tiles may be
    partial) holding `dtype`. name: what StarPU's traces and nt._C.live_tile_tensors() call them; persistent: they
    live as long as the model (parameters, optimizer states) and may get home buffers in host RAM; logical_dtype:
    the dtype a TileTensor over them has (torch.float32 over bf16 tiles: a bf16 master weight)."""
    t = _C.TileTensor(list(shape), list(tile_shape), tiles_dtype_name(dtype), name, persistent)
    if logical_dtype is not None:
        t.logical_dtype = tiles_dtype_name(logical_dtype)
    return t


def tiles_like(like, dtype=torch.float32, name="", persistent=False):
    """New, unwritten C++ tiles with the shape and tiling of `like` (C++ tiles or a TileTensor's)."""
    if isinstance(like, TileTensor):
        like = like._raw
    return new_tiles(like.shape, like.tile_shape, dtype, name, persistent)


def same_tiling(a, b):
    """Whether TileTensors a and b have the same shape over tiles of the same shape, tiling and dtype."""
    return a.shape == b.shape and a._tiles.same_tiling(b._tiles)


_CPU = torch.device("cpu")


def _full_device(device):
    """torch.device with an index for CUDA (autograd's engine needs one to pick its device queue)."""
    if type(device) is torch.device and (device.index is not None or device.type != "cuda"):
        return device  # the common case (every new TileTensor asks), without building a new torch.device
    if device is None or device == "cpu":
        return _CPU  # building torch.device("cpu") anew took 4 us, a twelfth of a decoded token's TileTensor
    device = torch.device(device)
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
    # Made by a bf16 layer (nn.Linear with precision="bf16": it sets this), and so are the views of it: attention on
    # it (F.scaled_dot_product_attention) computes in bf16 too.
    made_in_bf16 = False

    @staticmethod
    def __new__(cls, tiles, shape=None, device=None, requires_grad=False, view=None):
        """view: None (the values are the tiles' elements in order), or (strides, offset) into those elements."""
        if shape is None:
            shape = tuple(tiles.shape)
        else:
            shape = tuple(shape)
            if view is None and math.prod(shape) != math.prod(tiles.shape):
                raise ValueError(f"shape {shape} does not hold the {math.prod(tiles.shape)} elements of tiles of "
                                 f"shape {tuple(tiles.shape)}")
        dtype = _DTYPES[getattr(tiles, "logical_dtype", None) or tiles.dtype]
        if view is None:
            r = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=_full_device(device),
                                                    requires_grad=requires_grad)
        else:
            r = torch.Tensor._make_wrapper_subclass(cls, shape, strides=tuple(view[0]), storage_offset=int(view[1]),
                                                    dtype=dtype, device=_full_device(device),
                                                    requires_grad=requires_grad)
        r._raw = tiles  # read through _tiles / tiles, which flush a pending producer first
        r._view = None if view is None else (tuple(view[0]), int(view[1]))
        r._dense_cache = None
        return r

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Functions that become tile tasks on TileTensors (F.cross_entropy on tiled logits, F.layer_norm,
        # F.gelu, F.dropout, F.scaled_dot_product_attention, ...: FUNCTIONS); each returns NotImplemented for
        # what it does not cover, which then runs as torch code (recorded: convert_report, strict mode).
        # Everything else (every .shape, .dtype, ... too: ~12k calls per GPT-2 step) takes torch's own C path.
        tiled = FUNCTIONS.get(func)
        if tiled is not None:
            out = tiled(*args, **(kwargs or {}))
            if out is not NotImplemented:
                return out
        return _disabled_torch_function(func, types, args, kwargs or {})

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, tile_shape, device=None, dtype=torch.float32, name="", persistent=False):
        """Uninitialised tiles (write them before reading). persistent: a tensor that lives as long as the model
        (parameters, optimizer states), which may get home buffers in host RAM (NNTILE_HOST_HOMES)."""
        ensure_init()
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"tile dtype must be torch.float32 or torch.bfloat16 (got {dtype})")
        return cls(new_tiles(shape, tile_shape, dtype, name, persistent), device=device)

    @classmethod
    def from_dense(cls, tensor, tile_shape, tiled_shape=None):
        """Copies `tensor` into new tiles of `tile_shape` (tiled as `tiled_shape`, default its own shape)."""
        ensure_init()
        tiled_shape = tuple(tensor.shape if tiled_shape is None else tiled_shape)
        t = new_tiles(tiled_shape, tile_shape, tensor.dtype if tensor.dtype in _TILE_DTYPES else torch.float32)
        t.from_dense(tensor.detach().reshape(tiled_shape))
        return cls(t, tensor.shape, tensor.device)

    # --- access -------------------------------------------------------------------------------------------
    @property
    def _tiles(self):
        """The C++ tiled tensor, its values submitted: the one accessor that hands tiles on (to C++ ops, to
        materialize), so a pending producer (docs/fusion.md, pending.py) is flushed before anything reads them.
        _raw: the same tiles without the flush, for what reads only their shape (views, dtypes)."""
        raw = self._raw
        if PENDING.data and raw in PENDING:  # .data: the dict's C truth test (~10k reads a step)
            flush(raw)
        return raw

    tiles = _tiles  # one property call, not two

    @property
    def tiles_unflushed(self):
        """The C++ tiled tensor without flushing its pending producer (docs/fusion.md): for the one consumer that
        fuses with the producer (pending.fuse_bf16), which submits it itself. Anything else reads `tiles`."""
        return self._raw

    @property
    def tiles_dtype(self):
        """The torch dtype the tiles hold (torch.bfloat16 under a bf16 master weight, whose dtype is float32)."""
        return _DTYPES[self._raw.dtype]

    @property
    def is_view(self):
        """Whether this is a strided view of its tiles' elements (not them in order: see plain())."""
        return self._view is not None

    new_tiles = staticmethod(new_tiles)

    def replace_tiles(self, tiles):
        """Puts other C++ tiles of the same values under this tensor (a bf16 master weight's: ParamState); the
        cached dense copy goes with the old ones."""
        self._raw = tiles
        self._dense_cache = None

    def materialize(self):
        """Dense copy on this tensor's device (waits for the tasks writing the tiles), cached until the tiles
        change. It is a copy: writing to it does not change the tiles (write to the TileTensor itself), and the
        next materialize() raises if it was written, rather than hand out values the tiles do not hold."""
        ensure_init()
        flush_all()  # a host wait: nothing stays pending across it (docs/fusion.md)
        version = self._tiles.version
        cache = self._dense_cache
        if cache is not None and cache[0] == version:
            if cache[1]._version != cache[2]:
                raise RuntimeError("the dense copy of a TileTensor (from materialize()) was written in place; it does "
                                   "not write to the tiles, which still hold the old values: write to the TileTensor "
                                   "itself (t.copy_(...), t[...] = ...), which writes through")
            return cache[1]
        dense = self._tiles.to_dense(self.device)
        if dense.dtype != self.dtype:  # bf16 tiles of a float32 tensor (a bf16 master weight)
            dense = dense.to(self.dtype)
        if self._view is None:
            dense = dense.reshape(self.shape)
        else:
            dense = dense.reshape(-1).as_strided(self.shape, *self._view)
        self._dense_cache = (version, dense, dense._version)
        return dense

    def _write(self, dense):
        """Writes `dense` (this tensor's shape) into the tiles; a view writes its own elements through to them."""
        ensure_init()
        if self._view is None:
            self._tiles.from_dense(dense.reshape(tuple(self._tiles.shape)))
            return
        base = self._tiles.to_dense(self.device).reshape(-1)
        base.as_strided(self.shape, *self._view).copy_(dense)
        self._tiles.from_dense(base.reshape(tuple(self._tiles.shape)))

    def __deepcopy__(self, memo):
        """New tiles with the same values (a copy task per tile, no wait); requires_grad, the parameter flag and
        the gradient are copied too, as torch does (copy.deepcopy of a converted model works)."""
        if id(self) in memo:
            return memo[id(self)]
        ensure_init()
        t = self._tiles
        if self._view is not None:
            n = self.numel()  # a view: a plain copy of its own values
            new = TileTensor.from_dense(self.materialize().contiguous(), [min(n, 1 << 20)], (n,))
            memo[id(self)] = new
            return new
        if dtype_of(t) == torch.float32:
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
        view = "" if self._view is None else f", view of strides {self._view[0]} at offset {self._view[1]}"
        return (f"TileTensor(shape={tuple(self.shape)}, tiles={tuple(t.tile_shape)} x {tuple(t.grid)}{view}, "
                f"device={self.device}, dtype={self.dtype})\n{self.materialize()!r}")

    # --- dispatch -----------------------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ensure_init()
        handler = _HANDLERS.get(func)
        if handler is None and _is_view_op(func):
            handler = functools.partial(_view_op, func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return dense_fallback(func, args, kwargs)


def _like(src, tiles, device=None):
    return TileTensor(tiles, src.shape, device or src.device)


def _empty_tiles_like(t):
    """New, unwritten C++ tiles with t's shape, tiling, dtype, name, persistence and logical dtype."""
    logical = getattr(t, "logical_dtype", None)
    return new_tiles(t.shape, t.tile_shape, dtype_of(t), t.name, t.persistent,
                     _DTYPES[logical] if logical else None)


def fp32_tiles(x):
    """Whether x's tiles hold float32 (what the tile ops on whole tensors here compute on; a float32 TileTensor over
    bf16 tiles, a bf16 master weight, goes through dense torch code instead)."""
    return dtype_of(x) == torch.float32


def _copy_tiles(src):
    new = _empty_tiles_like(src._tiles)
    _C.add(1.0, src._tiles, 0.0, new)
    return new


def _same_tiles(a, b):
    return plain(a) and plain(b) and a.shape == b.shape and a._tiles.same_tiling(b._tiles) and fp32_tiles(a)


def _detach(self):
    if self._view is not None:
        return TileTensor(self._raw, self.shape, self.device, view=self._view)
    return _like(self, self._raw)


def _as_tiles_of(like, other):
    """other as a TileTensor tiled like `like` (a TileTensor): itself when it already is, a copy of a dense
    tensor that broadcasts to its shape (no wait: fresh tiles), else None (left to torch)."""
    if _same_tiles(like, other):
        return other
    if plain(like) and isinstance(other, torch.Tensor) and not isinstance(other, TileTensor) \
            and other.dtype == torch.float32 and fp32_tiles(like) and other.device == like.device:
        try:
            if torch.broadcast_shapes(other.shape, like.shape) != like.shape:
                return None
        except RuntimeError:
            return None
        t = like._tiles
        tiles = tiles_like(t)
        tiles.from_dense(other.detach().expand(like.shape).reshape(tuple(t.shape)))
        return _like(like, tiles)
    return None


def add_tiles_(self, other, alpha=1):
    # Gradient accumulation lands here (a dense gradient from torch code meeting a tiled one): stays tasks.
    o = _as_tiles_of(self, other) if plain(self) else None
    if o is None:
        return NotImplemented
    _C.add(float(alpha), o._tiles, 1.0, self._tiles)
    return self


def _mul_scalar(self, other):
    # A tensor times a Python number: autograd's backward of add(..., alpha=a) and of x * a, a loss scaled by
    # 1 / accumulation steps. One task per tile, dst = other * src.
    if not isinstance(self, TileTensor) or not plain(self) or not fp32_tiles(self) \
            or isinstance(other, bool) or not isinstance(other, (int, float)):
        return NotImplemented
    t = self._tiles
    new = tiles_like(t, dtype_of(t))
    _C.add(float(other), t, 0.0, new)
    return _like(self, new)


def _mul(self, other):
    # x * 3 in Python code reaches here as mul.Tensor with the number itself, or as a 0-d CPU tensor (reading it
    # is no wait)
    if isinstance(self, TileTensor) and not isinstance(other, TileTensor):
        x, s = self, other
    elif isinstance(other, TileTensor) and not isinstance(self, TileTensor):
        x, s = other, self
    else:
        return NotImplemented
    if isinstance(s, torch.Tensor):
        if s.dim() != 0 or s.device.type != "cpu" or s.requires_grad or s.dtype.is_complex or s.dtype == torch.bool:
            return NotImplemented
        s = s.item()
    return _mul_scalar(x, s)


def _block_operand(big, small):
    """The (r, C) tiles of `small` when it broadcasts over `big`'s leading dimensions in a way add_blocks and
    sum_blocks cover (big's row tiles hold whole blocks of r rows, same column tiles); else None."""
    if not (plain(big) and plain(small)) or big.device != small.device \
            or not fp32_tiles(big) or not fp32_tiles(small):
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


def _fused_residual(a, b):
    """a + b written by the pending GEMM of a Linear's output among them, reading the other as the residual
    (docs/fusion.md, pair 3), or None: both float32 TileTensors of one shape, tiling and device."""
    if not (plain(a) and plain(b)) or a.device != b.device or a.shape != b.shape:
        return None
    for y, residual in ((a, b), (b, a)):
        yt, rt = y._raw, residual._raw
        if yt is rt or dtype_of(yt) != torch.float32 or dtype_of(rt) != torch.float32 \
                or list(yt.shape) != list(rt.shape) or list(yt.tile_shape) != list(rt.tile_shape):
            continue
        if fusable_with_residual(yt):  # before reading the other's tiles, which may be a pending GEMM's too
            return _like(y, fuse_residual(yt, residual._tiles, lambda: _empty_tiles_like(rt)))
    return None


def add_tiles(self, other, alpha=1):
    if alpha == 1 and PENDING.data and isinstance(self, TileTensor) and isinstance(other, TileTensor):
        fused = _fused_residual(self, other)
        if fused is not None:
            return fused
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
        return NotImplemented  # a dense destination: torch code reads the source
    if _same_tiles(self, src):
        _C.add(1.0, src._tiles, 0.0, self._tiles)
    else:
        dense = src.materialize() if isinstance(src, TileTensor) else src
        self._write(dense.expand(self.shape))
    return self


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # A device move of a float32 TileTensor copies tiles (tasks, no wait); StarPU decides where they live.
    if dtype not in (None, self.dtype) or layout not in (None, torch.strided) or not fp32_tiles(self) \
            or not plain(self):
        return NotImplemented
    return _like(self, _copy_tiles(self), torch.device(device) if device is not None else self.device)


def _clone(self, memory_format=None):
    if not fp32_tiles(self) or not plain(self):
        return NotImplemented
    return _like(self, _copy_tiles(self))


def _view(self, size):
    # Any shape with the same elements in the same order: an alias of the same tiles, as a view of a contiguous
    # tensor shares its storage (the values are the tiles' row-major elements whatever the logical shape).
    if not plain(self):
        return _view_op(aten.view.default, self, size)
    size = list(size)
    if -1 in size:
        known = math.prod(v for v in size if v != -1)
        size[size.index(-1)] = self.numel() // known if known else 0
    if math.prod(size) != self.numel():
        return NotImplemented
    return TileTensor(self._raw, size, self.device)


_VIEW_OPS = {}


def _is_view_op(func):
    """Whether func returns views of its first argument (view, split, transpose, select, slice, expand, ...)."""
    known = _VIEW_OPS.get(func)
    if known is None:
        s = func._schema
        first = s.arguments[0].alias_info if s.arguments else None
        known = (first is not None and not first.is_write and bool(s.returns)
                 and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns))
        _VIEW_OPS[func] = known
    return known


def _view_arg(shape, strides, offset, numel):
    """TileTensor's view= for that geometry over `numel` elements: None where it is all of them in order."""
    if offset == 0 and math.prod(shape) == numel \
            and all(st == c for n, st, c in zip(shape, strides, contiguous_strides(shape)) if n != 1):
        return None
    return tuple(strides), offset


def view_of(tiles, shape, strides, offset, device):
    """A TileTensor over `tiles` with that geometry: a plain one when it is the tiles' elements in order."""
    shape = tuple(shape)
    return TileTensor(tiles, shape, device, view=_view_arg(shape, strides, offset, math.prod(tiles.shape)))


def _frozen(a):
    """a with its lists turned into tuples, at any depth (hashable where its other items are); TypeError where an
    item is a tensor (narrow's start: hashed by identity, its value could change)."""
    return tuple(_frozen(v) if type(v) in (list, tuple) else _no_tensor(v) for v in a)


def _no_tensor(v):
    if isinstance(v, torch.Tensor):
        raise TypeError("a tensor argument")
    return v


# (view op, x's geometry, the op's other arguments) -> the results' geometries, or None where the op is no view of
# these strides. A step asks the same few dozen questions every layer (nanoGPT's attention: a split, three views and
# four transposes forward, as many backward); running each on a meta tensor was half a view's cost
# (docs/measurements.md, "View ops' geometry").
_VIEW_GEOMETRY = {}
_VIEW_GEOMETRY_MAX = 4096


def _view_geometry(func, x, args, kwargs):
    """What func(x, *args, **kwargs) gives on a tensor of x's geometry: ("one" | list | tuple, [(shape, view= of
    TileTensor)]), or None where it is not a view (torch's own rules, run on a meta tensor; cached per geometry)."""
    numel, shape, strides, offset = math.prod(x._raw.shape), tuple(x.shape), x.stride(), x.storage_offset()
    try:
        key = (func, shape, strides, offset, numel, x.dtype, _frozen(args),
               _frozen(sorted(kwargs.items())) if kwargs else ())
        hash(key)
    except TypeError:
        key = None  # an argument that is not hashable: asked every time
    if key is not None:
        known = _VIEW_GEOMETRY.get(key, False)
        if known is not False:
            return known
    base = torch.empty(numel, dtype=x.dtype, device="meta")
    try:
        out = func(base.as_strided(shape, strides, offset), *args, **kwargs)
    except RuntimeError:
        got = None  # not a view of these strides: the dense path does what torch does (or raises)
    else:
        many = isinstance(out, (list, tuple))
        rs = list(out) if many else [out]
        got = None
        if all(isinstance(r, torch.Tensor) and r.dtype == x.dtype for r in rs):
            shapes = [tuple(r.shape) for r in rs]
            got = (type(out) if many else "one",
                   [(sh, _view_arg(sh, r.stride(), r.storage_offset(), numel)) for sh, r in zip(shapes, rs)])
    if key is not None:
        if len(_VIEW_GEOMETRY) >= _VIEW_GEOMETRY_MAX:
            _VIEW_GEOMETRY.clear()
        _VIEW_GEOMETRY[key] = got
    return got


@without_torch_function
def _view_op(func, *args, **kwargs):
    # The op's results' strides and offsets, from torch's own rules and errors (a view that cannot be one raises as
    # it does on dense tensors): _view_geometry.
    x = args[0]
    if not isinstance(x, TileTensor) or any(isinstance(a, TileTensor) for a in args[1:]):
        return NotImplemented
    got = _view_geometry(func, x, args[1:], kwargs)
    if got is None:
        return NotImplemented
    kind, geometries = got
    raw, device, bf16 = x._raw, x.device, x.made_in_bf16
    views = []
    for shape, view in geometries:
        v = TileTensor(raw, shape, device, view=view)
        if bf16:
            v.made_in_bf16 = True
        views.append(v)
    return views[0] if kind == "one" else kind(views)


def _cat(tensors, dim=0):
    # Pieces that are adjacent views of the same tiles and together are all of them in order: the tiles
    # themselves (autograd's backward of a split: the q, k, v gradients of an attention back into one matrix).
    if not tensors or not all(isinstance(t, TileTensor) for t in tensors):
        return NotImplemented
    tiles = tensors[0]._tiles
    nd = tensors[0].dim()
    dim %= nd
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    strides = contiguous_strides(shape)
    offset = 0
    for t in tensors:
        if t._tiles is not tiles or t.dim() != nd or t.storage_offset() != offset or any(
                t.shape[d] != shape[d] for d in range(nd) if d != dim) or any(
                t.stride(d) != strides[d] for d in range(nd) if t.shape[d] != 1):
            return NotImplemented
        offset += t.shape[dim] * strides[dim]
    # Each piece has the concatenation's contiguous strides and starts where the one before it ends along dim: its
    # elements sit where the concatenation's are; together they are all the tiles' elements.
    if math.prod(shape) != math.prod(tiles.shape):
        return NotImplemented
    return TileTensor(tiles, shape, tensors[0].device)


def _sum(self, dim=None, keepdim=False, dtype=None):
    """Sums over leading dimensions (autograd's reduction for a broadcast add) as block-sum tasks."""
    if dtype is not None or dim is None or not fp32_tiles(self) or not plain(self):
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
    dst = new_tiles([r, c], [r, t.tile_shape[1]])
    _C.sum_blocks(t, dst)
    return TileTensor(dst, (1,) * k + shape[k:] if keepdim else shape[k:], self.device)


def _factory_like(fill):
    """ones_like & co. need no values: a dense result, without waiting for the tiles (autograd's default
    gradient of a tiled loss is ones_like(loss)). zeros_like gives zero-filled tiles instead (pointwise.py: the
    optimizer states torch.optim makes with it)."""
    def handler(x, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        value = args[0] if fill is None else fill
        return torch.full(tuple(x.shape), value, dtype=dtype or x.dtype, device=device or x.device)
    return handler


_HANDLERS = {
    aten.sum.dim_IntList: _sum,
    aten.ones_like.default: _factory_like(1),
    aten.full_like.default: _factory_like(None),
    aten.view.default: _view,
    aten.cat.default: _cat,
    aten._unsafe_view.default: _view,
    aten.detach.default: _detach,
    aten.alias.default: _detach,
    aten.add_.Tensor: add_tiles_,
    aten.add.Tensor: add_tiles,
    aten.mul.Scalar: _mul_scalar,
    aten.mul.Tensor: _mul,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten.clone.default: _clone,
}


def dense_fallback(func, args, kwargs):
    """Runs `func` on dense copies; TileTensors that `func` writes get the result written back. Inside a converted
    model's forward this is recorded (convert_report), warned about, or raised in strict mode (report.note_dense)."""
    from .report import note_dense
    note_dense(func)
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
