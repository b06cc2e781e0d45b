"""Hugging Face's Llama family (Llama, Mistral, Qwen2): the gated MLP as tile tasks (convert() patches its forward:
down(silu_mul(gate(x), up(x))), the elementwise step one task per tile), and the forms for the memory plan
(nntile_torch/costs.py). Their linear
layers (q, k, v, o, gate, up, down, the untied head) and RMSNorms describe themselves; what is the family's own is
described here, recognized by structure (the attributes its forward uses), not by class names:
- the decoder layer: a residual block (its input kept under checkpointing, the residual stream's gradient);
- grouped-query attention: q of `width` features, k and v of kv_width = kv_heads x head_dim each;
- the gated MLP, down(silu(gate(x)) * up(x)): the two products over the inner width it keeps for its backward."""
import types

import torch

from .. import config
from ..costs import Costs, register_form, residual_block
from ..functional_llama import SiluMulFunction
from ..tensor import without_torch_function

F = torch.nn.functional


def _shared_input(width, precision):
    """Bytes per token that projections reading one input count twice: in fp32 and tf32 each keeps the same
    float32 tiles (Linear's costs count them once per projection); in bf16 each makes its own bf16 copy."""
    return 0 if precision == "bf16" else 4 * width


def gqa_attention_costs(width, kv_width, seq, hidden=None, precision="fp32"):
    """Causal grouped-query attention beside its projections, per token: it keeps q, k, v after the rotary
    embedding (float32, width + 2 x kv_width; the k/v heads repeated for the fused kernel, 2 x width more) and its
    output (width) for the backward, which makes the gradients of all of them; QK^T and PV are 2 x 2 x width x seq
    forward FLOPs per token over the query heads (the causal half not subtracted, as GPT-2's attention_costs).
    The k and v projections keep the q projection's input (`hidden` wide): taken back here."""
    qkv = 4 * (width + 2 * kv_width)
    repeated = 4 * 2 * width if kv_width != width else 0
    shared = 2 * _shared_input(hidden or width, precision)
    return Costs(kept=qkv + repeated + 4 * width - shared, backward=qkv + repeated, attention_flops=4 * width * seq)


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
    return gqa_attention_costs(out, m.k_proj.weight.shape[0], seq, hidden, precision)


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
    x = torch.randn(2, w.shape[1], device=w.device, generator=None)
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
    return self.down_proj(SiluMulFunction.apply(g, u, batch_tile, tile))
