"""The Llama family's forms as tile tasks against Hugging Face's own modules (built from configs, no hub weights):
RMSNorm, the gated MLP's silu(gate) * up, rotary position embeddings and grouped-query attention, forward and every
gradient on awkward shapes, their recognition by what they compute, and their conversion; whole Llama, Mistral and
Qwen2 models converted strict, trained without host waits, against the unconverted model."""
import pytest
import torch
from torch import nn

import nntile_torch as nt
from conftest import assert_close_as_torch, padded_causal_bias, softmax_logsumexp
from nntile_torch.recognize import rmsnorm_like

llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def grads(module, x, gy, params=()):
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    return y, torch.autograd.grad(y, [x, *params], gy)


class RMSNormWrittenOut(nn.Module):
    """An RMSNorm of a user's own, eps nowhere as an attribute: recognized by what it computes."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 3e-6))


@pytest.mark.parametrize("shape,btile", [((3, 11, 53), 8), ((5, 96), 2), ((1, 7), 1024), ((2, 37, 300), 64)],
                         ids=["3x11x53,rows=8", "5x96,rows=2", "1x7,one-tile", "2x37x300,rows=64"])
def test_rmsnorm_matches_hf(device, shape, btile):
    c = shape[-1]
    torch.manual_seed(0)
    ref = llama.LlamaRMSNorm(c, eps=1e-6).to(device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    ours = nt.nn.RMSNorm(c, eps=1e-6, batch_tile_size=btile, device=device)
    ours.load_state_dict(ref.state_dict())
    ref64 = llama.LlamaRMSNorm(c, eps=1e-6).to(device).double()
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    x = torch.randn(*shape, device=device) * 3 + 1
    gy = torch.randn(*shape, device=device)
    y, g = grads(ours, x, gy, [ours.weight])
    yr, gr = grads(ref, x, gy, [ref.weight])
    y64, g64 = grads(ref64, x.double(), gy.double(), [ref64.weight])
    assert isinstance(y, nt.TileTensor)
    assert_close_as_torch(y, yr, y64, what="output")
    for name, a, b, c64 in zip(["x", "weight"], g, gr, g64):
        assert_close_as_torch(a, b, c64, what=f"grad {name}")


def test_rmsnorm_eps_weighs(device):
    """Small inputs, where eps changes the result: a wrong eps (or none) fails here."""
    c = 41
    ref = llama.LlamaRMSNorm(c, eps=1e-5).to(device)
    ours = nt.nn.RMSNorm(c, eps=1e-5, batch_tile_size=4, device=device)
    x = torch.randn(9, c, device=device) * 1e-3
    y = ours(x).materialize()
    assert (y - ref(x)).abs().max().item() <= 1e-6 * ref(x).abs().max().item()
    assert (nt.nn.RMSNorm(c, eps=1e-6, device=device)(x).materialize() - ref(x)).abs().max().item() > 1e-2


def test_rmsnorm_chain_stays_asynchronous(device):
    """RMSNorm -> Linear -> RMSNorm, forward and backward, on tiles from the first: no host wait."""
    torch.manual_seed(0)
    c = 45
    n1 = nt.nn.RMSNorm(c, eps=1e-6, batch_tile_size=16, device=device)
    fc = nt.nn.Linear(c, c, bias=False, tile_size=64, batch_tile_size=16, device=device)
    n2 = nt.nn.RMSNorm(c, eps=1e-6, batch_tile_size=16, device=device)
    x = torch.randn(3, 37, c, device=device)
    n2(fc(n1(x)))  # warm-up
    before = nt.stats()["blocking_waits"]
    h = n1(x)
    y = h + n2(fc(h))
    y.backward(torch.ones_like(x))
    assert nt.stats()["blocking_waits"] == before
    r1, rfc, r2 = llama.LlamaRMSNorm(c, 1e-6), nn.Linear(c, c, bias=False), llama.LlamaRMSNorm(c, 1e-6)
    rfc.load_state_dict(fc.state_dict())
    for r in (r1, r2, rfc):
        r.to(device)
    hr = r1(x)
    yr = hr + r2(rfc(hr))
    yr.backward(torch.ones_like(x))
    assert (y.materialize() - yr).abs().max().item() < 1e-5
    assert (fc.weight.grad.materialize() - rfc.weight.grad).abs().max().item() < 1e-4
    assert (n1.weight.grad.materialize() - r1.weight.grad).abs().max().item() < 1e-4


def test_rmsnorm_recognized_by_what_it_computes():
    assert rmsnorm_like(llama.LlamaRMSNorm(77, eps=1e-6)) == (77, 1e-6)
    with torch.device("meta"):
        meta = llama.LlamaRMSNorm(64, eps=1e-5)
    assert rmsnorm_like(meta) == (64, 1e-5)
    assert rmsnorm_like(RMSNormWrittenOut(50)) == (50, 3e-6)
    assert rmsnorm_like(nn.RMSNorm(33, eps=1e-5)) == (33, 1e-5)
    assert rmsnorm_like(nn.RMSNorm(33)) == (33, torch.finfo(torch.float32).eps)
    for other in (nn.LayerNorm(33, bias=False), nn.Linear(4, 4), nn.GELU()):
        assert rmsnorm_like(other) is None

    class OnePlusWeight(RMSNormWrittenOut):  # Gemma's form, weight * (1 + w): not this one
        def forward(self, x):
            return super().forward(x) * (1 + self.weight)
    assert rmsnorm_like(OnePlusWeight(20)) is None


def test_convert_swaps_rmsnorms_strict():
    torch.manual_seed(0)
    c = 48
    model = nn.Sequential(llama.LlamaRMSNorm(c, eps=1e-6), nn.Linear(c, c, bias=False), RMSNormWrittenOut(c))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[2].weight.uniform_(0.5, 1.5)
    ref = nn.Sequential(llama.LlamaRMSNorm(c, eps=1e-6), nn.Linear(c, c, bias=False), RMSNormWrittenOut(c))
    ref.load_state_dict(model.state_dict())
    nt.convert(model, strict=True, batch_tile_size=16)
    assert isinstance(model[0], nt.nn.RMSNorm) and isinstance(model[2], nt.nn.RMSNorm)
    assert model[0].eps == 1e-6 and model[2].eps == 3e-6
    assert set(model.state_dict()) == set(ref.state_dict())
    x = torch.randn(2, 21, c)
    y = model(x)
    yr = ref(x)
    y.sum().backward()
    yr.sum().backward()
    assert (y.materialize() - yr).abs().max().item() < 1e-5
    for (name, p), pr in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad.materialize() - pr.grad).abs().max().item() < 1e-4, name


def test_rmsnorm_bad_input():
    n = nt.nn.RMSNorm(8)
    with pytest.raises(ValueError, match=r"\(\*, 8\)"):
        n(torch.randn(3, 9))
    with pytest.raises(TypeError, match="float32"):
        n(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dimension"):
        nt.nn.RMSNorm((4, 8))


# --- the gated MLP: silu(gate(x)) * up(x) as one tile task per tile ---

def silu_mul_ref(g, u):
    return torch.nn.functional.silu(g) * u


@pytest.mark.parametrize("shape,tiles", [((3, 11, 53), (8, 16)), ((5, 160), (2, 64)), ((1, 7), (1024, 1024))],
                         ids=["3x11x53,tiles=8x16", "5x160,tiles=2x64", "1x7,one-tile"])
def test_silu_mul_matches_torch(device, shape, tiles):
    from nntile_torch.functional_llama import SiluMulFunction
    torch.manual_seed(0)
    g = (torch.randn(*shape, device=device) * 4).requires_grad_(True)
    u = torch.randn(*shape, device=device).requires_grad_(True)
    gy = torch.randn(*shape, device=device)
    y = SiluMulFunction.apply(g, u, *tiles)
    assert isinstance(y, nt.TileTensor)
    dg, du = torch.autograd.grad(y, [g, u], gy)
    yr = silu_mul_ref(g, u)
    dgr, dur = torch.autograd.grad(yr, [g, u], gy)
    g64, u64 = g.detach().double().requires_grad_(True), u.detach().double().requires_grad_(True)
    y64 = silu_mul_ref(g64, u64)
    dg64, du64 = torch.autograd.grad(y64, [g64, u64], gy.double())
    assert_close_as_torch(y, yr, y64, what="output")
    assert_close_as_torch(dg, dgr, dg64, what="grad gate")
    assert_close_as_torch(du, dur, du64, what="grad up")


def tiny_config(**kw):
    return llama.LlamaConfig(vocab_size=300, hidden_size=72, intermediate_size=164, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)


def test_gated_mlp_converted_strict_no_waits(device):
    """LlamaMLP converted (its Linears swapped, its forward patched): output and every gradient as Hugging Face's,
    strict (no dense op), no host wait in forward and backward."""
    torch.manual_seed(0)
    ref = llama.LlamaMLP(tiny_config()).to(device)
    model = llama.LlamaMLP(tiny_config()).to(device)
    model.load_state_dict(ref.state_dict())
    nt.convert(model, strict=True, tile_size=64, batch_tile_size=16)
    assert type(model.gate_proj).__module__.startswith("nntile_torch")
    assert any("silu" in why for _, _, why in nt.convert_report(model).patched)
    x = torch.randn(3, 37, 72, device=device)
    model(x)  # warm-up
    before = nt.stats()["blocking_waits"]
    y = model(x)
    y.backward(torch.ones_like(x))
    assert nt.stats()["blocking_waits"] == before
    yr = ref(x)
    yr.backward(torch.ones_like(x))
    assert (y.materialize() - yr).abs().max().item() <= 1e-5 * yr.abs().max().item()
    for (name, p), pr in zip(model.named_parameters(), ref.parameters()):
        err = (p.grad.materialize() - pr.grad).abs().max().item()
        assert err <= 2e-5 * pr.grad.abs().max().item(), name
    assert nt.convert_report(model).all_tiled


def test_gated_mlp_recognition():
    from nntile_torch.nn.llama import is_gated_silu_mlp
    assert is_gated_silu_mlp(llama.LlamaMLP(tiny_config()))
    with torch.device("meta"):
        meta = llama.LlamaMLP(tiny_config())
    assert is_gated_silu_mlp(meta)
    assert not is_gated_silu_mlp(llama.LlamaMLP(tiny_config(hidden_act="gelu")))
    assert not is_gated_silu_mlp(llama.LlamaMLP(tiny_config(mlp_bias=True)))

    class Swapped(llama.LlamaMLP):  # the same parts, another computation: not patched
        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))
    assert not is_gated_silu_mlp(Swapped(tiny_config()))


# --- rotary position embeddings and grouped-query attention ---

def rotary_angles(hd, b, t, rope="default", per_sequence=False, device="cpu"):
    """cos and sin (1 or b, t, hd) from Hugging Face's own rotary module (Llama 3's frequency scaling included)."""
    kw = {}
    if rope == "llama3":
        kw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8, "rope_theta": 500000.0}
    cfg = tiny_config(**kw)
    cfg.head_dim = hd
    rot = llama.LlamaRotaryEmbedding(cfg).to(device)
    pos = torch.arange(t, device=device)[None] + (torch.arange(b, device=device)[:, None] * 5 if per_sequence else 0)
    return rot(torch.zeros(1, device=device), pos)


@pytest.mark.parametrize("rope", ["default", "llama3"])
@pytest.mark.parametrize("b,t,heads,hd,tiles,per_sequence", [
    (3, 11, 3, 16, (8, 32), False), (2, 7, 2, 8, (14, 16), True), (1, 5, 1, 4, (1024, 1024), False)],
    ids=["3x11,3x16,tiles=8x32", "2x7,2x8,tiles=14x16,positions-per-sequence", "1x5,1x4,one-tile"])
def test_rope_matches_hf_bitwise(device, rope, b, t, heads, hd, tiles, per_sequence):
    """RopeFunction against Hugging Face's apply_rotary_pos_emb with its rotary module's cos and sin: output and
    gradient equal to the bit in fp32 (one rounding per product and sum, as torch's elementwise ops)."""
    from nntile_torch.functional_llama import RopeFunction, rope_tiles
    torch.manual_seed(0)
    cos, sin = rotary_angles(hd, b, t, rope, per_sequence, device)
    if rope == "llama3":  # the scaled frequencies differ from the default ones: the module's own were used
        assert not torch.equal(cos, rotary_angles(hd, b, t, "default", per_sequence, device)[0])
    x = torch.randn(b, t, heads * hd, device=device)
    gy = torch.randn(b, t, heads * hd, device=device)
    rows, cols = min(tiles[0], b * t), min(tiles[1], heads * hd)
    xt = nt.TileTensor.from_dense(x, (rows, cols), (b * t, heads * hd)).requires_grad_(True)
    y = RopeFunction.apply(xt, rope_tiles(cos, "cos", b, t, rows), rope_tiles(sin, "sin", b, t, rows), hd)
    (dx,) = torch.autograd.grad(y, [xt], gy)
    xr = x.view(b, t, heads, hd).transpose(1, 2).requires_grad_(True)
    yr, _ = llama.apply_rotary_pos_emb(xr, xr, cos, sin)
    (dxr,) = torch.autograd.grad(yr, [xr], gy.view(b, t, heads, hd).transpose(1, 2))
    assert torch.equal(y.materialize(), yr.transpose(1, 2).reshape(b, t, -1))
    dx = dx.materialize() if isinstance(dx, nt.TileTensor) else dx
    assert torch.equal(dx, dxr.transpose(1, 2).reshape(b, t, -1))


def test_rope_bad_input():
    from nntile_torch import _C
    from nntile_torch.tensor import new_tiles
    x, y = new_tiles([6, 24], [6, 12]), new_tiles([6, 24], [6, 12])
    cos = new_tiles([6, 8], [6, 8])
    with pytest.raises(RuntimeError, match="whole heads of 8"):
        _C.rope(x, cos, cos, y, 8, False)
    with pytest.raises(RuntimeError, match="even"):
        _C.rope(x, cos, cos, y, 3, False)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \(6, 6\)"):
        _C.rope(x, cos, cos, y, 6, False)


def gqa_ref(q, k, v, heads, kv_heads, mask=None):
    """Hugging Face's sdpa path: heads (B, H, T, D), k and v repeated over each group (repeat_kv), causal or masked."""
    b, t, _ = q.shape
    hd = q.shape[-1] // heads
    qh, kh, vh = (z.view(b, t, -1, hd).transpose(1, 2) for z in (q, k, v))
    kh, vh = llama.repeat_kv(kh, heads // kv_heads), llama.repeat_kv(vh, heads // kv_heads)
    if mask is None:
        y = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=hd ** -0.5)
    else:
        y = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=hd ** -0.5)
    return y.transpose(1, 2).reshape(b, t, -1)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding-mask"])
