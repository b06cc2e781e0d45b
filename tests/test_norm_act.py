"""nntile_torch.nn.LayerNorm and GELU against torch: forward and every gradient on awkward shapes, tiled inputs
from a preceding tile op, bad input."""
import pytest
import torch

import nntile_torch as nt
from conftest import assert_close_as_torch, max_err, padded_causal_bias, softmax_logsumexp


def grads(module, x, gy, params=()):
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    return y, torch.autograd.grad(y, [x, *params], gy)


@pytest.mark.parametrize("shape,btile", [((3, 11, 53), 8), ((5, 96), 2), ((1, 7), 1024), ((2, 300, 1601), 512)],
                         ids=["3x11x53,rows=8", "5x96,rows=2", "1x7,one-tile", "2x300x1601,rows=512"])
def test_layer_norm_matches_torch(device, shape, btile):
    c = shape[-1]
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(c, eps=1e-5, device=device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    ours = nt.nn.LayerNorm(c, batch_tile_size=btile, device=device)
    ours.load_state_dict(ref.state_dict())
    ref64 = torch.nn.LayerNorm(c, device=device).double()
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    x = torch.randn(*shape, device=device) * 3 + 1
    gy = torch.randn(*shape, device=device)
    y, g = grads(ours, x, gy, [ours.weight, ours.bias])
    yr, gr = grads(ref, x, gy, [ref.weight, ref.bias])
    y64, g64 = grads(ref64, x.double(), gy.double(), [ref64.weight, ref64.bias])
    assert isinstance(y, nt.TileTensor)
    assert_close_as_torch(y, yr, y64, what="output")
    for name, a, b, c64 in zip(["x", "weight", "bias"], g, gr, g64):
        assert_close_as_torch(a, b, c64, what=f"grad {name}")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_matches_torch(device, approximate):
    x = torch.randn(3, 11, 53, device=device) * 3
    gy = torch.randn(3, 11, 53, device=device)
    ours = nt.nn.GELU(approximate, tile_size=16, batch_tile_size=8)
    ref = torch.nn.GELU(approximate)
    y, (g,) = grads(ours, x, gy)
    yr, (gr,) = grads(ref, x, gy)
    y64, (g64,) = grads(ref, x.double(), gy.double())
    assert_close_as_torch(y, yr, y64, what="output")
    assert_close_as_torch(g, gr, g64, what="grad x")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_bf16_outputs_are_torchs_float32_values_rounded(device, approximate):
    """GELU's forward and backward writing bfloat16 tiles (a bf16 matmul's input, docs/fusion.md): bit for bit
    torch's float32 gelu and gelu backward cast to bfloat16 (on GPUs one kernel computing ATen's formula), on uneven
    tiles, with values from the tails to zero."""
    from nntile_torch import _C
    from nntile_torch.tensor import TileTensor, new_tiles
    torch.manual_seed(0)
    x = torch.cat([torch.randn(1700, device=device) * 3, torch.linspace(-12, 12, 97, device=device),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 50.0, -50.0], device=device)]).reshape(3, 601)
    dy = torch.randn(3, 601, device=device)
    xt = nt.TileTensor.from_dense(x, (2, 256), x.shape)
    dyt = nt.TileTensor.from_dense(dy, (2, 256), dy.shape)
    tanh = approximate == "tanh"
    y = new_tiles(x.shape, (2, 256), torch.bfloat16)
    _C.gelu_forward(xt.tiles, y, tanh)
    dx = new_tiles(x.shape, (2, 256), torch.bfloat16)
    _C.gelu_backward(dyt.tiles, xt.tiles, dx, tanh)
    y_ref = torch.nn.functional.gelu(x, approximate=approximate).bfloat16()
    dx_ref = torch.ops.aten.gelu_backward(dy, x, approximate=approximate).bfloat16()
    for ours, ref, what in ((y, y_ref, "gelu"), (dx, dx_ref, "gelu_backward")):
        got = TileTensor(ours, x.shape, x.device).materialize()
        assert got.dtype == torch.bfloat16, got.dtype
        differ = (got.view(torch.int16) != ref.view(torch.int16)).sum().item()
        assert differ == 0, f"{what}: {differ} of {ref.numel()} values differ from torch's float32 result rounded"


