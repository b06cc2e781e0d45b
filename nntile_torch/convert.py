"""convert(): turns, in place, what a model computes into tile tasks, keeping parameter names, shapes, state_dict
keys and weight ties, and says what it could not (convert_report, strict mode).

Recognized by what modules compute, not by a list of classes:
- matmuls: torch.nn.Linear -> nntile_torch.nn.Linear, transformers' Conv1D (GPT-2) -> nntile_torch.nn.Conv1D;
- layer norms: nn.LayerNorm (last dim, bias or not) -> nntile_torch.nn.LayerNorm; any other module whose forward
  is F.layer_norm of its input with its own weight and optional bias (nanoGPT's LayerNorm) keeps its class and
  gets tiled parameters: its F.layer_norm call then runs as tile tasks (TileTensor.__torch_function__);
- RMSNorm (torch.nn.RMSNorm, Hugging Face's LlamaRMSNorm and its copies in Mistral and Qwen2: any module whose only
  parameter is a weight and whose forward is weight * (x * rsqrt(mean(x^2) + eps)), checked on probes) ->
  nntile_torch.nn.RMSNorm;
- GELU in every form (nn.GELU, F.gelu in a module, the tanh formula written out: Hugging Face's
  NewGELUActivation, nanoGPT's new_gelu), found by running the module on a probe -> nntile_torch.nn.GELU;
- nn.Embedding (default options, width within a tile; token or position table, tied to a converted linear layer
  or not) -> nntile_torch.nn.Embedding; nn.Dropout -> nntile_torch.nn.Dropout (p = 0 included: code reading
  .p, as Hugging Face's attention does, still finds it);
- attention: F.scaled_dot_product_attention on q, k, v split from one tiled matrix (nanoGPT's, Hugging Face's
  sdpa) runs as tile tasks wherever it is called; Hugging Face's GPT2Attention keeps its module and runs
  attention as tile tasks for every attn_implementation, padding masks included (nntile_torch/nn/gpt2.py); a module
  whose forward is qkv Linear -> split into heads -> causal SDPA -> projection Linear -> dropouts (nanoGPT's
  CausalSelfAttention; found by a probe) keeps its module and submits that without its view ops
  (nntile_torch/nn/sdpa_attention.py);
- the Llama family's attention (Llama's, Mistral's, Qwen2's: q, k, v projections, rotary position embeddings from
  the model's rotary module, grouped-query causal or masked attention, o projection; found by structure and a probe)
  keeps its module and runs as tile tasks; so do gated MLPs (down(silu(gate(x)) * up(x)), found the same way):
  silu(gate) * up is one tile task per tile (nntile_torch/nn/llama.py);
- functions called inline on tiles: F.gelu, F.layer_norm, F.dropout, F.embedding, F.cross_entropy (functional.py).
Everything else runs as torch code on materialized TileTensors: correct, with host waits. convert_report(model)
lists it; strict=True raises instead (report.py).
"""
import gc
import sys

import torch
from torch import nn
from tqdm import tqdm

from . import config
from .nn import GELU, Conv1D, Dropout, Embedding, LayerNorm, Linear, RMSNorm
from .nn.embedding import check_indices_now
from .nn._init import no_init
from .nn.gpt2 import is_gpt2_attention, patch_gpt2_attention
from .nn.sdpa_attention import patch_sdpa_attention, sdpa_attention_form
from .nn.llama import is_gated_silu_mlp, is_llama_attention, patch_gated_mlp, patch_llama_attention
from .owners import module_record
from .param import param_state
from .recognize import gelu_like, layer_norm_like, rmsnorm_like
from .report import ConvertReport, register
from .runtime import ensure_init, info, is_running
from .tensor import TileTensor

# Modules without parameters that need no tile version: they only pass tiles on or hold others.
_PASSIVE = (nn.Identity, nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList, nn.ParameterDict)


def _is_hf_conv1d(m):
    # transformers.pytorch_utils.Conv1D, recognized without importing transformers.
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "weight") and m.weight.dim() == 2


def _check_dense_float32(name, m):
    for pname, p in m.named_parameters(recurse=False):
        if p.dtype != torch.float32:
            raise TypeError(f"convert() keeps float32 master weights; {name}.{pname} is {p.dtype} "
                            "(load the model in float32 and pick precision='bf16' for bf16 matmuls)")


