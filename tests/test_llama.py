"""The Llama family's forms as tile tasks against Hugging Face's own modules (built from configs, no hub weights):
RMSNorm forward and every gradient on awkward shapes, its recognition by what it computes, and its conversion."""
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
