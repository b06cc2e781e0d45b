"""nntile_torch.optim.AdamW against torch.optim.AdamW: 20 steps of losses and weights, param groups,
state_dict interchange and resume."""
import copy
import warnings

import pytest
import torch

import nntile_torch as nt
from conftest import assert_same_training_runs, max_err


def norm_err(a, ref):
    return (a.detach().double().cpu() - ref.detach().double().cpu()).norm().item()


def models(device, seed=0):
    torch.manual_seed(seed)
    ours = torch.nn.Sequential(nt.nn.Linear(37, 29, tile_size=16, batch_tile_size=8, device=device), torch.nn.Tanh(),
                               nt.nn.Linear(29, 13, tile_size=16, batch_tile_size=8, device=device))
    ref = torch.nn.Sequential(torch.nn.Linear(37, 29, device=device), torch.nn.Tanh(),
                              torch.nn.Linear(29, 13, device=device))
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def batches(n, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(3, 11, 37, generator=g).to(device), torch.randn(3, 11, 13, generator=g).to(device))
            for _ in range(n)]


def train(model, opt, data):
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def groups(model, lr):
    params = list(model.parameters())
    return [{"params": params[:2]}, {"params": params[2:], "lr": lr / 3, "weight_decay": 0.1}]


@pytest.mark.parametrize("use_groups", [False, True], ids=["one-group", "param-groups"])
def test_twenty_steps_match_torch(device, use_groups):
    ours, ref = models(device)
    kw = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.05)
    opt = nt.optim.AdamW(groups(ours, 1e-2) if use_groups else ours.parameters(), **kw)
    ropt = torch.optim.AdamW(groups(ref, 1e-2) if use_groups else ref.parameters(), foreach=False, **kw)
    ref64 = copy.deepcopy(ref).double()
    ropt64 = torch.optim.AdamW(groups(ref64, 1e-2) if use_groups else ref64.parameters(), foreach=False, **kw)
    data = batches(20, device)
    l_ours, l_ref = train(ours, opt, data), train(ref, ropt, data)
    l_64 = train(ref64, ropt64, [(x.double(), y.double()) for x, y in data])
    # "Within float32 rounding": Adam divides by sqrt(v), which magnifies the rounding of near-zero gradients,
    # so the yardstick is torch's own float32 run against a float64 run of the same steps. Losses: at most twice
    # as far from float64 as torch. Weights (by norm; single elements with gradients near eps swing either way in
    # any float32 run): at most 4x, because the tiled GEMM rounds once per K-tile where cuBLAS rounds once, and
    # 20 Adam steps compound it (measured on the H200: 2.6x; on the CPU: under 2x). A wrong update is >100x off.
    tol = 4 * torch.finfo(torch.float32).eps
    assert max(abs(a - c) for a, c in zip(l_ours, l_64)) <= 2 * max(abs(b - c) for b, c in zip(l_ref, l_64)) + tol
    for (name, a), b, c in zip(ours.state_dict().items(), ref.state_dict().values(), ref64.state_dict().values()):
        assert norm_err(a, c) <= 4 * norm_err(b, c) + tol * c.norm().item(), name
    assert l_ours[-1] < l_ours[0]


@pytest.mark.parametrize("maximize", [False, True], ids=["minimize", "maximize"])
def test_update_matches_torch_on_the_same_gradients(device, maximize):
    """The update alone: identical gradients each step, so only the optimizer's float32 arithmetic differs."""
    torch.manual_seed(3)
    w0 = torch.randn(37, 53, device=device)
    ours = torch.nn.Parameter(nt.TileTensor.from_dense(w0, (16, 16)))
    ref = torch.nn.Parameter(w0.clone())
    kw = dict(lr=3e-2, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.1, maximize=maximize)
    opt, ropt = nt.optim.AdamW([ours], **kw), torch.optim.AdamW([ref], foreach=False, **kw)
    for _ in range(10):
        g = torch.randn(37, 53, device=device) * torch.rand(37, 53, device=device)
        ours.grad = nt.TileTensor.from_dense(g, (16, 16))
        ref.grad = g.clone()
        opt.step()
        ropt.step()
    assert isinstance(ours, nt.TileTensor)
    assert max_err(ours, ref) <= 1e-5 * ref.abs().max().item()
    st, rst = opt.state[ours], ropt.state[ref]
    assert max_err(st["exp_avg"], rst["exp_avg"]) <= 1e-6 and max_err(st["exp_avg_sq"], rst["exp_avg_sq"]) <= 1e-6


