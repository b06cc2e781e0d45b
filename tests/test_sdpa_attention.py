"""Attention written as torch code around F.scaled_dot_product_attention (nanoGPT's CausalSelfAttention), found by a
probe to be qkv -> causal attention -> projection, submitted without its view ops (nntile_torch/nn/sdpa_attention.py):
the same training bit for bit as the module's own code on tiles (attention dropout and checkpointing included), fewer
torch calls on the submitting thread, and every module that computes something else keeps its own code, with
torch's results."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nntile_torch as nt
from benchmarks import models
from nntile_torch.nn.sdpa_attention import _FormForward
from nntile_torch.streaming import checkpoint_blocks


def nanogpt(dropout, layers=2, width=48, heads=4, seq=24):
    torch.manual_seed(0)
    m = models.nanogpt_module()
    return m.GPT(m.GPTConfig(block_size=seq, vocab_size=96, n_layer=layers, n_head=heads, n_embd=width,
                             dropout=dropout))


def forms(model):
    """{module name: its _Form} of the converted model's modules bound to this form."""
    return {n: m.forward.__func__.form for n, m in model.named_modules()
            if isinstance(getattr(m.forward, "__func__", None), _FormForward)}


def own_code(model):
    """The model's attention modules made to run their own code again (the reference)."""
    for n, m in model.named_modules():
        if n in forms(model):
            del m.forward


def train(model, ids, steps=3):
    """Losses, gradients and the weights after `steps` AdamW steps, then an evaluation loss under no_grad, dense."""
    opt = nt.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for _ in range(steps):
        loss = models.loss("nanogpt", model, ids)
        loss.backward()
        grads.append({n: p.grad.materialize().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    model.eval()
    with torch.no_grad():
        losses.append(float(models.loss("nanogpt", model, ids[:, :17])))  # a shorter sequence: other tiles
    model.train()
    weights = {n: p.materialize().clone() for n, p in model.named_parameters()}
    # all in tiles, checkpoint's recompute too (it runs inside nntile's backward: functional.kept)
    assert nt.convert_report(model).dense_ops == {}
    return losses, grads, weights


@pytest.mark.parametrize("dropout, checkpointed", [(0.0, False), (0.15, False), (0.15, True)])
def test_nanogpt_attention_as_the_form_is_its_own_code_bit_for_bit(device, dropout, checkpointed):
    """Training (attention and residual dropout, each block under torch.utils.checkpoint or not), then evaluation
    on a shorter sequence: the same losses, gradients and weights as the module's own code on tiles."""
    ids = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(1)).to(device)
    runs = []
    for bound in (True, False):
        model = nanogpt(dropout).to(device)
        state = torch.random.get_rng_state()
        model = nt.convert(model, tile_size=48 * 3, batch_tile_size=48)
        assert torch.equal(torch.random.get_rng_state(), state)  # the probe draws nothing from torch's generator
        assert set(forms(model)) == {"transformer.h.0.attn", "transformer.h.1.attn"}
        for form in forms(model).values():
            assert (form.qkv, form.proj, form.dropouts, form.heads) == ("c_attn", "c_proj", ["resid_dropout"], 4)
            assert form.scale == 1 / math.sqrt(12) and form.dropout_p == {True: dropout, False: 0.0}
        if not bound:
            own_code(model)
        if checkpointed:
            checkpoint_blocks(model, "transformer.h")
        torch.manual_seed(5)  # the dropout masks' seeds: drawn in the same order either way
        runs.append(train(model, ids))
    (l1, g1, w1), (l2, g2, w2) = runs
    assert l1 == l2
    for a, b in zip(g1, g2):
        assert all(torch.equal(a[n], b[n]) for n in a), [n for n in a if not torch.equal(a[n], b[n])]
    assert all(torch.equal(w1[n], w2[n]) for n in w1)


def test_nanogpt_attention_makes_fewer_torch_calls_and_the_same_tasks(monkeypatch):
    """The point of it: per step, far fewer calls into TileTensor's __torch_function__ (each view op one, with
    torch's dispatcher and autograd behind it), not more tasks."""
    ids = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(1))
    calls = []
    through = nt.TileTensor.__torch_function__.__func__

    def counted(cls, func, types, args=(), kwargs=None):
        calls.append(func)
        return through(cls, func, types, args, kwargs)
    monkeypatch.setattr(nt.TileTensor, "__torch_function__", classmethod(counted))
    counts = []
    for bound in (True, False):
        model = nt.convert(nanogpt(0.0), tile_size=48 * 3, batch_tile_size=48)
        if not bound:
            own_code(model)
        calls.clear()
        n0 = nt.stats()["tasks_submitted"]
        models.loss("nanogpt", model, ids).backward()
        counts.append((len(calls), nt.stats()["tasks_submitted"] - n0))
    (calls_w, tasks_w), (calls_o, tasks_o) = counts
    assert tasks_w <= tasks_o, counts
    assert calls_w <= calls_o - 2 * 10, counts  # 11 view ops and the attention per layer go


