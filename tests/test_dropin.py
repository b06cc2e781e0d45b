"""convert() on GPT-2 code nobody wrote for nntile_torch: a nanoGPT-style model.py (examples/nanogpt) and Hugging
Face GPT-2 in every attention implementation, with padding masks; every form of GELU, layer norm and dropout;
strict mode, the report, no host wait inside a step, views that stay truthful, the examples' scripts."""
import copy
import importlib.util
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import nntile_torch as nt
from conftest import assert_close_as_torch

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")
REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("nanogpt_model", REPO / "examples" / "nanogpt" / "model.py")
nanogpt_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nanogpt_model)

# Tiles for a wait-free step: weight tiles of at least 3 x the width (c_attn's output in one column tile), row
# tiles of whole sequences.
TILES = dict(tile_size=384, batch_tile_size=32)


def nanogpt(device, bias=True, manual=False, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    cfg = nanogpt_model.GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64, bias=bias,
                                  dropout=dropout, manual_attention=manual)
    return nanogpt_model.GPT(cfg).to(device)


def hf_gpt2(device, impl=None, seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=101, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    if impl is not None:
        cfg._attn_implementation = impl
    return transformers.GPT2LMHeadModel(cfg).to(device)


def dense(t):
    return t.materialize() if isinstance(t, nt.TileTensor) else t


def nano_step(model, ids):
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    logits, loss = model(x, y)
    return logits, loss, torch.autograd.grad(loss, list(model.parameters()))


def padded(device, kind, b=3, t=32, seed=1):
    """ids, attention_mask (1 on tokens, 0 on pads) and labels (-100 on pads) of a batch padded on the right or
    the left, each row a different length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    for i, n in enumerate([t, t - 5, t - 11][:b]):
        if kind == "right":
            mask[i, n:] = 0
        elif kind == "left":
            mask[i, :t - n] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if kind == "left":
        # The first token of a left-padded row is predicted from the last pad, a row that attends to nothing:
        # eager's float mask then gives it uniform weights whose gradient is a float32-rounding artifact (torch's
        # fused attention, which Hugging Face's sdpa uses, gives zeros); nothing worth learning, so not a label.
        first = (mask == 0).sum(1)
        labels[torch.arange(b), first.clamp(max=t - 1)] = -100
    return ids.to(device), mask.to(device), labels.to(device)


def hf_step(model, ids, mask, labels):
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    return out.logits, out.loss, torch.autograd.grad(out.loss, list(model.parameters()))


def assert_parity(ours, ref, step, *inputs, keep=None):
    """Loss, logits (the rows `keep` selects) and every gradient within float32 rounding: at most twice torch's own
    float32 error against a float64 run of the unconverted model (plus a few ulps)."""
    ref64 = copy.deepcopy(ref).double()
    lo, so, go = step(ours, *inputs)
    lr, sr, gr = step(ref, *inputs)
    l64, s64, g64 = step(ref64, *inputs)
    lo, lr, l64 = dense(lo), lr, l64
    if keep is not None:
        lo, lr, l64 = lo[keep], lr[keep], l64[keep]
    assert_close_as_torch(dense(so), sr, s64, what="loss")
    assert_close_as_torch(lo, lr, l64, what="logits")
    names = [n for n, _ in ref.named_parameters()]
    assert names == [n for n, _ in ours.named_parameters()]
    for name, a, b, c in zip(names, go, gr, g64):
        assert_close_as_torch(dense(a), b, c, what=f"grad {name}")


def waits_per_step(model, step_inputs, loss_of, steps=2):
    """Host waits of each full training step (forward, backward, nt.optim.AdamW) after a first one, without
    reading the loss."""
    opt = nt.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for i in range(steps + 1):
        before = nt.stats()["blocking_waits"]
        loss = loss_of(model, *step_inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i:
            out.append(nt.stats()["blocking_waits"] - before)
    before = nt.stats()["blocking_waits"]
    loss.item()
    out.append(nt.stats()["blocking_waits"] - before)  # reading the loss: one wait
    return out


# --- nanoGPT --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_nanogpt_every_layer_in_tiles_and_exact(device, bias):
    """nanoGPT's shape (its own LayerNorm calling F.layer_norm, bias=None allowed; c_attn split and SDPA inline;
    nn.GELU; wte tied to lm_head; wpe; dropout) converts whole under strict=True: every parameter a tile tensor,
    nothing left dense; loss, logits and every gradient to float32 rounding. Before: 15 of 40 parameters (the
    LayerNorms, wpe) stayed dense."""
    ref = nanogpt(device, bias=bias)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    report = nt.convert_report(ours)
    assert report.dense == [] and report.dense_ops == {}
    assert all(isinstance(p, nt.TileTensor) for p in ours.parameters())
    assert ours.lm_head.weight is ours.transformer.wte.weight
    assert isinstance(ours.transformer.wpe, nt.nn.Embedding)
    assert type(ours.transformer.h[0].ln_1) is nanogpt_model.LayerNorm  # kept, its parameters tiled
    assert {n for n, _, _ in report.tiled} >= {"transformer.ln_f", "transformer.h.0.ln_1", "transformer.h.1.ln_2"}
    ids = torch.randint(0, 101, (3, 33), device=device)
    assert_parity(ours, ref, nano_step, ids)
    assert report.dense_ops == {}  # strict: nothing ran dense (it would have raised)
    sd, rsd = ours.state_dict(), ref.state_dict()
    assert list(sd) == list(rsd) and all(type(sd[k]) is torch.Tensor and torch.equal(sd[k], rsd[k]) for k in rsd)


@pytest.mark.parametrize("kind", ["hf", "nanogpt"])
def test_default_tiles_keep_every_layer_in_tiles(kind, device):
    """convert() without tile sizes picks the weight tile from the model's width (3 x width; 4 x on GPUs): at width
    384, the fixed default of 1024 put c_attn's 1152 columns in two tiles and attention ran as dense torch code (it
    did for GPT-2 small, width 768, and every larger GPT-2). Strict mode raises on any dense op."""
    torch.manual_seed(0)
    if kind == "hf":
        cfg = transformers.GPT2Config(n_layer=1, n_embd=384, n_head=6, vocab_size=101, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        ref = transformers.GPT2LMHeadModel(cfg).to(device)
        step = lambda m, ids: m(ids, labels=ids).loss  # noqa: E731
    else:
        cfg = nanogpt_model.GPTConfig(block_size=16, vocab_size=101, n_layer=1, n_head=6, n_embd=384, dropout=0.0)
        ref = nanogpt_model.GPT(cfg).to(device)
        step = lambda m, ids: m(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())[1]  # noqa: E731
    ours = nt.convert(copy.deepcopy(ref), strict=True)
    cuda = nt.info()["workers"].get("cuda", 0) > 0
    assert ours.transformer.h[0].attn.c_attn.tile_size == (4 if cuda else 3) * 384
    assert nt.config.weight_tile(384, cuda) == (4 if cuda else 3) * 384
    ids = torch.randint(0, 101, (2, 16), device=device)
    loss = step(ours, ids)
    loss.backward()
    assert nt.convert_report(ours).dense_ops == {}
    assert abs(loss.item() - step(ref, ids).item()) < 1e-4


@pytest.mark.parametrize("bias", [False, True], ids=["bias=False", "bias=True"])
def test_nanogpt_built_on_meta_converts_with_its_own_init(device, bias):
    """nanoGPT built on the meta device and converted with its _init_weights: its LayerNorms (no
    reset_parameters, skipped by _init_weights) start at weight 1, bias 0, as built on a device, each with
    parameters of its own (ties are matched by the ids of the meta parameters: a materialized one's id, reused
    once it was replaced by its tiles, once tied later LayerNorms to earlier ones); the model trains."""
    cfg = nanogpt_model.GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64, bias=bias)
    with torch.device("meta"):
        meta = nanogpt_model.GPT(cfg)
    names = [n for n, _ in meta.named_parameters()]
    ours = nt.convert(meta, strict=True, init=meta._init_weights, init_device=device, **TILES)
    assert not any(p.is_meta for p in ours.parameters())
    assert [n for n, _ in ours.named_parameters()] == names  # one tie only: the head and the token embedding
    ln = ours.transformer.h[1].ln_2
    assert (ln.bias is None) != bias and torch.equal(dense(ln.weight).cpu(), torch.ones(64))
    if bias:
        assert torch.equal(dense(ln.bias).cpu(), torch.zeros(64))
    w = dense(ours.transformer.h[0].mlp.c_fc.weight)
    assert abs(w.std().item() - 0.02) < 0.003
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    opt = nt.optim.AdamW(ours.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        _, loss = ours(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(101)) < 0.3 and losses[-1] < losses[0] - 0.5, losses


def test_nanogpt_step_makes_no_host_wait(device):
    """A converted nanoGPT step (forward, backward, nt.optim.AdamW) waits on the host only when the loss is read.
    Before: 47 blocking waits per forward and backward."""
    ours = nt.convert(nanogpt(device), strict=True, **TILES)
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    assert waits_per_step(ours, (x, y), lambda m, a, b: m(a, b)[1]) == [0, 0, 1]


def test_nanogpt_training_with_dropout_is_tiled(device):
    """Dropout (modules, and nanoGPT's attention dropout through SDPA's dropout_p, off in eval): training runs in
    tiles under strict mode; in eval the loss is the unconverted model's."""
    ref = nanogpt(device, dropout=0.1)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    assert isinstance(ours.transformer.drop, nt.nn.Dropout) and isinstance(ours.transformer.h[0].mlp.dropout,
                                                                            nt.nn.Dropout)
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    _, loss = ours(x, y)
    loss.backward()
    assert math.isfinite(loss.item())
    ours.eval()
    ref.eval()
    assert abs(ours(x, y)[1].item() - ref(x, y)[1].item()) < 1e-5


