"""convert(): swaps, in place, a model's matmul modules for tile-task ones, keeping parameter names, shapes,
state_dict keys and weight ties.

Swapped now: torch.nn.Linear -> nntile_torch.nn.Linear, transformers' Conv1D (GPT-2) -> nntile_torch.nn.Conv1D.
Every other module keeps running as torch code on materialized TileTensors (correct, with host waits).
"""
import torch
from torch import nn

from . import config
from .nn import Conv1D, Linear
from .runtime import ensure_init
from .tensor import TileTensor


def _is_hf_conv1d(m):
    # transformers.pytorch_utils.Conv1D, recognized without importing transformers.
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "weight") and m.weight.dim() == 2


def _check_dense_float32(name, m):
    for pname, p in m.named_parameters(recurse=False):
        if p.dtype != torch.float32:
            raise TypeError(f"convert() keeps float32 master weights; {name}.{pname} is {p.dtype} "
                            "(load the model in float32 and pick precision='bf16' for bf16 matmuls)")


def _swap(m, kw):
    if type(m) is nn.Linear:
        new = Linear(m.in_features, m.out_features, bias=m.bias is not None, device=m.weight.device, **kw)
    elif _is_hf_conv1d(m):
        new = Conv1D(m.nf, m.weight.shape[0], device=m.weight.device, **kw)
    else:
        return None
    return new


def convert(model, precision="fp32", tile_size=None, batch_tile_size=None):
    """Swaps, in place, model's nn.Linear and Hugging Face Conv1D modules for nntile_torch ones and returns
    model. Parameters keep their names, shapes, values, requires_grad and ties (a weight shared by several
    modules, such as GPT-2's token embedding and LM head, stays one Parameter).

    precision: "fp32" (exact), "tf32" or "bf16" for the matmuls; tile_size / batch_tile_size: tile edges in
    elements (defaults in nntile_torch.config).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert() takes a torch.nn.Module (got {type(model).__name__})")
    config.check_precision(precision)
    config.check_tile(tile_size, "tile_size")
    config.check_tile(batch_tile_size, "batch_tile_size")
    ensure_init()
    kw = dict(tile_size=tile_size, batch_tile_size=batch_tile_size, precision=precision)
    swapped = {}  # id(old parameter) -> new parameter
    plan = []
    for name, m in model.named_modules():
        for cname, child in m.named_children():
            full = f"{name}.{cname}" if name else cname
            if type(child) is nn.Linear or _is_hf_conv1d(child):
                _check_dense_float32(full, child)
                plan.append((m, cname, child))
    for parent, cname, old in plan:
        new = _swap(old, kw)
        for pname, p in old.named_parameters(recurse=False):
            if id(p) in swapped:  # tied to a parameter converted already
                setattr(new, pname, swapped[id(p)])
            else:
                with torch.no_grad():
                    getattr(new, pname).copy_(p)
                getattr(new, pname).requires_grad_(p.requires_grad)
                swapped[id(p)] = getattr(new, pname)
        new.train(old.training)
        setattr(parent, cname, new)
    # Modules left as torch code that shared a swapped parameter get the new one, so ties survive; their
    # state_dict then still holds ordinary tensors.
    for m in model.modules():
        retied = False
        for pname, p in list(m.named_parameters(recurse=False)):
            if id(p) in swapped and p is not swapped[id(p)]:
                setattr(m, pname, swapped[id(p)])
                retied = True
        if retied:
            m._register_state_dict_hook(_dense_state_dict)
    return model


def _dense_state_dict(module, state_dict, prefix, local_metadata):
    for name, p in module.named_parameters(recurse=False):
        if isinstance(p, TileTensor) and isinstance(state_dict.get(prefix + name), TileTensor):
            state_dict[prefix + name] = p.materialize().clone()