def tiles(x, rows):
    """x (B, T, C) as a TileTensor of `rows` rows per tile, as a converted model's activations are."""
    return nt.TileTensor.from_dense(x, (rows, x.shape[-1]), (x.shape[0] * x.shape[1], x.shape[-1]))


class _Attention(nn.Module):
    """nanoGPT's attention with one change (`change`), each computing something else than the form."""

    def __init__(self, change, width=32, heads=4):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.drop = nn.Dropout(0.0)
        self.change, self.heads = change, heads

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        if self.change == "input scaled":
            x = x * 2.0
        qkv = self.c_attn(x)
        if self.change == "qkv scaled":
            qkv = qkv * 0.5
        q, k, v = qkv.split(c, dim=2)
        if self.change == "q and k swapped":
            q, k = k, q
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.change != "not causal")
        if self.change == "heads mixed":  # the output's heads in another order: not the attention's own layout
            y = y.flip(1)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        out = self.drop(self.c_proj(y))
        if self.change == "residual inside":
            out = out + x
        return out


@pytest.mark.parametrize("change", ["none", "input scaled", "qkv scaled", "q and k swapped", "not causal",
                                    "heads mixed", "residual inside"])
def test_a_module_that_computes_something_else_keeps_its_own_code(device, change):
    torch.manual_seed(3)
    ref = _Attention(change).to(device)
    x = torch.randn(3, 8, 32, device=device)
    model = nt.convert(copy.deepcopy(ref), tile_size=96, batch_tile_size=16)
    assert set(forms(model)) == ({""} if change == "none" else set())
    for step in range(2):
        xt = tiles(x, 16).requires_grad_(True)
        xr = x.clone().requires_grad_(True)
        y, yr = model(xt), ref(xr)
        torch.testing.assert_close(y.materialize(), yr, rtol=1e-5, atol=1e-5)
        gy = torch.randn_like(yr)
        y.backward(gy)
        yr.backward(gy)
        torch.testing.assert_close(xt.grad.materialize(), xr.grad, rtol=1e-4, atol=1e-5)
        for (n, p), pr in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.materialize(), pr.grad, rtol=1e-4, atol=1e-5, msg=n)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)


def test_children_hooks_run_and_other_inputs_take_the_modules_code():
    torch.manual_seed(4)
    ref = _Attention("none")
    model = nt.convert(copy.deepcopy(ref), tile_size=96, batch_tile_size=16)
    seen = []
    model.c_proj.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    x = torch.randn(2, 8, 32)
    for _ in range(2):
        model(tiles(x, 16))
    assert seen == [(2, 8, 32)] * 2 and forms(model)[""]
    # another sequence length, then a dense input (not tiles: the module's own code)
    for z in (torch.randn(2, 5, 32), torch.randn(1, 8, 32)):
        y = model(tiles(z, 10) if z.shape[1] == 5 else z)
        torch.testing.assert_close(y.materialize() if isinstance(y, nt.TileTensor) else y, ref(z), rtol=1e-5,
                                   atol=1e-5)


def test_the_probe_runs_on_a_copy_of_a_meta_module():
    """A model built on the meta device (what a memory plan converts) is probed on a CPU copy with random weights."""
    from nntile_torch.nn import sdpa_attention
    sdpa_attention._FORMS.clear()
    with torch.device("meta"):
        model, bad = nanogpt(0.1), _Attention("qkv scaled")
    form = sdpa_attention.sdpa_attention_form(model.transformer.h[0].attn)
    assert form is not None and form.dropout_p == {True: 0.1, False: 0.0} and form.heads == 4
    assert sdpa_attention.sdpa_attention_form(bad) is None
    assert all(p.is_meta for p in model.parameters())  # the model itself untouched
