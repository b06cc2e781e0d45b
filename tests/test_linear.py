"""nntile_torch.nn.Linear against torch.nn.Linear: forward, every gradient, precisions, state_dict, bad input."""
import pytest
import torch

import nntile_torch as nt
from conftest import assert_close_as_torch, max_err

# (in_features, out_features, leading batch shape, tile_size, batch_tile_size): none divisible by the tiles.
SHAPES = [
    pytest.param(37, 53, (3, 11), 16, 8, id="37->53,batch=3x11,tile=16"),
    pytest.param(64, 17, (5,), 16, 4, id="64->17,batch=5,tile=16"),
    pytest.param(7, 9, (2, 3, 5), 1024, 1024, id="7->9,batch=2x3x5,one-tile"),
    # more rows per tile than the CUDA bias-gradient kernel has row phases (128), output tiles 4 values wide or not
    pytest.param(24, 42, (300,), 16, 512, id="24->42,batch=300,tile=16"),
]


def round_tf32(t):
    """Rounds float32 values to tf32 (10 mantissa bits), to nearest."""
    i = t.detach().contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def make_pair(n_in, n_out, bias, tile, btile, device, precision="fp32"):
    torch.manual_seed(1234)
    ref = torch.nn.Linear(n_in, n_out, bias=bias, device=device)
    ours = nt.nn.Linear(n_in, n_out, bias=bias, device=device, tile_size=tile, batch_tile_size=btile,
                        precision=precision)
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def run(module, x, gy):
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    params = [p for p in module.parameters()]
    grads = torch.autograd.grad(y, [x] + params, gy)
    return y, grads


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("n_in,n_out,batch,tile,btile", SHAPES)
def test_fp32_matches_torch(n_in, n_out, batch, tile, btile, bias, device):
    ours, ref = make_pair(n_in, n_out, bias, tile, btile, device)
    x = torch.randn(*batch, n_in, device=device)
    gy = torch.randn(*batch, n_out, device=device)
    y, g = run(ours, x, gy)
    yr, gr = run(ref, x, gy)
    ref64 = torch.nn.Linear(n_in, n_out, bias=bias).double().to(device)
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    y64, g64 = run(ref64, x.double(), gy.double())
    assert isinstance(y, nt.TileTensor) and y.shape == yr.shape and y.device == yr.device
    assert_close_as_torch(y, yr, y64, what="output")
    for name, a, b, c in zip(["x"] + [n for n, _ in ref.named_parameters()], g, gr, g64):
        assert a.shape == b.shape
        assert_close_as_torch(a, b, c, what=f"grad {name}")


@pytest.mark.parametrize("precision,dtype", [("tf32", torch.float32), ("bf16", torch.bfloat16)],
                         ids=["precision=tf32", "precision=bf16"])
