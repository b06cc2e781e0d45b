"""ParamState: the one owner of a parameter's placement and state (docs/DESIGN.md, "Parameter state").

Each parameter of a converted model has one, reached by `nt.param_state(p)` (made on first use and kept on the
parameter; nothing else sets attributes on parameters). The memory plan (MemoryPlan.install, from convert), the
optimizer and the user set its placement; the autograd Functions, the optimizer's update and the streaming hooks
ask it what to read, where to run and what to move:

- master weight: the parameter's tiles, float32 or bf16 (`keep_bf16_master`); moments: the dtype the optimizer keeps
  them in (`moment_dtype`, recorded by AdamW);
- bf16 copy for the matmuls (bf16 precision): kept per weight version (the default; the update writes the next one in
  its own task), or made per use (`bf16_per_use`, a GPU-resident block's under checkpointing); `cast_apart`: bf16
  matmul inputs cast by tasks of their own instead of inside the GEMM (beyond GPU memory);
- where its update runs (`update_on`): "any" (wherever StarPU places it), "cpu" (CPU workers: master, moments and
  bf16 copy live in host RAM), "streamed" (on the GPU, its state fetched from host RAM and written back after);
  `evict_first`: what the update wrote is marked won't-use (first in StarPU's eviction order);
- the streaming's view: `matmul_tiles` (what the matmuls read, to prefetch), `update_state` (what a streamed update
  reads, to fetch ahead).
"""
import contextlib
import weakref

import torch

from . import _C
from .runtime import host_tasks
from .tensor import dtype_of, new_tiles, tiles_like

UPDATE_PLACES = ("any", "cpu", "streamed")
_NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it twice is fine


def bf16_like(tiles):
    """New, unwritten bf16 tiles with the shape and tiling of `tiles` (named after them)."""
    return tiles_like(tiles, torch.bfloat16, name=tiles.name + ".bf16")


def to_bf16(tiles):
    """bfloat16 copy of C++ tiles, one convert task per tile (the same tiles when they already are bf16)."""
    if dtype_of(tiles) == torch.bfloat16:
        return tiles
    b = bf16_like(tiles)
    _C.convert(tiles, b)
    return b


def param_state(param):
    """The ParamState of `param` (a parameter of a converted model, usually a TileTensor), made on first use."""
    state = getattr(param, "_nntile_state", None)
    if state is None:
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"param_state() takes a parameter (got {type(param).__name__})")
        state = ParamState(param)
        param._nntile_state = state
    return state