def _kind(m, tile_size):
    """How convert() handles module m: ("swap", what) for a tile-task module in its place, ("tile", (C, eps,
    bias)) for a layer norm kept with tiled parameters, ("dense", why) for one left as torch code, or None (a
    container, or a module with nothing to convert)."""
    if type(m) is nn.Linear or _is_hf_conv1d(m):
        return "swap", "matmul"
    if type(m) is nn.LayerNorm:
        if len(m.normalized_shape) == 1 and m.weight is not None:
            return "swap", "layer_norm"
        return "dense", "LayerNorm over several dims or without elementwise_affine"
    if type(m) is nn.Embedding:
        # Tables tied to a converted linear layer (GPT-2's token embedding and LM head) add their gradient to
        # the linear layer's as tiles; untied ones (GPT-2's positions) broadcast over the batch as block tasks.
        if m.padding_idx is not None or m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
            return "dense", "Embedding with padding_idx, max_norm, scale_grad_by_freq or sparse"
        tile = tile_size or config.DEFAULT_TILE_SIZE
        if m.embedding_dim > tile:
            return "dense", f"embedding_dim {m.embedding_dim} wider than a tile ({tile})"
        return "swap", "embedding"
    if type(m) is nn.Dropout:
        return "swap", "dropout"  # p = 0: exactly the identity; else tile dropout (torch's would materialize)
    if type(m) is nn.GELU:
        return "swap", ("gelu", m.approximate)
    if isinstance(m, _PASSIVE) or is_gpt2_attention(m):
        return None
    if next(iter(m.children()), None) is not None:
        return None  # a container: its own code's ops on tiles are checked as it runs
    ln = layer_norm_like(m)
    if ln is not None:
        return "tile", ln
    rms = rmsnorm_like(m)
    if rms is not None:
        return "swap", ("rmsnorm",) + rms
    approximate = gelu_like(m)
    if approximate is not None:
        return "swap", ("gelu", approximate)
    if next(iter(m.parameters(recurse=False)), None) is not None:
        return "dense", f"no tile version of {type(m).__name__} (its parameters stay dense)"
    # Without parameters (an activation other than GELU, a softmax, ...): dense only if it meets tiles, which the
    # running model reports (and strict mode raises there); it may well see dense tensors alone (masks, ids).
    return None


def _model_width(model):
    """The widest layer norm's or RMSNorm's width (a GPT-2's or Llama's hidden size), or None: what the default
    weight tile is made from."""
    widths = []
    for m in model.modules():
        if type(m) is nn.LayerNorm:
            if len(m.normalized_shape) == 1:
                widths.append(m.normalized_shape[0])
            continue
        params = dict(m.named_parameters(recurse=False))
        w = params.get("weight")
        if w is not None and w.dim() == 1 and set(params) <= {"weight", "bias"} \
                and next(iter(m.children()), None) is None:
            ln = layer_norm_like(m)  # a forward on two rows: only for modules shaped like one
            if ln is not None:
                widths.append(ln[0])
            elif set(params) == {"weight"} and rmsnorm_like(m) is not None:
                widths.append(w.shape[0])
    return max(widths) if widths else None


def default_tile_size(model, plan=None):
    """convert()'s weight tile edge when none is given: config.weight_tile of the model's width (3 x width, 4 x width
    on GPUs when no memory plan streams it), so that layer norm rows and attention's q, k, v rows sit in one tile
    and stay tile tasks; config.DEFAULT_TILE_SIZE for a model without layer norms."""
    width = _model_width(model)
    if width is None:
        return config.DEFAULT_TILE_SIZE
    return config.weight_tile(width, _cuda_workers(), plan is not None and plan.beyond_gpu)


def _cuda_workers():
    """Whether the runtime has CUDA workers (where the tile tasks then run)."""
    return (info().get("workers") or {}).get("cuda", 0) > 0


