"""Pending producers fused into bf16 Linears (docs/fusion.md): LayerNorm -> Linear, GELU -> Linear, GELU's backward
-> the fc Linear's backward; and a Linear's pending GEMM fused with the residual add that reads its output. Fused
equals unfused (NNTILE_FUSION=0) bit for bit on the CPU; anything else reading a pending tensor gets its fp32 values;
no host wait; the casts' and the adds' tasks go."""
import pytest
import torch

import nntile_torch as nt
from nntile_torch import pending
from nntile_torch.owners import PENDING
from nntile_torch.param import param_state

C, ROWS, TILE = 40, 16, 64


def block(device, fc_bias=True, precision="bf16"):
    """LayerNorm -> Linear(C, 4C) -> GELU(tanh) -> Linear(4C, C), the same values at every call (seeded)."""
    torch.manual_seed(0)
    ln = nt.nn.LayerNorm(C, batch_tile_size=ROWS, device=device)
    fc = nt.nn.Linear(C, 4 * C, bias=fc_bias, tile_size=TILE, batch_tile_size=ROWS, precision=precision,
                      device=device)
    proj = nt.nn.Linear(4 * C, C, tile_size=TILE, batch_tile_size=ROWS, precision=precision, device=device)
    with torch.no_grad():
        ln.weight.copy_(torch.rand(C) + 0.5)
        ln.bias.copy_(torch.rand(C) - 0.5)
    return ln, fc, nt.nn.GELU("tanh"), proj


def inputs(device):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 37, C, generator=g) * 2 + 0.5).to(device)  # 111 rows: tiles of 16 rows, the last partial
    gy = torch.randn(3, 37, C, generator=g).to(device)
    return x, gy


def step(device, fusion, monkeypatch, fc_bias=True, apart=False):
    """One forward and backward of the block with fusion on or off: the output, every gradient (dense) and the
    tasks it submitted."""
    monkeypatch.setenv("NNTILE_FUSION", {True: "1", False: "0"}.get(fusion, fusion))
    ln, fc, act, proj = block(device, fc_bias)
    for m in (fc, proj):
        param_state(m.weight).cast_apart = apart
    x, gy = inputs(device)
    x.requires_grad_(True)
    params = [p for m in (ln, fc, proj) for p in m.parameters()]
    nt.synchronize()
    tasks, waits = nt.stats()["tasks_submitted"], nt.stats()["blocking_waits"]
    h = proj(act(fc(ln(x))))
    grads = torch.autograd.grad(h, [x, *params], gy)
    tasks, waits = nt.stats()["tasks_submitted"] - tasks, nt.stats()["blocking_waits"] - waits
    dense = [h.materialize()] + [g.materialize() if isinstance(g, nt.TileTensor) else g for g in grads]
    return dense, tasks, waits


def dense(t):
    return t.materialize() if isinstance(t, nt.TileTensor) else t


def assert_same(fused, unfused, device):
    for i, (a, b) in enumerate(zip(fused, unfused)):
        if device == "cpu":
            assert torch.equal(a, b), f"value {i}: fused differs from unfused by {(a - b).abs().max().item():.3e}"
        else:  # the same roundings; a GPU GEMM may sum in another order
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3, msg=f"value {i}")


@pytest.mark.parametrize("fusions", ["bf16_outputs", "1"])
@pytest.mark.parametrize("fc_bias", [True, False], ids=["fc_bias=True", "fc_bias=False"])
def test_fused_block_equals_unfused(device, monkeypatch, fc_bias, fusions):
    """Forward and every gradient. The bf16 outputs alone: with fc's bias its gradient reads the fp32 dy, so GELU's
    backward is not fused; without it GELU's backward writes fc's bf16 dy too. Every fusion on ("1"): the dW GEMMs
    sum the bias gradients from the bf16 dy (tests/test_linear.py checks those sums), so GELU's backward fuses with
    fc's bias too; the bias gradients differ from the unfused fp32 sums by bf16's rounding of dy, the rest not."""
    fused, _, waits = step(device, fusions, monkeypatch, fc_bias)
    unfused, _, _ = step(device, False, monkeypatch, fc_bias)
    assert waits == 0
    if fusions == "1":  # values: output, dx, then ln's, fc's and proj's parameters' gradients
        biases = [5, 7] if fc_bias else [6]
        for i in biases:
            a, b = fused.pop(i - biases.index(i)), unfused.pop(i - biases.index(i))
            torch.testing.assert_close(a, b, rtol=0, atol=2 ** -7 * b.abs().max().item(), msg=f"bias {i}")
    assert_same(fused, unfused, device)
    assert not PENDING  # nothing left behind