@pytest.mark.parametrize("b,t,heads,kv_heads,hd,rows", [(3, 11, 4, 2, 8, 22), (2, 5, 6, 1, 4, 5),
                                                         (2, 7, 3, 3, 16, 14)],
                         ids=["3x11,4q/2kv,rows=22", "2x5,6q/1kv,rows=5", "2x7,3q/3kv,rows=14"])
def test_gqa_attention_matches_torch(device, b, t, heads, kv_heads, hd, rows, masked):
    """GQAttentionFunction against scaled_dot_product_attention on repeated k/v heads (Hugging Face's sdpa path):
    output and the gradients of q, k and v (a k/v head's summed over its group) within twice torch's own error."""
    from nntile_torch.functional import attention_mask_tiles
    from nntile_torch.functional_llama import GQAttentionFunction
    torch.manual_seed(0)
    q = torch.randn(b, t, heads * hd, device=device)
    k, v = (torch.randn(b, t, kv_heads * hd, device=device) for _ in range(2))
    gy = torch.randn(b, t, heads * hd, device=device)
    mask = None
    if masked:  # the last two positions of sequence 0 are padding, as Hugging Face's 4-d boolean mask says
        keep = torch.ones(b, t, dtype=torch.bool, device=device)
        keep[0, -2:] = False
        mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None] & keep[:, None, None, :]
        mask = mask | torch.eye(t, dtype=torch.bool, device=device)  # a padded query still sees itself
    tiled = [nt.TileTensor.from_dense(z, (rows, z.shape[-1]), (b * t, z.shape[-1])).requires_grad_(True)
             for z in (q, k, v)]
    mt = None if mask is None else attention_mask_tiles(mask, b, t, rows, device)
    y = GQAttentionFunction.apply(*tiled, heads, kv_heads, hd ** -0.5, False, mt)
    grads = torch.autograd.grad(y, tiled, gy)
    dense = [z.clone().requires_grad_(True) for z in (q, k, v)]
    yr = gqa_ref(*dense, heads, kv_heads, mask)
    gr = torch.autograd.grad(yr, dense, gy)
    d64 = [z.double().requires_grad_(True) for z in (q, k, v)]
    y64 = gqa_ref(*d64, heads, kv_heads, mask)
    g64 = torch.autograd.grad(y64, d64, gy.double())
    assert_close_as_torch(y, yr, y64, what="output")
    for name, a, r, r64 in zip("qkv", grads, gr, g64):
        assert_close_as_torch(a, r, r64, what=f"grad {name}")