class ParamState:
    """Placement and state of one parameter (see the module docstring). Kept on the parameter, it refers back to it
    weakly: it lives exactly as long as the parameter."""

    __slots__ = ("_param", "name", "_per_use", "cast_apart", "update_on", "evict_first", "moment_dtype", "_bf16",
                 "_moments")

    def __init__(self, param):
        self._param = weakref.ref(param)
        self.name = None  # its name in the model (the memory plan names parameters; MemoryPlan.install sets it)
        self._per_use = False
        self.cast_apart = False
        self.update_on = "any"
        self.evict_first = False
        self.moment_dtype = None  # the optimizer's (AdamW's state_dtype), once one places the parameter
        self._bf16 = None  # the kept bf16 copy: (weight version it was made from, bf16 tiles)
        self._moments = None  # a streamed update's moments (C++ tiles), once it has run

    # -- what it is ---------------------------------------------------------------------------------------------
    @property
    def param(self):
        return self._param()

    @property
    def tiles(self):
        """The master weight's C++ tiles (float32, or bf16 marked logical float32)."""
        return self._param().tiles

    @property
    def master_dtype(self):
        """The dtype the master weight is stored in (bf16 tiles of a float32 parameter: torch.bfloat16)."""
        param = self._param()
        if not hasattr(param, "tiles"):  # a dense parameter (the plan names those too)
            return param.dtype
        return param.tiles_dtype

    @property
    def on_host(self):
        """Updated by CPU workers: master weight, moments and bf16 copy are written in host RAM."""
        return self.update_on == "cpu"

    @property
    def home(self):
        """Where the state lives between steps: "host" (host RAM) or "device" (wherever StarPU keeps it)."""
        return "host" if self.update_on in ("cpu", "streamed") else "device"

    def __repr__(self):
        copy = "per use" if self._per_use else "kept" if self._bf16 is not None else "none yet"
        moments = "?" if self.moment_dtype is None else str(self.moment_dtype).replace("torch.", "")
        return (f"<ParamState {self.name or '(unnamed)'}: master {str(self.master_dtype).replace('torch.', '')}, "
                f"moments {moments}, update on {self.update_on}, home {self.home}, bf16 copy {copy}"
                f"{', cast apart' if self.cast_apart else ''}{', evict first' if self.evict_first else ''}>")

    # -- master weight -----------------------------------------------------------------------------------------
    def keep_bf16_master(self, on_host=False):
        """Replaces a float32 tile parameter's tiles by bf16 ones with its values rounded to nearest (the memory plan's
        master_dtype=torch.bfloat16): the parameter stays a float32 tensor to torch (state_dict, gradients, optimizers
        see float32), its only copy is bf16, which the matmuls read as it is and AdamW updates with stochastic
        rounding. on_host: the conversion runs on CPU workers, so the new tiles start in host RAM (a block the plan
        keeps there)."""
        param = self._param()
        t = param.tiles
        if dtype_of(t) != torch.float32 or param.dtype != torch.float32:
            raise TypeError(f"a bf16 master weight is made from a float32 tile parameter (got tiles of {dtype_of(t)})")
        b = new_tiles(t.shape, t.tile_shape, torch.bfloat16, t.name, t.persistent, logical_dtype=torch.float32)
        with host_tasks() if on_host else _NO_CONTEXT:
            _C.convert(t, b)
        param.replace_tiles(b)
        self._bf16 = None

    # -- the bf16 copy the matmuls read ------------------------------------------------------------------------
    @property
    def bf16_per_use(self):
        """Whether the bf16 copy is made for each use and freed with it (the caller keeps it for its backward as an
        activation, which checkpointing drops and recomputes) instead of kept per weight version. Setting it drops
        the kept copy."""
        return self._per_use

    @bf16_per_use.setter
    def bf16_per_use(self, value):
        self._per_use = bool(value)
        if self._per_use:
            self._bf16 = None

    @property
    def bf16_copy(self):
        """The kept bf16 copy as (weight version it was made from, C++ tiles), or None."""
        return self._bf16

    def drop_bf16_copy(self):
        """Forgets the kept copy (the next use makes a new one; the update then writes none until it has)."""
        self._bf16 = None

    def weight_bf16(self):
        """bf16 tiles of the weight for a matmul: the kept copy, made once per weight version (the optimizer's update
        makes a new version), on CPU workers for a weight updated there; or, with bf16_per_use, a copy for this use
        alone."""
        if self._per_use:
            return to_bf16(self.tiles)
        t = self.tiles
        version = t.version
        cache = self._bf16
        if cache is None or cache[0] != version:
            with host_tasks() if self.update_on == "cpu" else _NO_CONTEXT:
                cache = (version, to_bf16(t))
            self._bf16 = cache
        return cache[1]

    def matmul_tiles(self, bf16):
        """The tiles the matmuls read now (the streaming prefetches them): in bf16 mode the kept copy of the current
        weight version (None if there is none yet) or a bf16 master itself; otherwise the weight's tiles."""
        t = self.tiles
        if not bf16 or dtype_of(t) != torch.float32:
            return t
        cache = self._bf16
        return cache[1] if cache is not None and cache[0] == t.version else None

    # -- the update --------------------------------------------------------------------------------------------
    def place_update(self, where, evict_first=False, moment_dtype=None):
        """Where the optimizer runs this parameter's update ("any", "cpu", "streamed"), whether what it writes goes
        first in the eviction order, and the moments' dtype. The optimizer that takes the parameter sets it."""
        if where not in UPDATE_PLACES:
            raise ValueError(f"an update runs on one of {UPDATE_PLACES} (got {where!r})")
        self.update_on = where
        self.evict_first = bool(evict_first)
        self.moment_dtype = moment_dtype

    def update_context(self):
        """The context the update's tasks are submitted in: CPU workers only for an update on "cpu"."""
        return host_tasks() if self.update_on == "cpu" else _NO_CONTEXT

    def bf16_copy_for_update(self):
        """New bf16 tiles for the update to write the next weight version's copy into, in its own task, or None.
        The same values as a conversion after it, one pass over the weight and one task per tile less; the memory plan's streaming fetches it ahead of the next
        forward. Only for a float32 master whose copy is kept and was made at least once (one made per use is never
        kept; a bf16 master is its own copy)."""
        t = self.tiles
        if self._bf16 is not None and dtype_of(t) == torch.float32:
            return bf16_like(t)
        return None

    def record_update(self, exp_avg, exp_avg_sq, copy=None):
        """After the update's tasks are submitted (exp_avg, exp_avg_sq, copy: the C++ tiles they wrote): keeps the new
        bf16 copy; for a streamed update, records its state for the streaming and sends master, moments and copy back
        to host RAM, then first in the GPU's eviction order; with evict_first, marks what was written won't-use."""
        t = self.tiles
        if copy is not None:
            self._bf16 = (t.version, copy)
        if self.update_on == "streamed":
            self._moments = (exp_avg, exp_avg_sq)  # the streaming fetches them ahead of the next update
            # Back to host RAM once written (an acquisition there ordered after the update), then first in the GPU's
            # eviction order: clean copies, so making room for the next blocks writes nothing back under pressure.
            for x in (t, exp_avg, exp_avg_sq) + ((copy,) if copy is not None else ()):
                x.prefetch(0)
                x.wont_use()
            return
        if self.evict_first:
            exp_avg.wont_use()
            exp_avg_sq.wont_use()
            if self._bf16 is not None:
                # The next forward's bf16 copy, made now from the weight just written (the same values as later):
                # the fp32 weight is then read only by the next update, in this same order, so it goes first too.
                self.weight_bf16()
                self.tiles.wont_use()

    def update_state(self):
        """The tiles a streamed update reads (master weight, exp_avg, exp_avg_sq), once one has run; else ()."""
        if self._moments is None:
            return ()
        return (self.tiles,) + self._moments
