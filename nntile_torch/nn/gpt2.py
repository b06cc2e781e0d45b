"""Hugging Face GPT-2 attention as tile tasks: convert() rebinds each GPT2Attention's forward to this one, which
keeps the module (its class, children and state_dict keys) and falls back to the original forward for what it
does not cover (key/value caches, padding masks, cross-attention, attention dropout, returned weights)."""
import types

import torch.nn.functional as F

from ..functional import CausalAttentionFunction, attention_tiles_ok
from ..tensor import without_torch_function
from .linear import Conv1D


def is_gpt2_attention(m):
    return type(m).__name__ == "GPT2Attention" and all(
        hasattr(m, a) for a in ("c_attn", "c_proj", "split_size", "num_heads", "head_dim", "scaling"))


def patch_gpt2_attention(m):
    if getattr(m, "_nntile_original_forward", None) is None:
        m._nntile_original_forward = m.forward
        m.forward = types.MethodType(_forward, m)


def _forward(self, hidden_states, past_key_values=None, attention_mask=None, encoder_hidden_states=None,
             encoder_attention_mask=None, output_attentions=False, **kwargs):
    covered = (past_key_values is None and attention_mask is None and encoder_hidden_states is None
               and not output_attentions and not (self.training and getattr(self.attn_dropout, "p", 0.0) > 0)
               and not getattr(self, "reorder_and_upcast_attn", False) and not getattr(self, "is_cross_attention", False)
               and isinstance(self.c_attn, Conv1D) and not kwargs.get("use_cache", False))
    if not covered:
        return self._nntile_original_forward(hidden_states, past_key_values=past_key_values,
                                             attention_mask=attention_mask,
                                             encoder_hidden_states=encoder_hidden_states,
                                             encoder_attention_mask=encoder_attention_mask,
                                             output_attentions=output_attentions, **kwargs)
    return _covered_forward(self, hidden_states)


@without_torch_function
def _covered_forward(self, hidden_states):
    qkv = self.c_attn(hidden_states)  # (B, T, 3C)
    if attention_tiles_ok(qkv):
        # The attention kernel runs in the precision of the layer feeding it (bf16 as torch under bf16 autocast).
        y = CausalAttentionFunction.apply(qkv, self.num_heads, float(self.scaling), self.c_attn.precision == "bf16")
    else:  # tiles that do not hold whole rows and sequences: torch's fused attention on the dense values
        b, t, _ = qkv.shape
        q, k, v = (z.reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)
                   for z in qkv.split(self.split_size, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        y = y.transpose(1, 2).reshape(b, t, -1)
    out = self.resid_dropout(self.c_proj(y))
    return out, None