def test_reduced_precision_no_worse_than_torch(precision, dtype, device):
    n_in, n_out = 301, 157
    ours, ref = make_pair(n_in, n_out, True, 64, 32, device, precision)
    x = torch.randn(4, 45, n_in, device=device)
    gy = torch.randn(4, 45, n_out, device=device)
    y, g = run(ours, x, gy)
    ref64 = torch.nn.Linear(n_in, n_out).double().to(device)
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    y64, g64 = run(ref64, x.double(), gy.double())
    # torch in the same precision: bf16 tensors, or for tf32 its inputs rounded to tf32 (cuBLAS may decline
    # tensor cores for small matrices even when tf32 is allowed, so allowing it would not show tf32's error).
    rnd = round_tf32 if precision == "tf32" else (lambda t: t.to(dtype))
    refp = torch.nn.Linear(n_in, n_out, device=device, dtype=dtype)
    refp.load_state_dict({k: rnd(v) for k, v in ref.state_dict().items()})
    xp, gyp = rnd(x), rnd(gy)
    yp = refp(xp)
    # Gradients in that precision: each product's inputs are rounded, as the tensor cores would.
    w = refp.weight.detach()
    gp = [rnd(gyp) @ rnd(w), rnd(gyp).reshape(-1, n_out).t() @ rnd(xp).reshape(-1, n_in), gyp.sum((0, 1))]
    assert_close_as_torch(y, yp, y64, what=f"{precision} output")
    for name, a, b, c in zip(["x", "weight", "bias"], g, gp, g64):
        assert_close_as_torch(a, b, c, what=f"{precision} grad {name}")


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False)],
                         ids=["x@W^T", "x@W", "x^T@W"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"], ids=["precision=fp32", "precision=bf16"])
def test_gemm_adds_the_bias_once_per_row(trans_a, trans_b, precision, device):
    # C = alpha op(A) op(B) + beta C + bias, with K over 3 tiles (the bias goes with the first only), columns of C
    # over 4 tiles (each with its bias tile), and beta != 0 (C's old values kept): the Linear's forward GEMM
    m, n, k, t = 13, 53, 37, 16
    torch.manual_seed(7)
    a = torch.randn(k, m) if trans_a else torch.randn(m, k)
    b = torch.randn(n, k) if trans_b else torch.randn(k, n)
    c0, bias = torch.randn(m, n), torch.randn(n)
    if precision == "bf16":  # the tiles the bf16 matmuls read
        a, b = a.bfloat16(), b.bfloat16()
    at, bt = nt.TileTensor.from_dense(a.to(device), (t, t)), nt.TileTensor.from_dense(b.to(device), (t, t))
    ct, biast = nt.TileTensor.from_dense(c0.to(device), (t, t)), nt.TileTensor.from_dense(bias.to(device), (t,))
    nt._C.gemm(trans_a, at.tiles, trans_b, bt.tiles, ct.tiles, 0.5, 0.25, "fp32", bias=biast.tiles)
    opa = a.double().t() if trans_a else a.double()
    opb = b.double().t() if trans_b else b.double()
    ref = 0.5 * opa @ opb + 0.25 * c0.double() + bias.double()
    assert max_err(ct.materialize(), ref) < 1e-4 * ref.abs().max().item()
    with pytest.raises(RuntimeError, match="bias must be"):
        nt._C.gemm(trans_a, at.tiles, trans_b, bt.tiles, ct.tiles, 1.0, 0.0, "fp32",
                   bias=nt.TileTensor.from_dense(bias.to(device), (8,)).tiles)


@pytest.mark.parametrize("trans_a", [False, True], ids=["A", "A^T"])
def test_gemm_casts_its_input_inside_its_first_task(trans_a, device):
    # A bf16 matmul's input cast by the GEMM (a_source): A's tiles (K over 3 tiles, so every tile of A is cast once
    # and read by 4 column tiles of C) hold the source rounded to bf16, C equals the GEMM of the cast A; the bias
    # rides along as in the Linear's forward
    m, n, k, t = 13, 53, 37, 16
    torch.manual_seed(11)
    src = torch.randn(k, m) if trans_a else torch.randn(m, k)
    b, bias = torch.randn(n, k).bfloat16(), torch.randn(n)
    st = nt.TileTensor.from_dense(src.to(device), (t, t))
    a = nt._C.TileTensor(list(src.shape), [t, t], "bfloat16", "a")
    bt, biast = nt.TileTensor.from_dense(b.to(device), (t, t)), nt.TileTensor.from_dense(bias.to(device), (t,))
    ct = nt._C.TileTensor([m, n], [t, t], "float32", "c")
    nt._C.gemm(trans_a, a, True, bt.tiles, ct, 1.0, 0.0, "fp32", bias=biast.tiles, a_source=st.tiles)
    assert torch.equal(a.to_dense().cpu(), src.bfloat16())
    opa = src.bfloat16().double()
    ref = (opa.t() if trans_a else opa) @ b.double().t() + bias.double()
    assert max_err(ct.to_dense(), ref) < 1e-4 * ref.abs().max().item()
    with pytest.raises(RuntimeError, match="source must have A's shape"):
        nt._C.gemm(trans_a, a, True, bt.tiles, ct, 1.0, 0.0, "fp32",
                   a_source=nt.TileTensor.from_dense(src.to(device), (8, 8)).tiles)
    with pytest.raises(RuntimeError, match="float32 source and bfloat16 A"):
        nt._C.gemm(trans_a, st.tiles, True, bt.tiles, ct, 1.0, 0.0, "fp32", a_source=st.tiles)
    with pytest.raises(RuntimeError, match="not with k_over_places"):
        nt._C.gemm(trans_a, a, True, bt.tiles, ct, 1.0, 0.0, "fp32", k_over_places=True, a_source=st.tiles)


@pytest.mark.parametrize("apart", [False, True], ids=["cast in the GEMM", "cast apart (beyond GPU memory)"])
def test_bf16_linear_casts_its_inputs_in_its_gemms(apart, device):
    # bf16: x and dy are cast to bf16 inside the first GEMM task that reads each tile (no convert task between
    # their producer and the GEMM), unless the memory plan streams the model (then as tasks of their own); the
    # results are the same either way. x (33, 37): 5 x 3 tiles of (8, 16); dy (33, 53): 5 x 4 tiles.
    rows, k_tiles, n_tiles = 5, 3, 4
    torch.manual_seed(3)
    x, gy = torch.randn(3, 11, 37, device=device), torch.randn(3, 11, 53, device=device)
    results = []
    for cast_apart in (apart, not apart):
        ours, _ = make_pair(37, 53, True, 16, 8, device, "bf16")
        nt.param_state(ours.weight).cast_apart = cast_apart
        nt.param_state(ours.weight).weight_bf16()  # the weight's own bf16 copy, made once per version: not counted
        with nt.task_trace() as records:
            y, grads = run(ours, x, gy)
            results.append([y.materialize(), *(g.materialize() for g in grads)])
        names = [r["name"] for r in records]
        if cast_apart:
            assert "cast+gemm+bias" not in names and "cast+gemm" not in names
            assert names.count("convert") == rows * k_tiles + rows * n_tiles
        else:
            assert names.count("convert") == 0
            # x: each tile with its first GEMM (the bias with k == 0's); dy: each tile with its first dx GEMM
            assert names.count("cast+gemm+bias") == rows
            assert names.count("cast+gemm") == rows * (k_tiles - 1) + rows * n_tiles
    for a, b in zip(*results):
        assert torch.equal(a.cpu(), b.cpu())


def test_gradients_accumulate(device):
    ours, ref = make_pair(37, 53, True, 16, 8, device)
    x = torch.randn(3, 11, 37, device=device)
    for _ in range(2):
        ours(x).sum().backward()
        ref(x).sum().backward()
    assert isinstance(ours.weight.grad, nt.TileTensor)
    assert max_err(ours.weight.grad, ref.weight.grad) < 1e-4
    assert max_err(ours.bias.grad, ref.bias.grad) < 1e-4


def test_state_dict_round_trip(device):
    torch.manual_seed(0)
    ref = torch.nn.Linear(37, 53, device=device)
    ours = nt.nn.Linear(37, 53, device=device, tile_size=16)
    ours.load_state_dict(ref.state_dict())
    sd = ours.state_dict()
    assert set(sd) == {"weight", "bias"}
    assert all(type(v) is torch.Tensor for v in sd.values())
    assert torch.equal(sd["weight"], ref.weight.detach()) and torch.equal(sd["bias"], ref.bias.detach())
    back = torch.nn.Linear(37, 53, device=device)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(5, 37, device=device)
    assert torch.equal(back(x), ref(x))
    # Same seed, same initial weights as torch.nn.Linear.
    torch.manual_seed(7)
    a = torch.nn.Linear(20, 30)
    torch.manual_seed(7)
    b = nt.nn.Linear(20, 30, tile_size=8)
    assert torch.equal(a.weight.detach(), b.weight.materialize())


@pytest.mark.parametrize("bad,err", [
    (lambda d: torch.randn(4, 37, dtype=torch.float64, device=d), TypeError),
    (lambda d: torch.randn(4, 36, device=d), ValueError),
    (lambda d: torch.randint(0, 5, (4, 37), device=d), TypeError),
    (lambda d: torch.randn(0, 37, device=d), ValueError),
], ids=["float64", "wrong-last-dim", "integer", "empty"])
def test_bad_input_raises_and_module_still_works(bad, err, device):
    ours, ref = make_pair(37, 53, True, 16, 8, device)
    with pytest.raises(err, match="Linear expects|Linear got"):
        ours(bad(device))
    x = torch.randn(4, 37, device=device)
    assert max_err(ours(x), ref(x)) < 1e-5


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="in_features"):
        nt.nn.Linear(0, 3)
    with pytest.raises(ValueError, match="precision"):
        nt.nn.Linear(3, 3, precision="fp8")
    with pytest.raises(ValueError, match="tile_size"):
        nt.nn.Linear(3, 3, tile_size=-1)
    with pytest.raises(TypeError, match="float32"):
        nt.nn.Linear(3, 3, dtype=torch.float64)