def test_step_does_not_wait(device):
    ours, _ = models(device)
    layer = ours[0]  # no torch op between tile ops (torch's tanh would read its input: one wait)
    opt = nt.optim.AdamW(layer.parameters(), lr=1e-3)
    x = batches(1, device)[0][0]
    before = nt.stats()["blocking_waits"]
    layer(x).backward(torch.ones(3, 11, 29, device=device))  # a dense gradient from torch code: no wait either
    opt.step()
    opt.step()
    assert nt.stats()["blocking_waits"] == before
    assert isinstance(opt.state[ours[0].weight]["exp_avg"], nt.TileTensor)


def test_state_dict_interchange_and_resume(device):
    data = batches(10, device)
    # Uninterrupted run.
    ours, ref = models(device)
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-2)
    full = train(ours, opt, data)
    # Stop after 5 steps, save both, resume in fresh objects; the saved optimizer state is plain tensors.
    a, _ = models(device)
    opt_a = nt.optim.AdamW(a.parameters(), lr=1e-2)
    first = train(a, opt_a, data[:5])
    saved_model, saved_opt = copy.deepcopy(a.state_dict()), copy.deepcopy(opt_a.state_dict())
    assert all(type(v) is torch.Tensor for s in saved_opt["state"].values() for v in s.values())
    b, _ = models(device, seed=99)
    b.load_state_dict(saved_model)
    opt_b = nt.optim.AdamW(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(copy.deepcopy(saved_opt))
    rest = train(b, opt_b, data[5:])
    assert max(abs(x - y) for x, y in zip(first + rest, full)) < 1e-6
    # torch.optim.AdamW takes our state_dict and continues like we do.
    _, r = models(device)
    r.load_state_dict(saved_model)
    ropt = torch.optim.AdamW(r.parameters(), lr=1e-2, foreach=False)
    ropt.load_state_dict(copy.deepcopy(saved_opt))
    assert max(abs(x - y) for x, y in zip(train(r, ropt, data[5:]), rest)) < 1e-5


def test_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kw, match in [(dict(lr=-1), "learning rate"), (dict(betas=(0.9, 1.0)), "betas"), (dict(eps=-1), "epsilon"),
                      (dict(weight_decay=-1), "weight_decay"), (dict(amsgrad=True), "amsgrad")]:
        with pytest.raises(ValueError, match=match):
            nt.optim.AdamW(p, **kw)


def test_plain_parameters_match_torch():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    w2 = torch.nn.Parameter(w.detach().clone())
    opt, ropt = nt.optim.AdamW([w], lr=0.1), torch.optim.AdamW([w2], lr=0.1, foreach=False)
    for _ in range(5):
        for p, o in ((w, opt), (w2, ropt)):
            o.zero_grad()
            (p ** 2).sum().backward()
            o.step()
    assert torch.allclose(w, w2, atol=1e-6)


def test_step_in_backward_gives_the_same_updates_and_drops_gradients(device):
    """step_in_backward=True: every parameter updated by its hook during backward, bit for bit as step() does,
    gradients gone after backward; param groups, lr changes and a state_dict round trip included."""
    ours, _ = models(device)
    twin = copy.deepcopy(ours)
    opt = nt.optim.AdamW(groups(ours, 1e-2), lr=1e-2)
    opt_b = nt.optim.AdamW(groups(twin, 1e-2), lr=1e-2, step_in_backward=True)
    data = batches(6, device)
    for i, (x, y) in enumerate(data):
        if i == 3:  # a schedule changing lr, and a reload of the state: the hooks must follow both
            for o in (opt, opt_b):
                o.param_groups[0]["lr"] = 3e-3
            opt_b.load_state_dict(copy.deepcopy(opt_b.state_dict()))
        opt.zero_grad()
        la = torch.nn.functional.mse_loss(ours(x), y)
        la.backward()
        opt.step()
        lb = torch.nn.functional.mse_loss(twin(x), y)
        lb.backward()
        assert all(p.grad is None for p in twin.parameters())
        opt_b.step()  # nothing left to do
        assert la.item() == lb.item()
    for (name, a), b in zip(ours.named_parameters(), twin.parameters()):
        assert torch.equal(a.materialize(), b.materialize()), name
    assert int(opt_b.state[twin[0].weight]["step"]) == 6


def bf16_neighbours(x):
    """The two bf16 values around each float32 of x (equal when x is one), as float32."""
    bits = x.float().contiguous().view(torch.int32)
    down = (bits & -65536).view(torch.float32)  # toward zero
    up = ((bits & -65536) + 65536).view(torch.float32)  # away from zero
    exact = (bits & 65535) == 0
    return down, torch.where(exact, down, up)


def test_bf16_state_is_adamw_rounded_stochastically(device):
    """state_dtype=bfloat16, first step (zero states): the weights are fp32-state AdamW's bit for bit (the update
    uses the fp32 moments), each stored moment is one of the two bf16 values around the fp32 one, and the
    rounding is unbiased on average."""
    torch.manual_seed(0)
    w = nt.TileTensor.from_dense(torch.randn(300, 200, device=device), (128, 64))
    w_ref = nt.TileTensor.from_dense(w.materialize().clone(), (128, 64))
    p, p_ref = torch.nn.Parameter(w), torch.nn.Parameter(w_ref)
    g = torch.randn(300, 200, device=device) * torch.logspace(-4, 1, 200, device=device)
    opt = nt.optim.AdamW([p], lr=1e-2, state_dtype=torch.bfloat16)
    ref = nt.optim.AdamW([p_ref], lr=1e-2)
    for param, o in ((p, opt), (p_ref, ref)):
        param.grad = nt.TileTensor.from_dense(g.clone(), (128, 64))
        o.step()
    assert torch.equal(p.materialize(), p_ref.materialize())
    for name in ("exp_avg", "exp_avg_sq"):
        ours = opt.state[p][name]
        assert ours.dtype == torch.bfloat16 and ours.tiles.dtype == "bfloat16"
        ours, exact = ours.materialize().float(), ref.state[p_ref][name].materialize()
        down, up = bf16_neighbours(exact)
        assert ((ours == down) | (ours == up)).all(), name
        spacing = (up - down).abs()
        frac = ((ours - exact).abs() / spacing.clamp_min(1e-45))[spacing > 0]
        rounded_up = (ours != down)[spacing > 0].float()
        # Unbiased: up with probability (exact - down) / spacing.
        dropped = ((exact - down).abs() / spacing.clamp_min(1e-45))[spacing > 0]
        assert abs(rounded_up.mean().item() - dropped.mean().item()) < 0.01, name
        assert frac.numel() > 50000 and 0 < rounded_up.mean().item() < 1


def bf16_master_models(device, seed=0):
    """models()'s pair with bf16 matmuls, and the matmul weights of ours kept as bf16 master weights."""
    torch.manual_seed(seed)
    ours = torch.nn.Sequential(
        nt.nn.Linear(37, 29, tile_size=16, batch_tile_size=8, device=device, precision="bf16"), torch.nn.Tanh(),
        nt.nn.Linear(29, 13, tile_size=16, batch_tile_size=8, device=device, precision="bf16"))
    twin = copy.deepcopy(ours)
    for m in ours:
        if isinstance(m, nt.nn.Linear):
            nt.param_state(m.weight).keep_bf16_master()
    return ours, twin


def test_bf16_master_weight_is_adamw_rounded_stochastically(device):
    """A float32 parameter kept as bf16 tiles (a bf16 master weight, the memory plan's master_dtype): torch sees
    float32; after the first step each weight is one of the two bf16 values around the fp32 AdamW result from the
    same start (bf16 moments start at zero: the update is fp32 AdamW's), rounded up with the probability that makes
    it unbiased; moments as with bf16 states. Needs bf16 states; refused by fp32 matmuls."""
    torch.manual_seed(0)
    start = torch.randn(300, 200, device=device).bfloat16().float()
    p = torch.nn.Parameter(nt.TileTensor.from_dense(start.clone(), (128, 64)))
    nt.param_state(p).keep_bf16_master()
    p_ref = torch.nn.Parameter(nt.TileTensor.from_dense(start.clone(), (128, 64)))
    assert p.dtype == torch.float32 and p.tiles.dtype == "bfloat16" and p.tiles.name == p_ref.tiles.name
    assert p.materialize().dtype == torch.float32 and torch.equal(p.materialize(), start)
    g = torch.randn(300, 200, device=device) * torch.logspace(-4, 1, 200, device=device)
    with pytest.raises(ValueError, match="state_dtype=torch.bfloat16"):
        nt.optim.AdamW([p], lr=1e-2)
    opt = nt.optim.AdamW([p], lr=1e-2, state_dtype=torch.bfloat16)
    ref = nt.optim.AdamW([p_ref], lr=1e-2)
    for param, o in ((p, opt), (p_ref, ref)):
        param.grad = nt.TileTensor.from_dense(g.clone(), (128, 64))
        o.step()
    assert p.tiles.dtype == "bfloat16" and p.dtype == torch.float32
    ours, exact = p.materialize(), p_ref.materialize()
    down, up = bf16_neighbours(exact)
    assert ((ours == down) | (ours == up)).all()
    spacing = (up - down).abs()
    moved = spacing > 0
    rounded_up = (ours != down)[moved].float()
    dropped = ((exact - down).abs() / spacing.clamp_min(1e-45))[moved]
    assert moved.sum() > 50000 and abs(rounded_up.mean().item() - dropped.mean().item()) < 0.01
    for name in ("exp_avg", "exp_avg_sq"):
        m, m_exact = opt.state[p][name].materialize().float(), ref.state[p_ref][name].materialize()
        lo, hi = bf16_neighbours(m_exact)
        assert ((m == lo) | (m == hi)).all(), name
    sd = opt.state_dict()  # and the model's view of it: float32 tensors holding bf16 values
    assert sd["state"][0]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(p.materialize().bfloat16().float(), p.materialize())


def test_bf16_master_weights_track_fp32_ones_and_are_deterministic(device):
    """200 steps with the matmul weights kept as bf16 master weights: deterministic (two runs, and updates inside
    backward, give the same bits), within a small share of the fp32-master trajectory's travel, losses alike; a
    state_dict round trip resumes bit for bit; fp32 matmuls refuse such a weight."""
    data = batches(200, device)
    runs = []
    for bf16_master, in_bwd in ((False, False), (True, False), (True, False), (True, True)):
        ours, twin = bf16_master_models(device)
        model = ours if bf16_master else twin
        start = [p.materialize().clone() for p in model.parameters()]
        opt = nt.optim.AdamW(model.parameters(), lr=3e-3, state_dtype=torch.bfloat16, step_in_backward=in_bwd)
        losses = train(model, opt, data)
        runs.append((losses, [p.materialize().clone() for p in model.parameters()], start))
        if bf16_master and in_bwd:
            assert [p.tiles.dtype for p in model.parameters()] == ["bfloat16", "float32"] * 2
    (l32, p32, start), (l16, p16, _), (l16b, p16b, _), (l16c, p16c, _) = runs
    assert l16 == l16b == l16c and all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(p16, p16b, p16c))
    travel = sum(norm_err(a, s) ** 2 for a, s in zip(p32, start)) ** 0.5
    drift = sum(norm_err(a, b) ** 2 for a, b in zip(p16, p32)) ** 0.5
    print("drift / travel", drift / travel)
    assert drift < 0.1 * travel, (drift, travel)
    assert abs(sum(l16[-20:]) - sum(l32[-20:])) < 0.02 * sum(l32[-20:]), (l16[-5:], l32[-5:])
    # resume from a state_dict: the same steps as going on
    ours, _ = bf16_master_models(device)
    opt = nt.optim.AdamW(ours.parameters(), lr=3e-3, state_dtype=torch.bfloat16)
    train(ours, opt, data[:3])
    saved_model, saved_opt = copy.deepcopy(ours.state_dict()), copy.deepcopy(opt.state_dict())
    assert all(v.dtype == torch.float32 for v in saved_model.values())
    again, _ = bf16_master_models(device, seed=5)
    again.load_state_dict(saved_model)
    assert [p.tiles.dtype for p in again.parameters()] == ["bfloat16", "float32"] * 2
    opt_b = nt.optim.AdamW(again.parameters(), lr=3e-3, state_dtype=torch.bfloat16)
    opt_b.load_state_dict(saved_opt)
    assert train(ours, opt, data[3:6]) == train(again, opt_b, data[3:6])
    fp32 = nt.nn.Linear(37, 29, tile_size=16, batch_tile_size=8, device=device)
    nt.param_state(fp32.weight).keep_bf16_master()
    with pytest.raises(TypeError, match="bf16 matmuls only"):
        fp32(data[0][0])


