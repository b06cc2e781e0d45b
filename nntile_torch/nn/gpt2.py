"""Hugging Face GPT-2 attention as tile tasks: convert() rebinds each GPT2Attention's forward to this one, which
keeps the module (its class, children and state_dict keys) and runs attention as tile tasks whatever the
configured attn_implementation ("eager", "sdpa", the default): causal, or with the 4-d mask Hugging Face builds
from a padding attention_mask (boolean for sdpa, additive float for eager; causality included), with attn_pdrop's
dropout on the probabilities in training (inside the tasks). Generation's key/value cache (Hugging Face's
DynamicCache, as generate() makes it) is kept in tiles: each layer's cache entry holds the qkv rows of every position
so far as one tile tensor, grown by row gather tasks (_cached_forward). What it does not cover (other caches,
cross-attention, returned attention weights, masks that differ per head) runs the original forward, recorded as a
dense fallback (convert_report; strict mode raises)."""
import types

import torch
import torch.nn.functional as F

from .. import _C
from ..costs import Costs, register_form, residual_block
from ..functional import (CausalAttentionFunction, attention_mask_tiles, attention_tiles_ok, dropout_seed,
                          gather_rows)
from ..report import note_dense
from ..tensor import TileTensor, plain, without_torch_function
from .linear import Conv1D
from .norm_act import GELU


def is_gpt2_attention(m):
    return type(m).__name__ == "GPT2Attention" and all(
        hasattr(m, a) for a in ("c_attn", "c_proj", "split_size", "num_heads", "head_dim", "scaling"))


class _TiledForward:
    """A patched GPT2Attention's forward (bound to it by types.MethodType, so it holds no reference to the module):
    tile tasks where covered, else `original`, the forward it had, as a function of the module (a deepcopy of the
    module, whose bound forward is rebound to the copy, then falls back to its own)."""

    def __init__(self, original):
        self.original = original

    def __call__(self, module, *args, **kwargs):
        return _forward(module, self.original, *args, **kwargs)


def patch_gpt2_attention(m):
    forward = m.forward
    if isinstance(getattr(forward, "__func__", None), _TiledForward):
        return  # convert() of a converted model
    if getattr(forward, "__self__", None) is m:
        original = forward.__func__
    else:  # a forward already set on the instance (another library's wrapper): called as it is

        def original(module, *args, _forward=forward, **kwargs):
            return _forward(*args, **kwargs)
    m.forward = types.MethodType(_TiledForward(original), m)


def _uncovered(self, past_key_values, attention_mask, encoder_hidden_states, output_attentions, kwargs):
    """Why this call cannot run as tile tasks, or None."""
    if past_key_values is None and kwargs.get("use_cache", False):
        return "key/value cache"
    if past_key_values is not None:
        why = _cache_uncovered(self, past_key_values)
        if why is not None:
            return why
    if encoder_hidden_states is not None or getattr(self, "is_cross_attention", False):
        return "cross-attention"
    if output_attentions:
        return "output_attentions=True"
    if not isinstance(self.c_attn, Conv1D):
        return "c_attn not converted"
    if attention_mask is not None and not torch.is_tensor(attention_mask):
        return f"attention mask of type {type(attention_mask).__name__}"
    return None


def _forward(self, original, hidden_states, past_key_values=None, attention_mask=None, encoder_hidden_states=None,
             encoder_attention_mask=None, output_attentions=False, **kwargs):
    why = _uncovered(self, past_key_values, attention_mask, encoder_hidden_states, output_attentions, kwargs)
    if why is None and past_key_values is not None:
        out = _cached_forward(self, hidden_states, attention_mask, past_key_values.layers[self.layer_idx])
        if not isinstance(out, str):
            return out
        why = out
    elif why is None:
        out = _covered_forward(self, hidden_states, attention_mask)
        if out is not None:
            return out
        why = "attention mask that differs per head"
    note_dense("attention", why)
    return original(self, hidden_states, past_key_values=past_key_values, attention_mask=attention_mask,
                    encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask,
                    output_attentions=output_attentions, **kwargs)