def test_stacked_layers_stay_asynchronous(device):
    """Two layers and their backward submit tasks without one host wait; reading the loss waits once."""
    torch.manual_seed(0)
    l1 = nt.nn.Linear(37, 29, tile_size=16, batch_tile_size=8, device=device)
    l2 = nt.nn.Linear(29, 13, tile_size=16, batch_tile_size=8, device=device)
    r1, r2 = torch.nn.Linear(37, 29, device=device), torch.nn.Linear(29, 13, device=device)
    r1.load_state_dict(l1.state_dict())
    r2.load_state_dict(l2.state_dict())
    x = torch.randn(3, 11, 37, device=device)
    gy = torch.randn(3, 11, 13, device=device)
    before = nt.stats()
    y = l2(l1(x))
    y.backward(gy)
    after = nt.stats()
    assert after["blocking_waits"] == before["blocking_waits"]
    assert after["tasks_submitted"] > before["tasks_submitted"]
    r2(r1(x)).backward(gy)
    assert max_err(y, r2(r1(x))) < 1e-5
    assert max_err(l1.weight.grad, r1.weight.grad) < 1e-4
    assert nt.stats()["blocking_waits"] > after["blocking_waits"]


def test_bf16_weight_copy_follows_updates(device):
    """bf16 matmuls read a bf16 copy of the weight; it must be remade after the weight changes."""
    ours, ref = make_pair(37, 53, True, 16, 8, device, "bf16")
    x = torch.randn(3, 11, 37, device=device)

    def expected(layer):
        w, b = layer.weight.detach(), layer.bias.detach()
        return torch.nn.functional.linear(x.bfloat16().float(), w.bfloat16().float(), b)

    assert max_err(ours(x), expected(ref)) < 1e-5
    opt = nt.optim.AdamW(ours.parameters(), lr=0.1)
    ours(x).sum().backward()
    opt.step()
    with torch.no_grad():
        ref.load_state_dict(ours.state_dict())
    assert max_err(ours.weight, ref.weight) == 0
    assert max_err(ours(x), expected(ref)) < 1e-5


