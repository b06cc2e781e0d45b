"""Attention dropout inside the tiled attention: the mask keeps the right share, scales by 1 / (1 - p), is the same
for a seed and for any tiling; output and gradient against a PyTorch reference with the same mask; nanoGPT and
Hugging Face GPT-2 with attention dropout train in tiles. On CPUs the mask is nntile's hash of (seed, sequence, head,
query, key), which `_C.attention_dropout_keep` gives; on GPUs the fused kernel drops with its Philox generator set
from the seed and the tile's place (the kernel torch's own attention picks, as without dropout: in float32 the
memory-efficient one; NNTILE_ATTENTION names one in bf16): float32 checked with the mask read off the output of an
attention whose values are the identity (`kernel_keep`), bf16 against torch's own attention with dropout from the
same generator state."""
import copy
import importlib.util
from pathlib import Path

import pytest
import torch

import nntile_torch as nt
from conftest import assert_close_as_torch
from nntile_torch import _C
from nntile_torch.functional import CausalAttentionFunction, attention_mask_tiles


def split_heads(qkv, heads):
    b, t, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    return [u.reshape(b, t, heads, c // heads).transpose(1, 2) for u in qkv.split(c, dim=2)]


def masked_reference(qkv, heads, scale, keep, p, bias=None):
    """Attention (B, T, 3C) -> (B, T, C) with dropout by the keep mask (B, H, T, T) on the probabilities, written
    out in torch; causal, or with the additive bias (B, 1, T, T)."""
    q, k, v = split_heads(qkv, heads)
    b, h, t, d = q.shape
    scores = q @ k.transpose(2, 3) * scale
    if bias is None:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=qkv.device).triu(1), float("-inf"))
    else:
        scores = scores + bias
    probs = torch.softmax(scores, -1) * keep.to(qkv.device, qkv.dtype) / (1 - p)
    return (probs @ v).transpose(1, 2).reshape(b, t, h * d)


def tiled(qkv, rows, heads, scale, p, seed, mask=None, gy=None, bf16=False):
    """nntile's attention with dropout on qkv (B, T, 3C) in tiles of `rows` rows: output and gradient, dense."""
    b, t, c3 = qkv.shape
    x = nt.TileTensor.from_dense(qkv, (rows, c3), (b * t, c3)).requires_grad_(True)
    y = CausalAttentionFunction.apply(x, heads, scale, bf16, mask, p, seed)
    if gy is None:
        return y.materialize(), None
    (g,) = torch.autograd.grad(y, x, gy)
    return y.materialize(), g.materialize()


def one_hot_values(b, t, heads):
    """qkv (B, T, 3C) with q = k = 0 (uniform causal probabilities 1 / (i + 1)) and each head's values the
    identity (hd = T): output row i of head h is then row i of that head's dropped probabilities."""
    c = heads * t
    qkv = torch.zeros(b, t, 3 * c)
    qkv[:, :, 2 * c:] = torch.eye(t).repeat(1, heads)
    return qkv


def probabilities_seen(y, b, t, heads):
    return y.reshape(b, t, heads, t).transpose(1, 2)  # (B, H, query, key)


def kernel_keep(device, b, t, heads, p, seed, rows, mask=None, bf16=False):
    """The keep mask (B, H, T, T) the attention tasks apply for this seed and tiling: nntile's hash on CPUs; on GPUs
    read off the output for identity values (entries the mask or causality rules out read as dropped)."""
    if device == "cpu":
        return _C.attention_dropout_keep(b, heads, t, p, seed)
    y, _ = tiled(one_hot_values(b, t, heads).to(device), rows, heads, 1.0, p, seed, mask, bf16=bf16)
    return probabilities_seen(y.cpu(), b, t, heads) != 0


@pytest.mark.parametrize("b,t,heads,hd,rows,p", [(3, 37, 3, 8, 37, 0.1), (4, 9, 2, 5, 18, 0.5)],
                         ids=["3x37,3 heads,one seq per tile,p=0.1", "4x9,2 heads,two seqs per tile,p=0.5"])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding mask"])
