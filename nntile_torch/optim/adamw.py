"""nntile_torch.optim.AdamW: torch.optim.AdamW's semantics, the update as one task per parameter tile."""
import torch

import warnings

from .. import _C, runtime
from ..functional import tiles_of
from ..param import param_state
from ..pending import flush_all
from ..runtime import info
from ..tensor import TileTensor, dtype_of, fp32_tiles, new_tiles, tiles_like, without_torch_function


_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


def state_bytes_per_param(state_dtype=torch.float32):
    """Bytes AdamW's two moments take per parameter element with AdamW(state_dtype=...): 8 (float32), 4 (bfloat16),
    or 2 + 8/256 (torch.uint8: 8-bit block-wise moments, one code byte each plus one float32 scale per 256 elements
    each; a tile's last partial block and code word round this up by at most 8 + 6 bytes per tile)."""
    if state_dtype == torch.float32:
        return 8.0
    if state_dtype == torch.bfloat16:
        return 4.0
    if state_dtype == torch.uint8:
        return 2.0 + 8.0 / 256
    raise ValueError(f"state_dtype must be torch.float32, torch.bfloat16 or torch.uint8 (got {state_dtype!r})")


def q8_layout(param):
    """(ntiles, words per tile) of the 8-bit moments of a tile parameter: each moment is a float32 word tensor of
    ntiles * words elements in tiles of `words`, tile t holding the scales and codes of parameter tile t
    (csrc/kernels/adamw_q8.h); words fits the largest tile, the first."""
    shape, tile = list(param.tiles.shape), list(param.tiles.tile_shape)
    ntiles, largest = 1, 1
    for n, t in zip(shape, tile):
        ntiles *= -(-n // t)
        largest *= min(n, t)
    return ntiles, _C.q8_words(largest)


def _same(given, chosen):
    """An argument given beside a plan agrees with the plan's choice (parameter lists compared by identity)."""
    if isinstance(given, (list, tuple, set)) or isinstance(chosen, (list, tuple, set)):
        if not isinstance(given, (list, tuple, set)) or not isinstance(chosen, (list, tuple, set)):
            return False
        return {id(p) for p in given} == {id(p) for p in chosen}
    return given == chosen


def _evict_updated_first():
    """NNTILE_EVICT_WONT_USE_FIRST (default on; the patched StarPU's setting, scripts/patch_starpu.py, as the runtime
    chose it: runtime.patch_setting): after each update the moments, and the fp32 weight of a weight with a bf16 copy
    (that copy is then made right away instead of in the next forward), are marked "won't use", which puts them
    first in their node's eviction order. A training step updates them in the same order every step, so the ones
    updated last are needed last: evicting them first moves only the overflow of a model larger than the GPU,
    where least-recently-used eviction misses on every tile. Experimental (docs/DESIGN.md, "Beyond GPU memory");
    no effect on values."""
    return runtime.patch_setting("NNTILE_EVICT_WONT_USE_FIRST")


def _tiles_like(param, value, dtype=torch.float32, name="", persistent=False):
    """value (dense or TileTensor) as a TileTensor of `dtype` tiled like param (value itself when it is: bf16
    moments once failed that test, same_tiling comparing dtypes, and were re-tiled through host RAM every step)."""
    tiles = tiles_of(param.tiles.shape, param.tiles.tile_shape, value, dtype, name, persistent)
    if isinstance(value, TileTensor) and value.tiles is tiles and value.shape == param.shape:
        return value
    return TileTensor(tiles, param.shape, param.device)


def _grad_tiles(param):
    """The fp32 tiles of param.grad tiled like param: the gradient's own tiles when they are (as backward makes
    them; torch keeps a gradient's shape equal to its parameter's), checked without torch's dispatch: this runs
    once per parameter per step, on the submitting thread (docs/DESIGN.md, "The stream of tasks")."""
    grad = param.grad
    if type(grad) is TileTensor:
        g, t = grad.tiles, param.tiles
        if dtype_of(g) == torch.float32 and g.tile_shape == t.tile_shape and g.shape == t.shape:
            return g
    return _tiles_like(param, grad).tiles


def adamw_update(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step, fresh, seed):
    """One AdamW step of a tile parameter: one task per tile, submitted where its ParamState places the update, which
    writes the next bf16 copy where one is kept and does the placement's bookkeeping after (a streamed update's
    write-back, evict-first). No wait.

    param: the TileTensor parameter (its fp32 or bf16 master tiles are updated in place); grad: fp32 C++ tiles tiled
    like it; exp_avg, exp_avg_sq: the moments as TileTensors tiled like it (fp32 or bf16; bf16 ones are stored with
    stochastic rounding seeded by `seed`, the same on any device); step: the step count after this one's increment
    (bias correction); fresh: the moments are unwritten (this is their first step: they start at zero)."""
    state = param_state(param)
    with state.update_context():
        copy = state.bf16_copy_for_update()
        _C.adamw(grad, param.tiles, exp_avg.tiles, exp_avg_sq.tiles, lr, beta1, beta2, eps, weight_decay, step, fresh,
                 seed, copy=copy)
        state.record_update(exp_avg.tiles, exp_avg_sq.tiles, copy)


class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay and bias correction, as torch.optim.AdamW (amsgrad=False).

    For TileTensor parameters (those of nntile_torch.nn modules) the fp32 master weights and the states
    exp_avg, exp_avg_sq are tiles, and each step submits one AdamW task per tile, which StarPU runs on a CPU
    core or a GPU, wherever the tiles are; nothing waits. Plain tensors get the same update with torch ops.
    state_dict() holds ordinary tensors under torch.optim.AdamW's keys, so either optimizer loads it.

    step_in_backward=True: each parameter is updated as soon as backward has finished its gradient (a
    post-accumulate-grad hook submits its AdamW tasks) and its gradient is dropped right away, so gradients of
    the whole model are never held at once (the memory of one copy of the weights, for models beyond GPU
    memory). step() and zero_grad() then have nothing left to do for those parameters; anything that needs
    every gradient before the update (clipping by global norm, gradient accumulation over micro-batches) does
    not fit this mode. The updates are the same as step()'s, bit for bit.

    state_dtype=torch.bfloat16: exp_avg and exp_avg_sq of tile parameters are kept in bf16 (4 bytes per
    parameter instead of 8: 14 -> 10 bytes per parameter with bf16 weight copies and step_in_backward). Each
    step computes them in fp32 from their bf16 values and updates the weight with those fp32 values, then
    stores them rounded stochastically (up or down with the probabilities that make the rounding unbiased, from
    a hash of the parameter, step, tile and element: the same on any device), because round-to-nearest would
    drop exp_avg_sq's updates (beta2 = 0.999 moves it by 0.1%, bf16's spacing is 0.4%). Not bitwise torch's
    AdamW any more: tests/test_adamw.py bounds how far the trajectory drifts. Plain tensor parameters keep fp32.

    state_dtype=torch.uint8: 8-bit block-wise moments, bitsandbytes' 8-bit AdamW scheme (2 + 8/256 bytes per parameter
    for both: state_bytes_per_param): per block of 256 elements of a tile, a float32 scale (the absmax) and one code
    byte per element indexing bitsandbytes' dynamic map (signed for exp_avg, unsigned for exp_avg_sq). Each step
    dequantizes, runs the fp32 update above, and quantizes again to the nearest map entry. A bf16 master weight (nt.plan's
    master_dtype=torch.bfloat16) is updated in fp32 from its bf16 value and stored rounded stochastically with the
    same bits as with bf16 moments (2 + 2 + 8/256 bytes per parameter of persistent state); plain tensor parameters
    keep fp32. state_dict() holds each tile parameter's
    moments as their packed bytes (a uint8 tensor: scales, then codes, tile after tile; see q8_layout), which only
    this optimizer with state_dtype=torch.uint8 loads.

    offload (a fraction of the tile parameters' elements, taken from the last parameter backwards, or the parameters
    themselves): those parameters are updated by CPU workers, so their fp32 master weights and states live in host
    RAM, and their bf16 copies are made there too; GPUs only receive the bf16 copy and send back the gradient
    (ZeRO-Offload's split). For models whose weights and states do not fit in GPU memory, without relying on
    StarPU to evict them from a full GPU. Needs CPU workers (nt.init(ncpus=...)); same updates as without.
    offload_update="gpu": the offloaded parameters' state still lives in host RAM between steps, but their updates
    run on the GPU: each update's master weight and moments are fetched to it (its gradient is already there) and
    written back to host RAM right after, with the new bf16 copy, and the GPU's copies are then evicted first. More
    PCIe traffic (12 bytes per parameter each way instead of 4 + 4), no CPU work: faster where the CPU updates, not
    PCIe, bound the step (the memory plan chooses). Same updates as on CPU workers. offload_update given as offload
    is (a fraction, from the last parameter backwards, or the parameters themselves) splits them: those are updated
    by CPU workers, the other offloaded parameters on the GPU, so that both work at once (the memory plan's "mixed").

    plan (nt.plan(...)): step_in_backward, state_dtype, offload and offload_update as the memory plan chose them (arguments given
    here must agree with it); the parameters the plan keeps in host RAM are those of its last blocks.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, amsgrad=False,
                 maximize=False, step_in_backward=None, state_dtype=None, offload=None, offload_update=None,
                 plan=None):
        params = list(params)
        if plan is not None:  # nt.plan(): its choices where the caller made none, the same ones where they did
            chosen = plan.adamw_kwargs(p for g in params for p in (g["params"] if isinstance(g, dict) else [g]))
            for name, given in (("step_in_backward", step_in_backward), ("state_dtype", state_dtype),
                                ("offload", offload), ("offload_update", offload_update)):
                if given is not None and name != "offload" and not _same(given, chosen.get(name)):
                    raise ValueError(f"AdamW({name}={given!r}) contradicts the plan's {name}={chosen.get(name)!r} "
                                     "(pin it in nt.plan(...) instead)")
            step_in_backward = chosen["step_in_backward"] if step_in_backward is None else step_in_backward
            state_dtype = chosen["state_dtype"] if state_dtype is None else state_dtype
            if offload is None:
                offload = chosen.get("offload") or None
            if offload_update is None:
                offload_update = chosen.get("offload_update")
        step_in_backward = bool(step_in_backward)
        offload_update = "cpu" if offload_update is None else offload_update
        if isinstance(offload_update, str) and offload_update not in ("cpu", "gpu"):
            raise ValueError(f"offload_update must be 'cpu', 'gpu', a fraction or parameters (got {offload_update!r})")
        state_dtype = torch.float32 if state_dtype is None else state_dtype
        if not isinstance(lr, (int, float)) or lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr!r} (must be a float >= 0)")
        if not isinstance(eps, (int, float)) or eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps!r} (must be >= 0)")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Invalid betas: {betas!r} (two values in [0, 1))")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay!r} (must be >= 0)")
        if amsgrad:
            raise ValueError("amsgrad=True is not supported by nntile_torch.optim.AdamW")
        if state_dtype not in _STATE_DTYPES:
            raise ValueError(f"state_dtype must be torch.float32, torch.bfloat16 or torch.uint8 (got {state_dtype!r})")
        # torch.optim.AdamW's group keys too, so that it reads our state_dict as AdamW (not Adam with L2).
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
                        maximize=maximize, foreach=None, capturable=False, differentiable=False, fused=None,
                        decoupled_weight_decay=True)
        self.step_in_backward = step_in_backward
        self.state_dtype = state_dtype
        self._hooks = []
        self._seeds = {}  # parameter -> its index in the groups: the stochastic rounding's seed
        self._tiled_states = {}  # parameter -> (exp_avg, exp_avg_sq) as last checked: no re-check while they stay
        self._evict_first = _evict_updated_first()
        super().__init__(params, defaults)
        if state_dtype == torch.float32 and not all(fp32_tiles(p) for p in self._tiled_params()):
            raise ValueError("parameters kept as bf16 master weights (nt.plan's master_dtype=torch.bfloat16) need "
                             "compact moments: state_dtype=torch.bfloat16 or torch.uint8 (got torch.float32)")
        chosen = self._offloaded(offload, offload_update if isinstance(offload_update, str) else "gpu")
        # host: updated by CPU workers; streamed: state in host RAM, updated on the GPU and written back
        if isinstance(offload_update, str):
            host, streamed = (chosen, set()) if offload_update == "cpu" else (set(), chosen)
        else:  # a split: these of the offloaded ones by CPU workers, the others on the GPU
            on_cpu = self._offloaded(offload_update, "cpu", among=[p for p in self._tiled_params() if p in chosen])
            host, streamed = on_cpu, chosen - on_cpu
            offload_update = "cpu" if not streamed else "gpu" if not host else "mixed"
        self.offload_update = offload_update
        for p in self._tiled_params():  # each parameter's state says where its update runs (the bf16 copy too)
            param_state(p).place_update("cpu" if p in host else "streamed" if p in streamed else "any",
                                        self._evict_first, state_dtype)

    def _tiled_params(self):
        return [p for g in self.param_groups for p in g["params"]
                if isinstance(p, TileTensor) and p.dtype == torch.float32]

    def _offloaded(self, offload, where, among=None):
        """The parameters `offload` names (a fraction of the elements of `among`, default every tile parameter,
        from the last backwards; or the parameters), checked to be updated here."""
        what = "offload" if among is None else "offload_update"
        tiled = self._tiled_params() if among is None else among
        fraction = isinstance(offload, (int, float)) and not isinstance(offload, bool)
        if offload is None or (fraction and offload == 0):
            return set()
        if not fraction:
            chosen = set(offload)
            stray = [p for p in chosen if not any(p is q for q in tiled)]
            if stray:
                raise ValueError(f"{what}= names parameters this optimizer does not "
                                 + ("update as tiles" if among is None else "offload") + f" ({len(stray)} of {len(chosen)})")
        else:
            if not 0 < offload <= 1:
                raise ValueError(f"{what} must be a fraction in (0, 1] or parameters (got {offload!r})")
            # From the last parameters backwards: their gradients come first in the backward, so the CPU workers
            # have the rest of it to update them, and the next forward reads them last (docs/memory_plan.md).
            total, chosen, taken = sum(p.numel() for p in tiled), set(), 0
            for p in reversed(tiled):
                if taken >= offload * total:
                    break
                chosen.add(p)
                taken += p.numel()
        if where == "gpu":
            return chosen  # on a machine without GPUs "the GPU" is the CPU workers: the same updates
        workers = info().get("workers") or {}
        if chosen and workers.get("cpu", 0) == 0:
            raise ValueError("offload= needs CPU workers to run the updates (nt.init(ncpus=...))")
        if chosen and workers.get("cuda", 0) > 0 and workers.get("cpu", 0) < 4:
            warnings.warn(f"AdamW(offload=...) updates {len(chosen)} parameters on {workers.get('cpu')} CPU "
                          "worker(s); nt.init(ncpus=...) with more makes the step faster", stacklevel=3)
        return chosen

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        for p in self.param_groups[index]["params"]:
            self._seeds.setdefault(p, len(self._seeds))
        if self.step_in_backward:
            for p in self.param_groups[index]["params"]:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(index)))

    def _hook(self, index):
        @without_torch_function
        def update_now(p):
            with torch.no_grad():  # the group looked up now: load_state_dict replaces the group dicts
                self._update(self.param_groups[index], p)
            p.grad = None  # its tiles go once the AdamW tasks reading them have run
        return update_now

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flush_all()  # a pending producer reads no weight the update writes (docs/fusion.md)
        self._update_all()
        return loss

    @without_torch_function  # ~3 .grad reads per parameter, each a Python call otherwise (the closure is the user's)
    def _update_all(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # with step_in_backward, only parameters the hooks did not see
                    self._update(group, p)

    @without_torch_function
    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)

    def _update(self, group, p):
        # Once per parameter per step on the submitting thread: kept free of torch dispatch where it can be
        # (docs/measurements.md, "Submitting an update").
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        tiled = type(p) is TileTensor and p.dtype == torch.float32  # fp32 tiles, or bf16 ones (bf16 master weights)
        if not (tiled and type(p.grad) is TileTensor) and p.grad.is_sparse:  # tiles are never sparse
            raise RuntimeError("AdamW does not support sparse gradients")
        state = self.state[p]
        fresh = len(state) == 0
        if fresh:
            state["step"] = torch.tensor(0.0)
        state["step"] = state["step"] + 1  # not in place: a loaded state_dict may share the tensor
        step = int(state["step"].item())
        if tiled:
            with param_state(p).update_context():  # CPU workers for a parameter updated there
                self._tile_step(p, state, fresh, group.get("maximize", False), lr, beta1, beta2, eps, wd, step)
        else:
            self._dense_step(p, state, fresh, group.get("maximize", False), lr, beta1, beta2, eps, wd, step)

    def _tile_step(self, p, state, fresh, maximize, lr, beta1, beta2, eps, wd, step):
        dtype = self.state_dtype
        grad = _grad_tiles(p)
        if maximize:
            neg = tiles_like(grad)
            _C.add(-1.0, grad, 0.0, neg)
            grad = neg
        if dtype == torch.uint8:
            return self._tile_step_q8(p, state, fresh, grad, lr, beta1, beta2, eps, wd, step)
        if fresh:
            shape, tile = list(p.tiles.shape), list(p.tiles.tile_shape)
            for name in ("exp_avg", "exp_avg_sq"):
                state[name] = TileTensor(new_tiles(shape, tile, dtype, name, True), p.shape,
                                         p.device)
        else:
            known = self._tiled_states.get(p)
            if known is None or known[0] is not state["exp_avg"] or known[1] is not state["exp_avg_sq"]:
                if state["exp_avg"].dtype == torch.uint8:
                    raise ValueError("AdamW state_dtype=%s cannot load 8-bit moments (saved with "
                                     "state_dtype=torch.uint8)" % str(dtype))
                # states loaded from a state_dict arrive dense (and in the type they were saved in)
                state["exp_avg"] = _tiles_like(p, state["exp_avg"], dtype, "exp_avg", True)
                state["exp_avg_sq"] = _tiles_like(p, state["exp_avg_sq"], dtype, "exp_avg_sq", True)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        self._tiled_states[p] = (m, v)
        adamw_update(p, grad, m, v, lr, beta1, beta2, eps, wd, step, fresh, self._seeds[p])

    def _tile_step_q8(self, p, state, fresh, grad, lr, beta1, beta2, eps, wd, step):
        ntiles, words = q8_layout(p)
        if fresh:
            for name in ("exp_avg", "exp_avg_sq"):
                state[name] = TileTensor(new_tiles([ntiles * words], [words], torch.float32, name, True),
                                         torch.Size([ntiles * words]), p.device)
        else:
            known = self._tiled_states.get(p)
            if known is None or known[0] is not state["exp_avg"] or known[1] is not state["exp_avg_sq"]:
                for name in ("exp_avg", "exp_avg_sq"):  # loaded from a state_dict: the packed bytes
                    value = state[name]
                    if isinstance(value, TileTensor) or value.dtype != torch.uint8 \
                            or value.numel() != ntiles * words * 4:
                        raise ValueError(f"AdamW(state_dtype=torch.uint8) loads 8-bit moments as the uint8 bytes its "
                                         f"state_dict() saves ({ntiles * words * 4} for this parameter; got "
                                         f"{value.dtype} of {value.numel()} elements)")
                    dense = value.detach().to("cpu").contiguous().view(torch.float32)
                    state[name] = TileTensor(tiles_of([ntiles * words], [words], dense, torch.float32, name, True),
                                             torch.Size([ntiles * words]), p.device)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        self._tiled_states[p] = (m, v)
        pstate = param_state(p)
        with pstate.update_context():
            copy = pstate.bf16_copy_for_update()
            _C.adamw_q8(grad, p.tiles, m.tiles, v.tiles, lr, beta1, beta2, eps, wd, step, fresh, self._seeds[p],
                        copy=copy)
            pstate.record_update(m.tiles, v.tiles, copy)

    @staticmethod
    def _dense_step(p, state, fresh, maximize, lr, beta1, beta2, eps, wd, step):
        grad = p.grad if not maximize else -p.grad
        if isinstance(grad, TileTensor):
            grad = grad.materialize()
        if fresh:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        p.mul_(1 - lr * wd)
        m.lerp_(grad, 1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (v.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
        p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** step))

    def load_state_dict(self, state_dict):
        self._tiled_states.clear()  # the states it held go with the old state (their tiles are freed now)
        # 8-bit moments (uint8 bytes) as saved: torch's load_state_dict casts state to its parameter's dtype
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = dict(zip(saved_ids, (p for g in self.param_groups for p in g["params"])))
        raw = {(k, n): v for k, s in state_dict["state"].items() for n, v in s.items()
               if isinstance(v, torch.Tensor) and v.dtype == torch.uint8}
        super().load_state_dict(state_dict)
        for (k, n), v in raw.items():
            if k in params:
                self.state[params[k]][n] = v.clone()

    def state_dict(self):
        sd = super().state_dict()
        q8 = self.state_dtype == torch.uint8  # tile parameters' moments are packed words: saved as their bytes

        def dense(v):
            if not isinstance(v, TileTensor):
                return v
            return v.materialize().clone().view(torch.uint8) if q8 else v.materialize().clone()
        sd["state"] = {k: {n: dense(v) for n, v in s.items()} for k, s in sd["state"].items()}
        return sd