@without_torch_function
def _covered_forward(self, hidden_states, attention_mask):
    qkv = self.c_attn(hidden_states)  # (B, T, 3C)
    b, t, _ = qkv.shape
    # The attention kernel runs in the precision of the layer feeding it (bf16 as torch under bf16 autocast).
    bf16 = self.c_attn.precision == "bf16"
    dropout_p = float(getattr(self.attn_dropout, "p", 0.0)) if self.training else 0.0
    if attention_tiles_ok(qkv):
        mask = None
        if attention_mask is not None:
            mask = attention_mask_tiles(attention_mask, b, t, qkv.tiles.tile_shape[0], qkv.device)
            if mask is None:
                return None
        y = CausalAttentionFunction.apply(qkv, self.num_heads, float(self.scaling), bf16, mask, dropout_p,
                                          dropout_seed() if dropout_p > 0.0 else 0)
    else:  # tiles that do not hold whole rows and sequences: torch's fused attention on the dense values
        note_dense("attention", f"qkv tiles {tuple(qkv.tiles.tile_shape)} do not hold whole rows and sequences "
                                f"of {t} (tile_size >= 3 x width, batch_tile_size a multiple of the sequence length)")
        q, k, v = (z.reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)
                   for z in qkv.split(self.split_size, dim=2))
        if attention_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, dropout_p=dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.scaling,
                                               dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(b, t, -1)
    out = self.resid_dropout(self.c_proj(y))
    return out, None


# --- generation's key/value cache in tiles ------------------------------------------------------------------------
# Hugging Face's DynamicLayer keeps keys and values (B, H, T, D) and concatenates each step's onto them (torch.cat).
# Here a layer's entry holds instead the qkv rows (B * T, 3C) of every position so far as one tile tensor in tiles of
# whole sequences (`_nntile_qkv`); its keys and values are views of those tiles, so that the cache's length
# (get_seq_length), the masks Hugging Face builds from it, and any torch code that reads them (materialized) work
# unchanged. A step's new rows are added by row gather tasks (the old rows and the new ones, each gathered into the
# grown tiling, summed), then causal attention runs over the whole grown sequence (the attention kernel takes
# queries and keys of one length) and the new positions' output rows are gathered for c_proj. So the projections, MLP
# and norms run on the new positions only, as with Hugging Face's cache, while attention is recomputed for every
# position (T^2 instead of T per step): a kernel with fewer queries than keys would remove that.

def _cache_uncovered(self, cache):
    """Why a call with this cache cannot keep it in tiles, or None."""
    if type(cache).__name__ != "DynamicCache" or self.layer_idx is None or self.layer_idx >= len(cache.layers):
        return f"key/value cache of type {type(cache).__name__}"
    layer = cache.layers[self.layer_idx]
    if type(layer).__name__ != "DynamicLayer":
        return f"key/value cache layer of type {type(layer).__name__}"
    if getattr(layer, "is_initialized", False) and layer.get_seq_length() > 0 and _tile_cache(layer) is None:
        return "key/value cache holding dense tensors (filled outside nntile, or changed since: crop, beam reorder)"
    if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
        return "key/value cache with gradients"
    if self.training and float(getattr(self.attn_dropout, "p", 0.0)) > 0.0:
        return "key/value cache with attention dropout in training"
    return None


def _tile_cache(layer):
    """The qkv tiles (B, T, 3C) a cache layer holds, if its keys and values are still the views this module left."""
    qkv = getattr(layer, "_nntile_qkv", None)
    if qkv is None or layer.keys is not layer._nntile_kv[0] or layer.values is not layer._nntile_kv[1]:
        return None
    return qkv


_square_mask_cache = [None]  # (Hugging Face's mask, its version, the square mask): one mask for all layers


def _square_mask(mask, total):
    """Hugging Face's mask for the new queries, (B, 1, Tn, T) (or one broadcasting to it), as the (B, 1, T, T) mask of
    every query of the grown sequence: causal rows above the new ones (their outputs are not used; causal so that no
    row is empty), Hugging Face's own rows for the new ones."""
    cached = _square_mask_cache[0]
    if cached is not None and cached[0] is mask and cached[1] == mask._version and cached[2].shape[-1] == total:
        return cached[2]
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() <= 4 else mask
    if m.dim() != 4 or m.shape[1] != 1 or m.shape[-1] != total or m.shape[-2] > total:
        return None
    tn = m.shape[-2]
    causal = torch.ones(total - tn, total, dtype=torch.bool, device=m.device).tril_()
    if m.dtype != torch.bool:
        causal = torch.zeros(causal.shape, dtype=m.dtype, device=m.device).masked_fill_(~causal,
                                                                                          torch.finfo(m.dtype).min)
    square = torch.cat([causal.expand(m.shape[0], 1, total - tn, total), m], dim=2)
    _square_mask_cache[0] = (mask, mask._version, square)
    return square