def test_bf16_state_tracks_fp32_state_and_is_deterministic(device):
    """200 steps: bf16 moments keep the trajectory within a small fraction of fp32-state AdamW's own travel
    (round-to-nearest would freeze exp_avg_sq); two runs, and step_in_backward, give the same bits."""
    data = batches(200, device)
    runs = []
    for state_dtype, in_bwd in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, False),
                                (torch.bfloat16, True)):
        ours, _ = models(device)
        start = [p.materialize().clone() for p in ours.parameters()]
        opt = nt.optim.AdamW(ours.parameters(), lr=3e-3, state_dtype=state_dtype, step_in_backward=in_bwd)
        losses = train(ours, opt, data)
        runs.append((losses, [p.materialize().clone() for p in ours.parameters()], start))
    (l32, p32, start), (l16, p16, _), (l16b, p16b, _), (l16c, p16c, _) = runs
    assert l16 == l16b == l16c and all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(p16, p16b, p16c))
    travel = sum(norm_err(a, s) ** 2 for a, s in zip(p32, start)) ** 0.5
    drift = sum(norm_err(a, b) ** 2 for a, b in zip(p16, p32)) ** 0.5
    assert drift < 0.02 * travel, (drift, travel)
    assert abs(sum(l16[-20:]) - sum(l32[-20:])) < 0.01 * sum(l32[-20:]), (l16[-5:], l32[-5:])
    assert sum(l16[-20:]) / 20 < 0.9 * l16[0]  # it learns (the targets are noise: no lower)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_moments_stay_in_place_across_steps(state_dtype):
    """Later steps update the moments' tiles where they are: the same tile tensors, no new tiles. (bf16 moments
    were once rebuilt every step through host RAM: the whole state copied and held twice.)"""
    torch.manual_seed(0)
    p = torch.nn.Parameter(nt.TileTensor.from_dense(torch.randn(300, 200), (128, 64)))
    opt = nt.optim.AdamW([p], lr=1e-2, state_dtype=state_dtype)
    seen = None
    for _ in range(3):
        p.grad = nt.TileTensor.from_dense(torch.randn(300, 200), (128, 64))
        opt.step()
        p.grad = None
        nt.synchronize()
        now = [opt.state[p][k].tiles for k in ("exp_avg", "exp_avg_sq")]
        if seen is None:
            seen, before = now, nt.stats()["tile_bytes"]
            nt.reset_peak_stats()
        assert all(a is b for a, b in zip(now, seen))
    grad_bytes = 300 * 200 * 4
    assert nt.stats()["tile_bytes"] == before and nt.stats()["peak_tile_bytes"] <= before + grad_bytes