@pytest.mark.parametrize("fc_bias", [True, False], ids=["fc_bias=True", "fc_bias=False"])
def test_fusion_drops_the_cast_tasks(monkeypatch, fc_bias):
    """With the casts as tasks of their own (cast_apart), each fused pair drops one task per tile: LayerNorm's
    output (7 row tiles), GELU's (7 x 3) and, without fc's bias, GELU's dx (7 x 3). With the cast inside the GEMM's
    task (the default) the count is the same and the fp32 output and the cast kernel go."""
    fused, tasks_fused, _ = step("cpu", "bf16_outputs", monkeypatch, fc_bias, apart=True)
    unfused, tasks_unfused, _ = step("cpu", False, monkeypatch, fc_bias, apart=True)
    assert_same(fused, unfused, "cpu")
    assert tasks_unfused - tasks_fused == 7 + 21 + (0 if fc_bias else 21)
    _, tasks_fused, _ = step("cpu", "bf16_outputs", monkeypatch, fc_bias)
    _, tasks_unfused, _ = step("cpu", False, monkeypatch, fc_bias)
    assert tasks_fused == tasks_unfused


def test_fused_gemms_cast_nothing(monkeypatch):
    """The GEMMs reading a fused producer's output are plain GEMMs, not cast+gemm tasks."""
    monkeypatch.setenv("NNTILE_FUSION", "1")
    ln, fc, act, proj = block("cpu", fc_bias=False)
    x, _ = inputs("cpu")
    ln(x)  # the first call converts nothing twice
    with nt.task_trace() as trace:
        h = proj(act(fc(ln(x))))
        nt.synchronize()
    names = [t["name"] for t in trace]
    assert not any(n.startswith("cast+") for n in names), names
    del h


def test_every_other_reader_gets_the_fp32_values(device, monkeypatch):
    """A pending LayerNorm output read by materialize(), by torch code, by an fp32 Linear, or after a bf16 Linear
    fused with it, holds what the unfused LayerNorm writes."""
    monkeypatch.setenv("NNTILE_FUSION", "0")
    ln, fc, _, _ = block(device)
    x, _ = inputs(device)
    with torch.no_grad():
        want = ln(x).materialize()
    monkeypatch.setenv("NNTILE_FUSION", "1")
    x.requires_grad_(True)
    y = ln(x)
    assert pending.pending(y.tiles_unflushed)
    assert torch.equal(y.materialize(), want)  # read first: the plain op
    y = ln(x)
    fc(y)  # fused: bf16 tiles for the GEMM; the fp32 values still owed
    assert pending.pending(y.tiles_unflushed)
    assert torch.equal(dense(y * 1.0), want)  # torch code reads it: the plain op
    assert not pending.pending(y.tiles_unflushed)
    fp32 = nt.nn.Linear(C, C, tile_size=TILE, batch_tile_size=ROWS, device=device)
    y = ln(x)
    out = fp32(y)  # an fp32 Linear reads the fp32 tiles: flushed
    assert not pending.pending(y.tiles_unflushed)
    ref = torch.nn.functional.linear(want, fp32.weight.materialize(), fp32.bias.materialize())
    torch.testing.assert_close(out.materialize(), ref)


def test_two_bf16_linears_read_one_bf16_copy(monkeypatch):
    """A LayerNorm output read by two bf16 Linears (q and k projections, say): one fused LayerNorm task per tile,
    whose bf16 tiles both GEMMs read; the same values as unfused."""
    def run(fusion):
        monkeypatch.setenv("NNTILE_FUSION", {True: "1", False: "0"}.get(fusion, fusion))
        ln, fc, _, _ = block("cpu")
        torch.manual_seed(2)
        other = nt.nn.Linear(C, C, tile_size=TILE, batch_tile_size=ROWS, precision="bf16")
        x, _ = inputs("cpu")
        x.requires_grad_(True)
        fc(ln(x)), other(ln(x))  # the first calls make the weights' bf16 copies
        with nt.task_trace() as trace:
            y = ln(x)
            a, b = fc(y), other(y)
            del y  # nothing reads its fp32 values: they are never computed
            nt.synchronize()
        return [a.materialize(), b.materialize()], [t["name"] for t in trace]

    fused, names = run(True)
    unfused, names_unfused = run(False)
    assert_same(fused, unfused, "cpu")
    assert names.count("layer_norm_forward") == 7, names  # not again for the second Linear
    assert not any(n.startswith("cast+") for n in names)
    assert len(names) == len(names_unfused)