@without_torch_function
def _cached_forward(self, hidden_states, attention_mask, layer):
    """Attention of the new positions hidden_states (B, Tn, C) over the cached ones and themselves, the cache layer
    grown in tiles. Returns (output, None), or why it cannot (a string: the caller falls back)."""
    qkv = self.c_attn(hidden_states)  # (B, Tn, 3C)
    if not plain(qkv) or qkv.dim() != 3 or len(qkv.tiles.shape) != 2 or qkv.tiles.grid[1] != 1:
        return f"key/value cache with qkv tiles {tuple(qkv.tiles.tile_shape)} that do not hold whole rows"
    b, tn, c3 = qkv.shape
    c = c3 // 3
    old = _tile_cache(layer)
    past = 0 if old is None else old.shape[1]
    total = past + tn
    # Row tiles of whole sequences of the grown length, about as many rows as the layer's activation tiles.
    row_tile = total * max(1, min(b, self.c_attn.batch_tile_size // total))
    pos = torch.arange(total)
    seq = torch.arange(b).reshape(b, 1)
    new_rows = torch.where(pos >= past, seq * tn + pos - past, -1)  # row of qkv for each (sequence, position)
    grown = gather_rows(qkv.tiles, new_rows.reshape(-1), row_tile, name="kv_cache.qkv")
    if old is not None:
        old_rows = torch.where(pos < past, seq * past + pos, -1)
        _C.add(1.0, gather_rows(old.tiles, old_rows.reshape(-1), row_tile, name="kv_cache.old"), 1.0, grown)
    grown = TileTensor(grown, (b, total, c3), qkv.device)
    mask = None
    if attention_mask is not None:
        square = _square_mask(attention_mask, total)
        mask = None if square is None else attention_mask_tiles(square, b, total, row_tile, qkv.device)
        if mask is None:
            return "key/value cache with an attention mask that differs per head"
    bf16 = self.c_attn.precision == "bf16"
    y = CausalAttentionFunction.apply(grown, self.num_heads, float(self.scaling), bf16, mask, 0.0, 0)  # (B, T, C)
    new_out = (seq * total + past + torch.arange(tn)).reshape(-1)  # the new positions' rows of y
    y = TileTensor(gather_rows(y.tiles, new_out, self.c_proj.batch_tile_size, name="kv_cache.y"), (b, tn, c),
                   qkv.device)
    # The cache layer: the grown qkv tiles, and keys and values (B, H, T, D) as views of them.
    k, v = (z.reshape(b, total, self.num_heads, self.head_dim).transpose(1, 2) for z in grown.split(c, dim=2)[1:])
    if not getattr(layer, "is_initialized", False):
        layer.dtype, layer.device, layer.is_initialized = k.dtype, k.device, True
    layer.keys, layer.values, layer._nntile_qkv, layer._nntile_kv = k, v, grown, (k, v)
    return self.resid_dropout(self.c_proj(y)), None


# GPT-2's block form for the memory plan (nntile_torch/costs.py): its layer norms and projections describe
# themselves (LayerNorm, Conv1D); what is GPT-2's own is described here.

def attention_costs(width, seq):
    """Causal attention over `width` features (heads side by side), beside its projections, per token: it keeps qkv
    (float32, 3 x width) and its output for the backward, whose gradient of qkv it makes; QK^T and PV are 2 x 2 x
    width x seq forward FLOPs per token (the causal half not subtracted: the kernels' work is counted as measured)."""
    return Costs(kept=12 * width + 4 * width, backward=12 * width, attention_flops=4 * width * seq)


def _out_features(linear):
    return getattr(linear, "out_features", None) or linear.weight.shape[1]  # transformers' Conv1D: (in, out)


register_form(lambda m: type(m).__name__ == "GPT2Block" and hasattr(m, "attn"),
              lambda m, precision, seq: residual_block(m.attn.split_size))
register_form(is_gpt2_attention, lambda m, precision, seq: attention_costs(m.split_size, seq))
register_form(lambda m: type(m).__name__ == "GPT2MLP" and hasattr(m, "c_fc"),
              lambda m, precision, seq: GELU.costs_at(_out_features(m.c_fc)))  # its activation, over the inner width
