"""Cross-entropy over vocabulary tiles (F.cross_entropy on tiled logits) against torch, CPU and CUDA."""
import pytest
import torch
import torch.nn.functional as F

import nntile_torch as nt
from conftest import assert_close_as_torch


def tiled_logits(x, tile):
    t = nt.TileTensor.from_dense(x, tile)
    t.requires_grad_(True)
    return t


@pytest.mark.parametrize("m,v,tile,reduction", [
    (111, 1000, (40, 128), "mean"),   # partial row and vocabulary tiles
    (37, 301, (37, 301), "sum"),      # one tile
    (64, 257, (16, 64), "mean"),
])
def test_cross_entropy_matches_torch(device, m, v, tile, reduction):
    g = torch.Generator().manual_seed(m + v)
    x = (torch.randn(m, v, generator=g) * 3).to(device)
    labels = torch.randint(0, v, (m,), generator=g).to(device)
    labels[::7] = -100  # ignored rows
    labels[1] = v - 1
    ours_x = tiled_logits(x, tile)
    waits = nt.stats()["blocking_waits"]
    loss = F.cross_entropy(ours_x, labels, reduction=reduction)
    assert isinstance(loss, nt.TileTensor) and loss.shape == ()
    (gx,) = torch.autograd.grad(loss, [ours_x])
    assert isinstance(gx, nt.TileTensor) and nt.stats()["blocking_waits"] == waits  # all asynchronous so far
    ref_x = x.clone().requires_grad_(True)
    ref = F.cross_entropy(ref_x, labels, reduction=reduction)
    (gref,) = torch.autograd.grad(ref, [ref_x])
    x64 = x.double().requires_grad_(True)
    ref64 = F.cross_entropy(x64, labels, reduction=reduction)
    (g64,) = torch.autograd.grad(ref64, [x64])
    assert_close_as_torch(loss.materialize(), ref, ref64, what="loss")
    assert_close_as_torch(gx.materialize(), gref, g64, what="dlogits")
    # an upstream gradient other than one
    (gx2,) = torch.autograd.grad(F.cross_entropy(ours_x, labels, reduction=reduction), [ours_x],
                                 torch.tensor(-2.5, device=device))
    assert_close_as_torch(gx2.materialize(), -2.5 * gref, -2.5 * g64, what="scaled dlogits")


def test_cross_entropy_all_ignored_and_bad_targets(device):
    x = torch.randn(10, 50, device=device)
    t = tiled_logits(x, (4, 16))
    labels = torch.full((10,), -100, device=device)
    assert torch.isnan(F.cross_entropy(t, labels).materialize()) and torch.isnan(F.cross_entropy(x, labels))
    assert F.cross_entropy(t, labels, reduction="sum").materialize().item() == 0.0
    # labels on a GPU are checked by a task: the error comes at the next wait
    with pytest.raises(IndexError, match="target 50 is out of bounds|index 50 is out of range"):
        F.cross_entropy(t, torch.full((10,), 50, device=device)).materialize()
    with pytest.raises(IndexError, match="out of bounds|out of range"):
        F.cross_entropy(t, torch.full((10,), -3, device=device)).materialize()
    with pytest.raises(TypeError, match="integer dtype"):
        F.cross_entropy(t, torch.zeros(10, device=device))
    with pytest.raises(ValueError, match="shape"):
        F.cross_entropy(t, torch.zeros(9, dtype=torch.long, device=device))


def test_cross_entropy_options_tiles_do_not_cover_fall_back_to_torch(device):
    x = torch.randn(12, 30, device=device)
    t = tiled_logits(x, (5, 7))
    labels = torch.randint(0, 30, (12,), device=device)
    for kw in [dict(label_smoothing=0.1), dict(weight=torch.rand(30, device=device)), dict(ignore_index=3)]:
        ours = F.cross_entropy(t, labels, **kw)
        torch.testing.assert_close(ours, F.cross_entropy(x, labels, **kw))