def test_synchronize_and_the_optimizer_step_flush(monkeypatch):
    """Nothing stays pending across nt.synchronize(), nor across an optimizer step that writes what a pending
    producer reads (it is submitted first, with the old weight)."""
    monkeypatch.setenv("NNTILE_FUSION", "0")
    ln, fc, _, _ = block("cpu")
    x, _ = inputs("cpu")
    with torch.no_grad():
        want = ln(x).materialize()
    monkeypatch.setenv("NNTILE_FUSION", "1")
    x.requires_grad_(True)
    y = ln(x)
    fc(y)
    assert pending.pending(y.tiles_unflushed)
    nt.synchronize()
    assert not pending.pending(y.tiles_unflushed)
    y = ln(x)
    opt = nt.optim.AdamW(ln.parameters(), lr=0.1)
    for p in ln.parameters():
        p.grad = nt.TileTensor.from_dense(torch.ones(C), [C])
    opt.step()
    assert not pending.pending(y.tiles_unflushed)
    assert torch.equal(y.materialize(), want)
    assert not torch.equal(ln(x).materialize(), want)  # the weights did change


def test_nothing_pending_without_grad_or_fusion(monkeypatch):
    ln, _, _, _ = block("cpu")
    x, _ = inputs("cpu")
    monkeypatch.setenv("NNTILE_FUSION", "1")
    with torch.no_grad():
        assert not pending.pending(ln(x).tiles_unflushed)
    monkeypatch.setenv("NNTILE_FUSION", "0")
    assert not pending.pending(ln(x.requires_grad_(True)).tiles_unflushed)


def test_converted_gpt2_fused_equals_unfused(monkeypatch):
    """A converted Hugging Face GPT-2 in bf16, one forward and backward: the same loss and gradients bit for bit
    with the bf16 outputs fused and not, as many host waits, and the casts of LayerNorm's and GELU's outputs gone
    from the GEMMs (ln_1 -> c_attn, ln_2 -> c_fc, GELU -> c_proj per block, ln_f -> lm_head). Every fusion on: the
    same loss and waits, no bias_grad task left, the residual adds inside c_proj's GEMMs, nothing else added."""
    transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=96, n_head=6, vocab_size=1000, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 1000, (3, 37), generator=torch.Generator().manual_seed(11))

    def run(fusion):
        monkeypatch.setenv("NNTILE_FUSION", {True: "1", False: "0"}.get(fusion, fusion))
        torch.manual_seed(0)
        model = nt.convert(transformers.GPT2LMHeadModel(cfg), precision="bf16", tile_size=300, batch_tile_size=37)
        model(ids, labels=ids)  # the first step makes the weights' bf16 copies
        nt.synchronize()
        waits = nt.stats()["blocking_waits"]
        with nt.task_trace() as trace:
            out = model(ids, labels=ids)
            grads = torch.autograd.grad(out.loss, list(model.parameters()))
            waits = nt.stats()["blocking_waits"] - waits
        names = [t["name"] for t in trace]
        return [out.loss.materialize()] + [g.materialize() for g in grads], names, waits

    fused, names_fused, waits_fused = run("bf16_outputs")
    unfused, names_unfused, waits_unfused = run(False)
    every, names_every, waits_every = run(True)  # with the bias gradients in the dW GEMMs too
    assert waits_every == waits_unfused and torch.equal(every[0], unfused[0])  # the same forward
    assert "bias_grad" not in names_every and names_unfused.count("bias_grad") > 0
    # the residual adds (two per block, 3 row tiles each) are written by c_proj's GEMMs
    assert sum(n.endswith("+residual") for n in names_every) == 2 * 2 * 3
    assert names_unfused.count("add_into") - names_every.count("add_into") == 2 * 2 * 3
    assert len(names_every) == len(names_unfused) - names_unfused.count("bias_grad") - 2 * 2 * 3
    assert waits_fused == waits_unfused
    assert_same(fused, unfused, "cpu")
    # 3 row tiles of 37 rows; a cast per A tile: ln_1 -> c_attn 3, ln_2 -> c_fc 3, GELU -> c_proj 3 x 2 (K = 384
    # in tiles of 300), per block; ln_f -> lm_head 3. The casts run inside the GEMMs' tasks: the task count is equal.
    casts = [sum(n.startswith("cast+") for n in names) for names in (names_fused, names_unfused)]
    assert casts[1] - casts[0] == 2 * (3 + 3 + 6) + 3, casts
    assert len(names_fused) == len(names_unfused)
    assert not PENDING


