"""convert(): swaps, in place, a model's matmul modules for tile-task ones, keeping parameter names, shapes,
state_dict keys and weight ties.

Swapped now: torch.nn.Linear -> nntile_torch.nn.Linear, transformers' Conv1D (GPT-2) -> nntile_torch.nn.Conv1D,
torch.nn.LayerNorm (last dim, with weight and bias) -> nntile_torch.nn.LayerNorm, torch.nn.GELU and transformers'
NewGELUActivation / GELUActivation -> nntile_torch.nn.GELU, nn.Embedding (default options, width within a
tile; tied to a converted linear layer or not) -> nntile_torch.nn.Embedding, nn.Dropout ->
nntile_torch.nn.Dropout (p = 0: nn.Identity); Hugging Face GPT2Attention keeps its module but runs causal
attention as tile tasks (nntile_torch/nn/gpt2.py).
Every other module keeps running as torch code on materialized TileTensors (correct, with host waits).
"""
import sys

import torch
from torch import nn
from tqdm import tqdm

from . import config
from .nn import GELU, Conv1D, Dropout, Embedding, LayerNorm, Linear
from .nn.embedding import check_indices
from .nn._init import no_init
from .nn.gpt2 import is_gpt2_attention, patch_gpt2_attention
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


_HF_GELU = {"NewGELUActivation": "tanh", "GELUTanh": "tanh", "PytorchGELUTanh": "tanh", "GELUActivation": "none"}


def _swappable(m, tile_size):
    if type(m) is nn.Linear or _is_hf_conv1d(m):
        return True
    if type(m) is nn.LayerNorm:
        return len(m.normalized_shape) == 1 and m.weight is not None and m.bias is not None
    if type(m) is nn.Embedding:
        # Tables tied to a converted linear layer (GPT-2's token embedding and LM head) add their gradient to
        # the linear layer's as tiles; untied ones (GPT-2's positions) broadcast over the batch as block tasks.
        return (m.padding_idx is None and m.max_norm is None
                and not m.scale_grad_by_freq and not m.sparse
                and m.embedding_dim <= (tile_size or config.DEFAULT_TILE_SIZE))
    if type(m) is nn.Dropout:
        return True  # p = 0: exactly the identity; else tile dropout (torch's would read, materialize, its input)
    return type(m) is nn.GELU or type(m).__name__ in _HF_GELU


def _swap(m, kw, home=None):
    tiles = dict(tile_size=kw["tile_size"], batch_tile_size=kw["batch_tile_size"])
    dev = home if home is not None else getattr(getattr(m, "weight", None), "device", None)
    if type(m) is nn.Linear:
        return Linear(m.in_features, m.out_features, bias=m.bias is not None, device=dev, **kw)
    if _is_hf_conv1d(m):
        return Conv1D(m.nf, m.weight.shape[0], device=dev, **kw)
    if type(m) is nn.LayerNorm:
        return LayerNorm(m.normalized_shape, eps=m.eps, device=dev, batch_tile_size=kw["batch_tile_size"])
    if type(m) is nn.GELU:
        return GELU(m.approximate, **tiles)
    if type(m) is nn.Dropout:
        return nn.Identity() if m.p == 0 else Dropout(m.p, **tiles)
    if type(m) is nn.Embedding:
        return Embedding(m.num_embeddings, m.embedding_dim, device=dev, **tiles)
    return GELU(_HF_GELU[type(m).__name__], **tiles)