def test_moments_set_by_hand_are_used_by_the_next_step(device):
    """The optimizer skips re-tiling the moments while they are the tile tensors it left in its state; moments
    replaced in opt.state (dense, as a state_dict loads them) are tiled and used by the next step, as torch's are."""
    ours, ref = models(device)
    opt, ref_opt = nt.optim.AdamW(ours.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    data = batches(4, device)
    train(ours, opt, data[:2])
    train(ref, ref_opt, data[:2])
    g = torch.Generator().manual_seed(5)
    for (p, q) in zip(ours.parameters(), ref.parameters()):
        m, v = torch.randn(q.shape, generator=g).to(device), torch.rand(q.shape, generator=g).to(device)
        opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"] = m.clone(), v.clone()
        ref_opt.state[q]["exp_avg"], ref_opt.state[q]["exp_avg_sq"] = m.clone(), v.clone()
    train(ours, opt, data[2:])
    train(ref, ref_opt, data[2:])
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert norm_err(p, q) <= 1e-5 * q.detach().norm().item(), norm_err(p, q)
        assert isinstance(opt.state[p]["exp_avg"], nt.TileTensor)


def test_bf16_state_dict_round_trip(device):
    data = batches(6, device)
    ours, _ = models(device)
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-2, state_dtype=torch.bfloat16)
    train(ours, opt, data[:3])
    saved = copy.deepcopy(opt.state_dict())
    assert all(v.dtype == torch.bfloat16 for s in saved["state"].values() for k, v in s.items() if k != "step")
    twin = copy.deepcopy(ours)
    opt_b = nt.optim.AdamW(twin.parameters(), lr=1e-2, state_dtype=torch.bfloat16)
    opt_b.load_state_dict(saved)
    assert train(ours, opt, data[3:]) == train(twin, opt_b, data[3:])
    with pytest.raises(ValueError, match="state_dtype"):
        nt.optim.AdamW(ours.parameters(), state_dtype=torch.float16)