def dyadic(*shape, limit):
    """Integers in (-limit, limit) over 64, exact in bf16 (limit <= 256): sums and dot products of a few dozen of
    them are exact in float32, whatever the order of the additions."""
    return torch.randint(1 - limit, limit, shape).float() / 64


BIAS_GRAD_OF = pytest.mark.parametrize("of", ["a", "b"], ids=["dy=A (nn.Linear: dW = dy^T x)",
                                                               "dy=B (Conv1D: dW = x^T dy)"])


@BIAS_GRAD_OF
def test_gemm_sums_the_bias_grad_of_its_bf16_dy(of, device):
    check_gemm_bias_grad(of, device)


@BIAS_GRAD_OF
@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and nt._C.built_with_cuda),
                    reason="requires CUDA (a GPU and a CUDA build)")
def test_gemm_bias_grad_without_the_cublaslt_epilogue(of, monkeypatch):
    # the path of shapes cuBLASLt has no bias-gradient algorithm for: the GEMM, then ATen's sums of the bf16 dy
    monkeypatch.setenv("NNTILE_BGRAD_EPILOGUE", "0")
    check_gemm_bias_grad(of, "cuda")


def check_gemm_bias_grad(of, device):
    # A Linear's dW GEMM with the bias gradient fused: dy (37, 53) in 5 x 4 tiles (the GEMM's K over 5 row tiles,
    # none of the sizes a multiple of its tile), x (37, 29) in 5 x 2. The bias gradient is float32 sums of the
    # bf16 dy: exactly so on data whose sums are exact, and to float32 rounding on random data.
    rows, n, k_in, bt, t = 37, 53, 29, 8, 16
    torch.manual_seed(5)
    for exact, dy, x in ((True, dyadic(rows, n, limit=256), dyadic(rows, k_in, limit=8)),
                         (False, torch.randn(rows, n), torch.randn(rows, k_in))):
        dy, x = dy.bfloat16(), x.bfloat16()
        dyt = nt.TileTensor.from_dense(dy.to(device), (bt, t))
        xt = nt.TileTensor.from_dense(x.to(device), (bt, t))
        db = nt._C.TileTensor([n], [t], "float32", "db")
        if of == "a":
            dw = nt._C.TileTensor([n, k_in], [t, t], "float32", "dw")
            nt._C.gemm(True, dyt.tiles, False, xt.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True, bias_grad=db,
                       bias_grad_of="a")
            dw_ref = dy.double().t() @ x.double()
        else:
            dw = nt._C.TileTensor([k_in, n], [t, t], "float32", "dw")
            nt._C.gemm(True, xt.tiles, False, dyt.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True, bias_grad=db,
                       bias_grad_of="b")
            dw_ref = x.double().t() @ dy.double()
        db_ref = dy.double().sum(0)
        if exact:
            assert torch.equal(db.to_dense().cpu(), db_ref.float())
            assert torch.equal(dw.to_dense().cpu(), dw_ref.float())
        else:
            bound = rows * torch.finfo(torch.float32).eps * dy.float().abs().max().item()
            assert max_err(db.to_dense(), db_ref) <= bound
            assert max_err(dw.to_dense(), dw_ref) < 1e-4 * dw_ref.abs().max().item()


