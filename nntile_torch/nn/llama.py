"""Hugging Face's Llama family (Llama, Mistral, Qwen2): attention and the gated MLP as tile tasks, and the forms for the
memory plan (nntile_torch/costs.py).
- Attention: convert() rebinds the attention's forward (keeping the module, its children and state_dict keys): q, k
  and v projections (Qwen2's biases included), rotary position embeddings on q and k with the cos and sin the
  model's own rotary module computed for this forward (Llama 3's frequency scaling and attention_scaling are in
  them; copied into tiles once per forward), grouped-query causal attention (k/v heads repeated inside the task),
  the o projection: no dense step. Recognized by structure and a probe of what it computes, not by class names.
  Generation's key/value cache (Hugging Face's DynamicCache) is kept in tiles: k and v after the rotary embedding,
  with room to grow, the new rows written in place (kv_cache.py). Attention dropout in training
  (attention_dropout > 0) runs inside the attention task, its keep mask nntile's hash of the global positions, as
  GPT-2's. Other caches (sliding windows, a cache holding dense tensors, a cache in training with attention
  dropout), returned attention weights, other attention implementations than sdpa and eager, masks per head, and
  tilings whose tiles do not hold whole rows and sequences run as torch code (recorded: convert_report; strict mode
  raises).
- The gated MLP: its forward becomes down(silu_mul(gate(x), up(x))), the elementwise step one task per tile.
Their linear layers (q, k, v, o, gate, up, down, the untied head) and RMSNorms describe themselves to the plan; what
is the family's own is described here:
- the decoder layer: a residual block (its input kept under checkpointing, the residual stream's gradient);
- grouped-query attention: q of `width` features, k and v of kv_width = kv_heads x head_dim each;
- the gated MLP, down(silu(gate(x)) * up(x)): the two products over the inner width it keeps for its backward."""
import types

import torch

from .. import config
from ..costs import Costs, register_form, residual_block
from ..functional import apply_tiled, attention_mask_tiles, dropout_seed
from ..functional_llama import GQAttentionFunction, RopeFunction, SiluMulFunction, rope_tiles
from ..report import note_dense
from ..tensor import TileTensor, plain, without_torch_function
from . import kv_cache

F = torch.nn.functional


def _shared_input(width, precision):
    """Bytes per token that projections reading one input count twice: in fp32 and tf32 each keeps the same
    float32 tiles (Linear's costs count them once per projection); in bf16 each makes its own bf16 copy."""
    return 0 if precision == "bf16" else 4 * width


def gqa_attention_costs(width, kv_width, seq, hidden=None, precision="fp32", heads=0):
    """Causal grouped-query attention beside its projections, per token: it keeps q and k after the rotary embedding and
    v (float32, width + 2 x kv_width) for the backward, which makes their gradients (the k/v heads are repeated for
    the fused kernel inside its tasks only, nothing kept), its output and a softmax log-sum-exp per query head
    (float32: the backward reads them instead of recomputing the forward); the output is also the o projection's
    input, the same tiles in fp32 and tf32, in bf16 beside that Linear's bf16 copy. QK^T and PV are 2 x 2 x width x
    seq forward FLOPs per token over the query heads (the causal half not subtracted, as GPT-2's attention_costs).
    The k and v projections keep the q projection's input (`hidden` wide): taken back here. The rotary embedding
    reads q and k and writes them again (elementwise)."""
    qkv = 4 * (width + 2 * kv_width)
    shared = 2 * _shared_input(hidden or width, precision)
    out = 4 * width if precision == "bf16" else 0
    return Costs(kept=qkv - shared + out + 4 * heads, backward=qkv, attention_flops=4 * width * seq,
                 elementwise=8 * (width + kv_width))


def gated_mlp_costs(inner, hidden=None, precision="fp32"):
    """silu(gate) * up over the inner width, per token: it keeps both products (float32, 2 x inner) for its
    backward, which makes both their gradients; the down projection keeps its own input (Linear's costs), the up
    projection the gate's (`hidden` wide, taken back here). silu_mul reads two values and writes one (elementwise)."""
    shared = _shared_input(hidden, precision) if hidden else 0
    return Costs(kept=8 * inner - shared, backward=8 * inner, elementwise=12 * inner)


def _is_llama_attention(m):
    return all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "num_key_value_groups"))