def test_offload_gives_the_same_updates_with_state_in_host_ram(device):
    """AdamW(offload=...): the chosen parameters are updated by CPU workers (their states live in host RAM,
    memory node 0) and the others where they were; the updates are those of AdamW without offload (bit for bit
    on CPUs; on a GPU up to the CPU and GPU kernels' float rounding)."""
    ours, _ = models(device)
    twin = copy.deepcopy(ours)
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few CPU workers beside a GPU: a speed warning
        opt_h = nt.optim.AdamW(twin.parameters(), lr=1e-2, offload=0.25)
    host = [p for p in twin.parameters() if nt.param_state(p).update_on == "cpu"]
    assert 0 < len(host) < len(list(twin.parameters()))
    assert sum(p.numel() for p in host) >= 0.25 * sum(p.numel() for p in twin.parameters())
    data = batches(5, device)
    assert train(ours, opt, data) == pytest.approx(train(twin, opt_h, data), rel=1e-6)
    for a, b in zip(ours.parameters(), twin.parameters()):
        if device == "cpu":
            assert torch.equal(a.materialize(), b.materialize())
        else:
            assert norm_err(a.materialize(), b.materialize()) <= 1e-6 * a.materialize().norm().item()
    nt.synchronize()
    for p in twin.parameters():
        nodes = opt_h.state[p]["exp_avg"].tiles.valid_nodes()
        if nt.param_state(p).on_host:
            assert all(n == [0] for n in nodes), nodes
        elif device != "cpu":
            assert all(0 not in n for n in nodes), nodes  # updated on the GPU, never copied back