def test_gemm_bias_grad_bad_input_raises(device):
    dy = nt.TileTensor.from_dense(torch.randn(37, 53, device=device).bfloat16(), (8, 16))
    x = nt.TileTensor.from_dense(torch.randn(37, 29, device=device).bfloat16(), (8, 16))
    dw = nt._C.TileTensor([53, 29], [16, 16], "float32", "dw")
    with pytest.raises(RuntimeError, match="bias gradient must be"):
        nt._C.gemm(True, dy.tiles, False, x.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True,
                   bias_grad=nt._C.TileTensor([53], [8], "float32", "db"))
    with pytest.raises(RuntimeError, match="bfloat16 dy, a float32 bias gradient"):
        nt._C.gemm(True, dy.tiles, False, x.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True,
                   bias_grad=nt._C.TileTensor([53], [16], "bfloat16", "db"))
    with pytest.raises(RuntimeError, match="needs alpha 1"):
        nt._C.gemm(True, dy.tiles, False, x.tiles, dw, 0.5, 0.0, "fp32", k_over_places=True,
                   bias_grad=nt._C.TileTensor([53], [16], "float32", "db"))
    with pytest.raises(RuntimeError, match="bias_grad_of must be"):
        nt._C.gemm(True, dy.tiles, False, x.tiles, dw, 1.0, 0.0, "fp32", k_over_places=True,
                   bias_grad=nt._C.TileTensor([53], [16], "float32", "db"), bias_grad_of="c")