def convert(model, precision="fp32", tile_size=None, batch_tile_size=None, init=None, init_device=None,
            progress=None, plan=None):
    """Swaps, in place, model's nn.Linear, Hugging Face Conv1D, nn.LayerNorm and GELU modules for nntile_torch
    ones (see the module docstring) and returns model. Parameters keep their names, shapes, values,
    requires_grad and ties (a weight shared by several modules, such as GPT-2's token embedding and LM head,
    stays one Parameter).

    precision: "fp32" (exact), "tf32" or "bf16" for the matmuls; tile_size / batch_tile_size: tile edges in
    elements (defaults in nntile_torch.config).

    A model built on the meta device (``with torch.device("meta"): model = ...``) is materialized one module
    at a time, so the dense model never exists whole (a 20B model is 80 GB of float32): each swapped module
    gets empty dense parameters on init_device (default: the current GPU when nntile runs GPU workers, else
    the CPU), init(module) fills them (default: the module's own reset_parameters(); for Hugging Face models
    pass init=model._init_weights), they are copied into tiles and dropped. The tiles' home device (where
    inputs and materialized copies go) is then init_device. Parameters of modules convert() does not swap
    must not be on the meta device (the error names them).

    progress: a progress bar over the modules on stderr (a 20B model on meta takes ~100 s); None shows it for
    models of 1B parameters or more when stderr is a terminal.

    plan: a memory plan (nt.plan(model, batch, seq, precision)) whose checkpointing and streaming hooks are put on
    the converted model (docs/memory_plan.md); its precision must be this one.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert() takes a torch.nn.Module (got {type(model).__name__})")
    config.check_precision(precision)
    config.check_tile(tile_size, "tile_size")
    config.check_tile(batch_tile_size, "batch_tile_size")
    if plan is not None and plan.precision != precision:
        raise ValueError(f"convert(precision={precision!r}) differs from the plan's precision {plan.precision!r}")
    ensure_init()
    kw = dict(tile_size=tile_size, batch_tile_size=batch_tile_size, precision=precision)
    swapped = {}  # id(old parameter) -> new parameter
    swaps, names = [], {}
    for name, m in model.named_modules():
        for cname, child in m.named_children():
            full = f"{name}.{cname}" if name else cname
            if _swappable(child, tile_size):
                _check_dense_float32(full, child)
                swaps.append((m, cname, child))
                names.setdefault(id(child), full)
    _check_meta(model, swaps, init)
    meta_plan = any(p.is_meta for _, _, m in swaps for p in m.parameters(recurse=False))
    home = _home_device(init_device) if meta_plan else None  # only meta modules need one
    keep = []
    if progress is None:
        progress = sys.stderr.isatty() and sum(p.numel() for p in model.parameters()) >= 10**9
    for parent, cname, old in tqdm(swaps, desc="nntile_torch.convert", unit="module", disable=not progress,
                                   file=sys.stderr, leave=False):
        ids = {pname: id(p) for pname, p in old.named_parameters(recurse=False)}
        keep.extend(old.parameters(recurse=False))  # alive, so their ids stay unique while ties are matched
        meta = any(p.is_meta for p in old.parameters(recurse=False))
        if meta and any(i not in swapped for i in ids.values()):
            _materialize(old, init, home)
            if plan is not None and plan.beyond_gpu:
                # Written from where the plan keeps it: host blocks from host RAM, the rest from the GPU, so that
                # host RAM holds no build-time copy of the GPU's tiles (StarPU 1.3.10 keeps a buffer once written).
                old.to("cpu" if plan.in_host_ram(names[id(old)]) else home)
        with no_init():  # every parameter is written from `old` below
            new = _swap(old, kw, home if meta else None)
        if {n for n, _ in new.named_parameters(recurse=False)} - {n for n, _ in old.named_parameters(recurse=False)}:
            new.reset_parameters()  # a parameter the original lacks: give it its usual initial values
        new.train(old.training)
        for pname, p in old.named_parameters(recurse=False):
            key = ids[pname]  # the id before any materialization, which ties are known by
            if key in swapped:  # tied to a parameter converted already
                setattr(new, pname, swapped[key])
            else:
                with torch.no_grad():
                    getattr(new, pname).copy_(p)
                getattr(new, pname).requires_grad_(p.requires_grad)
                swapped[key] = getattr(new, pname)
        if meta:
            old.to_empty(device="meta", recurse=False)  # drop the dense copy now, not when the loop ends
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
    for m in model.modules():
        if is_gpt2_attention(m):
            patch_gpt2_attention(m)
    # Hugging Face keeps a key/value cache during training too unless told otherwise; a cache needs dense keys
    # and values (host waits) and is of no use to training. Generation still works without it.
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "use_cache", False):
        cfg.use_cache = False
    # Embeddings left as torch code get their indices checked first, because an out-of-range index on a GPU is
    # a device-side assert that poisons the CUDA context (StarPU's included) instead of an error.
    for name, m in model.named_modules():
        if type(m) is nn.Embedding and not getattr(m, "_nntile_checked", False):
            m.register_forward_pre_hook(_index_check(name or "embedding"))
            m._nntile_checked = True
    if plan is not None:
        plan.apply(model)
    return model


def _home_device(init_device):
    if init_device is not None:
        return torch.device(init_device)
    from .runtime import info
    cuda = torch.cuda.is_available() and (info().get("workers") or {}).get("cuda", 0) > 0
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def _check_meta(model, plan, init):
    """Before anything changes: every meta tensor must belong to a module convert() swaps (or be tied to one),
    and each such module must have a way to get values."""
    swapped = {id(m) for _, _, m in plan}
    covered = {id(p) for _, _, m in plan for p in m.parameters(recurse=False)}
    left = []
    for name, m in model.named_modules():
        tensors = [] if id(m) in swapped else list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
        left += [f"{name}.{n}" if name else n for n, t in tensors if t.is_meta and id(t) not in covered]
    if left:
        raise ValueError("convert() materializes only the modules it swaps; still on the meta device: "
                         f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''} (build those modules on a real "
                         "device, or give them values before convert())")
    if init is None:
        for parent, cname, m in plan:
            if any(p.is_meta for p in m.parameters(recurse=False)) and not hasattr(m, "reset_parameters"):
                raise TypeError(f"convert(): {type(parent).__name__}.{cname} ({type(m).__name__}) is on the meta "
                                "device and has no reset_parameters(); pass init= (for Hugging Face models: "
                                "init=model._init_weights)")


def _materialize(old, init, device):
    """Empty dense parameters on `device` for a meta module, filled by init(old) or old.reset_parameters()."""
    old.to_empty(device=device, recurse=False)
    with torch.no_grad():
        if init is not None:
            init(old)
        else:
            old.reset_parameters()


def _index_check(name):
    def hook(module, args):
        check_indices(args[0], module.num_embeddings, name)
    return hook


def _dense_state_dict(module, state_dict, prefix, local_metadata):
    for name, p in module.named_parameters(recurse=False):
        if isinstance(p, TileTensor) and isinstance(state_dict.get(prefix + name), TileTensor):
            state_dict[prefix + name] = p.materialize().clone()