def test_offload_arguments():
    ours, _ = models("cpu")
    with pytest.raises(ValueError, match="fraction"):
        nt.optim.AdamW(ours.parameters(), offload=1.5)
    with pytest.raises(ValueError, match="does not update"):
        nt.optim.AdamW(ours[0].parameters(), offload=list(ours[2].parameters()))
    nt.optim.AdamW(ours.parameters(), offload=0)
    assert all(nt.param_state(p).update_on == "any" for p in ours.parameters())
    every = nt.optim.AdamW(ours.parameters(), offload=1.0)
    assert every.offload_update == "cpu" and all(nt.param_state(p).on_host for p in ours.parameters())


def test_moments_marked_for_eviction_first_give_the_same_training(tmp_path):
    """NNTILE_EVICT_WONT_USE_FIRST=1 reorders StarPU's eviction (patched StarPU) and must not change a value. Host
    RAM is limited and a disk node registered, so tiles really are evicted (host RAM is then evictable and the
    reordering runs on it); each setting runs in its own process (StarPU reads it once)."""
    def check(flag, run):
        assert run.spilled > 0  # tiles went to disk: eviction really ran

    assert_same_training_runs(tmp_path, "NNTILE_EVICT_WONT_USE_FIRST=0 against 1",
                              ("0", dict(NNTILE_EVICT_WONT_USE_FIRST="0")), ("1", dict(NNTILE_EVICT_WONT_USE_FIRST="1")),
                              check)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["state=fp32", "state=bf16"])