def _is_gated_mlp(m):
    return all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def _is_llama_block(m):
    return all(hasattr(m, a) for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"))


def _attention(m, precision, seq):
    out, hidden = m.q_proj.weight.shape  # (out, in) as torch's Linear
    return gqa_attention_costs(out, m.k_proj.weight.shape[0], seq, hidden, precision, out // m.head_dim)


register_form(_is_llama_block, lambda m, precision, seq: residual_block(m.input_layernorm.weight.shape[0]))
register_form(_is_llama_attention, _attention)
register_form(_is_gated_mlp, lambda m, precision, seq: gated_mlp_costs(*m.gate_proj.weight.shape, precision))


def silu_like(m):
    """Whether m (no parameters or buffers) computes SiLU, x * sigmoid(x), on a probe input to float32 rounding."""
    if m is None or next(iter(m.parameters()), None) is not None or next(iter(m.buffers()), None) is not None:
        return False
    x = torch.linspace(-8.0, 8.0, 161, device="cpu").reshape(1, 161)
    try:
        with torch.no_grad():
            y = m(x.clone())
    except Exception:
        return False
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != torch.float32:
        return False
    return (y.double() - F.silu(x.double())).abs().max().item() <= 8 * torch.finfo(torch.float32).eps * 8.0


def is_gated_silu_mlp(m):
    """A module with gate_proj, up_proj, down_proj (linear layers without bias) and a SiLU act_fn, whose forward is
    down(act_fn(gate(x)) * up(x)) (checked on a probe when its weights are real): Llama's, Mistral's, Qwen2's MLP."""
    if not _is_gated_mlp(m) or not silu_like(m.act_fn):
        return False
    projs = (m.gate_proj, m.up_proj, m.down_proj)
    if any(getattr(p, "bias", None) is not None or getattr(p, "weight", None) is None for p in projs):
        return False
    w = m.gate_proj.weight
    if w.is_meta or type(w).__name__ == "TileTensor":
        return True  # the structure alone: a meta module cannot be run, a converted one is checked as it runs
    x = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.device)  # not torch's generator
    with torch.no_grad():
        try:
            y = m(x)
        except Exception:
            return False
        ref = m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))
    return isinstance(y, torch.Tensor) and y.shape == ref.shape and torch.allclose(y, ref, rtol=1e-5, atol=1e-6)


def patch_gated_mlp(m):
    """Its forward becomes down(silu_mul(gate(x), up(x))): the product one tile task per tile, no dense step."""
    if getattr(m.forward, "__func__", None) is not _gated_mlp_forward:  # once (convert() of a converted model)
        m.forward = types.MethodType(_gated_mlp_forward, m)


@without_torch_function
def _gated_mlp_forward(self, x):
    g, u = self.gate_proj(x), self.up_proj(x)
    tile = getattr(self.gate_proj, "tile_size", None) or config.DEFAULT_TILE_SIZE
    batch_tile = getattr(self.gate_proj, "batch_tile_size", None) or config.DEFAULT_BATCH_TILE_SIZE
    return self.down_proj(apply_tiled(SiluMulFunction, g, u, batch_tile, tile))


# --- attention ---

