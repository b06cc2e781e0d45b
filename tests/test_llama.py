"""The Llama family's forms as tile tasks against Hugging Face's own modules (built from configs, no hub weights):
RMSNorm and the gated MLP's silu(gate) * up, forward and every gradient on awkward shapes, their recognition by what
they compute, and their conversion."""
import pytest
import torch
from torch import nn

import nntile_torch as nt
from conftest import assert_close_as_torch
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
    # per token and block, float32: two RMSNorms (input + rstd), the 7 projections' inputs (six of 72, down's 164),
    # attention's q, k, v (72 + 2 x 36), the repeated k/v (2 x 72) and its output (72), less the k and v projections'
    # shared input (2 x 72), the gated MLP's two products (2 x 164), less the up projection's shared input (72)
    expect = 2 * (4 * 72 + 4) + 4 * (6 * 72 + 164) + 4 * (144 + 144 + 72 - 144) + 4 * (2 * 164 - 72)
    assert c.blocks[0].kept == expect == 4856
    assert gqa_attention_costs(72, 36, 64, 72, "bf16").kept - gqa_attention_costs(72, 36, 64, 72).kept == 8 * 72
    assert gated_mlp_costs(164, 72).kept == 4 * (2 * 164 - 72)
    # elementwise bytes per token and block: two residual adds, two RMSNorms, silu_mul over the inner width
    assert c.blocks[0].elementwise == 24 * 72 + 2 * 8 * 72 + 12 * 164
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
    per_block = [24 * 72 + 16 * 72 + 12 * inner for inner in (164, 1640)]
    assert times[1] / times[0] == pytest.approx(per_block[1] / per_block[0], rel=1e-6)
    assert times[0] == pytest.approx(1e-9 * 2 * per_block[0] / GPT2_BLOCK_ELEMENTWISE * 4 * 64, rel=1e-6)


# --- whole Hugging Face models: what has a tile version runs as tiles, the rest as torch code, same numbers ---

def hf_model(kind, seed=0, **kw):
    import transformers
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    cfg = cls[0](vocab_size=300, hidden_size=64, intermediate_size=164, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False, **kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return cls[1](cfg)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_hf_model_parity_with_dense_attention(kind):
    """Loss, logits and every parameter's gradient as the unconverted model's (fp32), then two AdamW steps as
    torch's AdamW. The RMSNorms, every linear layer, the gated MLPs' silu * up, the embedding and the loss run as
    tile tasks; rotary embeddings and grouped-query attention still run as torch code (strict mode names them)."""
    import copy
    ref = hf_model(kind)
    model = nt.convert(copy.deepcopy(ref), tile_size=64, batch_tile_size=37)
    rep = nt.convert_report(model)
    swapped = {new for _, _, new in rep.swapped}
    assert {"nntile_torch.nn.RMSNorm", "nntile_torch.nn.Linear", "nntile_torch.nn.Embedding"} <= swapped
    assert sum("silu" in why for _, _, why in rep.patched) == 2
    ids = torch.randint(0, 300, (3, 37), generator=torch.Generator().manual_seed(1))
    out, out_ref = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    assert abs(out.loss.item() - out_ref.loss.item()) <= 1e-5 * out_ref.loss.item()
    logits = out.logits.materialize() if isinstance(out.logits, nt.TileTensor) else out.logits
    assert (logits - out_ref.logits).abs().max().item() <= 1e-5 * out_ref.logits.abs().max().item()
    out.loss.backward()
    out_ref.loss.backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, gr = p.grad, ref_params[name].grad
        g = g.materialize() if isinstance(g, nt.TileTensor) else g
        assert (g - gr).abs().max().item() <= 1e-4 * gr.abs().max().item() + 1e-7, name
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    opt = nt.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    opt.step(), opt_ref.step()
    for _ in range(2):
        opt.zero_grad(), opt_ref.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        ref(input_ids=ids, labels=ids).loss.backward()
        opt.step(), opt_ref.step()
    # Adam divides by sqrt(v): where a gradient is near zero its rounding passes undamped into that element's update
    # (up to lr), so the updates are compared as wholes: each parameter's change within 0.1% of torch's, in norm.
    state = model.state_dict()
    for name, v in ref.state_dict().items():
        moved = (v - start[name]).norm().item()
        assert (state[name] - v).norm().item() <= 1e-3 * moved, name
    strict = nt.convert(hf_model(kind), strict=True, tile_size=64, batch_tile_size=37)
    with pytest.raises(nt.DenseFallbackError):  # until rotary and GQA have tile versions: named where they run
        strict(input_ids=ids)


def test_llama_example_trains():
    """examples/llama/train.py: built on meta, planned, converted, a few steps on the CLI's corpus; the loss starts
    near ln(256) (bytes) and falls."""
    import math
    from pathlib import Path
    from conftest import run_python
    script = Path(__file__).resolve().parents[1] / "examples" / "llama" / "train.py"
    code = f"import sys, runpy; sys.argv = [{str(script)!r}, '--steps', '4']; runpy.run_path(sys.argv[0])"
    rc, out, err = run_python(code, 300, env={"PYTHONPATH": str(script.parents[2])}, what="the Llama example")
    assert rc == 0, out[-2000:] + err[-3000:]
    assert "memory plan:" in out
    losses = [float(ln.split("loss ")[1].split()[0]) for ln in out.splitlines() if ln.startswith("step ")]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(256)) < 0.5 and losses[-1] < losses[0]