def test_nanogpt_manual_attention_is_not_silent(device):
    """nanoGPT without SDPA (attention written out with matmul, masked_fill, softmax) has no tile version: strict
    mode raises where it runs, naming the module and the op; by default it runs (exact) with one warning per
    kind of op, and the report lists them."""
    ref = nanogpt(device, manual=True)
    ids = torch.randint(0, 101, (3, 33), device=device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    strict = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    with pytest.raises(nt.DenseFallbackError, match=r"transformer\.h\.0\.attn \(CausalSelfAttention\)"):
        strict(x, y)
    ours = nt.convert(copy.deepcopy(ref), **TILES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits, loss = ours(x, y)
    ran_dense = [str(w.message) for w in caught if "ran as dense torch code" in str(w.message)]
    assert ran_dense and len(ran_dense) == len(set(m.split(" ran as")[0] for m in ran_dense))  # once per kind
    assert any(m == "transformer.h.1.attn" for m, _ in nt.convert_report(ours).dense_ops)
    assert abs(loss.item() - ref(x, y)[1].item()) < 1e-5


# --- Hugging Face GPT-2 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("padding", ["none", "right", "left"])
@pytest.mark.parametrize("impl", ["eager", "sdpa", None], ids=["eager", "sdpa", "default"])
def test_hf_gpt2_every_attention_form_and_padding_in_tiles(device, impl, padding):
    """Hugging Face GPT-2 with each attn_implementation, with and without a padding attention_mask (right and
    left padded rows of different lengths, labels -100 on the pads): strict mode passes, loss, logits (of the
    tokens; pads' rows are garbage on either side) and every gradient to float32 rounding. Before: a padded
    batch, or the eager implementation, ran attention dense, silently."""
    ref = hf_gpt2(device, impl)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES)
    assert [n for n, _, _ in nt.convert_report(ours).patched] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    ids, mask, labels = padded(device, padding)
    assert_parity(ours, ref, hf_step, ids, mask, labels, keep=mask.bool())
    assert nt.convert_report(ours).dense_ops == {}


@pytest.mark.parametrize("kind", ["hf", "nanogpt"])
def test_row_tiles_that_would_cut_a_sequence_hold_whole_ones(device, kind):
    """batch_tile_size 20 with sequences of 7 (4 of them: 28 rows): the activation tiles take the two whole
    sequences that fit (14 rows), so attention stays a tile task: strict mode passes, loss, logits and every gradient
    to float32 rounding. Before: tiles of 20 rows cut a sequence and attention ran dense."""
    ref = hf_gpt2(device) if kind == "hf" else nanogpt(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, tile_size=384, batch_tile_size=20)
    ids = torch.randint(0, 101, (4, 8), device=device)
    if kind == "hf":
        x = ids[:, :7]
        assert_parity(ours, ref, hf_step, x, torch.ones_like(x), x)
    else:
        assert_parity(ours, ref, nano_step, ids)
    assert nt.convert_report(ours).dense_ops == {}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_gpt2_padded_step_makes_no_host_wait(device, impl):
    ours = nt.convert(hf_gpt2(device, impl), strict=True, **TILES)
    ids, mask, labels = padded(device, "right")
    loss = lambda m, i, a, lab: m(input_ids=i, attention_mask=a, labels=lab).loss  # noqa: E731
    assert waits_per_step(ours, (ids, mask, labels), loss) == [0, 0, 1]


def test_hf_gpt2_attention_falls_back_with_dropout_modules_swapped(device):
    """Hugging Face's own attention code (the fallback) reads attn_dropout.p: a swapped p = 0 dropout keeps it
    (before, it became nn.Identity and a padded batch's fallback raised AttributeError)."""
    ours = nt.convert(hf_gpt2(device), **TILES)
    assert isinstance(ours.transformer.h[0].attn.attn_dropout, nt.nn.Dropout)
    assert ours.transformer.h[0].attn.attn_dropout.p == 0.0
    ids = torch.randint(0, 101, (2, 16), device=device)
    per_head = torch.zeros(2, 4, 16, 16, device=device).masked_fill(
        ~torch.ones(16, 16, dtype=torch.bool, device=device).tril(), float("-inf"))
    with pytest.warns(UserWarning, match="differs per head"):
        out = ours.transformer.h[0].attn(ours.transformer.wte(ids), attention_mask=per_head)[0]
    assert out.shape == (2, 16, 64)


def test_hf_gpt2_uncovered_attention_is_named(device):
    """What the tiled attention does not cover (here returned attention weights) runs Hugging Face's own code:
    strict mode raises naming the module and why; by default it runs, and the report lists it."""
    model = hf_gpt2(device, "eager")
    ids = torch.randint(0, 101, (2, 16), device=device)
    strict = nt.convert(copy.deepcopy(model), strict=True, **TILES).train()
    with pytest.raises(nt.DenseFallbackError,
                       match=r"attention \(output_attentions=True\).*transformer\.h\.0\.attn"):
        strict.transformer.h[0].attn(strict.transformer.wte(ids), output_attentions=True)
    ours = nt.convert(copy.deepcopy(model), **TILES).train()
    with pytest.warns(UserWarning, match="output_attentions=True"):
        out = ours.transformer.h[1].attn(ours.transformer.wte(ids), output_attentions=True)
    assert out[0].shape == (2, 16, 64)
    assert ("transformer.h.1.attn", "attention (output_attentions=True)") in nt.convert_report(ours).dense_ops


# --- what people write: layer norms, GELU, dropout, embeddings -------------------------------------------------

class NewGELU(nn.Module):  # the tanh formula written out (Hugging Face's NewGELUActivation, nanoGPT's new_gelu)
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class FGELU(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class Norm(nn.Module):  # a custom layer norm with another eps and other attribute names around it
    def __init__(self, c):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.randn(c))
        self.eps = 1e-6

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), weight=self.weight, bias=self.bias, eps=self.eps)