def _reference_attention(m, x, cos, sin, mask):
    """What Llama's attention computes, written out in torch: the probe's reference."""
    b, t, _ = x.shape
    hd, groups = m.head_dim, m.num_key_value_groups
    q, k, v = (p(x).view(b, t, -1, hd).transpose(1, 2) for p in (m.q_proj, m.k_proj, m.v_proj))

    def rope(z):
        half = z.shape[-1] // 2
        return z * cos[:, None] + torch.cat((-z[..., half:], z[..., :half]), dim=-1) * sin[:, None]
    q, k = rope(q), rope(k)
    k, v = (z.repeat_interleave(groups, dim=1) for z in (k, v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(m.scaling))
    return m.o_proj(y.transpose(1, 2).reshape(b, t, -1))


def is_llama_attention(m):
    """A module with q_proj, k_proj, v_proj, o_proj (linear layers), head_dim, num_key_value_groups and scaling whose
    forward(hidden_states, position_embeddings=(cos, sin), attention_mask) is o(attention(rope(q(x)), rope(k(x)),
    v(x))) with grouped-query heads (checked on a probe when its weights are real): Llama's, Mistral's, Qwen2's."""
    if not _is_llama_attention(m) or not hasattr(m, "scaling"):
        return False
    w = getattr(m.q_proj, "weight", None)
    if w is None or w.dim() != 2 or m.head_dim % 2:
        return False
    if w.is_meta or type(w).__name__ == "TileTensor":
        return True  # the structure alone: a meta module cannot be run, a converted one is checked as it runs
    b, t, hd = 2, 5, m.head_dim
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(b, t, w.shape[1], generator=gen).to(w.device)
    angles = torch.rand(b, t, hd // 2, generator=gen).to(w.device) * 3
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    future = torch.ones(t, t, dtype=torch.bool, device=w.device).triu(1)
    mask = torch.zeros(b, 1, t, t, device=w.device).masked_fill(future, float("-inf"))  # every implementation's form
    was_training = m.training
    m.eval()
    try:
        with torch.no_grad():
            y = m(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)
            ref = _reference_attention(m, x, cos, sin, mask)
    except Exception:
        return False
    finally:
        m.train(was_training)
    y = y[0] if isinstance(y, tuple) else y
    return isinstance(y, torch.Tensor) and y.shape == ref.shape and torch.allclose(y, ref, rtol=1e-4, atol=1e-5)


class _TiledAttentionForward:
    """A patched Llama-family attention's forward (bound by types.MethodType, holding no reference to the module):
    tile tasks where covered, else `original`, the forward it had, as a function of the module."""

    def __init__(self, original):
        self.original = original

    def __call__(self, module, *args, **kwargs):
        return _attention_forward(module, self.original, *args, **kwargs)


def patch_llama_attention(m):
    forward = m.forward
    if isinstance(getattr(forward, "__func__", None), _TiledAttentionForward):
        return  # convert() of a converted model
    if getattr(forward, "__self__", None) is m:
        original = forward.__func__
    else:  # a forward already set on the instance (another library's wrapper): called as it is

        def original(module, *args, _forward=forward, **kwargs):
            return _forward(*args, **kwargs)
    m.forward = types.MethodType(_TiledAttentionForward(original), m)


def _uncovered(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs):
    """Why this call cannot run as tile tasks, or None."""
    if past_key_values is None and kwargs.get("use_cache", False):
        return "key/value cache"
    if past_key_values is not None:
        why = kv_cache.cache_uncovered(self, past_key_values)
        if why is not None:
            return why
        if getattr(self, "sliding_window", None) is not None:
            return "key/value cache with a sliding window"
    if kwargs.get("output_attentions", False):
        return "output_attentions=True"
    if not isinstance(position_embeddings, (tuple, list)) or len(position_embeddings) != 2:
        return "no position_embeddings (cos, sin) given"
    if past_key_values is not None and _dropout_p(self) > 0.0:
        return "key/value cache with attention dropout in training"
    impl = getattr(getattr(self, "config", None), "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager"):
        return f"attn_implementation {impl!r}"
    if attention_mask is None and (impl == "eager" or not getattr(self, "is_causal", True)):
        return "attention without a mask that is not causal"
    if attention_mask is not None and not torch.is_tensor(attention_mask):
        return f"attention mask of type {type(attention_mask).__name__}"
    window = getattr(self, "sliding_window", None)
    if attention_mask is None and window is not None and window < hidden_states.shape[-2]:
        return "sliding window without a mask"
    if not all(type(p).__module__.startswith("nntile_torch") for p in (self.q_proj, self.k_proj, self.v_proj)):
        return "projections not converted"
    return None


def _attention_forward(self, original, hidden_states, position_embeddings=None, attention_mask=None,
                       past_key_values=None, **kwargs):
    why = _uncovered(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs)
    if why is None and past_key_values is not None:
        out = _cached_forward(self, hidden_states, position_embeddings, attention_mask,
                              past_key_values.layers[self.layer_idx])
        if not isinstance(out, str):
            return out, None
        why = out
    elif why is None:
        return _covered_forward(self, hidden_states, position_embeddings, attention_mask), None
    note_dense("attention", why)
    return original(self, hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask,
                    past_key_values=past_key_values, **kwargs)


def _dropout_p(self):
    """The attention dropout this call applies: the module's attention_dropout in training, else 0."""
    return float(getattr(self, "attention_dropout", 0.0) or 0.0) if self.training else 0.0


def _whole_rows(z, seq, row_tile):
    return plain(z) and z.dim() == 3 and len(z.tiles.shape) == 2 and z.tiles.grid[1] == 1 \
        and z.tiles.tile_shape[0] == row_tile and row_tile % seq == 0


@without_torch_function
def _covered_forward(self, hidden_states, position_embeddings, attention_mask):
    q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)  # (B, T, H x hd)
    b, t = q.shape[0], q.shape[1]
    hd, heads = self.head_dim, q.shape[-1] // self.head_dim
    kv_heads = k.shape[-1] // hd
    bf16 = getattr(self.q_proj, "precision", "fp32") == "bf16"  # the kernel runs in its feeding layer's precision
    cos, sin = position_embeddings
    row_tile = q.tiles.tile_shape[0] if plain(q) and len(q.tiles.shape) == 2 else 0
    angles = mask = None
    why = None
    if not all(_whole_rows(z, t, row_tile) for z in (q, k, v)):
        why = (f"q, k, v tiles do not hold whole rows and sequences of {t} (tile_size >= width, batch_tile_size a "
               f"multiple of the sequence length)")
    else:
        angles = rope_tiles(cos, "cos", b, t, row_tile), rope_tiles(sin, "sin", b, t, row_tile)
        if angles[0] is None or angles[1] is None:
            why = f"cos and sin of shape {tuple(cos.shape)} (not (1 or {b}, {t}, {hd}) float32)"
        elif attention_mask is not None:
            mask = attention_mask_tiles(attention_mask, b, t, row_tile, q.device)
            if mask is None:
                why = "attention mask that differs per head"
    if why is None:
        q, k = apply_tiled(RopeFunction, q, *angles, hd), apply_tiled(RopeFunction, k, *angles, hd)
        p = _dropout_p(self)
        y = apply_tiled(GQAttentionFunction, q, k, v, heads, kv_heads, float(self.scaling), bf16, mask, p,
                                      dropout_seed() if p > 0.0 else 0)
        return self.o_proj(y)
    # torch's attention on the dense values: correct, with host waits
    note_dense("attention", why)
    qh, kh, vh = (z.reshape(b, t, -1, hd).transpose(1, 2) for z in (q, k, v))
    half = hd // 2
    cos_, sin_ = cos.unsqueeze(1), sin.unsqueeze(1)
    qh, kh = (z * cos_ + torch.cat((-z[..., half:], z[..., :half]), dim=-1) * sin_ for z in (qh, kh))
    kh, vh = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (kh, vh))
    p = _dropout_p(self)
    if attention_mask is None:
        y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=t > 1, scale=float(self.scaling), dropout_p=p)
    else:
        y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attention_mask, scale=float(self.scaling),
                                           dropout_p=p)
    return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