def test_block_of_tile_ops_stays_asynchronous(device):
    """LayerNorm -> Linear -> GELU -> Linear -> residual add, forward and backward: no host wait."""
    torch.manual_seed(0)
    c = 40
    ln = nt.nn.LayerNorm(c, batch_tile_size=16, device=device)
    fc = nt.nn.Linear(c, 4 * c, tile_size=64, batch_tile_size=16, device=device)
    proj = nt.nn.Linear(4 * c, c, tile_size=64, batch_tile_size=16, device=device)
    act = nt.nn.GELU("tanh")
    mods = [torch.nn.LayerNorm(c), torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)]
    for m, o in zip(mods, (ln, fc, proj)):
        m.to(device).load_state_dict(o.state_dict())
    x = torch.randn(3, 37, c, device=device)
    h = proj(fc(ln(x)))  # warm-up converts nothing twice; the block below is what is checked
    before = nt.stats()["blocking_waits"]
    x_t = ln(x)  # a TileTensor: the residual stream
    h = x_t + proj(act(fc(ln(x_t))))
    h.backward(torch.ones_like(x))
    assert nt.stats()["blocking_waits"] == before
    ref_ln, ref_fc, ref_proj = mods
    xr = ref_ln(x)
    hr = xr + ref_proj(torch.nn.functional.gelu(ref_fc(ref_ln(xr)), approximate="tanh"))
    hr.backward(torch.ones_like(x))
    assert (h.materialize() - hr).abs().max().item() < 1e-4
    assert (fc.weight.grad.materialize() - ref_fc.weight.grad).abs().max().item() < 1e-3


def test_bad_input():
    ln = nt.nn.LayerNorm(8)
    with pytest.raises(ValueError, match=r"\(\*, 8\)"):
        ln(torch.randn(3, 7))
    with pytest.raises(TypeError, match="float32"):
        ln(torch.randn(3, 8).double())
    with pytest.raises(ValueError, match="last dimension"):
        nt.nn.LayerNorm((4, 8))
    with pytest.raises(ValueError, match="approximate"):
        nt.nn.GELU("erf")
    assert torch.allclose(ln(torch.ones(2, 8)).materialize(), torch.zeros(2, 8))