def residual_step(device, fusion, monkeypatch, precision="bf16", bias=True, y_first=True, k=4 * C):
    """h = x + Linear(k, C)(u) (or Linear(u) + x, y_first), then h's sum of squares backward: h, the gradients of
    x, u and the Linear's parameters (dense), the task names and the host waits."""
    monkeypatch.setenv("NNTILE_FUSION", fusion)
    torch.manual_seed(0)
    proj = nt.nn.Linear(k, C, bias=bias, tile_size=TILE, batch_tile_size=ROWS, precision=precision, device=device)
    g = torch.Generator().manual_seed(2)
    x = nt.TileTensor.from_dense(torch.randn(3, 37, C, generator=g).to(device), tile_shape=(ROWS, TILE),
                                 tiled_shape=(111, C)).requires_grad_(True)
    u = torch.randn(3, 37, k, generator=g).to(device).requires_grad_(True)
    params = list(proj.parameters())
    nt.synchronize()
    waits = nt.stats()["blocking_waits"]
    with nt.task_trace() as trace:
        y = proj(u)
        h = y + x if y_first else x + y
        del y
        grads = torch.autograd.grad(h, [x, u, *params], h.detach())
        waits = nt.stats()["blocking_waits"] - waits
        out = [dense(h)] + [dense(t) for t in grads]
    return out, [t["name"] for t in trace], waits


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("y_first", [True, False], ids=["y+x", "x+y"])
@pytest.mark.parametrize("k", [4 * C, 50], ids=["K_in_3_tiles", "K_in_1_tile"])
def test_residual_add_fused_into_the_gemm(device, monkeypatch, precision, bias, y_first, k):
    """Pair 3 (docs/fusion.md): a Linear's output added to the residual stream is written by the Linear's GEMM
    reading the residual (the K chain's last task adds it): the add's tasks go (one per tile: 7 row tiles), the
    GEMM tasks that finish C carry '+residual', and the values and gradients are the unfused ones (bit for bit on
    the CPU, where the task adds after the GEMM; on GPUs cuBLASLt's epilogue rounds once)."""
    fused, names, waits = residual_step(device, "residual", monkeypatch, precision, bias, y_first, k)
    unfused, names_unfused, _ = residual_step(device, "0", monkeypatch, precision, bias, y_first, k)
    assert waits == 0
    assert_same(fused, unfused, device)
    assert names_unfused.count("add_into") - names.count("add_into") == 7
    assert sum(n.endswith("+residual") for n in names) == 7, names
    assert len(names) == len(names_unfused) - 7
    assert not any(n.endswith("+residual") for n in names_unfused)
    assert not PENDING


def test_a_linear_output_read_after_its_fused_add(device, monkeypatch):
    """The Linear's own output, read after the add that fused with its GEMM (and by a second add), holds the
    unfused values: the GEMM is submitted again, without the residual."""
    def run(fusion):
        monkeypatch.setenv("NNTILE_FUSION", fusion)
        torch.manual_seed(0)
        proj = nt.nn.Linear(2 * C, C, tile_size=TILE, batch_tile_size=ROWS, device=device)
        g = torch.Generator().manual_seed(3)
        u = torch.randn(111, 2 * C, generator=g).to(device).requires_grad_(True)
        x = nt.TileTensor.from_dense(torch.randn(111, C, generator=g).to(device), tile_shape=(ROWS, TILE))
        with nt.task_trace() as trace:
            y = proj(u)
            h = x + y
            h2 = y + h  # y again: the GEMM once more, plain (7 row tiles x 2 K tiles), and the add
            nt.synchronize()
        names = [t["name"] for t in trace]
        if fusion == "residual":
            assert names.count("gemm+residual") == 7 and names.count("add_into") == 7, names
            assert sum(n.startswith("gemm") for n in names) == 2 * 14, names
        return [dense(h), dense(y), dense(h2)]

    fused, unfused = run("residual"), run("0")
    assert_same(fused, unfused, device)
    assert not PENDING


