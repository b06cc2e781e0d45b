"""TileTensor: dense round trips on awkward shapes, torch ops through materialization, in-place write-back."""
import pytest
import torch

import nntile_torch as nt


@pytest.mark.parametrize("shape,tile", [
    ((37, 53), (16, 16)), ((5,), (2,)), ((3, 7, 11), (2, 3, 4)), ((1, 1), (8, 8)), ((64, 32), (64, 32)),
], ids=lambda v: "x".join(map(str, v)))
def test_dense_round_trip(shape, tile):
    x = torch.randn(*shape)
    t = nt.TileTensor.from_dense(x, tile)
    grid = [-(-s // min(b, s)) for s, b in zip(shape, tile)]
    assert list(t.tiles.grid) == grid
    assert torch.equal(t.materialize(), x)
    assert torch.equal(t + 0, x)


def test_bfloat16_tiles():
    x = torch.randn(9, 10).bfloat16()
    t = nt.TileTensor.from_dense(x, (4, 4))
    assert t.dtype == torch.bfloat16 and torch.equal(t.materialize(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=lambda d: f"dtype={d}")
def test_new_tiles_speak_torch_dtypes(dtype):
    """The public way to make C++ tiles (tensor.new_tiles / TileTensor.new_tiles, tiles_like): torch dtypes in,
    torch dtypes out (dtype_of, tiles_dtype), awkward shapes with partial edge tiles."""
    from nntile_torch.tensor import dtype_of, new_tiles, same_tiling, tiles_like
    nt.init()
    t = nt.TileTensor.new_tiles((37, 11), (16, 4), dtype, name="probe")
    assert dtype_of(t) == dtype and list(t.grid) == [3, 3] and t.name == "probe"
    x = (torch.randn(37, 11) * 100).to(dtype)
    t.from_dense(x)
    w = nt.TileTensor(t, (37, 11))
    assert w.tiles_dtype == dtype and w.dtype == dtype and torch.equal(w.materialize(), x)
    like = tiles_like(w, torch.float32, name="like")
    assert dtype_of(like) == torch.float32 and not like.persistent
    assert tiles_like(w, dtype).same_tiling(t) and like.same_tiling(t) == (dtype == torch.float32)
    assert same_tiling(w, nt.TileTensor(tiles_like(t, dtype), (37, 11)))
    assert not same_tiling(w, nt.TileTensor(new_tiles((37, 11), (16, 5), dtype), (37, 11)))
    assert not same_tiling(w, nt.TileTensor(tiles_like(t, dtype), (11, 37)))  # same tiles, another logical shape
    assert not w.is_view and w.t().is_view


def test_bf16_tiles_under_a_float32_tensor():
    """logical_dtype: bf16 tiles that a float32 TileTensor stands over (a bf16 master weight)."""
    from nntile_torch.tensor import dtype_of, new_tiles
    nt.init()
    t = new_tiles((9, 10), (4, 4), torch.bfloat16, logical_dtype=torch.float32)
    x = torch.randn(9, 10).bfloat16()
    t.from_dense(x)
    w = nt.TileTensor(t)
    assert w.dtype == torch.float32 and w.tiles_dtype == torch.bfloat16 == dtype_of(w)
    assert torch.equal(w.materialize(), x.float())


def test_tile_dtypes_other_than_the_three_are_refused():
    from nntile_torch.tensor import new_tiles, tiles_dtype_name
    assert tiles_dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(TypeError, match="float16"):
        new_tiles((4,), (2,), torch.float16)
    with pytest.raises(TypeError, match="float64"):
        nt.TileTensor.empty((4,), (2,), dtype=torch.float64)


def test_the_tile_functions_and_ops_are_registered_by_their_modules():
    """register_tile_function / register_tile_op are how functional.py, pointwise.py and optim/torch_optim.py put
    their torch functions and aten ops on tiles (tensor.py imports none of them)."""
    from nntile_torch import tensor
    F = torch.nn.functional
    for func in (F.cross_entropy, F.layer_norm, F.gelu, F.scaled_dot_product_attention, F.embedding):
        assert tensor.FUNCTIONS[func].__module__ == "nntile_torch.functional", func
    ops = torch.ops.aten
    assert tensor._HANDLERS[ops.mul_.Scalar].__module__ == "nntile_torch.pointwise"
    assert tensor._HANDLERS[ops._fused_adamw_.default].__module__ == "nntile_torch.optim.torch_optim"


def test_torch_ops_see_a_dense_tensor():
    x = torch.randn(6, 7)
    t = nt.TileTensor.from_dense(x, (4, 4))
    assert torch.allclose(torch.sum(t), x.sum())
    assert torch.equal(t.t() @ t, x.t() @ x)
    assert torch.equal(t[2:4, 1], x[2:4, 1])
    assert "TileTensor" in repr(t)


def test_in_place_ops_write_back_to_tiles():
    x = torch.randn(6, 7)
    t = nt.TileTensor.from_dense(x, (4, 4))
    v = t.tiles.version
    t.mul_(2).add_(1)
    assert t.tiles.version > v
    assert torch.equal(t.tiles.to_dense(), x * 2 + 1)
    t.zero_()
    assert torch.equal(t.materialize(), torch.zeros(6, 7))


def test_tile_ops_between_tile_tensors():
    a, b = torch.randn(9, 5), torch.randn(9, 5)
    ta, tb = nt.TileTensor.from_dense(a, (4, 2)), nt.TileTensor.from_dense(b, (4, 2))
    waits = nt.stats()["blocking_waits"]
    s = ta + tb  # tile tasks, no wait
    c = ta.clone()
    ta.add_(tb, alpha=3)
    assert isinstance(s, nt.TileTensor) and isinstance(c, nt.TileTensor)
    assert nt.stats()["blocking_waits"] == waits
    assert torch.allclose(s.materialize(), a + b)
    assert torch.equal(c.materialize(), a)
    assert torch.allclose(ta.materialize(), a + 3 * b)


def test_copy_between_tilings():
    a = torch.randn(9, 5)
    ta = nt.TileTensor.from_dense(a, (4, 2))
    tb = nt.TileTensor.empty((9, 5), (3, 3))
    tb.copy_(ta)
    assert torch.equal(tb.materialize(), a)


def test_convert_to_bf16_rounds_like_torch(device):
    x = torch.randn(37, 21, device=device)
    x[0, :4] = torch.tensor([1.00390625, 1.01171875, float("nan"), float("inf")])  # ties to even, nan, inf
    t = nt.TileTensor.from_dense(x, (16, 8))
    b = nt._C.TileTensor([37, 21], [16, 8], "bfloat16", "")
    nt._C.convert(t.tiles, b)
    got = nt.TileTensor(b, device=device).materialize()
    assert got.dtype == torch.bfloat16
    want = x.bfloat16()
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok].view(torch.int16), want[ok].view(torch.int16))  # bit for bit
    back = nt._C.TileTensor([37, 21], [16, 8], "float32", "")
    nt._C.convert(b, back)
    widened = nt.TileTensor(back, device=device).materialize()
    assert torch.allclose(widened, x.bfloat16().float(), rtol=0, atol=0, equal_nan=True)


def test_deepcopy_of_a_converted_model_is_independent():
    """copy.deepcopy of a model with tile parameters (and gradients): same values, own tiles."""
    import copy
    torch.manual_seed(0)
    m = torch.nn.Sequential(nt.nn.Linear(13, 7, tile_size=5, batch_tile_size=4), nt.nn.LayerNorm(7))
    x = torch.randn(6, 13)
    m(x).sum().backward()
    c = copy.deepcopy(m)
    assert isinstance(c[0].weight, nt.TileTensor) and c[0].weight.requires_grad and c[0].weight is not m[0].weight
    assert set(dict(c.named_parameters())) == set(dict(m.named_parameters()))
    for (name, a), (_, b) in zip(m.named_parameters(), c.named_parameters()):
        assert torch.equal(a.materialize(), b.materialize()), name
        assert torch.equal(a.grad.materialize(), b.grad.materialize()), name
    y = m(x).materialize().clone()
    assert torch.equal(c(x).materialize(), y)
    with torch.no_grad():
        m[0].weight.add_(1.0)
    assert torch.equal(c[0].weight.materialize() + 1.0, m[0].weight.materialize())
    assert torch.equal(c(x).materialize(), y)  # the copy did not move with the original


def test_tiles_read_before_any_write_do_not_abort():
    """A TileTensor.empty never written, read on the host, by a task, or kept across a runtime restart: StarPU
    aborted the process there ("handle ... is not initialized while trying to read it"), so this runs in its own
    process. Host reads now see zeros; a task reading it sees undefined values (torch.empty's contract)."""
    import subprocess
    import sys
    code = """
import torch, nntile_torch as nt
from nntile_torch import _C
nt.init(ncpus=1, ncuda=0)
e = nt.TileTensor.empty((5, 7), (2, 3))
assert torch.equal(e.materialize(), torch.zeros(5, 7)), e.materialize()
f = nt.TileTensor.empty((4, 6), (4, 4))
g = _C.TileTensor([4, 6], [4, 4], "float32", "")
_C.add(1.0, f.tiles, 0.0, g)  # a task reads f's tiles
assert g.to_dense(None).shape == (4, 6)
h = nt.TileTensor.empty((3, 3), (2, 2), dtype=torch.bfloat16)  # alive at shutdown, whose values are kept
nt.shutdown()
nt.init(ncpus=1, ncuda=0)
assert torch.equal(h.materialize(), torch.zeros(3, 3, dtype=torch.bfloat16))
nt.shutdown()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-3000:])


@pytest.mark.parametrize("shape,tile", [((37, 53), (16, 16)), ((5, 3, 7), (2, 3, 4))], ids=["37x53", "5x3x7"])
@pytest.mark.parametrize("alpha", [1.0, -0.375])
def test_sum_of_tiled_tensors_is_one_task_per_tile(shape, tile, alpha, device):
    """t + alpha * u (residual connections, autograd's sums of gradients) writes fresh tiles in one add_into task
    per tile, where a copy and an add took two; the operands are left as they were."""
    x, y = torch.randn(*shape, device=device), torch.randn(*shape, device=device)
    t, u = nt.TileTensor.from_dense(x, tile), nt.TileTensor.from_dense(y, tile)
    before = nt.stats()["tasks_submitted"]
    s = torch.add(t, u, alpha=alpha)
    assert nt.stats()["tasks_submitted"] - before == t.tiles.ntiles
    assert isinstance(s, nt.TileTensor) and list(s.tiles.tile_shape) == list(t.tiles.tile_shape)
    torch.testing.assert_close(s.materialize(), torch.add(x, y, alpha=alpha))  # float32 rounding (exact at alpha 1)
    if alpha == 1.0:
        assert torch.equal(s.materialize(), x + y)
    assert torch.equal(t.materialize(), x) and torch.equal(u.materialize(), y)
    d = torch.randn(*shape, device=device)  # a dense operand on either side: tiled like the TileTensor, then summed
    torch.testing.assert_close((d + t).materialize(), d + x, rtol=0, atol=0)


def test_add_into_checks_tiling_and_dtype():
    from nntile_torch import _C
    a = _C.TileTensor([4, 6], [4, 4], "float32", "")
    b = _C.TileTensor([4, 6], [2, 4], "float32", "")
    c = _C.TileTensor([4, 6], [4, 4], "bfloat16", "")
    with pytest.raises(Exception, match="same shape and tiles"):
        _C.add_into(1.0, a, 1.0, b, a)
    with pytest.raises(Exception, match="add_into"):
        _C.add_into(1.0, a, 1.0, a, c)


def test_view_ops_take_torch_geometry_and_remember_it():
    """View ops on a TileTensor (view, transpose, split by size and by sizes, unsqueeze, permute, select, narrow,
    expand, t, squeeze, unflatten, chains of them) are views of the same tiles with the geometry torch gives a dense
    tensor, values equal; the second time a geometry is asked it comes from the cache (nanoGPT asks the same ones every
    layer), with the same values; a view torch refuses on these strides is refused the same way both times."""
    from nntile_torch import tensor as T
    x = torch.randn(3, 10, 12)
    t = nt.TileTensor.from_dense(x, (2, 4, 5))
    ops = [
        lambda a: a.view(3, 10, 3, 4), lambda a: a.transpose(0, 2), lambda a: a.split(5, dim=1),
        lambda a: a.split([4, 7, 1], dim=2), lambda a: a.unsqueeze(1), lambda a: a.permute(2, 0, 1),
        lambda a: a[1], lambda a: a.narrow(2, 3, 6), lambda a: a[:1].expand(4, 10, 12), lambda a: a[0].t(),
        lambda a: a[:, :1].squeeze(1), lambda a: a.unflatten(2, (2, 6)),
        lambda a: a.view(3, 10, 2, 6).transpose(1, 2)[:, 1:].split(3, dim=-1),
    ]
    for round_ in range(2):
        for op in ops:
            got, want = op(t), op(x)
            for g, w in zip(*((got, want) if isinstance(want, (list, tuple)) else ((got,), (want,)))):
                assert isinstance(g, nt.TileTensor) and g._raw is t._raw, "a view, not a copy"
                assert g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
                assert torch.equal(g.materialize(), w)
        if round_ == 0:
            asked = dict(T._VIEW_GEOMETRY)
    assert len(asked) >= len(ops) and T._VIEW_GEOMETRY == asked  # remembered: the second round asked nothing new
    for _ in range(2):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            t.transpose(0, 1).view(-1)
    start = torch.tensor(2)
    for value in (2, 5):  # a tensor argument is not remembered: its value can change
        start.fill_(value)
        got = torch.ops.aten.narrow.Tensor(t, 1, start, 3)
        assert got._raw is t._raw and torch.equal(got.materialize(), x.narrow(1, value, 3))
    assert not any(isinstance(v, torch.Tensor) for key in T._VIEW_GEOMETRY for v in key[6])