def sdpa_reference(qkv, heads, scale):
    """torch's causal attention on (B, T, 3C) -> (B, T, C), heads side by side."""
    b, t, c = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    q, k, v = (u.reshape(b, t, heads, c // heads).transpose(1, 2) for u in qkv.split(c, dim=2))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale) \
        .transpose(1, 2).reshape(b, t, c)


def tiled_attention(qkv, gy, heads, scale, bf16):
    """nntile's causal attention on qkv (b, t, 3c), one sequence per tile: output and gradient of qkv, dense."""
    from nntile_torch.functional import CausalAttentionFunction
    b, t, c3 = qkv.shape
    tiled = nt.TileTensor.from_dense(qkv, (t, c3), (b * t, c3))
    tiled.requires_grad_(True)
    y = CausalAttentionFunction.apply(tiled, heads, scale, bf16)
    (g,) = torch.autograd.grad(y, tiled, gy)
    return y.materialize(), g.materialize()  # waits for the tasks


def bf16_and_float64_references(qkv, gy, heads, scale):
    """torch's sdpa on bfloat16 inputs and in float64: outputs and gradients of qkv (y, g, y64, g64)."""
    x = qkv.clone().requires_grad_(True)
    yr = sdpa_reference(x.bfloat16(), heads, scale).float()
    (gr,) = torch.autograd.grad(yr, x, gy)
    x64 = qkv.double().requires_grad_(True)
    y64 = sdpa_reference(x64, heads, scale)
    (g64,) = torch.autograd.grad(y64, x64, gy.double())
    return yr, gr, y64, g64


@pytest.mark.parametrize("b,t,heads,hd,rows", [(3, 37, 6, 16, 37), (4, 9, 2, 5, 18)],
                         ids=["3x37,6 heads,one seq per tile", "4x9,2 heads,two seqs per tile"])
def test_causal_attention_matches_torch(device, b, t, heads, hd, rows):
    from nntile_torch.functional import CausalAttentionFunction
    c = heads * hd
    qkv = torch.randn(b, t, 3 * c, device=device)
    gy = torch.randn(b, t, c, device=device)
    scale = 0.7 / hd ** 0.5

    tiled = nt.TileTensor.from_dense(qkv, (rows, 3 * c), (b * t, 3 * c))
    tiled.requires_grad_(True)
    y = CausalAttentionFunction.apply(tiled, heads, scale)
    (g,) = torch.autograd.grad(y, tiled, gy)
    x = qkv.clone().requires_grad_(True)
    yr = sdpa_reference(x, heads, scale)
    (gr,) = torch.autograd.grad(yr, x, gy)
    x64 = qkv.double().requires_grad_(True)
    y64 = sdpa_reference(x64, heads, scale)
    (g64,) = torch.autograd.grad(y64, x64, gy.double())
    assert_close_as_torch(y, yr, y64, what="output")
    assert_close_as_torch(g, gr, g64, what="grad qkv")


def test_causal_attention_in_bf16_no_worse_than_torch_in_bf16(device):
    """bf16=True: q, k, v and the output gradient rounded to bfloat16, the kernel in bfloat16 (what torch does under
    bf16 autocast). Output and gradient no further from the float64 result than twice torch's sdpa on bfloat16
    inputs, and really in bfloat16 (further from float64 than the float32 kernel)."""
    b, t, heads, hd = 2, 45, 3, 24
    c = heads * hd
    torch.manual_seed(3)
    qkv = torch.randn(b, t, 3 * c, device=device)
    gy = torch.randn(b, t, c, device=device)
    scale = 1 / hd ** 0.5

    out = {bf16: tiled_attention(qkv, gy, heads, scale, bf16) for bf16 in (False, True)}
    yr, gr, y64, g64 = bf16_and_float64_references(qkv, gy, heads, scale)
    assert_close_as_torch(out[True][0], yr, y64, what="bf16 output")
    assert_close_as_torch(out[True][1], gr, g64, what="bf16 grad qkv")
    assert max_err(out[True][0], y64) > 10 * max_err(out[False][0], y64)


def test_bf16_attention_runs_the_kernel_torch_would_pick(device):
    """bf16 causal attention on a GPU runs the fused kernel torch's own scaled_dot_product_attention picks for the
    same tensors (torch._fused_sdp_choice: cuDNN's on the H200, where the memory-efficient one took 4x its time),
    forward and backward, with torch's accuracy; on CPUs, the CPU flash kernel. GPT-2 XL's head size and a
    sequence long enough for every kernel."""
    from nntile_torch.runtime import attention_forwards
    b, t, heads, hd = 2, 256, 4, 64
    c = heads * hd
    torch.manual_seed(5)
    qkv = torch.randn(b, t, 3 * c, device=device)
    gy = torch.randn(b, t, c, device=device)
    scale = 1 / hd ** 0.5
    before = attention_forwards()
    y, g = tiled_attention(qkv, gy, heads, scale, True)
    after = attention_forwards()
    used = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    if device == "cpu":
        expected = "cpu"
    else:
        q, k, v = (u.reshape(b, t, heads, hd).transpose(1, 2).bfloat16() for u in qkv.split(c, dim=2))
        choice = torch._fused_sdp_choice(q, k, v, is_causal=True, scale=scale)
        expected = {1: "flash", 3: "cudnn"}.get(choice, "efficient")
    assert used == {expected: b}, used  # one per sequence tile: the backward reads the forward's statistics
    yr, gr, y64, g64 = bf16_and_float64_references(qkv, gy, heads, scale)
    assert_close_as_torch(y, yr, y64, what="bf16 output")
    assert_close_as_torch(g, gr, g64, what="bf16 grad qkv")


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "masked"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,p", [(23, 0.0), (46, 0.0), (46, 0.25)], ids=["1seq", "2seq", "2seq-dropout"])
def test_attention_backward_from_the_kept_statistics_equals_the_recomputing_one(device, masked, bf16, rows, p):
    """The forward keeps each query's softmax log-sum-exp (natural log, as float64 computes it from the bf16 or fp32
    q and k the kernel read); the backward given the output and those statistics runs no forward, and its gradient
    is the one of the backward that recomputes the forward: bit for bit on CPUs, to the fused kernels' rounding on
    GPUs (their backward sums in no fixed order). Three sequences of 23 (awkward: no multiple of 8 or 32), head size
    12 (padded to 16 on GPUs), 1 or 2 sequences per tile (the last tile partial), causal or a padding mask, with
    attention dropout (on CPUs the explicit path, which keeps nothing)."""
    from nntile_torch import _C
    from nntile_torch.runtime import attention_forwards
    from nntile_torch.tensor import new_tiles, tiles_like
    b, t, heads, hd, seed = 3, 23, 2, 12, 77
    c, scale = heads * hd, hd ** -0.5
    gen = torch.Generator().manual_seed(21)
    qkv = torch.randn(b * t, 3 * c, generator=gen).to(device)
    dy = torch.randn(b * t, c, generator=gen).to(device)
    mask = None
    m = padded_causal_bias(b, t) if masked else None
    if masked:
        mask = nt.TileTensor.from_dense(m.reshape(b * t, t).to(device), (rows, t)).tiles
    x = nt.TileTensor.from_dense(qkv, (rows, 3 * c)).tiles
    g = nt.TileTensor.from_dense(dy, (rows, c)).tiles
    y = new_tiles([b * t, c], [rows, c])
    stats = new_tiles([b, heads * t], [rows // t, heads * t])
    _C.attention_forward(x, y, t, heads, scale, bf16, mask, p, seed, stats)
    dense = nt.TileTensor(stats, (b, heads, t), device).materialize().double()
    before = attention_forwards()
    d_kept = tiles_like(x)
    _C.attention_backward(g, x, d_kept, t, heads, scale, bf16, mask, p, seed, y, stats)
    nt.synchronize()
    middle = attention_forwards()
    d_again = tiles_like(x)
    _C.attention_backward(g, x, d_again, t, heads, scale, bf16, mask, p, seed)
    nt.synchronize()
    after = attention_forwards()
    explicit = p > 0 and device == "cpu"  # the explicit dropout path: no fused kernel either way
    assert middle == before, (before, middle)
    assert sum(after.values()) - sum(middle.values()) == (0 if explicit else -(-b * t // rows))
    ours = nt.TileTensor(d_kept, (b * t, 3 * c), device).materialize()
    theirs = nt.TileTensor(d_again, (b * t, 3 * c), device).materialize()
    if device == "cpu":
        assert torch.equal(ours, theirs)
    else:
        err = (ours - theirs).abs().max().item() / theirs.abs().max().item()
        assert err < (1e-2 if bf16 else 1e-5), f"relative difference {err:.2e}"
    if explicit:
        return
    q, k = (u.reshape(b, t, heads, hd).transpose(1, 2).double() for u in qkv.split(c, dim=1)[:2])
    if bf16:
        q, k = q.bfloat16().double(), k.bfloat16().double()
    torch.testing.assert_close(dense, softmax_logsumexp(q, k, scale, m), rtol=0, atol=1e-2 if bf16 else 1e-5)


def test_embedding_matches_torch(device):
    torch.manual_seed(0)
    ref = torch.nn.Embedding(1000, 53, device=device)
    ours = nt.nn.Embedding(1000, 53, tile_size=96, batch_tile_size=8, device=device)  # 11 vocabulary tiles
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 1000, (3, 11), device=device)
    ids[0, :3] = torch.tensor([0, 999, 999])  # first and last rows, a repeated id
    gy = torch.randn(3, 11, 53, device=device)
    y = ours(ids)
    assert isinstance(y, nt.TileTensor) and torch.equal(y.materialize(), ref(ids))  # a gather: exact
    (g,) = torch.autograd.grad(y, [ours.weight], gy)
    (gr,) = torch.autograd.grad(ref(ids), [ref.weight], gy)
    ref64 = torch.nn.Embedding(1000, 53, device=device).double()
    (g64,) = torch.autograd.grad(ref64(ids), [ref64.weight], gy.double())
    assert_close_as_torch(g, gr, g64, what="grad weight")
    for bad, err in [(torch.tensor([[1000]], device=device), IndexError), (torch.tensor([[-1]], device=device), IndexError),
                     (torch.zeros(2, 3, device=device), TypeError)]:
        # ids on a GPU are checked by a task: the error comes at the next wait, as IndexError too
        with pytest.raises(err, match="out of range|integer tensor"):
            ours(bad).materialize()
    with pytest.raises(ValueError, match="padding_idx"):
        nt.nn.Embedding(10, 4, padding_idx=0)


def test_dropout_is_seeded_scaled_and_its_backward_uses_the_same_mask(device):
    x = torch.randn(300, 97, device=device)
    drop = nt.nn.Dropout(0.3, tile_size=40, batch_tile_size=64)
    xt = nt.TileTensor.from_dense(x, (64, 40)).requires_grad_(True)
    torch.manual_seed(5)
    y = drop(xt)
    assert isinstance(y, nt.TileTensor)
    yd = y.materialize()
    kept = yd != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.01  # 29100 draws: 5 standard deviations
    torch.testing.assert_close(yd[kept], x[kept] / 0.7, rtol=1e-6, atol=0)
    gy = torch.randn_like(x)
    (gx,) = torch.autograd.grad(y, [xt], gy)
    assert torch.equal(gx.materialize() != 0, kept)
    torch.testing.assert_close(gx.materialize()[kept], gy[kept] / 0.7, rtol=1e-6, atol=0)
    torch.manual_seed(5)
    assert torch.equal(drop(xt).materialize(), yd)  # same seed, same mask
    assert not torch.equal(drop(xt).materialize(), yd)  # the next call draws a new seed
    # the mask does not depend on the device: the CPU computes the same one
    torch.manual_seed(5)
    assert torch.equal(drop(nt.TileTensor.from_dense(x.cpu(), (64, 40))).materialize().cpu(), yd.cpu())
    drop.eval()
    assert drop(xt) is xt
    with pytest.raises(ValueError, match="between 0 and 1"):
        nt.nn.Dropout(1.5)


def test_dropout_mask_does_not_depend_on_the_tiling(device):
    """The mask is a function of (seed, element index in the whole tensor): tiles of any size, partial edge tiles,
    an N-d tiling or a dense input tiled by the module all drop the same elements (the mask of tile t once counted
    from t * (full tile size), so another tile size gave another mask)."""
    x = torch.randn(6, 37, 29, device=device)
    outs = []
    for tiled_shape, tile in [((6 * 37, 29), (222, 29)), ((6 * 37, 29), (64, 10)), ((6 * 37, 29), (5, 29)),
                              ((6, 37, 29), (4, 8, 16)), ((6, 37, 29), (1, 37, 29))]:
        torch.manual_seed(7)
        xt = nt.TileTensor.from_dense(x, tile, tiled_shape)
        outs.append(nt.nn.Dropout(0.4)(xt).materialize())
    for tile_size, batch_tile_size in [(29, 222), (7, 50)]:  # dense input, tiled by the module
        torch.manual_seed(7)
        outs.append(nt.nn.Dropout(0.4, tile_size=tile_size, batch_tile_size=batch_tile_size)(x).materialize())
    kept = outs[0] != 0
    assert 0.5 < kept.float().mean().item() < 0.7
    for i, y in enumerate(outs[1:], 1):
        assert torch.equal(y, outs[0]), f"tiling {i} gives another mask"


def test_dropout_task_draws_the_hash_of_the_element_index(device):
    """The dropout task's mask (a one-pass loop on CPUs, a kernel on GPUs) is the splitmix64 hash of each element's
    index in the whole tensor that _C.attention_dropout_keep computes with ATen integer ops, over partial 4-d
    tiles; kept elements are x times 1 / (1 - p) exactly (p as the float32 the task gets, the factor rounded to
    float32)."""
    from nntile_torch import _C
    for p, seed in [(0.3, 5), (0.9, 2 ** 40 + 7)]:
        x = torch.randn(3, 4, 7, 7, device=device)
        xt = nt.TileTensor.from_dense(x, (2, 3, 4, 5))
        yt = nt.TileTensor.empty(x.shape, (2, 3, 4, 5), device=device)
        _C.dropout(xt.tiles, yt.tiles, p, seed)
        y = yt.materialize()
        keep = _C.attention_dropout_keep(3, 4, 7, p, seed, 0).to(device)
        assert torch.equal(y != 0, keep)
        scale = torch.tensor(1.0 / (1.0 - torch.tensor(p).item()), dtype=torch.float32, device=device)
        assert torch.equal(y[keep], (x * scale)[keep])