def test_a_fused_gemm_leaves_nothing_owed_once_its_output_dies(monkeypatch):
    """After the add fused with it, a GEMM owes only its own output's values (its cast input is written): the output
    dying takes it along, and the next flush submits nothing. Unfused, a pending GEMM's cast input (read by
    backward) submits it when read."""
    monkeypatch.setenv("NNTILE_FUSION", "1")
    proj = nt.nn.Linear(2 * C, C, tile_size=TILE, batch_tile_size=ROWS, precision="bf16")
    u = torch.randn(111, 2 * C, requires_grad=True)
    x = nt.TileTensor.from_dense(torch.randn(111, C), tile_shape=(ROWS, TILE))
    proj(u) + x  # the weight's bf16 copy
    nt.synchronize()
    with nt.task_trace() as trace:
        y = proj(u)
        h = y + x
        assert len(PENDING) == 1
        del y
        assert not PENDING
        nt.synchronize()
    names = [t["name"] for t in trace]  # 7 row tiles, K in 2 tiles: the first adds the bias, the last the residual
    assert len(names) == 14 and names.count("cast+gemm+bias") == 7 and names.count("cast+gemm+residual") == 7, names
    y = proj(u)
    (gu,) = torch.autograd.grad(y, [u], torch.ones(111, C))  # reads the cast input: the GEMM runs first
    ref = torch.ones(111, C) @ proj.weight.materialize().bfloat16().float()
    torch.testing.assert_close(dense(gu), ref, rtol=1e-2, atol=1e-2)
    del h


def test_linear_into_bf16_linear_with_pending_gemms(device, monkeypatch):
    """A Linear's pending GEMM is not a bf16 producer (its bias needs fp32 tiles): a bf16 Linear reading another's
    output directly flushes it and casts, as unfused."""
    def run(fusion):
        monkeypatch.setenv("NNTILE_FUSION", fusion)
        torch.manual_seed(0)
        a = nt.nn.Linear(C, 2 * C, tile_size=TILE, batch_tile_size=ROWS, precision="bf16", device=device)
        b = nt.nn.Linear(2 * C, C, tile_size=TILE, batch_tile_size=ROWS, precision="bf16", device=device)
        u = torch.randn(111, C, generator=torch.Generator().manual_seed(4)).to(device).requires_grad_(True)
        h = b(a(u))
        grads = torch.autograd.grad(h, [u, *a.parameters(), *b.parameters()], h.detach())
        return [dense(h)] + [dense(t) for t in grads]

    assert_same(run("1"), run("bias_grad,bf16_outputs"), device)  # every fusion against all but the residual's
    assert not PENDING


def test_gemm_residual_errors():
    """The tile op names what is wrong with a residual."""
    from nntile_torch import _C
    nt.init()
    a, b = nt.TileTensor.new_tiles([8, 4], [4, 4]), nt.TileTensor.new_tiles([4, 6], [4, 3])
    c = nt.TileTensor.new_tiles([8, 6], [4, 3])
    for t in (a, b):
        t.from_dense(torch.ones(*t.shape))
    with pytest.raises(RuntimeError, match="residual must have C's shape and tiles"):
        _C.gemm(False, a, False, b, c, residual=nt.TileTensor.new_tiles([8, 6], [4, 6]))
    with pytest.raises(RuntimeError, match="residual cannot be C itself"):
        _C.gemm(False, a, False, b, c, residual=c)
    with pytest.raises(RuntimeError, match="forward GEMM only"):
        _C.gemm(True, a, False, c, nt.TileTensor.new_tiles([4, 6], [4, 3]), k_over_places=True,
                residual=nt.TileTensor.new_tiles([4, 6], [4, 3]))
    r = nt.TileTensor.new_tiles([8, 6], [4, 3])
    r.from_dense(torch.full((8, 6), 0.5))
    _C.gemm(False, a, False, b, c, residual=r)
    assert torch.equal(c.to_dense(), torch.full((8, 6), 4.5))