def _swap(m, what, kw, home=None):
    tiles = dict(tile_size=kw["tile_size"], batch_tile_size=kw["batch_tile_size"])
    dev = home if home is not None else getattr(getattr(m, "weight", None), "device", None)
    if type(m) is nn.Linear:
        return Linear(m.in_features, m.out_features, bias=m.bias is not None, device=dev, **kw)
    if _is_hf_conv1d(m):
        return Conv1D(m.nf, m.weight.shape[0], device=dev, **kw)
    if type(m) is nn.LayerNorm:
        return LayerNorm(m.normalized_shape, eps=m.eps, bias=m.bias is not None, device=dev,
                         batch_tile_size=kw["batch_tile_size"])
    if type(m) is nn.Dropout:
        return Dropout(m.p, inplace=m.inplace, **tiles)
    if type(m) is nn.Embedding:
        return Embedding(m.num_embeddings, m.embedding_dim, device=dev, **tiles)
    if what[0] == "rmsnorm":
        return RMSNorm(what[1], eps=what[2], device=dev, batch_tile_size=kw["batch_tile_size"])
    return GELU(what[1], **tiles)


def convert(model, precision=None, tile_size=None, batch_tile_size=None, init=None, init_device=None,
            progress=None, strict=False, plan=None):
    """Turns, in place, what model computes into tile tasks (see the module docstring) and returns model.
    Parameters keep their names, shapes, values, requires_grad and ties (a weight shared by several modules,
    such as GPT-2's token embedding and LM head, stays one Parameter).

    precision: "fp32" (exact, the default without a plan), "tf32" or "bf16" for the matmuls (a plan's by default); tile_size / batch_tile_size: tile edges in
    elements (tile_size by default from the model's width, default_tile_size(); batch_tile_size in
    nntile_torch.config).

    strict: raise (DenseFallbackError) instead of running any part of the model as dense torch code: modules
    without a tile version are named here, before anything changes; torch ops that would run on materialized
    tiles while the model runs are named where they happen (module and op). Without it, convert() and the
    model warn once per kind, naming them. nt.convert_report(model) lists what was swapped, tiled, patched and
    left dense, and why.

    A model built on the meta device (``with torch.device("meta"): model = ...``) is materialized one module
    at a time, so the dense model never exists whole (a 20B model is 80 GB of float32): each swapped module
    gets empty dense parameters on init_device (default: the current GPU when nntile runs GPU workers, else
    the CPU), init(module) fills them (default: the module's own reset_parameters(); for Hugging Face models
    pass init=model._init_weights), they are copied into tiles and dropped. The tiles' home device (where
    inputs and materialized copies go) is then init_device. Parameters of modules convert() does not swap
    must not be on the meta device (the error names them).

    plan: a memory plan (nt.plan(model, batch, seq, precision)) whose checkpointing and streaming hooks are put on
    the converted model (docs/memory_plan.md); its precision must be this one. A runtime not yet running is started
    with the plan's settings (plan.init()). plan.apply(model, ...) is this call.

    progress: a progress bar over the modules on stderr (a 20B model on meta takes ~100 s); None shows it for
    models of 1B parameters or more when stderr is a terminal.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert() takes a torch.nn.Module (got {type(model).__name__})")
    if precision is None:
        precision = plan.precision if plan is not None else "fp32"
    config.check_precision(precision)
    config.check_tile(tile_size, "tile_size")
    config.check_tile(batch_tile_size, "batch_tile_size")
    if plan is not None and plan.precision != precision:
        raise ValueError(f"convert(precision={precision!r}) differs from the plan's precision {plan.precision!r}")
    if plan is not None and not is_running():
        plan.init()  # its limits, workers and window: nt.init's defaults would not be what the plan counted on
    ensure_init()
    if tile_size is None:
        tile_size = default_tile_size(model, plan)
    kw = dict(tile_size=tile_size, batch_tile_size=batch_tile_size, precision=precision)
    report = ConvertReport(strict)
    swapped = {}  # id(old parameter) -> new parameter
    swaps, tile_plan, dense = [], [], []
    seen = set()
    for name, m in model.named_modules():
        for cname, child in m.named_children():
            full = f"{name}.{cname}" if name else cname
            if id(child) in seen:
                continue
            seen.add(id(child))
            kind = _kind(child, tile_size)
            if kind is None:
                continue
            if kind[0] == "swap":
                _check_dense_float32(full, child)
                swaps.append((m, cname, child, kind[1], full))
            elif kind[0] == "tile":
                tile_plan.append((full, child, kind[1]))
            else:
                dense.append((full, child, kind[1]))
    gated_mlps = [(name, m) for name, m in model.named_modules() if is_gated_silu_mlp(m)]  # probed while dense
    llama_attention = [(name, m) for name, m in model.named_modules() if is_llama_attention(m)]
    sdpa_attentions = [(name, m, f) for name, m in model.named_modules() if (f := sdpa_attention_form(m)) is not None]
    covered = {id(p) for _, _, c, _, _ in swaps for p in c.parameters(recurse=False)}
    covered |= {id(p) for _, c, _ in tile_plan for p in c.parameters(recurse=False)}
    # Modules left dense whose parameters are all tied to converted ones share the tiles: nothing stays dense.
    for full, child, why in dense:
        own = list(child.parameters(recurse=False))
        if own and all(id(p) in covered for p in own):
            continue
        report.dense.append((full, type(child).__name__, why))
    for name, m in model.named_modules():
        if not name and next(iter(m.parameters(recurse=False)), None) is not None \
                and not any(m is c for _, _, c, _, _ in swaps) and not any(m is c for _, c, _ in tile_plan):
            if any(id(p) not in covered for p in m.parameters(recurse=False)):
                report.dense.append(("", type(m).__name__, "parameters of the model itself stay dense"))
    if strict:
        report.check()  # before anything changes
    _check_meta(model, swaps, tile_plan, init)
    _check_fits(model, swaps, tile_plan)
    meta_plan = any(p.is_meta for _, _, m, _, _ in swaps for p in m.parameters(recurse=False)) or any(
        p.is_meta for _, m, _ in tile_plan for p in m.parameters(recurse=False))
    home = _home_device(init_device) if meta_plan else None  # only meta modules need one
    keep = []
    bf16_masters = set(plan.bf16_master_parameter_names()) if plan is not None else set()
    if progress is None:
        progress = sys.stderr.isatty() and sum(p.numel() for p in model.parameters()) >= 10**9
    for parent, cname, old, what, full in tqdm(swaps, desc="nntile_torch.convert", unit="module",
                                               disable=not progress, file=sys.stderr, leave=False):
        ids = {pname: id(p) for pname, p in old.named_parameters(recurse=False)}
        keep.extend(old.parameters(recurse=False))  # alive, so their ids stay unique while ties are matched
        meta = any(p.is_meta for p in old.parameters(recurse=False))
        if meta and any(i not in swapped for i in ids.values()):
            _materialize(old, init, home)
            if plan is not None and plan.beyond_gpu:
                # Written from where the plan keeps it: host blocks from host RAM, the rest from the GPU, so that
                # host RAM holds no build-time copy of the GPU's tiles (StarPU 1.3.10 keeps a buffer once written).
                old.to("cpu" if plan.in_host_ram(full) else home)
        with no_init():  # every parameter is written from `old` below
            new = _swap(old, what, kw, home if meta else None)
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
                if f"{full}.{pname}" in bf16_masters:  # the plan keeps it as a bf16 master weight
                    param_state(getattr(new, pname)).keep_bf16_master(on_host=plan.in_host_ram(full))
        if meta:
            old.to_empty(device="meta", recurse=False)  # drop the dense copy now, not when the loop ends
        new.train(old.training)
        setattr(parent, cname, new)
        report.swapped.append((full, type(old).__name__, ("nntile_torch.nn." if type(new).__module__.startswith(
            "nntile_torch") else "") + type(new).__name__))
    for full, m, (c, eps, has_bias) in tile_plan:
        keep.extend(m.parameters(recurse=False))
        _tile_parameters(m, c, swapped, init, home)
        report.tiled.append((full, type(m).__name__, f"layer norm over {c}{'' if has_bias else ', no bias'}, "
                                                     "parameters as tiles, its F.layer_norm as tile tasks"))
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
    for name, m in model.named_modules():
        if is_gpt2_attention(m):
            patch_gpt2_attention(m)
            report.patched.append((name, type(m).__name__, "attention as tile tasks (causal or masked) for every "
                                                           "attn_implementation"))
    for name, m in llama_attention:
        patch_llama_attention(m)
        report.patched.append((name, type(m).__name__, "rotary embeddings and grouped-query attention as tile tasks"))
    for name, m in gated_mlps:
        patch_gated_mlp(m)
        report.patched.append((name, type(m).__name__, "silu(gate) * up as tile tasks"))
    for name, m, form in sdpa_attentions:
        patch_sdpa_attention(m, form)
        report.patched.append((name, type(m).__name__, "qkv, causal attention and projection as tile tasks, without "
                                                       "its view ops"))
    # Hugging Face keeps a key/value cache during training too unless told otherwise; a cache is of no use to
    # training and would keep every layer's keys and values. generate() still makes one (its generation_config's
    # use_cache), kept in tiles (nn/kv_cache.py).
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "use_cache", False):
        cfg.use_cache = False
    # Embeddings left as torch code get their indices checked first, because an out-of-range index on a GPU is
    # a device-side assert that poisons the CUDA context (StarPU's included) instead of an error.
    for name, m in model.named_modules():
        if type(m) is nn.Embedding and not module_record(m).index_checked:
            m.register_forward_pre_hook(_index_check(name or "embedding"))
            module_record(m).index_checked = True
    if plan is not None:
        plan.install(model)
    register(model, report)
    if report.dense and not strict:
        import warnings
        warnings.warn("nntile_torch.convert: these modules run as dense torch code: " + "; ".join(
            f"{n or '(model)'} ({t}: {why})" for n, t, why in report.dense) + " (nt.convert_report(model) says more)",
            stacklevel=2)
    if plan is None:
        _advise_plan(model, precision)
    # Converting leaves many long-lived Python objects (tiles, handles, modules). Python runs a full collection,
    # which scans every object, once enough of them have piled up since the last one: it came in the first training
    # steps, with the submitting thread stopped and the GPU idle (docs/measurements.md, "Garbage collection").
    # Collecting here, where the caller waits anyway, clears that backlog; the steps themselves leave few objects
    # behind, so the next full collection is far off.
    gc.collect()
    return model


def _tile_parameters(m, c, swapped, init, home):
    """A layer norm module kept as it is: its weight and bias become tile parameters (one tile of c each)."""
    own = list(m.parameters(recurse=False))
    # Ties are known by the parameters' ids before materialization (the caller keeps those alive): a materialized
    # parameter dies once its tiles replace it, and a later module's could get its id and pass for tied to it.
    ids = {pname: id(p) for pname, p in m.named_parameters(recurse=False)}
    if any(p.is_meta for p in own) and any(id(p) not in swapped for p in own):
        # A layer norm's usual start (weight 1, bias 0: nanoGPT's LayerNorm has no reset_parameters, and model
        # inits such as its _init_weights skip it), then init or reset_parameters where there is one.
        m.to_empty(device=home, recurse=False)
        with torch.no_grad():
            m.weight.fill_(1.0)
            if getattr(m, "bias", None) is not None:
                m.bias.zero_()
            if init is not None:
                init(m)
            elif hasattr(m, "reset_parameters"):
                m.reset_parameters()
    for pname, p in list(m.named_parameters(recurse=False)):
        if ids[pname] in swapped:
            setattr(m, pname, swapped[ids[pname]])
            continue
        t = nn.Parameter(TileTensor.empty((c,), (c,), p.device, name=pname, persistent=True),
                         requires_grad=p.requires_grad)
        with torch.no_grad():
            t.copy_(p)
        swapped[ids[pname]] = t
        setattr(m, pname, t)
    m._register_state_dict_hook(_dense_state_dict)


def _check_fits(model, swaps, tile_plan):
    """Before anything changes: InsufficientMemoryError when the converted parameters (float32 tiles, ties once)
    and the tiles already live cannot fit in every memory node together (the same check a new tile tensor meets,
    which would otherwise fail midway, with a model half converted)."""
    from . import _C, runtime
    from .plan import InsufficientMemoryError, format_bytes
    if runtime.host_limit() is None:
        return  # host RAM without a limit: the operating system decides
    params = {id(p): p for _, _, m, _, _ in swaps for p in m.parameters(recurse=False)}
    params.update({id(p): p for _, m, _ in tile_plan for p in m.parameters(recurse=False)})
    need = sum(4 * p.numel() for p in params.values() if not isinstance(p, TileTensor))
    live = _C.tile_bytes()
    nodes = runtime.memory_nodes()
    total = sum(n["total_bytes"] for n in nodes)
    if need + live <= total:
        return
    short = need + live - total
    settings = runtime.info().get("settings") or {}
    disk = settings.get("disk_limit") or 0
    raise InsufficientMemoryError(
        f"convert(): the model's {sum(p.numel() for p in params.values()):,} parameters as float32 tiles take "
        f"{format_bytes(need)}" + (f" beside {format_bytes(live)} of tiles already live" if live else "")
        + f", more than every memory node holds together: {format_bytes(total)} (host limit "
        f"{format_bytes(runtime.host_limit())}" + (f", disk node {format_bytes(disk)}" if disk else ", no disk node")
        + "). Nothing was changed. What would make it fit: a host_memory_limit of at least "
        f"{format_bytes(runtime.host_limit() + short)} (nt.init), or a disk node (nt.init(disk_path=..., disk_limit=...)) "
        f"of at least {format_bytes(disk + short)}; training needs more still (optimizer states, activations: "
        "nt.plan(model, batch, seq) says how much)", missing={"host": short},
        fixes=[{"host_memory": runtime.host_limit() + short}, {"disk_limit": disk + short}])


def _advise_plan(model, precision):
    """convert() without a memory plan, on GPUs: a warning when training the converted model with AdamW needs more
    than the GPUs hold for its float32 weights, gradients and two moments alone (16 bytes per parameter, 2 more for
    bf16 matmuls' weight copies). Without a plan StarPU then moves tiles to host RAM as the GPU fills, with no plan of
    what to keep where: Llama 3 8B on an H100 ran 3.1 s per 4 x 1024-token step (64 TFLOP/s), and at 16 sequences
    finished no step in 230 s (benchmarks/results/h100/llama3_8b_v1). nt.plan places the state ahead of time."""
    import warnings
    from .accounting import adamw_state_bytes, format_bytes, machine_capacity
    cap = machine_capacity()
    if not cap.gpus or not cap.gpu_bytes:
        return
    params = {id(p): p for p in model.parameters() if isinstance(p, TileTensor)}
    count = sum(p.numel() for p in params.values())
    need = adamw_state_bytes(count, precision)
    gpu = cap.gpu_bytes * cap.gpus
    if need <= gpu:
        return
    warnings.warn(
        f"nntile_torch.convert: training these {count:,} parameters with AdamW takes {format_bytes(need)} for the "
        f"weights, gradients and moments alone, more than the GPU memory ({format_bytes(gpu)}). Without a memory "
        "plan StarPU moves tiles to host RAM only as the GPU fills, which is slow and can stall. Plan it instead, "
        "from the model as built (before convert): plan = nt.plan(model, batch, seq, precision); "
        "model = plan.apply(model); "
        "opt = plan.optimizer(model.parameters(), lr=...) (docs/memory_plan.md)", stacklevel=3)


def _home_device(init_device):
    if init_device is not None:
        return torch.device(init_device)
    cuda = torch.cuda.is_available() and _cuda_workers()
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def _check_meta(model, plan, tile_plan, init):
    """Before anything changes: every meta tensor must belong to a module convert() swaps or tiles (or be tied to
    one), and each such module must have a way to get values."""
    swapped = {id(m) for _, _, m, _, _ in plan} | {id(m) for _, m, _ in tile_plan}
    covered = {id(p) for _, _, m, _, _ in plan for p in m.parameters(recurse=False)}
    covered |= {id(p) for _, m, _ in tile_plan for p in m.parameters(recurse=False)}
    left = []
    for name, m in model.named_modules():
        tensors = [] if id(m) in swapped else list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
        left += [f"{name}.{n}" if name else n for n, t in tensors if t.is_meta and id(t) not in covered]
    if left:
        raise ValueError("convert() materializes only the modules it swaps; still on the meta device: "
                         f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''} (build those modules on a real "
                         "device, or give them values before convert())")
    if init is None:
        for m in [m for _, _, m, _, _ in plan]:  # tiled-in-place layer norms start at weight 1, bias 0
            if any(p.is_meta for p in m.parameters(recurse=False)) and not hasattr(m, "reset_parameters"):
                name = next(n for n, x in model.named_modules() if x is m)
                raise TypeError(f"convert(): {name} ({type(m).__name__}) is on the meta device and has no "
                                "reset_parameters(); pass init= (for Hugging Face models: init=model._init_weights)")


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
        check_indices_now(args[0], module.num_embeddings, name)
    return hook


def _dense_state_dict(module, state_dict, prefix, local_metadata):
    for name, p in module.named_parameters(recurse=False):
        if isinstance(p, TileTensor) and isinstance(state_dict.get(prefix + name), TileTensor):
            state_dict[prefix + name] = p.materialize().clone()