class MLPNet(nn.Module):
    def __init__(self, act, inline=None, c=48):
        super().__init__()
        self.emb = nn.Embedding(50, c)
        self.norm = Norm(c)
        self.up, self.act, self.down = nn.Linear(c, 4 * c), act, nn.Linear(4 * c, c)
        self.inline = inline
        self.ln = nn.LayerNorm(c, bias=False)

    def forward(self, ids):
        h = self.up(self.norm(self.emb(ids)))
        h = self.act(h) if self.inline is None else F.gelu(h, approximate=self.inline)
        h = F.dropout(h, p=0.0, training=self.training)
        return self.ln(self.down(h))


@pytest.mark.parametrize("form", ["nn.GELU", "nn.GELU-tanh", "hf-gelu_new", "hf-gelu", "written-out-tanh",
                                  "module-F.gelu", "inline-F.gelu", "inline-F.gelu-tanh"])
def test_every_gelu_and_layer_norm_form(device, form):
    acts = {"nn.GELU": nn.GELU(), "nn.GELU-tanh": nn.GELU("tanh"), "written-out-tanh": NewGELU(),
            "module-F.gelu": FGELU(), "hf-gelu_new": transformers.activations.ACT2FN["gelu_new"],
            "hf-gelu": transformers.activations.ACT2FN["gelu"]}
    torch.manual_seed(0)
    inline = {"inline-F.gelu": "none", "inline-F.gelu-tanh": "tanh"}.get(form)
    ref = MLPNet(copy.deepcopy(acts.get(form, nn.Identity())), inline).to(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, tile_size=256, batch_tile_size=16)
    report = nt.convert_report(ours)
    if inline is None:
        assert isinstance(ours.act, nt.nn.GELU), report
    assert [n for n, _, _ in report.tiled] == ["norm"] and isinstance(ours.ln, nt.nn.LayerNorm)
    ids = torch.randint(0, 50, (3, 7), device=device)

    def step(m, ids):
        out = m(ids)
        loss = (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum()  # outside the model
        return out, loss, torch.autograd.grad(loss, list(m.parameters()))
    assert_parity(ours, ref, step, ids)


def test_strict_names_modules_without_tile_version_before_changing_anything():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return x * self.s
    model = nn.Sequential(nn.Linear(8, 8), Scale(), nn.Conv1d(1, 1, 1))
    with pytest.raises(nt.DenseFallbackError, match=r"1 \(Scale: .*\); 2 \(Conv1d"):
        nt.convert(model, strict=True)
    assert type(model[0]) is nn.Linear  # unchanged
    with pytest.warns(UserWarning, match="run as dense torch code: 1 \\(Scale"):
        nt.convert(model)
    report = nt.convert_report(model)
    assert [n for n, _, _ in report.dense] == ["1", "2"] and [n for n, _, _ in report.swapped] == ["0"]
    assert "left dense" in str(report)


def test_runtime_dense_op_raises_in_strict_mode_and_warns_once_otherwise(device):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.tanh(self.fc(x))  # no tile version of tanh
    ref = nn.Sequential(Block(), Block()).to(device)
    x = torch.randn(4, 8, device=device)
    with pytest.raises(nt.DenseFallbackError, match=r"tanh.*in 0 \(Block\)"):
        nt.convert(copy.deepcopy(ref), strict=True)(x)
    ours = nt.convert(copy.deepcopy(ref))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = ours(x)
    assert len([w for w in caught if "tanh" in str(w.message)]) == 1
    assert {m for m, op in nt.convert_report(ours).dense_ops if "tanh" in op} == {"0", "1"}
    assert torch.allclose(dense(y), ref(x), atol=1e-6)
    with pytest.raises(ValueError, match="not converted"):
        nt.convert_report(ref)


class _ScaledSum(nn.Module):
    """Two converted Linears added with alpha: the backward scales a gradient by alpha (aten.mul.Scalar)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.c(torch.add(self.a(x), self.b(x), alpha=0.5) * 3)


def test_tensor_times_number_runs_as_tiles_forward_and_backward(device):
    torch.manual_seed(0)
    ref = _ScaledSum().to(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True)
    x = torch.randn(5, 8, device=device)
    waits = nt.stats()["blocking_waits"]
    y = ours(x)
    (y * y).sum().backward()  # the loss's own ops are the caller's, outside the model
    r = ref(x)
    (r * r).sum().backward()
    assert nt.convert_report(ours).dense_ops == {}
    assert torch.allclose(dense(y), r, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):  # sums in another order: float32's rounding
        assert torch.allclose(dense(p.grad), q.grad, rtol=1e-5, atol=1e-5), name
    assert nt.stats()["blocking_waits"] > waits  # the check reads values: the count moves when waits happen


def test_dense_op_in_the_backward_is_counted_warned_and_raised_in_strict_mode(device, monkeypatch):
    # Without its tile version, AddBackward0's aten.mul.Scalar runs on materialized tiles inside the backward,
    # where no module of the model is on the Python stack.
    from nntile_torch import tensor
    monkeypatch.delitem(tensor._HANDLERS, torch.ops.aten.mul.Scalar)
    torch.manual_seed(0)
    ref = _ScaledSum().to(device)
    x = torch.randn(5, 8, device=device)
    strict = nt.convert(copy.deepcopy(ref), strict=True)
    y = strict(x)  # the forward's * 3 is aten.mul.Tensor: tiled
    with pytest.raises(nt.DenseFallbackError, match=r"mul\.Scalar in AddBackward0 .* backward"):
        (y * y).sum().backward()
    ours = nt.convert(copy.deepcopy(ref))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = ours(x)
        (y * y).sum().backward()
    assert any("mul.Scalar" in str(w.message) for w in caught)
    ops = nt.convert_report(ours).dense_ops
    assert [(m, op) for m, op in ops] == [("(backward)", "mul.Scalar in AddBackward0")]
    r = ref(x)
    (r * r).sum().backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert torch.allclose(dense(p.grad), q.grad, rtol=1e-5, atol=1e-5), name
    # A backward that never goes through a converted model's outputs is nobody's: not recorded
    before = dict(ops)
    t = nt.TileTensor.from_dense(torch.randn(4, 4, device=device), [4, 4]).requires_grad_()
    (t * 2.0).sum().backward()
    assert nt.convert_report(ours).dense_ops == before


def test_cross_entropy_with_nanogpt_ignore_index(device):
    """ignore_index=-1 (nanoGPT's) on tiled logits: tile tasks, the same loss and gradient as torch's."""
    lin = nn.Linear(16, 30, bias=False).to(device)
    ours = nt.convert(copy.deepcopy(nn.Sequential(lin)), strict=True, tile_size=32, batch_tile_size=8)
    x = torch.randn(12, 16, device=device)
    t = torch.randint(0, 30, (12,), device=device)
    t[::3] = -1
    a = F.cross_entropy(ours(x), t, ignore_index=-1)
    b = F.cross_entropy(lin(x), t, ignore_index=-1)
    assert isinstance(a, nt.TileTensor) and abs(a.item() - b.item()) < 1e-6
    ga = torch.autograd.grad(a, ours[0].weight)[0]
    gb = torch.autograd.grad(b, lin.weight)[0]
    assert torch.allclose(dense(ga), gb, atol=1e-6)
    with pytest.raises(IndexError, match="out of bounds|out of range"):  # on a GPU, at the wait that reads the loss
        F.cross_entropy(ours(x), torch.full((12,), 30, device=device), ignore_index=-1).item()


# --- attention with a mask, views ------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [16, 13], ids=["seq=16", "seq=13"])
@pytest.mark.parametrize("mask_kind", ["causal", "bool", "float", "none"])
def test_sdpa_on_split_heads_runs_in_tiles(device, mask_kind, t):
    """F.scaled_dot_product_attention on the heads of c_attn(x).split(C, 2) (views of one tile matrix): tile tasks
    (causal, a boolean or additive mask shared by the heads, or no mask), output and q/k/v gradients as torch's,
    the output's transpose(1, 2).reshape back to (B, T, C) tiles without a copy. Two sequences per row tile, the
    last tile partial; a sequence length that is not a multiple of 16 (the CUDA kernel's bias alignment)."""
    torch.manual_seed(0)
    b, h, d = 3, 4, 8
    c = h * d
    lin = nn.Linear(c, 3 * c).to(device)
    ours = nt.nn.Linear(c, 3 * c, tile_size=128, batch_tile_size=2 * t, device=device)
    with torch.no_grad():
        ours.weight.copy_(lin.weight)
        ours.bias.copy_(lin.bias)
    x = torch.randn(b, t, c, device=device)
    kw = {}
    if mask_kind == "causal":
        kw = dict(is_causal=True)
    elif mask_kind in ("bool", "float"):
        keep = torch.rand(b, 1, t, t, device=device) > 0.3
        keep |= torch.eye(t, dtype=torch.bool, device=device)  # no row fully masked
        kw = dict(attn_mask=keep if mask_kind == "bool" else torch.zeros(b, 1, t, t, device=device).masked_fill(
            ~keep, -1e9) + torch.randn(b, 1, t, t, device=device))

    def forward(layer):
        q, k, v = layer(x).split(c, dim=2)
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, **kw)
        return y.transpose(1, 2).contiguous().view(b, t, c)
    before = nt.stats()["blocking_waits"]
    out = forward(ours)
    assert isinstance(out, nt.TileTensor) and nt.tensor.plain(out) and out.tiles.shape == [b * t, c]
    assert nt.stats()["blocking_waits"] == before  # no materialization on the way
    gy = torch.randn(b, t, c, device=device)
    grads = torch.autograd.grad(out, list(ours.parameters()), gy)
    ref_out = forward(lin)
    ref_grads = torch.autograd.grad(ref_out, list(lin.parameters()), gy)
    assert torch.allclose(dense(out), ref_out, atol=2e-5)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(dense(g), r, atol=2e-4)


def test_views_write_through_to_the_tiles(device):
    """In-place writes to views of tiles (a row, a column of the transpose, a slice of a detached alias) change the
    tiles; a materialized copy written in place raises instead of disagreeing with them. Before: the writes went
    to a dense copy and the tiles kept the old values."""
    lin = nt.nn.Linear(6, 4, tile_size=4, device=device)
    w = lin.weight
    ref = w.materialize().clone()
    w.data[0].fill_(1.0)
    ref[0] = 1.0
    w.data.T[1].mul_(0.0)
    ref[:, 1] = 0.0
    w.detach()[1:3].add_(100.0)
    ref[1:3] += 100.0
    w.data[3, 2:5] = torch.tensor([7.0, 8.0, 9.0], device=device)
    ref[3, 2:5] = torch.tensor([7.0, 8.0, 9.0])
    assert torch.equal(w.materialize(), ref.to(w.device))
    y = lin(torch.ones(2, 6, device=device))  # tasks read the written tiles
    assert torch.allclose(dense(y), (torch.ones(2, 6) @ ref.cpu().T + dense(lin.bias).cpu()).to(device), atol=1e-5)
    copy_ = w.materialize()
    copy_[0, 0] = 5.0
    with pytest.raises(RuntimeError, match="written in place"):
        w.materialize()


# --- waits counted everywhere ------------------------------------------------------------------------------------

def test_waits_are_counted_in_from_dense_and_index_checks_are_tasks(device):
    """from_dense into fresh tiles does not wait; into tiles that tasks still use it does, and counts it. Token ids
    off the CPU are range-checked by a task (no host read), its error raised at the next wait."""
    from nntile_torch import _C
    from nntile_torch.functional import EmbeddingFunction
    before = nt.stats()["blocking_waits"]
    t = nt.TileTensor.from_dense(torch.randn(64, 64), (32, 32))
    assert nt.stats()["blocking_waits"] == before
    n = 8192 if device == "cuda" else 512  # ~0.1 s of work queued on `busy` (20 GEMMs: on an H200 at 8192)
    a = _C.TileTensor([n, n], [n, n])
    a.from_dense(torch.randn(n, n) / n)
    busy = _C.TileTensor([n, n], [n, n])
    busy.from_dense(torch.zeros(n, n))
    for _ in range(20 if device == "cuda" else 80):  # on CPUs ~0.4 s: the next line's wait must still find them
        _C.gemm(False, a, False, a, busy, 1.0, 1.0)    # running on a loaded machine (it failed once under load)
    assert nt.stats()["tasks_pending"] > 0
    before = nt.stats()["blocking_waits"]
    busy.from_dense(torch.zeros(n, n))
    assert nt.stats()["blocking_waits"] - before == 1
    emb = nt.nn.Embedding(10, 8, tile_size=8, device=device)
    with pytest.raises(IndexError, match=r"Embedding: index 12 is out of range \[0, 10\)"):
        # at the next wait, or at the next submission when the check task has already failed by then
        EmbeddingFunction.apply(torch.tensor([[1, 12, 3]], device=device), emb.weight, 8, "Embedding").materialize()
    ok = EmbeddingFunction.apply(torch.tensor([[1, 2, 3]], device=device), emb.weight, 8, "Embedding")
    assert torch.equal(dense(ok)[0], dense(emb.weight)[[1, 2, 3]])


# --- the examples --------------------------------------------------------------------------------------------------

def _run_example(script, *args):
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                       cwd=script.parent, env=dict(os.environ, PYTHONWARNINGS="error::UserWarning",
                                                       PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def _added_lines(script):
    """The lines of code that use nntile_torch (nt.<something>), beside its import."""
    import ast
    text = script.read_text()
    lines = sorted({n.lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id == "nt"})
    return [text.splitlines()[i - 1] for i in lines]


def test_nanogpt_example_trains_with_one_added_line(tmp_path):
    script = REPO / "examples" / "nanogpt" / "train.py"
    assert [ln.split("#")[0].strip() for ln in _added_lines(script)] == ["model = nt.convert(model)"]
    out = _run_example(script, "--max_iters=3", "--eval_interval=2", "--eval_iters=1", "--n_layer=1",
                       "--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=2", f"--out_dir={tmp_path}",
                       "--device=cpu")
    losses = [float(ln.split("loss ")[1].split(",")[0]) for ln in out.splitlines() if ln.startswith("iter ")]
    assert len(losses) >= 1 and all(math.isfinite(v) for v in losses) and abs(losses[0] - math.log(256)) < 1.0


def test_hf_gpt2_example_trains_with_one_added_line(tmp_path):
    """The example's losses, with its one line, are those of the same script without it (plain PyTorch: torch's
    AdamW on the same padded batches), step after step; dropout off, as its random numbers differ."""
    script = REPO / "examples" / "hf_gpt2" / "train.py"
    assert [ln.split("#")[0].strip() for ln in _added_lines(script)] == ["model = nt.convert(model)"]
    plain = tmp_path / "train.py"
    text = script.read_text()
    assert text.count("\nmodel = nt.convert(model)") == 1
    plain.write_text(text.replace("\nmodel = nt.convert(model)", "\npass"))

    def losses(path, attn):
        out = _run_example(path, "--steps=4", "--layers=1", "--width=32", "--heads=2", "--batch=3", "--max-len=24",
                           f"--attn={attn}", "--device=cpu", "--dropout=0", f"--data={script}")
        return [float(ln.split("loss ")[1]) for ln in out.splitlines() if ln.startswith("step ")]
    for attn in ("sdpa", "eager"):
        ours, ref = losses(script, attn), losses(plain, attn)
        assert len(ours) == len(ref) == 2 and abs(ref[0] - math.log(257)) < 0.5, (ours, ref)
        assert abs(ref[1] - ref[0]) > 0.02, ref  # the steps change the loss: the comparison below says something
        assert all(abs(a - b) <= 2e-4 for a, b in zip(ours, ref)), (attn, ours, ref)  # printed to 4 decimals


def test_cuda_sources_count_torch_stream_syncs_apart(device):
    """from_dense of a CUDA tensor synchronizes torch's stream first (a wait for torch's own work, not nntile's
    tasks): counted in torch_stream_syncs, one per call; a CPU source makes none."""
    from nntile_torch import _C
    x = torch.randn(6, 5, device=device)
    before, waits = _C.torch_stream_syncs(), nt.stats()["blocking_waits"]
    nt.TileTensor.from_dense(x, (4, 4))
    assert _C.torch_stream_syncs() - before == (1 if device == "cuda" else 0)
    assert nt.stats()["blocking_waits"] == waits
