"""Broadcast adds between tiled tensors and sums over leading dims (autograd's reduction for them) as tasks."""
import pytest
import torch

import nntile_torch as nt


@pytest.mark.parametrize("small_shape,tile", [((1, 7, 10), (14, 4)), ((7, 10), (7, 10)), ((10,), (21, 3))])
def test_broadcast_add_and_its_gradient_stay_tiles(device, small_shape, tile):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 7, 10, generator=g).to(device)
    b = torch.randn(small_shape, generator=g).to(device)
    r = b.numel() // 10
    ta = nt.TileTensor.from_dense(a, tile, (21, 10)).requires_grad_(True)
    tb = nt.TileTensor.from_dense(b, (r, tile[1]), (r, 10)).requires_grad_(True)
    gy = torch.randn(3, 7, 10, generator=g).to(device)
    tgy = nt.TileTensor.from_dense(gy, tile, (21, 10))
    waits = nt.stats()["blocking_waits"]
    for y in (ta + tb, tb + ta):
        assert isinstance(y, nt.TileTensor) and y.shape == (3, 7, 10)
        ga, gb = torch.autograd.grad(y, [ta, tb], tgy)
        assert isinstance(gb, nt.TileTensor) and gb.shape == b.shape
        assert nt.stats()["blocking_waits"] == waits  # no materialization on the way
        assert torch.equal(y.materialize(), a + b)
        assert torch.equal(ga.materialize(), gy)
        # the block sum adds blocks in order: the same as summing the dense blocks one after another
        expect = gy.reshape(-1, r, 10)
        acc = expect[0].clone()
        for blk in expect[1:]:
            acc += blk
        assert torch.equal(gb.materialize(), acc.reshape(b.shape))
        waits = nt.stats()["blocking_waits"]


def test_sum_over_leading_dims_keepdim_and_fallback(device):
    x = torch.randn(4, 6, 5, device=device)
    t = nt.TileTensor.from_dense(x, (12, 5), (24, 5))
    torch.testing.assert_close(t.sum(0, keepdim=True).materialize(), x.sum(0, keepdim=True))
    torch.testing.assert_close(t.sum([0, 1]).materialize(), x.sum([0, 1]))
    s = t.sum(1)  # not leading: torch code on the materialized tensor, still right
    torch.testing.assert_close(s, x.sum(1))
    u = nt.TileTensor.from_dense(x, (5, 5), (24, 5))  # row tiles not holding whole 6-row blocks
    torch.testing.assert_close(u.sum(0), x.sum(0))
    torch.testing.assert_close(u + nt.TileTensor.from_dense(x[0], (6, 5)), x + x[0])