def test_attention_dropout_matches_the_masked_reference(device, b, t, heads, hd, rows, p, masked):
    """Output and gradient of qkv equal torch's attention with the same mask (nntile's hash on CPUs, the fused
    kernel's on GPUs: kernel_keep), within twice torch's own float32 error against float64."""
    torch.manual_seed(0)
    c = heads * hd
    qkv = torch.randn(b, t, 3 * c, device=device)
    gy = torch.randn(b, t, c, device=device)
    scale = 0.7 / hd ** 0.5
    seed = 1234567
    bias, mask = None, None
    if masked:  # right padding of different lengths, causality in the mask (Hugging Face's 4-d masks)
        lengths = torch.tensor([t - i for i in range(b)])
        allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t)[None, :] < lengths[:, None, None])
        allowed |= torch.eye(t, dtype=torch.bool)  # pads' rows attend to themselves: no row without a key
        bias = torch.zeros(b, 1, t, t).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min).to(device)
        mask = attention_mask_tiles(bias, b, t, rows, device)
    keep = kernel_keep(device, b, t, heads, p, seed, rows, mask)
    y, g = tiled(qkv, rows, heads, scale, p, seed, mask, gy)

    def ref(x, dtype):
        x = x.to(dtype).requires_grad_(True)
        yr = masked_reference(x, heads, scale, keep, p, None if bias is None else bias.to(dtype))
        (gr,) = torch.autograd.grad(yr, x, gy.to(dtype))
        return yr, gr

    yr, gr = ref(qkv, torch.float32)
    y64, g64 = ref(qkv, torch.float64)
    assert_close_as_torch(y, yr, y64, what="output")
    assert_close_as_torch(g, gr, g64, what="grad qkv")
    # the mask matters: without it the output is another one
    y_nodrop = masked_reference(qkv, heads, scale, torch.ones_like(keep), 0.0, bias)
    assert (y.cpu() - y_nodrop.cpu()).abs().max().item() > 1e-2


def test_keep_rate_and_scaling_from_the_output_itself(device):
    """With uniform probabilities and identity values the output shows the mask directly: each kept entry is
    1 / ((1 - p)(i + 1)), each dropped one 0, on CPUs the mask is the debug entry point's, and the keep rate is
    1 - p within 5 standard deviations."""
    b, t, heads, p, seed = 5, 40, 3, 0.2, 99
    y, _ = tiled(one_hot_values(b, t, heads).to(device), t, heads, 1.0, p, seed)
    seen = probabilities_seen(y.cpu(), b, t, heads)
    causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, heads, t, t)
    keep = seen != 0 if device != "cpu" else _C.attention_dropout_keep(b, heads, t, p, seed)
    assert torch.equal(seen[causal] != 0, keep[causal])
    assert torch.equal(seen[~causal], torch.zeros_like(seen[~causal]))
    expected = (1.0 / ((1 - p) * (torch.arange(t, dtype=torch.float32) + 1)))[:, None].expand(t, t)
    kept = causal & keep
    torch.testing.assert_close(seen[kept], expected.expand(b, heads, t, t)[kept], rtol=1e-6, atol=0)
    n = causal.sum().item()
    rate = kept.sum().item() / n
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5, rate
    whole = _C.attention_dropout_keep(40, 8, 64, 0.1, 3)  # the whole mask, not only its causal half
    assert abs(whole.float().mean().item() - 0.9) < 5 * (0.09 / whole.numel()) ** 0.5