def test_updates_write_the_bf16_copy_in_the_same_task(device, state_dtype):
    """In bf16 mode AdamW writes the updated weight's bf16 copy from the update's own task, on the weight's device
    and with offload=...: the copy equals the weight rounded to nearest (torch's .to(bfloat16)), and training gives
    the losses and weights of a separate conversion (the copy made by a convert task in the next forward), bit for
    bit on CPUs, with a convert task per weight tile and step less."""
    torch.manual_seed(0)
    ours = torch.nn.Sequential(nt.nn.Linear(37, 29, tile_size=16, batch_tile_size=8, device=device, precision="bf16"),
                               torch.nn.Tanh(),
                               nt.nn.Linear(29, 13, tile_size=16, batch_tile_size=8, device=device, precision="bf16"))
    off, apart = copy.deepcopy(ours), copy.deepcopy(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few CPU workers beside a GPU: a speed warning
        opt = nt.optim.AdamW(ours.parameters(), lr=1e-2, state_dtype=state_dtype)
        opt_off = nt.optim.AdamW(off.parameters(), lr=1e-2, state_dtype=state_dtype, offload=1.0)
        opt_apart = nt.optim.AdamW(apart.parameters(), lr=1e-2, state_dtype=state_dtype)
    data = batches(4, device)
    tasks, losses = [], []
    for model, o in ((ours, opt), (off, opt_off), (apart, opt_apart)):
        submitted = nt.stats()["tasks_submitted"]
        if model is apart:  # each forward finds no copy and converts the weight again
            o.step = lambda step=o.step: (step(), [nt.param_state(p).drop_bf16_copy() for p in apart.parameters()])
        losses.append(train(model, o, data))
        tasks.append(nt.stats()["tasks_submitted"] - submitted)
    converts = sum(p.tiles.ntiles for p in apart.parameters() if p.dim() == 2) * (len(data) - 1)
    assert tasks[0] == tasks[1] == tasks[2] - converts, tasks  # the first forward converts in all three
    if device == "cpu":
        assert losses[0] == losses[1] == losses[2]
    for p, q, r in zip(ours.parameters(), off.parameters(), apart.parameters()):
        for w in (p, q):
            if w.dim() == 2:
                version, cache = nt.param_state(w).bf16_copy
                assert version == w.tiles.version and cache.name == "weight.bf16"
                dense = nt.TileTensor(cache, tuple(w.shape), w.device).materialize()
                assert torch.equal(dense, w.materialize().to(torch.bfloat16))
        if device == "cpu":
            assert torch.equal(p.materialize(), r.materialize()) and torch.equal(q.materialize(), r.materialize())
    with pytest.raises(RuntimeError, match="copy must be bfloat16"):
        p = next(ours.parameters())
        st = opt.state[p]
        nt._C.adamw(p.tiles, p.tiles, st["exp_avg"].tiles, st["exp_avg_sq"].tiles, 1e-3, 0.9, 0.999, 1e-8, 0.0, 9,
                    False, 0, copy=p.tiles)
