"""Hugging Face GPT-2 attention as tile tasks: convert() rebinds each GPT2Attention's forward to this one, which
keeps the module (its class, children and state_dict keys) and runs attention as tile tasks whatever the
configured attn_implementation ("eager", "sdpa", the default): causal, or with the 4-d mask Hugging Face builds
from a padding attention_mask (boolean for sdpa, additive float for eager; causality included), with attn_pdrop's
dropout on the probabilities in training (inside the tasks). Generation's key/value cache (Hugging Face's
DynamicCache, as generate() makes it) is kept in tiles: each layer's cache entry holds the qkv rows of every position
so far as one tile tensor with room to grow, the new rows written in place (kv_cache.py). What it does not cover
(other caches, cross-attention, returned attention weights, masks that differ per head) runs the original forward,
recorded as a dense fallback (convert_report; strict mode raises)."""
import types

import torch
import torch.nn.functional as F

from ..costs import Costs, register_form, residual_block
from ..functional import (CausalAttentionFunction, apply_tiled, attention_mask_tiles, attention_tiles_ok,
                          dropout_seed)
from ..report import note_dense
from ..tensor import plain, without_torch_function
from . import kv_cache
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
        y = apply_tiled(CausalAttentionFunction, qkv, self.num_heads, float(self.scaling), bf16, mask, dropout_p,
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


# --- generation's key/value cache in tiles (kv_cache.py) -----------------------------------------------------------

def _cache_uncovered(self, cache):
    """Why a call with this cache cannot keep it in tiles, or None."""
    why = kv_cache.cache_uncovered(self, cache)
    if why is None and self.training and float(getattr(self.attn_dropout, "p", 0.0)) > 0.0:
        why = "key/value cache with attention dropout in training"
    return why


@without_torch_function
def _cached_forward(self, hidden_states, attention_mask, layer):
    """Attention of the new positions hidden_states (B, Tn, C) over the cached ones and themselves; the cache layer
    holds the qkv rows (B, T, 3C) of every position so far. Returns (output, None), or why it cannot (a string: the
    caller falls back)."""
    qkv = self.c_attn(hidden_states)  # (B, Tn, 3C)
    if not plain(qkv) or qkv.dim() != 3 or len(qkv.tiles.shape) != 2 or qkv.tiles.grid[1] != 1:
        return f"key/value cache with qkv tiles {tuple(qkv.tiles.tile_shape)} that do not hold whole rows"
    b, tn, c3 = qkv.shape
    c = c3 // 3
    (stored,), total, room = kv_cache.append(layer, [qkv.tiles], b, tn, self.c_attn.batch_tile_size, qkv.device,
                                             ["qkv"])
    bf16 = self.c_attn.precision == "bf16"
    y = kv_cache.attend(qkv.tiles, 0, stored.tiles, c, None, 2 * c, attention_mask, b, tn, total, room,
                        self.num_heads, self.num_heads, self.head_dim, float(self.scaling), bf16, qkv.device,
                        self.c_proj.batch_tile_size)
    if isinstance(y, str):
        return y
    k, v = (kv_cache.heads_view(stored, total, self.num_heads, self.head_dim, col) for col in (c, 2 * c))
    kv_cache.store(layer, [stored], total, k, v)
    return self.resid_dropout(self.c_proj(y)), None


# GPT-2's block form for the memory plan (nntile_torch/costs.py): its layer norms and projections describe
# themselves (LayerNorm, Conv1D); what is GPT-2's own is described here.

def attention_costs(width, seq, heads=0):
    """Causal attention over `width` features (heads side by side), beside its projections, per token: it keeps qkv
    (float32, 3 x width), its output and a softmax log-sum-exp per head for the backward, whose gradient of qkv it
    makes; QK^T and PV are 2 x 2 x width x seq forward FLOPs per token (the causal half not subtracted: the kernels'
    work is counted as measured)."""
    return Costs(kept=12 * width + 4 * width + 4 * heads, backward=12 * width, attention_flops=4 * width * seq)


def _out_features(linear):
    return getattr(linear, "out_features", None) or linear.weight.shape[1]  # transformers' Conv1D: (in, out)


register_form(lambda m: type(m).__name__ == "GPT2Block" and hasattr(m, "attn"),
              lambda m, precision, seq: residual_block(m.attn.split_size))
register_form(is_gpt2_attention, lambda m, precision, seq: attention_costs(m.split_size, seq, m.num_heads))
register_form(lambda m: type(m).__name__ == "GPT2MLP" and hasattr(m, "c_fc"),
              lambda m, precision, seq: GELU.costs_at(_out_features(m.c_fc)))  # its activation, over the inner width