def test_same_seed_same_mask_for_any_tiling(device):
    """One sequence per tile, two, all in one tile, and an uneven last tile: the same output and gradient (the
    mask of global sequence s is the same wherever s lies: on GPUs the memory-efficient kernel's Philox offsets,
    heads x T x T a multiple of 4); another seed drops other entries."""
    torch.manual_seed(1)
    b, t, heads, hd, p, seed = 6, 12, 2, 4, 0.3, 42
    c = heads * hd
    qkv = torch.randn(b, t, 3 * c, device=device)
    gy = torch.randn(b, t, c, device=device)
    y0, g0 = tiled(qkv, t, heads, 0.5, p, seed, gy=gy)
    for rows in (2 * t, 4 * t, b * t):  # 4 * t: tiles of 4 and 2 sequences
        y, g = tiled(qkv, rows, heads, 0.5, p, seed, gy=gy)
        torch.testing.assert_close(y, y0, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, g0, rtol=1e-6, atol=1e-6)
    y_again, _ = tiled(qkv, t, heads, 0.5, p, seed)
    assert torch.equal(y_again, y0)  # deterministic for a seed
    y_other, _ = tiled(qkv, t, heads, 0.5, p, seed + 1)
    assert (y_other - y0).abs().max().item() > 1e-2
    # the mask pattern itself, tiling by tiling, through identity values
    ones = one_hot_values(b, t, heads).to(device)
    pattern = [probabilities_seen(tiled(ones, rows, heads, 1.0, p, seed)[0].cpu(), b, t, heads) != 0
               for rows in (t, 3 * t, b * t)]
    assert torch.equal(pattern[0], pattern[1]) and torch.equal(pattern[0], pattern[2])


CUDA = pytest.mark.skipif(not (torch.cuda.is_available() and _C.built_with_cuda),
                          reason="requires CUDA (a GPU and a CUDA build)")


MASK64 = (1 << 64) - 1


def philox_of(seed, first_seq, heads, t):
    """The CUDA generator state (seed, offset) nntile sets around a tile's fused attention launch (attention.cpp,
    philox_of): splitmix64 of nntile's seed, and the tile's first element index first_seq * heads * T * T rounded
    up to a multiple of 4."""
    z = (0x9E3779B97F4A7C15 + seed) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31), (first_seq * heads * t * t + 3) // 4 * 4


def set_cuda_generator(seed, offset):
    """The default CUDA generator at (seed, offset): its state is those two 64-bit words."""
    words = [w - (1 << 64) if w >= 1 << 63 else w for w in (seed, offset)]
    torch.cuda.set_rng_state(torch.tensor(words, dtype=torch.int64).view(torch.uint8))


def kernel_used(before, after):
    """The one fused kernel whose forward count moved between two attention_forwards() readings (an error if
    several did: a backward on another worker must replay the kernel whose mask its forward drew)."""
    moved = [name for name in ("flash", "efficient", "cudnn") if after[name] > before[name]]
    assert len(moved) == 1 and after["cpu"] == before["cpu"], (before, after)
    return moved[0]


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


