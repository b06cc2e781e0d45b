"""torch's own optimizers (the user's torch.optim.AdamW, Adam, SGD, ...) over tile parameters, as tile tasks.

- fused=True (nanoGPT's train.py on CUDA) reaches `aten._fused_adamw_` / `aten._fused_adam_` with lists of
  parameters, gradients and states: each tile parameter becomes one AdamW task per tile (adamw.adamw_update, the
  task nntile_torch.optim.AdamW submits), Adam's L2 weight decay or maximize a task before it. The rest of the
  lists (dense parameters, bf16 master weights) goes to torch's own kernel.
- The for-loop and foreach forms are the pointwise ops of nntile_torch/pointwise.py.
- State tensors are made by torch with zeros_like(p): zero-filled tiles tiled like p. State loaded with
  load_state_dict arrives dense (torch moves it to the parameter's device); before the next step it is put back into
  tiles (a global optimizer step pre-hook, on each new state dict). state_dict() hands out ordinary tensors.

The fused ops take the step count as a tensor on the parameter's device; reading it would wait for the GPU every
step. Its value is known from its version counter instead: torch adds 1 to it (an in-place op, one version) before
every fused call, so it is read once, then counted.
"""
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

from .. import _C
from ..owners import STEP_VALUES, optimizer_record
from ..tensor import TileTensor, dense_fallback, fp32_tiles, register_tile_op, same_tiling, tiles_like

aten = torch.ops.aten


def _ok(x):
    return isinstance(x, TileTensor) and not x.is_view and fp32_tiles(x)


def _tiled_like(p, x):
    return _ok(x) and same_tiling(x, p)


def step_value(t):
    """The value of an optimizer's step count (a number or a one-value tensor), read from the tensor only when its
    version does not tell it (the first time, or after a change not made by +1 steps)."""
    if not isinstance(t, torch.Tensor):
        return float(t)
    version = t._version
    known = STEP_VALUES.get(t)  # (version, value) when read
    if known is not None and known[0] <= version:
        return known[1] + (version - known[0])
    value = float(t.item())
    STEP_VALUES[t] = (version, value)
    return value


def _fused_adam(decoupled):
    def handler(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        if amsgrad or grad_scale is not None or found_inf is not None:
            return NotImplemented  # AMP's gradient scaling and amsgrad: torch's kernel on dense copies
        from .adamw import adamw_update
        tiled = [i for i, p in enumerate(params)
                 if _ok(p) and all(_tiled_like(p, x[i]) for x in (grads, exp_avgs, exp_avg_sqs))]
        if tiled and isinstance(lr, torch.Tensor):
            lr = lr.item()
        for i in tiled:
            p, g = params[i], grads[i].tiles
            step = int(round(step_value(state_steps[i])))
            l2 = 0.0 if decoupled else float(weight_decay)
            if maximize or l2:  # Adam: the gradient + wd * p (torch's fused kernel computes that, then Adam)
                t = g
                g = tiles_like(t)
                _C.add_into(-1.0 if maximize else 1.0, t, l2, p.tiles, g)
            adamw_update(p, g, exp_avgs[i], exp_avg_sqs[i], lr, beta1, beta2, eps,
                         float(weight_decay) if decoupled else 0.0, step, False, 0)
        rest = [i for i in range(len(params)) if i not in set(tiled)]
        if rest:
            pick = (lambda xs: [xs[i] for i in rest] if len(xs) == len(params) else xs)
            func = aten._fused_adamw_.default if decoupled else aten._fused_adam_.default
            if isinstance(lr, torch.Tensor):
                func = aten._fused_adamw_.tensor_lr if decoupled else aten._fused_adam_.tensor_lr
            args = [pick(x) for x in (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)]
            kwargs = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
                          maximize=maximize, grad_scale=grad_scale, found_inf=found_inf)
            if any(isinstance(x, TileTensor) for x in tree_leaves(args)):
                dense_fallback(func, args, kwargs)
            else:
                func(*args, **kwargs)
        return None
    return handler


def _register():
    for decoupled, name in ((True, "_fused_adamw_"), (False, "_fused_adam_")):
        op = getattr(aten, name)
        register_tile_op(op.default, _fused_adam(decoupled))
        register_tile_op(op.tensor_lr, _fused_adam(decoupled))


def _dense_state(optimizer, state_dict):
    """state_dict() post-hook: tile states as ordinary tensors (saving reads them: that waits, as it must)."""
    state_dict["state"] = {k: {n: (v.materialize().clone() if isinstance(v, TileTensor) else v) for n, v in s.items()}
                           for k, s in state_dict["state"].items()}
    return state_dict


def _retile_states(optimizer, args, kwargs):
    """Global step pre-hook: on an optimizer's first step and after each load_state_dict (a new state dict), tile
    parameters' dense states of the parameter's shape (loaded ones) go back into tiles tiled like the parameter
    (no wait: a copy of a dense tensor into new tiles), and state_dict() is given its dense post-hook."""
    record = optimizer_record(optimizer)
    if record.seen_state is optimizer.state:
        return
    record.seen_state = optimizer.state
    from .adamw import AdamW
    if isinstance(optimizer, AdamW):
        return  # nntile's own AdamW keeps its states itself
    tiled = [p for g in optimizer.param_groups for p in g["params"] if _ok(p)]
    if not tiled:
        return
    if not record.hooked:
        optimizer.register_state_dict_post_hook(_dense_state)
        record.hooked = True
    for p in tiled:
        state = optimizer.state.get(p)
        if not state:
            continue
        for name, v in list(state.items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, TileTensor) and name != "step" \
                    and v.shape == p.shape and v.dtype == torch.float32:
                t = p.tiles
                tiles = tiles_like(t, name=t.name and f"{t.name}.{name}", persistent=t.persistent)
                tiles.from_dense(v.detach().to(p.device).reshape(tuple(t.shape)))
                state[name] = TileTensor(tiles, p.shape, p.device)


_register()
_pre_hook = register_optimizer_step_pre_hook(_retile_states)