@without_torch_function
def _cached_forward(self, hidden_states, position_embeddings, attention_mask, layer):
    """Attention of the new positions hidden_states (B, Tn, hidden) over the cached ones and themselves; the cache
    layer holds k and v after the rotary embedding, (B, T, kv_heads x hd) each, for every position so far
    (kv_cache.py); the new queries attend over them with the cached attention kernel. Returns the output, or why it
    cannot (a string: the caller falls back)."""
    q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)  # (B, Tn, H x hd)
    b, tn = q.shape[0], q.shape[1]
    hd, heads = self.head_dim, q.shape[-1] // self.head_dim
    kv_heads = k.shape[-1] // hd
    row_tile = q.tiles.tile_shape[0] if plain(q) and len(q.tiles.shape) == 2 else 0
    if not all(plain(z) and z.dim() == 3 and len(z.tiles.shape) == 2 and z.tiles.grid[1] == 1
               and z.tiles.tile_shape[0] == row_tile for z in (q, k, v)):
        return "key/value cache with q, k, v tiles that do not hold whole rows"
    cos, sin = position_embeddings
    angles = rope_tiles(cos, "cos", b, tn, row_tile), rope_tiles(sin, "sin", b, tn, row_tile)
    if angles[0] is None or angles[1] is None:
        return f"key/value cache with cos and sin of shape {tuple(cos.shape)} (not (1 or {b}, {tn}, {hd}) float32)"
    q, k = apply_tiled(RopeFunction, q, *angles, hd), apply_tiled(RopeFunction, k, *angles, hd)
    batch_tile = getattr(self.q_proj, "batch_tile_size", None) or config.DEFAULT_BATCH_TILE_SIZE
    (k_all, v_all), total, room = kv_cache.append(layer, [k.tiles, v.tiles], b, tn, batch_tile, k.device, ["k", "v"])
    bf16 = getattr(self.q_proj, "precision", "fp32") == "bf16"
    y = kv_cache.attend(q.tiles, 0, k_all.tiles, 0, v_all.tiles, 0, attention_mask, b, tn, total, room, heads,
                        kv_heads, hd, float(self.scaling), bf16, q.device,
                        getattr(self.o_proj, "batch_tile_size", None) or config.DEFAULT_BATCH_TILE_SIZE)
    if isinstance(y, str):
        return y
    keys, values = (kv_cache.heads_view(z, total, kv_heads, hd, 0) for z in (k_all, v_all))
    kv_cache.store(layer, [k_all, v_all], total, keys, values)
    return self.o_proj(y)