@pytest.mark.parametrize("layout", ["linear", "conv1d"], ids=["nn.Linear", "Conv1D (w_in_out)"])
def test_bf16_linear_fuses_its_bias_grad_into_the_dw_gemm(layout, monkeypatch, device):
    # bf16 with fusion on: the dW GEMM sums the bias gradient of the bf16 dy; no bias_grad task is left. dx and dW
    # are the same as unfused (on GPUs dW to the GEMM's rounding: cuBLASLt's kernel with the epilogue may sum in
    # another order than cuBLAS's); the bias gradient is float32 sums of the bf16 dy (unfused: of the float32 dy),
    # each within float32 rounding of its own float64 reference. x (3, 11, 37) in row tiles of 8: 5 row tiles; 53
    # outputs in 4 column tiles of 16.
    rows, n_tiles = 5, 4
    torch.manual_seed(13)
    x, gy = torch.randn(3, 11, 37, device=device), torch.randn(3, 11, 53, device=device)
    results, names = {}, {}
    for fusion in ("1", "0"):
        monkeypatch.setenv("NNTILE_FUSION", fusion)
        torch.manual_seed(1234)
        if layout == "linear":
            ours = nt.nn.Linear(37, 53, device=device, tile_size=16, batch_tile_size=8, precision="bf16")
        else:
            ours = nt.nn.Conv1D(53, 37, device=device, tile_size=16, batch_tile_size=8, precision="bf16")
            with torch.no_grad():
                ours.bias.copy_(torch.randn(53))
        nt.param_state(ours.weight).weight_bf16()  # the weight's own bf16 copy, made once per version: not counted
        with nt.task_trace() as records:
            y, grads = run(ours, x, gy)
            results[fusion] = [g.materialize().cpu() for g in grads]
        names[fusion] = [r["name"] for r in records]
    (dx1, dw1, db1), (dx0, dw0, db0) = results["1"], results["0"]
    assert torch.equal(dx1, dx0)
    if device == "cpu":
        assert torch.equal(dw1, dw0)
    else:
        assert max_err(dw1, dw0) <= 1e-5 * dw0.abs().max().item()
    dy = gy.reshape(-1, 53).cpu()
    bound = dy.shape[0] * torch.finfo(torch.float32).eps * dy.abs().max().item()
    assert max_err(db1, dy.bfloat16().double().sum(0)) <= bound
    assert max_err(db0, dy.double().sum(0)) <= bound
    assert names["1"].count("bias_grad") == 0 and names["0"].count("bias_grad") == rows * n_tiles
    assert names["1"].count("gemm+bias_grad") == rows * n_tiles
    # dW's K (the row tiles) spread over places (two CUDA workers per GPU): each place but one sums its bias
    # gradient into a partial tile, added in place order (one task per bias tile and place), as dW's partials are
    partials = n_tiles * (min(nt.runtime.num_places(), rows) - 1)
    assert len(names["1"]) == len(names["0"]) - rows * n_tiles + partials


def test_the_fusion_switch_reads_all_none_or_a_list_and_names_a_wrong_one(monkeypatch):
    """NNTILE_FUSION: unset the default fusions (the bias gradient in the dW GEMM; not the bf16 outputs, measured
    slower, nor the residual add in the GEMM, measured within the spread), 1 all, 0 none, a comma list those only; a misspelt name is an error, not a measurement of the unfused
    graph under the fused graph's name."""
    from nntile_torch import config
    for value, want in (("1", {"bias_grad": True, "bf16_outputs": True, "residual": True}),
                        ("0", {"bias_grad": False, "residual": False, None: False}),
                        ("bias_grad", {"bias_grad": True, "bf16_outputs": False, None: True}),
                        (" bf16_outputs , bias_grad", {"bias_grad": True, "bf16_outputs": True})):
        monkeypatch.setenv("NNTILE_FUSION", value)
        for name, on in want.items():
            assert config.fusion_enabled(name) is on, (value, name)
    monkeypatch.delenv("NNTILE_FUSION")
    assert config.fusion_enabled("bias_grad") and config.fusion_enabled()
    assert not config.fusion_enabled("bf16_outputs") and not config.fusion_enabled("residual")
    monkeypatch.setenv("NNTILE_FUSION", "bias_gard")
    with pytest.raises(ValueError, match="unknown fusion.*bias_gard"):
        config.fusion_enabled("bias_grad")
