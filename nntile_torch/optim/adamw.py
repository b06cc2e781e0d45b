"""nntile_torch.optim.AdamW: torch.optim.AdamW's semantics, the update as one task per parameter tile."""
import torch

from .. import _C
from ..tensor import TileTensor


def _tiles_like(param, value):
    """value (dense or TileTensor) as a TileTensor tiled like param."""
    if isinstance(value, TileTensor) and value.shape == param.shape and value.tiles.same_tiling(param.tiles):
        return value
    t = _C.TileTensor(list(param.tiles.shape), list(param.tiles.tile_shape), "float32", "")
    t.from_dense((value.materialize() if isinstance(value, TileTensor) else value).reshape(tuple(t.shape)))
    return TileTensor(t, param.shape, param.device)


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
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, amsgrad=False,
                 maximize=False, step_in_backward=False):
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
        # torch.optim.AdamW's group keys too, so that it reads our state_dict as AdamW (not Adam with L2).
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
                        maximize=maximize, foreach=None, capturable=False, differentiable=False, fused=None,
                        decoupled_weight_decay=True)
        self.step_in_backward = bool(step_in_backward)
        self._hooks = []
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if self.step_in_backward:
            index = len(self.param_groups) - 1
            for p in self.param_groups[index]["params"]:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(index)))

    def _hook(self, index):
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
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # with step_in_backward, only parameters the hooks did not see
                    self._update(group, p)
        return loss

    def _update(self, group, p):
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if p.grad.is_sparse:
            raise RuntimeError("AdamW does not support sparse gradients")
        state = self.state[p]
        fresh = len(state) == 0
        if fresh:
            state["step"] = torch.tensor(0.0)
        state["step"] = state["step"] + 1  # not in place: a loaded state_dict may share the tensor
        step = int(state["step"].item())
        if isinstance(p, TileTensor) and p.dtype == torch.float32:
            self._tile_step(p, state, fresh, group.get("maximize", False), lr, beta1, beta2, eps, wd, step)
        else:
            self._dense_step(p, state, fresh, group.get("maximize", False), lr, beta1, beta2, eps, wd, step)

    @staticmethod
    def _tile_step(p, state, fresh, maximize, lr, beta1, beta2, eps, wd, step):
        grad = _tiles_like(p, p.grad)
        if maximize:
            neg = _C.TileTensor(list(grad.tiles.shape), list(grad.tiles.tile_shape), "float32", "")
            _C.add(-1.0, grad.tiles, 0.0, neg)
            grad = TileTensor(neg, p.shape, p.device)
        if fresh:
            shape, tile = list(p.tiles.shape), list(p.tiles.tile_shape)
            state["exp_avg"] = TileTensor(_C.TileTensor(shape, tile, "float32", "exp_avg"), p.shape, p.device)
            state["exp_avg_sq"] = TileTensor(_C.TileTensor(shape, tile, "float32", "exp_avg_sq"), p.shape, p.device)
        else:  # states loaded from a state_dict arrive dense
            state["exp_avg"] = _tiles_like(p, state["exp_avg"])
            state["exp_avg_sq"] = _tiles_like(p, state["exp_avg_sq"])
        _C.adamw(grad.tiles, p.tiles, state["exp_avg"].tiles, state["exp_avg_sq"].tiles, lr, beta1, beta2, eps, wd,
                 step, fresh)

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

    def state_dict(self):
        sd = super().state_dict()
        sd["state"] = {k: {n: (v.materialize().clone() if isinstance(v, TileTensor) else v) for n, v in s.items()}
                       for k, s in sd["state"].items()}
        return sd