@pytest.fixture
def attention_kernel(request, monkeypatch):
    """The runtime restarted with NNTILE_ATTENTION set to the parameter ("auto": unset), and stopped after the test
    (the next one starts it with the environment restored). A kernel torch cannot run with dropout on this GPU
    skips."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kernel = request.param
    if kernel != "auto":
        q = torch.zeros(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
        try:
            with sdpa_kernel(getattr(SDPBackend, BACKENDS[kernel])):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
        except RuntimeError as e:
            pytest.skip(f"torch runs no {kernel} attention with dropout here: {e}")
    nt.shutdown()
    if kernel == "auto":
        monkeypatch.delenv("NNTILE_ATTENTION", raising=False)
    else:
        monkeypatch.setenv("NNTILE_ATTENTION", kernel)
    yield kernel
    nt.shutdown()


KERNELS = pytest.mark.parametrize("attention_kernel", ["auto", "cudnn", "flash"], indirect=True)


@pytest.mark.cuda
@CUDA
@KERNELS
@pytest.mark.parametrize("rows", [64, 128], ids=["one seq per tile", "two seqs per tile"])
def test_gpu_bf16_dropout_is_torchs_own_fused_attention_with_the_tiles_generator_state(rows, attention_kernel):
    """bf16 on a GPU: dropout inside one fused kernel for every tile (by default the one torch's own attention picks
    for the tile's tensors with this dropout probability, torch._fused_sdp_choice; cuDNN's or flash where
    NNTILE_ATTENTION names it); output and gradient equal torch's scaled_dot_product_attention with
    dropout through that kernel, tile by tile, from the generator state nntile sets for the tile (philox_of), to
    bf16's rounding, and far from it with another seed: the backward, from the forward's kept statistics, replays
    the forward's mask. The caller's CUDA random stream is left where it was."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from nntile_torch.runtime import attention_forwards
    b, t, heads, hd, p, seed = 3, 64, 2, 64, 0.1, 2024
    c, scale = heads * hd, hd ** -0.5
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(b, t, 3 * c, generator=gen).cuda()
    gy = torch.randn(b, t, c, generator=gen).cuda()
    torch.cuda.manual_seed(11)
    before = torch.cuda.get_rng_state()
    forwards = attention_forwards()
    y, g = tiled(qkv, rows, heads, scale, p, seed, gy=gy, bf16=True)
    kernel = kernel_used(forwards, attention_forwards())
    expected = attention_kernel
    if attention_kernel == "auto":
        choice = torch._fused_sdp_choice(*split_heads(qkv[:rows // t].bfloat16(), heads), None, p, True, scale=scale)
        expected = {1: "flash", 3: "cudnn"}.get(choice, "efficient")
    assert kernel == expected, kernel
    assert torch.equal(torch.cuda.get_rng_state(), before)  # nntile's launches put the generator back
    backend = getattr(SDPBackend, BACKENDS[kernel])
    per_tile = rows // t

    def torchs(seed):
        ys, gs = [], []
        for first in range(0, b, per_tile):
            x = qkv[first:first + per_tile].bfloat16().requires_grad_(True)
            set_cuda_generator(*philox_of(seed, first, heads, t))
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(
                    *split_heads(x, heads), dropout_p=p, is_causal=True, scale=scale)
            out = out.transpose(1, 2).reshape(x.shape[0], t, c)
            (gx,) = torch.autograd.grad(out, x, gy[first:first + per_tile].bfloat16())
            ys.append(out.float())
            gs.append(gx.float())
        torch.cuda.set_rng_state(before)
        return torch.cat(ys), torch.cat(gs)

    yr, gr = torchs(seed)
    yo, go = torchs(seed + 1)
    for ours, ref, other, what in ((y, yr, yo, "output"), (g, gr, go, "grad qkv")):
        err = (ours - ref).abs().max().item()
        assert err < 2e-2 * ref.abs().max().item(), f"{what} ({kernel}): error {err:.3e}"
        assert (ours - other).abs().max().item() > 4 * err, f"{what} ({kernel}): another seed is as close"


@pytest.mark.cuda
@CUDA
@KERNELS
def test_gpu_bf16_dropout_keeps_the_share_and_scales_by_one_over_one_minus_p(attention_kernel):
    """bf16 on a GPU, the mask read off the identity-values output (kernel_keep): kept entries are
    1 / ((1 - p)(i + 1)) to bf16's rounding, entries causality rules out are 0, the share kept is 1 - p within 5
    standard deviations and 1/256 (flash quantizes its threshold to 8 bits); the same seed gives the same mask,
    another seed another."""
    from nntile_torch.runtime import attention_forwards
    b, t, heads, p, seed = 5, 64, 2, 0.2, 99
    forwards = attention_forwards()
    y, _ = tiled(one_hot_values(b, t, heads).cuda(), t, heads, 1.0, p, seed, bf16=True)
    kernel = kernel_used(forwards, attention_forwards())
    seen = probabilities_seen(y.cpu(), b, t, heads)
    causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, heads, t, t)
    assert torch.equal(seen[~causal], torch.zeros_like(seen[~causal]))
    kept = causal & (seen != 0)
    expected = (1.0 / ((1 - p) * (torch.arange(t, dtype=torch.float32) + 1)))[:, None].expand(b, heads, t, t)
    torch.testing.assert_close(seen[kept], expected[kept], rtol=1e-2, atol=0, msg=kernel)
    n = causal.sum().item()
    rate = kept.sum().item() / n
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5 + 1 / 256, (kernel, rate)
    keep = kernel_keep("cuda", b, t, heads, p, seed, t, bf16=True)
    assert torch.equal(keep, seen != 0)
    assert not torch.equal(kernel_keep("cuda", b, t, heads, p, seed + 1, t, bf16=True), keep)


def test_bad_dropout_probability_is_a_clear_error():
    qkv = nt.TileTensor.from_dense(torch.randn(2, 4, 12), (4, 12), (8, 12))
    with pytest.raises(Exception, match=r"dropout_p must be in \[0, 1\) \(got 1"):
        CausalAttentionFunction.apply(qkv, 2, 1.0, False, None, 1.0, 0).materialize()


# --- models that train with attention dropout ----------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")
_spec = importlib.util.spec_from_file_location(
    "nanogpt_model", Path(__file__).resolve().parents[1] / "examples" / "nanogpt" / "model.py")
nanogpt_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nanogpt_model)
TILES = dict(tile_size=384, batch_tile_size=32)  # as tests/test_dropin.py: a wait-free step's tiles


def waits_of(fn):
    before = nt.stats()["blocking_waits"]
    out = fn()
    return out, nt.stats()["blocking_waits"] - before


def test_nanogpt_with_dropout_trains_in_tiles(device):
    """nanoGPT with dropout 0.2 (its fine-tuning configs' value; attention dropout through SDPA's dropout_p)
    converts under strict=True; a training step waits only where the loss is read; dropout is on in training
    (the loss moves with the seed) and off in eval (the unconverted model's loss)."""
    torch.manual_seed(0)
    cfg = nanogpt_model.GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64, dropout=0.2)
    ref = nanogpt_model.GPT(cfg).to(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step():
        _, loss = ours(x, y)
        loss.backward()
        return loss

    step()
    loss, waits = waits_of(step)
    assert waits == 0
    first, waits = waits_of(loss.item)
    assert waits == 1
    torch.manual_seed(3)
    a = ours(x, y)[1].item()
    torch.manual_seed(4)
    assert ours(x, y)[1].item() != a
    ours.eval()
    ref.eval()
    assert abs(ours(x, y)[1].item() - ref(x, y)[1].item()) < 1e-5
    assert nt.convert_report(ours).dense_ops == {}


def test_hf_gpt2_default_config_trains_in_tiles(device):
    """Hugging Face's default GPT2Config (attn_pdrop = resid_pdrop = embd_pdrop = 0.1) converts under
    strict=True and its training step waits only where the loss is read; in eval it is the unconverted model."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=32)
    assert cfg.attn_pdrop == 0.1
    ref = transformers.GPT2LMHeadModel(cfg).to(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES).train()
    ids = torch.randint(0, 101, (3, 32), device=device)

    def step():
        loss = ours(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    step()
    loss, waits = waits_of(step)
    assert waits == 0
    assert torch.isfinite(torch.tensor(loss.item()))
    ours.eval()
    ref.eval()
    assert abs(ours(input_ids=ids, labels=ids).loss.item() - ref(input_ids=ids, labels=ids).loss.item()) < 1e-5
    assert nt.convert_report(ours).dense_ops == {}


# --- evaluation ------------------------------------------------------------------------------------------------

def test_eval_under_no_grad_keeps_nothing_and_waits_only_for_the_loss(device):
    """nanoGPT's estimate_loss (model.eval(), torch.no_grad(), loss.item() per batch): the forward submits
    without a wait, keeps no tile for a backward (live tiles fall back to the weights' once the outputs go, where
    a training forward holds its activations), and reading the loss is the one wait; the loss is the unconverted
    model's."""
    torch.manual_seed(0)
    cfg = nanogpt_model.GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64, dropout=0.1)
    ref = nanogpt_model.GPT(cfg).to(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    ours.eval()
    ref.eval()
    with torch.no_grad():
        ours(x, y)[1].item()  # warm-up: caches of the first call
    base = nt.stats()["tile_bytes"]
    with torch.no_grad():
        (logits, loss), waits = waits_of(lambda: ours(x, y))
        assert waits == 0 and loss.grad_fn is None
        del logits
        kept_bytes = nt.stats()["tile_bytes"] - base
        value, waits = waits_of(loss.item)
        assert waits == 1
        assert abs(value - ref(x, y)[1].item()) < 1e-5
    assert kept_bytes <= 64, f"{kept_bytes} bytes of tiles outlive an evaluation forward beside its loss"
    # a training forward keeps its activations: the measure above would see them
    ours.train()
    logits, loss = ours(x, y)
    del logits
    assert nt.stats()["tile_bytes"] - base > 10_000
    loss.backward()


def test_hf_eval_loop_waits_only_for_the_loss(device):
    """A Hugging Face eval loop (model.eval(), torch.no_grad(), a padded batch, loss.item()) with the default
    dropouts: no wait before the loss is read, no autograd graph, the unconverted model's loss."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=32)
    ref = transformers.GPT2LMHeadModel(cfg).to(device).eval()
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES).eval()
    ids = torch.randint(0, 101, (3, 32), device=device)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        for _ in range(2):
            out, waits = waits_of(lambda: ours(input_ids=ids, attention_mask=mask, labels=labels))
            assert waits == 0 and out.loss.grad_fn is None
            value, waits = waits_of(out.loss.item)
            assert waits == 1
        assert abs(value - ref(input_ids=ids, attention_mask=mask, labels=labels).loss.item()) < 1e-5


# --- sampling --------------------------------------------------------------------------------------------------

def test_nanogpt_generate_takes_the_last_position_in_tiles(device):
    """nanoGPT's generate() (eval, dropout 0.1 configured): the forward's x[:, [-1], :] is a row gather by tasks
    (not a gathering of the whole activation), the same tokens as the unconverted model for a seed, and what still
    runs as torch code is only the sampling on the (B, V) logits, named in the report (no weight, no index)."""
    torch.manual_seed(0)
    cfg = nanogpt_model.GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64, dropout=0.1)
    ref = nanogpt_model.GPT(cfg).to(device).eval()
    # one row tile for every length the prompt grows to: attention's tiles must hold whole sequences
    ours = nt.convert(copy.deepcopy(ref), strict=True, tile_size=384, batch_tile_size=1024).eval()
    x = torch.randint(0, 101, (3, 8), device=device)
    with torch.no_grad():
        logits, _ = ours(x)
        assert isinstance(logits, nt.TileTensor) and logits.shape == (3, 1, 101)
        assert logits.materialize().device == x.device  # the model's device (its gather's ids are CPU)
        torch.testing.assert_close(logits.materialize(), ref(x)[0], rtol=1e-5, atol=1e-5)
    torch.manual_seed(1)
    tokens, waits = waits_of(lambda: ours.generate(x, 5, top_k=10))
    torch.manual_seed(1)
    assert torch.equal(tokens.cpu(), ref.generate(x, 5, top_k=10).cpu())
    report = nt.convert_report(ours)
    assert report.dense_ops == {}, report.dense_ops  # the forward, x[:, [-1], :] included, all in tiles
    ops = {op for _, op in report.outside_ops}  # generate()'s own sampling on the logits it read
    assert {m for m, _ in report.outside_ops} == {"GPT.generate"}, report.outside_ops
    assert not any(op.startswith("index.") for op in ops), ops
    assert ops <= {"topk.default", "lt.Tensor", "index_put_.default", "_softmax.default"}, ops
    assert waits <= 2 * 5, waits  # reading each step's (B, V) logits for the sampling