@pytest.mark.parametrize("masked", [False, True], ids=["causal", "masked"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,p", [(23, 0.0), (46, 0.0), (46, 0.25)], ids=["1seq", "2seq", "2seq-dropout"])
def test_gqa_attention_backward_from_the_kept_statistics_equals_the_recomputing_one(device, masked, bf16, rows, p):
    """Grouped-query attention as multi-head attention's test in test_norm_act.py: the forward keeps each query head's
    softmax log-sum-exp (over its group's k/v head, natural log, as float64 computes it from the q and k the kernel
    read); the backward given the output and those statistics runs no forward, and its dq, dk, dv are the recomputing
    backward's: bit for bit on CPUs, to the fused kernels' rounding on GPUs. Three sequences of 23, 4 query heads over
    2 k/v heads of 12 (padded to 16 on GPUs), 1 or 2 sequences per tile (the last tile partial), causal or a padding
    mask, with attention dropout (on CPUs the explicit path, which keeps nothing)."""
    from nntile_torch import _C
    from nntile_torch.runtime import attention_forwards
    from nntile_torch.tensor import new_tiles, tiles_like
    b, t, heads, kv_heads, hd, seed = 3, 23, 4, 2, 12, 77
    c, ckv, scale = heads * hd, kv_heads * hd, hd ** -0.5
    gen = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(b * t, w, generator=gen).to(device) for w in (c, ckv, ckv))
    dy = torch.randn(b * t, c, generator=gen).to(device)
    mask = None
    m = padded_causal_bias(b, t) if masked else None
    if masked:
        mask = nt.TileTensor.from_dense(m.reshape(b * t, t).to(device), (rows, t)).tiles
    qt, kt, vt = (nt.TileTensor.from_dense(z, (rows, z.shape[1])).tiles for z in (q, k, v))
    g = nt.TileTensor.from_dense(dy, (rows, c)).tiles
    y = new_tiles([b * t, c], [rows, c])
    stats = new_tiles([b, heads * t], [rows // t, heads * t])
    _C.gqa_attention_forward(qt, kt, vt, y, t, heads, kv_heads, scale, bf16, mask, p, seed, stats)
    dense = nt.TileTensor(stats, (b, heads, t), device).materialize().double()
    grads = {}
    counts = [attention_forwards()]
    for name, extra in (("kept", (y, stats)), ("again", ())):
        grads[name] = [tiles_like(z) for z in (qt, kt, vt)]
        _C.gqa_attention_backward(g, qt, kt, vt, *grads[name], t, heads, kv_heads, scale, bf16, mask, p, seed, *extra)
        nt.synchronize()
        counts.append(attention_forwards())
    explicit = p > 0 and device == "cpu"  # the explicit dropout path: no fused kernel either way
    assert counts[1] == counts[0], counts[:2]
    assert sum(counts[2].values()) - sum(counts[1].values()) == (0 if explicit else -(-b * t // rows))
    for z, ours, theirs in zip("qkv", grads["kept"], grads["again"]):
        ours, theirs = (nt.TileTensor(d, tuple(d.shape), device).materialize() for d in (ours, theirs))
        if device == "cpu":
            assert torch.equal(ours, theirs), z
        else:
            err = (ours - theirs).abs().max().item() / theirs.abs().max().item()
            assert err < (1e-2 if bf16 else 1e-5), f"d{z}: relative difference {err:.2e}"
    if explicit:
        return
    qh = q.reshape(b, t, heads, hd).transpose(1, 2).double()
    kh = k.reshape(b, t, kv_heads, hd).transpose(1, 2).double().repeat_interleave(heads // kv_heads, dim=1)
    if bf16:
        qh, kh = qh.bfloat16().double(), kh.bfloat16().double()
    torch.testing.assert_close(dense, softmax_logsumexp(qh, kh, scale, m), rtol=0, atol=1e-2 if bf16 else 1e-5)

def test_gqa_attention_bad_input():
    from nntile_torch import _C
    from nntile_torch.tensor import new_tiles
    q, y = new_tiles([10, 24], [10, 24]), new_tiles([10, 24], [10, 24])
    k = new_tiles([10, 12], [10, 12])
    with pytest.raises(RuntimeError, match="multiple of key/value heads"):
        _C.gqa_attention_forward(q, k, k, y, 5, 4, 3, 1.0)
    with pytest.raises(RuntimeError, match=r"k and v must be \(10, 6\)"):
        _C.gqa_attention_forward(q, k, k, y, 5, 4, 1, 1.0)
    with pytest.raises(RuntimeError, match="whole sequences of 4"):
        _C.gqa_attention_forward(q, k, k, y, 4, 4, 2, 1.0)


def test_llama_attention_recognition():
    from nntile_torch.nn.llama import is_llama_attention
    import transformers
    cfg = tiny_config()
    assert is_llama_attention(llama.LlamaAttention(cfg, 0))
    qwen = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                                    num_key_value_heads=2)
    assert is_llama_attention(transformers.models.qwen2.modeling_qwen2.Qwen2Attention(qwen, 0))
    with torch.device("meta"):
        assert is_llama_attention(llama.LlamaAttention(cfg, 0))

    class NoRope(llama.LlamaAttention):  # the same parts, another computation: not patched
        def forward(self, hidden_states, position_embeddings=None, **kw):
            return super().forward(hidden_states, (torch.ones_like(position_embeddings[0]),
                                                   torch.zeros_like(position_embeddings[1])), **kw)
    assert not is_llama_attention(NoRope(cfg, 0))
    assert not is_llama_attention(llama.LlamaMLP(cfg))


# --- the memory plan on Llama shapes ---

@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_plan_reads_llama_shapes(kind):
    """nt.plan on a meta-built model of each class: the MLP's real inner width, every matmul weight counted once
    (forward FLOPs = 2 x matmul parameters per token: q, k, v, o, gate, up, down and the untied head), GQA's smaller
    k/v, the RMSNorms' and gated MLPs' activations."""
    import transformers
    from nntile_torch.facts import model_facts
    from nntile_torch.nn.llama import gated_mlp_costs, gqa_attention_costs
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    cfg = cls[0](vocab_size=300, hidden_size=72, intermediate_size=164, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    with torch.device("meta"):
        model = cls[1](cfg)
    f = model_facts(model)
    assert (f.n_layer, f.width, f.vocab, f.inner) == (2, 72, 300, 164)
    matmul = {p.name for p in f.params if p.matmul}
    assert matmul == {n for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n}
    c = f.costs("fp32", 64)
    per_token = sum(p.numel() for n, p in model.named_parameters() if n in matmul)
    assert c.matmul_flops == 2 * per_token
    assert c.attention_flops == 2 * 4 * 72 * 64
    # per token and block, float32: two RMSNorms (input + rstd), the 7 projections' inputs (six of 72, o's being the
    # attention's output; down's 164), attention's rotated q, k and v (72 + 2 x 36; the k/v heads are repeated inside
    # its tasks only) and a log-sum-exp per query head (4), less the k and v projections' shared input (2 x 72), the
    # gated MLP's two products (2 x 164), less the up projection's shared input (72)
    expect = 2 * (4 * 72 + 4) + 4 * (6 * 72 + 164) + 4 * (144 - 144 + 4) + 4 * (2 * 164 - 72)
    assert c.blocks[0].kept == expect == 4008
    # bf16: the k and v projections' own bf16 copies (2 x 72), and the attention's fp32 output beside o's bf16 copy
    assert gqa_attention_costs(72, 36, 64, 72, "bf16").kept - gqa_attention_costs(72, 36, 64, 72).kept == 12 * 72
    assert gated_mlp_costs(164, 72).kept == 4 * (2 * 164 - 72)
    # elementwise bytes per token and block: two residual adds, two RMSNorms, rope over q and k, silu_mul over the
    # inner width
    assert c.blocks[0].elementwise == 24 * 72 + 2 * 8 * 72 + 8 * (72 + 36) + 12 * 164
    plan = nt.plan(model, 4, 64, "fp32", host_memory="8GiB")
    assert plan.facts.inner == 164 and plan.facts.n_layer == 2


def test_plan_elementwise_share_keeps_gpt2_and_scales_llama():
    """The plan's elementwise time is the blocks' described bytes at the rate fitted on GPT-2: a GPT-2 block sums to
    GPT2_BLOCK_ELEMENTWISE x width (its prediction unchanged), a Llama block to its own, and the predicted GPU time
    differs between two Llama shapes by their MLPs' inner width alone."""
    import transformers
    from nntile_torch.costs import GPT2_BLOCK_ELEMENTWISE
    from nntile_torch.facts import model_facts
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300))
    assert all(b.elementwise == GPT2_BLOCK_ELEMENTWISE * 64 for b in model_facts(gpt2).costs("bf16", 64).blocks)
    from nntile_torch.rates import Rates
    fast = 1e30  # GEMMs, attention and updates free: the GPU time is the elementwise share alone
    rates = Rates(gemm_flops=fast, gemm_flops_tf32=fast, gemm_flops_fp32=fast, hbm_bytes_s=fast,
                  per_layer_token_width_s=1e-9)
    times = []
    for inner in (164, 1640):
        cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=72, intermediate_size=inner, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        with torch.device("meta"):
            m = transformers.LlamaForCausalLM(cfg)
        p = nt.plan(m, 4, 64, "bf16", host_memory="8GiB", rates=rates, checkpointing=False)
        times.append(p.times["gpu_s"])
    per_block = [24 * 72 + 16 * 72 + 8 * (72 + 36) + 12 * inner for inner in (164, 1640)]
    assert times[1] / times[0] == pytest.approx(per_block[1] / per_block[0], rel=1e-6)
    assert times[0] == pytest.approx(1e-9 * 2 * per_block[0] / GPT2_BLOCK_ELEMENTWISE * 4 * 64, rel=1e-6)


# --- whole Hugging Face models: every layer as tile tasks, the unconverted model's numbers ---

def gqa_dropped_ref(q, k, v, heads, kv_heads, keep, p, mask=None):
    """Grouped-query attention with dropout by the keep mask (B, H, T, T) on the probabilities, written out: heads of
    q, k and v repeated over each group, causal or with a boolean mask."""
    b, t, _ = q.shape
    hd = q.shape[-1] // heads
    qh, kh, vh = (z.view(b, t, -1, hd).transpose(1, 2) for z in (q, k, v))
    kh, vh = llama.repeat_kv(kh, heads // kv_heads), llama.repeat_kv(vh, heads // kv_heads)
    scores = qh @ kh.transpose(2, 3) * hd ** -0.5
    allowed = torch.ones(t, t, dtype=torch.bool, device=q.device).tril() if mask is None else mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, -1) * keep.to(q.device, q.dtype) / (1 - p)
    return (probs @ vh).transpose(1, 2).reshape(b, t, -1)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding-mask"])
@pytest.mark.parametrize("b,t,heads,kv_heads,hd,rows,p", [(3, 11, 4, 2, 8, 22, 0.1), (2, 6, 6, 1, 4, 6, 0.5)],
                         ids=["3x11,4q/2kv,rows=22,p=0.1", "2x6,6q/1kv,rows=6,p=0.5"])
def test_gqa_attention_dropout_matches_the_masked_reference(device, b, t, heads, kv_heads, hd, rows, p, masked):
    """Attention dropout inside the grouped-query attention task (Llama's attention_dropout in training): output and
    the gradients of q, k, v equal the written-out attention with the same keep mask (one per query head: on CPUs
    the debug entry point's, hashed from the sequence's global index; on GPUs the fused kernel's, read off its
    output), within twice torch's own float32 error (3x on GPUs); the keep rate is about 1 - p; another seed drops
    other entries."""
    from nntile_torch import _C
    from nntile_torch.functional import attention_mask_tiles
    from nntile_torch.functional_llama import GQAttentionFunction
    torch.manual_seed(0)
    q = torch.randn(b, t, heads * hd, device=device)
    k, v = (torch.randn(b, t, kv_heads * hd, device=device) for _ in range(2))
    gy = torch.randn(b, t, heads * hd, device=device)
    mask = None
    if masked:
        keep_pos = torch.ones(b, t, dtype=torch.bool, device=device)
        keep_pos[0, -2:] = False
        mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None] & keep_pos[:, None, None, :]
        mask = mask | torch.eye(t, dtype=torch.bool, device=device)
    seed = 987654321
    mt = None if mask is None else attention_mask_tiles(mask, b, t, rows, device)

    def keep_of(seed):
        """The tasks' keep mask (B, H, T, T): nntile's hash on CPUs; on GPUs read off the fused kernel's output
        for q = k = 0 and identity values (hd = T), entries the mask rules out read as dropped."""
        if device == "cpu":
            return _C.attention_dropout_keep(b, heads, t, p, seed, 0)
        zq, zk = torch.zeros(b, t, heads * t, device=device), torch.zeros(b, t, kv_heads * t, device=device)
        eye = torch.eye(t, device=device).repeat(1, kv_heads).expand(b, t, kv_heads * t).contiguous()
        ones = [nt.TileTensor.from_dense(z, (rows, z.shape[-1]), (b * t, z.shape[-1])) for z in (zq, zk, eye)]
        seen = GQAttentionFunction.apply(*ones, heads, kv_heads, 1.0, False, mt, p, seed).materialize()
        return (seen.cpu().reshape(b, t, heads, t).transpose(1, 2) != 0)

    keep = keep_of(seed)
    allowed = (torch.ones(t, t, dtype=torch.bool).tril() if mask is None else mask.cpu()).expand(b, heads, t, t)
    assert abs(keep[allowed].float().mean().item() - (1 - p)) < 0.12
    assert not torch.equal(keep, keep_of(seed + 1))
    tiled = [nt.TileTensor.from_dense(z, (rows, z.shape[-1]), (b * t, z.shape[-1])).requires_grad_(True)
             for z in (q, k, v)]
    y = GQAttentionFunction.apply(*tiled, heads, kv_heads, hd ** -0.5, False, mt, p, seed)
    grads = torch.autograd.grad(y, tiled, gy)
    dense_ = [z.clone().requires_grad_(True) for z in (q, k, v)]
    yr = gqa_dropped_ref(*dense_, heads, kv_heads, keep, p, mask)
    gr = torch.autograd.grad(yr, dense_, gy)
    d64 = [z.double().requires_grad_(True) for z in (q, k, v)]
    y64 = gqa_dropped_ref(*d64, heads, kv_heads, keep, p, mask)
    g64 = torch.autograd.grad(y64, d64, gy.double())
    # on GPUs the fused kernel's own summation order: within 3x (a k/v head's gradient sums a group of up to 6)
    factor = 2.0 if device == "cpu" else 3.0
    assert_close_as_torch(y, yr, y64, factor=factor, what="output")
    for name, a, r, r64 in zip("qkv", grads, gr, g64):
        assert_close_as_torch(a, r, r64, factor=factor, what=f"grad {name}")


def test_hf_llama_with_attention_dropout_trains_in_tiles(device):
    """A Llama with attention_dropout 0.1 converts strict and trains with its dropout inside the attention task (no
    host wait in a step); with the same seed two steps drop alike, and eval is the unconverted model's."""
    import copy
    ref = hf_model("llama", attention_dropout=0.1).to(device)
    model = nt.convert(copy.deepcopy(ref), strict=True, tile_size=64, batch_tile_size=48).train()
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)
    torch.manual_seed(5)
    loss = model(input_ids=ids, labels=ids).loss.item()
    torch.manual_seed(5)
    assert model(input_ids=ids, labels=ids).loss.item() == loss
    torch.manual_seed(6)
    assert model(input_ids=ids, labels=ids).loss.item() != loss  # another mask
    opt = nt.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    before = nt.stats()["blocking_waits"]
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert nt.stats()["blocking_waits"] == before
    assert not nt.convert_report(model).dense_ops
    model.eval(), ref.eval()
    fresh = nt.convert(copy.deepcopy(ref), strict=True, tile_size=64, batch_tile_size=48).eval()
    with torch.no_grad():
        assert (dense(fresh(input_ids=ids).logits) - ref(input_ids=ids).logits).abs().max().item() \
            <= 1e-5 * ref(input_ids=ids).logits.abs().max().item()


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8, "rope_theta": 500000.0}


def hf_model(kind, seed=0, attn="sdpa", **kw):
    """A tiny model of each class: hidden 64 in 4 query heads over 2 key/value heads (head_dim 16), inner width 96,
    vocabulary 100 (kind "llama3": Llama with Llama 3's rope scaling; Qwen2's q, k, v have biases)."""
    import transformers
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    if kind == "llama3":
        kw["rope_scaling"] = LLAMA3_ROPE
    cfg = cls[0](vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False, **kw)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    return cls[1](cfg)


def dense(t):
    return t.materialize() if isinstance(t, nt.TileTensor) else t


@pytest.mark.parametrize("kind", ["llama", "llama3", "mistral", "qwen2"])
def test_hf_model_parity_strict(kind, device):
    """Converted strict (no op runs as dense torch code: RMSNorms, every linear layer, rotary embeddings, grouped-query
    attention, the gated MLPs' silu * up, the embedding and the loss are tile tasks): loss, logits and every
    parameter's gradient as the unconverted model's (fp32), sequences of 24 in row tiles of two (3 x 24 rows: tiles
    of 48 and 24), weight tiles of 64 over widths 64, 32, 96 and 100; then AdamW steps as torch's AdamW, a
    training step without a host wait."""
    import copy
    ref = hf_model(kind).to(device)
    if kind == "qwen2":
        assert ref.model.layers[0].self_attn.q_proj.bias is not None
    model = nt.convert(copy.deepcopy(ref), strict=True, tile_size=64, batch_tile_size=48)
    rep = nt.convert_report(model)
    swapped = {new for _, _, new in rep.swapped}
    assert {"nntile_torch.nn.RMSNorm", "nntile_torch.nn.Linear", "nntile_torch.nn.Embedding"} <= swapped
    assert sum("silu" in why for _, _, why in rep.patched) == 2
    assert sum("grouped-query attention" in why for _, _, why in rep.patched) == 2
    ids = torch.randint(0, 100, (3, 24), generator=torch.Generator().manual_seed(1)).to(device)
    out, out_ref = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    assert abs(out.loss.item() - out_ref.loss.item()) <= 1e-5 * out_ref.loss.item()
    assert (dense(out.logits) - out_ref.logits).abs().max().item() <= 1e-5 * out_ref.logits.abs().max().item()
    out.loss.backward()
    out_ref.loss.backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, gr = dense(p.grad), ref_params[name].grad
        assert (g - gr).abs().max().item() <= 1e-4 * gr.abs().max().item() + 1e-7, name
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    opt = nt.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    opt.step(), opt_ref.step()
    for step in range(2):
        opt.zero_grad(), opt_ref.zero_grad()
        before = nt.stats()["blocking_waits"]
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        assert nt.stats()["blocking_waits"] == before, f"host waits in training step {step + 2}"
        ref(input_ids=ids, labels=ids).loss.backward()
        opt_ref.step()
    # Adam divides by sqrt(v): where a gradient is near zero its rounding passes undamped into that element's update
    # (up to lr), so the updates are compared as wholes: each parameter's change within 0.1% of torch's, in norm.
    state = model.state_dict()
    for name, v in ref.state_dict().items():
        moved = (v - start[name]).norm().item()
        assert (state[name] - v).norm().item() <= 1e-3 * moved, name
    assert not rep.dense_ops


def test_hf_llama_padding_mask_and_eager():
    """A padding attention_mask (Hugging Face's 4-d mask, as sdpa and eager build it) runs as the attention tasks'
    mask: logits at the real positions and the gradients as the unconverted model's, strict."""
    import copy
    for attn in ("sdpa", "eager"):
        ref = hf_model("llama", attn=attn)
        model = nt.convert(copy.deepcopy(ref), strict=True, tile_size=64, batch_tile_size=24)
        ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(2))
        keep = torch.ones(2, 24, dtype=torch.long)
        keep[1, :5] = 0  # left padding
        labels = ids.masked_fill(keep == 0, -100)
        # the first real token's label is read at the last pad, a query row with every key masked, which HF's
        # attention forms fill differently (sdpa unmasks it, eager softmaxes a row of float minima): not compared
        labels[1, 5] = -100
        out = model(input_ids=ids, attention_mask=keep, labels=labels)
        out_ref = ref(input_ids=ids, attention_mask=keep, labels=labels)
        real = keep.bool()
        assert (dense(out.logits)[real] - out_ref.logits[real]).abs().max().item() \
            <= 1e-5 * out_ref.logits.abs().max().item(), attn
        out.loss.backward()
        out_ref.loss.backward()
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            g, gr = dense(p.grad), ref_params[name].grad
            assert (g - gr).abs().max().item() <= 1e-4 * gr.abs().max().item() + 1e-7, (attn, name)


def test_hf_llama_uncovered_calls_fall_back():
    """Tilings whose tiles do not hold whole sequences, and key/value caches, run as torch code, named in the
    report (strict mode raises): the same numbers."""
    import copy
    ref = hf_model("llama")
    model = nt.convert(copy.deepcopy(ref), tile_size=64, batch_tile_size=16)  # 16 rows: not whole sequences of 24
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(3))
    with pytest.warns(UserWarning, match="dense torch code"):
        logits = dense(model(input_ids=ids).logits)
    assert (logits - ref(input_ids=ids).logits).abs().max().item() <= 1e-5 * logits.abs().max().item()
    assert any("whole rows and sequences" in what for _, what in nt.convert_report(model).dense_ops)
    strict = nt.convert(hf_model("llama"), strict=True, tile_size=64, batch_tile_size=16)
    with pytest.raises(nt.DenseFallbackError, match="attention"):
        strict(input_ids=ids)


def test_llama_example_trains():
    """examples/llama/train.py: built on meta, planned, converted, a few steps on the CLI's corpus, every op as tile
    tasks; the loss starts near ln(256) (bytes) and falls."""
    import math
    from pathlib import Path
    from conftest import run_python
    script = Path(__file__).resolve().parents[1] / "examples" / "llama" / "train.py"
    code = f"import sys, runpy; sys.argv = [{str(script)!r}, '--steps', '4']; runpy.run_path(sys.argv[0])"
    rc, out, err = run_python(code, 300, env={"PYTHONPATH": str(script.parents[2])}, what="the Llama example")
    assert rc == 0, out[-2000:] + err[-3000:]
    assert "memory plan:" in out
    assert "torch ops run on materialized tiles: none" in out  # attention, rope and the MLP as tile tasks too
    losses = [float(ln.split("loss ")[1].split()[0]) for ln in out.splitlines() if ln.startswith("step ")]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(256)) < 0.5 and losses[-1] < losses[0]
