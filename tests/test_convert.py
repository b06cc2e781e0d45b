"""convert(): Hugging Face GPT-2 and a nanoGPT-style model against their unconverted selves: logits, loss, every
gradient, state_dict, weight ties, 20 AdamW steps."""
import contextlib
import copy
import gc
import math

import pytest
import torch
from torch import nn

import nntile_torch as nt
from conftest import assert_close_as_torch

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")


def gpt2(device, n_layer=3, n_embd=96, n_head=6, vocab=1000, n_positions=64, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                                  n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(device)


class NanoBlock(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class NanoGPT(nn.Module):
    """A nanoGPT-style model from torch.nn modules only."""

    def __init__(self, vocab=1000, block=64, c=96, heads=6, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.h = nn.ModuleList(NanoBlock(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_step(model, ids):
    out = model(ids, labels=ids)
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    return out.logits, out.loss, grads


def nano_step(model, ids):
    logits, loss = model(ids[:, :-1], ids[:, 1:])
    return logits, loss, torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("kind", ["hf-gpt2", "nanogpt"])
def test_fp32_logits_loss_and_gradients_match(device, kind):
    """Within float32 rounding: at most twice torch's own float32 error against a float64 run (plus ulps)."""
    torch.manual_seed(0)
    if kind == "hf-gpt2":
        ref, step = gpt2(device), hf_step
    else:
        ref, step = NanoGPT().to(device), nano_step
    ours = nt.convert(copy.deepcopy(ref), tile_size=40, batch_tile_size=16)  # 40 divides none of 96, 288, 1000
    ref64 = copy.deepcopy(ref).double()
    ids = torch.randint(0, 1000, (3, 37), device=device)
    lo, so, go = step(ours, ids)
    lr, sr, gr = step(ref, ids)
    l64, s64, g64 = step(ref64, ids)
    assert_close_as_torch(lo, lr, l64, what="logits")
    assert_close_as_torch(so, sr, s64, what="loss")
    names = [n for n, _ in ref.named_parameters()]
    assert names == [n for n, _ in ours.named_parameters()]
    for name, a, b, c in zip(names, go, gr, g64):
        assert_close_as_torch(a, b, c, what=f"grad {name}")


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_reduced_precision_no_worse_than_torch_in_that_precision(device, precision):
    """tf32 and bf16 (fp32 master weights, bf16 matmul operands, fp32 accumulation) against torch with tf32
    matmuls / under bf16 autocast: logits, loss and every gradient no further from the float64 run than twice
    torch's own error in that precision. The loss, one number per batch, is compared by its mean error over 6
    batches (on one batch either side can be lucky)."""
    ref = gpt2(device)
    ours = nt.convert(copy.deepcopy(ref), precision=precision, tile_size=300, batch_tile_size=37)
    ref64 = copy.deepcopy(ref).double()
    gen = torch.Generator().manual_seed(11)
    batches = [torch.randint(0, 1000, (3, 37), generator=gen).to(device) for _ in range(6)]

    @contextlib.contextmanager
    def torch_precision():
        if precision == "tf32":
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                yield
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
        else:
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                yield

    ids = batches[0]
    lo, so, go = hf_step(ours, ids)
    with torch_precision():
        lr, sr, gr = hf_step(ref, ids)
    l64, s64, g64 = hf_step(ref64, ids)
    assert_close_as_torch(lo, lr, l64, what=f"{precision} logits")
    for (name, _), a, b, c in zip(ref.named_parameters(), go, gr, g64):
        assert_close_as_torch(a, b, c, what=f"{precision} grad {name}")
    e_ours, e_torch = [], []
    with torch.no_grad():
        for ids in batches:
            l64 = ref64(ids, labels=ids).loss.item()
            e_ours.append(abs(ours(ids, labels=ids).loss.item() - l64))
            with torch_precision():
                e_torch.append(abs(ref(ids, labels=ids).loss.item() - l64))
    mean_ours, mean_torch = sum(e_ours) / 6, sum(e_torch) / 6
    assert mean_ours <= 2 * mean_torch + 4 * torch.finfo(torch.float32).eps * abs(l64), \
        f"{precision} loss: mean error {mean_ours:.3e} over 6 batches, torch's {mean_torch:.3e}"


def test_host_waits_per_step_do_not_grow_with_depth(device):
    """Every piece of the step runs as tile tasks (embeddings, blocks, loss, their backward): a GPT-2 step waits
    on the host only when the caller reads a value, whatever its depth."""
    waits = []
    for layers in (1, 4):
        ours = nt.convert(gpt2(device, n_layer=layers), tile_size=384, batch_tile_size=37)
        ids = torch.randint(0, 1000, (3, 37), device=device)
        ours(ids, labels=ids).loss.backward()  # first step: tiles and bf16/fp32 copies made
        before = nt.stats()["blocking_waits"]
        ours(ids, labels=ids).loss.backward()
        waits.append(nt.stats()["blocking_waits"] - before)
    assert waits == [0, 0], waits


def test_no_full_garbage_collection_lands_in_the_training_steps(device):
    """Converting makes many long-lived Python objects (a GPT-2 XL: ~430k in the process). Python runs a full
    collection, which scans them all and stops the submitting thread (~0.25 s on the H200, the GPU idle), once
    enough objects have piled up since the last one: it must come inside convert(), not in a training step."""
    old, fulls = gc.get_threshold(), []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            fulls.append(1)

    gc.collect()
    gc.disable()  # the backlog a big model's conversion leaves: long-lived objects, none collected yet
    try:
        backlog = [[] for _ in range(200_000)]
        ours = nt.convert(gpt2(device, n_layer=2), tile_size=384, batch_tile_size=37)
        ids = torch.randint(0, 1000, (3, 37), device=device)
        gc.set_threshold(50, 1, 1)  # young collections often, a full one considered at every other
        gc.callbacks.append(seen)
        gc.enable()
        for _ in range(3):
            ours(ids, labels=ids).loss.backward()
        nt.synchronize()
    finally:
        gc.enable()
        gc.set_threshold(*old)
        if seen in gc.callbacks:
            gc.callbacks.remove(seen)
    assert fulls == [] and len(backlog) == 200_000


def test_python_torch_function_calls_per_step_do_not_grow_with_depth(device, monkeypatch):
    """TileTensor.__torch_function__ is a call into Python (~5 us) for every .shape, .dim(), .grad ... of a
    TileTensor; nntile's modules, Functions and AdamW skip it (without_torch_function), so a step of a converted
    GPT-2 makes only those of the model's own code: its two residual adds per block, a constant for the rest. Before,
    ~150 per block (a 48-layer step: ~7.6k, ~40 ms of submission on a 2-core machine)."""
    from nntile_torch.tensor import TileTensor
    calls = []
    original = TileTensor.__torch_function__.__func__

    def counting(cls, func, types, args=(), kwargs=None):
        calls.append(getattr(func, "__name__", str(func)))
        return original(cls, func, types, args, kwargs)

    per_step = []
    for layers in (1, 4):
        model = nt.convert(gpt2(device, n_layer=layers), tile_size=384, batch_tile_size=37)
        opt = nt.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 1000, (3, 37), device=device)
        for step in range(2):
            if step == 1:
                calls.clear()
                monkeypatch.setattr(TileTensor, "__torch_function__", classmethod(counting))
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        monkeypatch.undo()
        per_step.append(len(calls))
    assert per_step[1] - per_step[0] <= 3 * 3, per_step  # at most 3 per added block (its 2 residual adds)
    assert per_step[0] <= 40, (per_step, calls)


def test_backward_frees_what_forward_kept(device):
    """With the loss still held (the usual loop keeps it until the next forward has run), backward has freed
    every tile its forward kept: what is left is the gradients. A second backward through the graph raises."""
    import gc
    ours = nt.convert(gpt2(device), precision="bf16", tile_size=384, batch_tile_size=37)
    ids = torch.randint(0, 1000, (3, 37), device=device)
    ours(ids, labels=ids).loss.backward()  # first step: the weights' bf16 copies made (they stay with the weights)
    for p in ours.parameters():
        p.grad = None
    gc.collect()
    before = nt.stats()["tile_bytes"]
    loss = ours(ids, labels=ids).loss
    assert nt.stats()["tile_bytes"] > before  # activations
    loss.backward()
    grads = sum(p.grad.numel() * 4 for p in ours.parameters() if isinstance(p.grad, nt.TileTensor))
    held = 4 * loss.numel() if isinstance(loss, nt.TileTensor) else 0  # the loss's own tile
    assert grads > 0 and nt.stats()["tile_bytes"] == before + grads + held
    again = ours(ids, labels=ids).loss
    again.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second time: its saved tiles were freed"):
        again.backward()


@pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_activation_checkpointing_drops_activations_and_keeps_results(device, reentrant):
    """torch's activation checkpointing (Hugging Face's gradient_checkpointing_enable) on a converted model: the
    tiles held after the forward shrink, and the loss and every gradient are those without it, bit for bit
    (dropout on: the recomputed forward draws the same seeds)."""
    import gc
    out = []
    for ckpt in (False, True):
        model = gpt2(device, n_layer=4)
        model.config.resid_pdrop = model.config.attn_pdrop = 0.1
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.1
        ours = nt.convert(model, tile_size=384, batch_tile_size=37)
        if ckpt:
            ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        ours.train()
        ids = torch.randint(0, 1000, (3, 37), generator=torch.Generator().manual_seed(1)).to(device)
        gc.collect()
        before = nt.stats()["tile_bytes"]
        torch.manual_seed(5)
        loss = ours(ids, labels=ids).loss
        held = nt.stats()["tile_bytes"] - before
        loss.backward()
        out.append((held, float(loss.detach()), [p.grad.materialize().clone() if isinstance(p.grad, nt.TileTensor)
                                                  else p.grad.clone() for p in ours.parameters()]))
        del loss, ours, model
    (held0, loss0, grads0), (held1, loss1, grads1) = out
    assert held1 < 0.6 * held0, (held1, held0)
    assert loss1 == loss0 and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


def test_convert_progress_bar(capsys):
    """progress=True draws a bar over the modules on stderr; False (and the default for small models off a
    terminal) draws none."""
    nt.convert(gpt2("cpu", n_layer=1), progress=True)
    assert "nntile_torch.convert" in capsys.readouterr().err
    nt.convert(gpt2("cpu", n_layer=1), progress=False)
    nt.convert(gpt2("cpu", n_layer=1))
    assert "nntile_torch.convert" not in capsys.readouterr().err


def test_structure_state_dict_and_ties(device):
    ref = gpt2(device)
    ours = nt.convert(copy.deepcopy(ref), tile_size=40)
    assert isinstance(ours.transformer.h[0].attn.c_attn, nt.nn.Conv1D)
    assert isinstance(ours.lm_head, nt.nn.Linear)
    assert isinstance(ours.transformer.h[0].ln_1, nt.nn.LayerNorm) and isinstance(ours.transformer.ln_f, nt.nn.LayerNorm)
    assert isinstance(ours.transformer.h[0].mlp.act, nt.nn.GELU) and ours.transformer.h[0].mlp.act.approximate == "tanh"
    assert ours.lm_head.weight is ours.transformer.wte.weight
    sd, rsd = ours.state_dict(), ref.state_dict()
    assert list(sd) == list(rsd)
    for k in rsd:
        assert type(sd[k]) is torch.Tensor and sd[k].shape == rsd[k].shape and torch.equal(sd[k], rsd[k]), k
    fresh = gpt2(device, seed=5)
    fresh.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 1000, (2, 20), device=device)
    assert torch.equal(fresh(ids).logits, ref(ids).logits)


def test_twenty_adamw_steps_match_torch(device):
    ref = gpt2(device, n_layer=2, n_positions=32)
    ours = nt.convert(copy.deepcopy(ref), tile_size=40, batch_tile_size=16)
    ref64 = copy.deepcopy(ref).double()
    kw = dict(lr=3e-3, weight_decay=0.01)
    opts = [nt.optim.AdamW(ours.parameters(), **kw), torch.optim.AdamW(ref.parameters(), foreach=False, **kw),
            torch.optim.AdamW(ref64.parameters(), foreach=False, **kw)]
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 1000, (3, 23), generator=g).to(device) for _ in range(20)]
    losses = [[], [], []]
    for ids in data:
        for model, opt, log in zip((ours, ref, ref64), opts, losses):
            opt.zero_grad()
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            log.append(loss.item())
    err = lambda a: max(abs(x - y) for x, y in zip(a, losses[2]))  # noqa: E731
    assert err(losses[0]) <= 2 * err(losses[1]) + 1e-6, (losses[0], losses[1])
    assert losses[0][-1] < losses[0][0]
    for (name, a), b, c in zip(ours.state_dict().items(), ref.state_dict().values(), ref64.state_dict().values()):
        e_ours, e_ref = (a.double() - c).norm().item(), (b.double() - c).norm().item()
        assert e_ours <= 4 * e_ref + 1e-6 * c.norm().item(), name  # 4x: see test_adamw.py


def test_bad_input_raises_and_leaves_model_unchanged(device):
    ours = nt.convert(gpt2(device), tile_size=40)
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-2)
    before = copy.deepcopy(ours.state_dict())
    bad = [torch.full((2, 5), 1000, device=device),                 # token id >= vocab
           torch.randint(0, 1000, (1, 65), device=device),          # longer than n_positions
           torch.rand(2, 5, device=device)]                         # float input_ids
    for ids in bad:
        opt.zero_grad()
        # Caught before any kernel runs (on a GPU an out-of-range index would be a device-side assert).
        with pytest.raises((IndexError, TypeError), match="out of range|integer tensor"):
            loss = ours(ids, labels=ids).loss
            loss.backward()
            opt.step()
    after = ours.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    ids = torch.randint(0, 1000, (2, 9), device=device)
    assert math.isfinite(ours(ids, labels=ids).loss.item())


def test_after_bad_input_the_next_step_is_that_of_a_model_that_never_saw_it(device):
    """Each bad batch (token ids out of range or negative, too long, of a float dtype; labels out of range, of a
    float dtype or of another shape) raises a clear error naming the requirement and the value, and changes
    nothing: the next good step gives the loss, weights and AdamW moments of a twin that never saw the bad input,
    bit for bit. (Out-of-range ids on a GPU: not yet, see below.)"""
    models = [nt.convert(gpt2(device, n_layer=2), tile_size=40) for _ in range(2)]
    opts = [nt.optim.AdamW(m.parameters(), lr=1e-2) for m in models]

    def step(i, ids, labels):
        opts[i].zero_grad()
        loss = models[i](ids, labels=labels).loss
        loss.backward()
        opts[i].step()
        return loss.item()
    g = torch.Generator().manual_seed(1)
    good = [torch.randint(0, 1000, (2, 9), generator=g).to(device) for _ in range(2)]
    assert step(0, good[0], good[0]) == step(1, good[0], good[0])  # the optimizer has state before the bad input
    ids = good[1]
    bad = [(torch.full_like(ids, 1000), ids, IndexError, r"index 1000 is out of range for 1000 rows"),
           (torch.full_like(ids, -1), ids, IndexError, r"index -1 is out of range"),
           (torch.randint(0, 1000, (1, 65), device=device), None, IndexError, r"out of range"),  # > n_positions
           (ids.float(), ids, TypeError, r"integer tensor"),
           (ids, torch.full_like(ids, 1000), IndexError, r"target 1000 is out of bounds for 1000 classes"),
           (ids, torch.full_like(ids, -5), IndexError, r"target -5 is out of bounds"),
           (ids, ids.float(), TypeError, r"integer dtype \(got torch.float32\)"),
           (ids, ids[:, :5], ValueError, r"expected targets of shape \(18,\) .* \(got \(10,\)\)")]  # shifted, padded
    if device == "cuda":
        # On a GPU ids and labels are range-checked by tasks: the error comes at the next wait, after that step's
        # updates were submitted (docs/troubleshooting.md), so the model does not stay as it was: dtype and shape only.
        bad = [b for b in bad if b[2] is not IndexError]
    for x, labels, kind, match in bad:
        with pytest.raises(kind, match=match):
            step(0, x, x if labels is None else labels)
    nt.synchronize()
    assert step(0, ids, ids) == step(1, ids, ids)
    def dense(t):
        return t.materialize() if isinstance(t, nt.TileTensor) else t
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(dense(a), dense(b)), name
        sa, sb = opts[0].state[a], opts[1].state[b]
        assert float(sa["step"]) == float(sb["step"]) == 2, name
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(dense(sa[k]), dense(sb[k])), (name, k)


def test_convert_rejects_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        nt.convert("gpt2")
    with pytest.raises(ValueError, match="precision"):
        nt.convert(nn.Linear(3, 3), precision="fp16")
    with pytest.raises(TypeError, match="float32"):
        nt.convert(nn.Sequential(nn.Linear(3, 3).double()))


def test_dropout_in_training_is_seeded_and_wait_free(device):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=96, n_head=6, vocab_size=1000, n_positions=64,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0)
    base = transformers.GPT2LMHeadModel(cfg).to(device)
    ref = copy.deepcopy(base)
    model = nt.convert(base, tile_size=300, batch_tile_size=37)
    assert isinstance(model.transformer.drop, nt.nn.Dropout) and model.transformer.drop.p == 0.1
    ids = torch.randint(0, 1000, (3, 37), device=device)
    model(ids, labels=ids).loss.backward()  # first step: tiles made
    waits = nt.stats()["blocking_waits"]
    torch.manual_seed(1)
    out = model(ids, labels=ids)
    out.loss.backward()
    assert nt.stats()["blocking_waits"] == waits
    torch.manual_seed(1)
    again = model(ids, labels=ids).loss.item()
    assert out.loss.item() == again  # seeded
    assert model(ids, labels=ids).loss.item() != again  # fresh masks
    model.eval()
    ref.eval()
    assert model.transformer.drop.training is False
    assert abs(model(ids, labels=ids).loss.item() - ref(ids, labels=ids).loss.item()) < 1e-5  # eval: no dropout


def test_convert_draws_no_random_numbers(device):
    """The new modules skip their random initialization (every parameter is copied from the original): the
    global generator is untouched and each parameter holds the original's values."""
    ref = gpt2(device)
    state = torch.get_rng_state()
    ours = nt.convert(copy.deepcopy(ref), tile_size=40)
    assert torch.equal(state, torch.get_rng_state())
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b.to(a.device)), name


def test_meta_model_is_built_module_by_module_as_on_a_device(device):
    """A model built on the meta device gets, module by module, the values its modules' reset_parameters() draw:
    with the same seed, the same weights as the model built on the device (no tie here: a tie keeps the value
    of the first module converted)."""
    def build():
        return nn.Sequential(nn.Embedding(50, 24), nn.LayerNorm(24), nn.Linear(24, 40), nn.GELU(),
                             nn.Linear(40, 50, bias=False))
    torch.manual_seed(3)
    with torch.device(device):
        ref = build()
    torch.manual_seed(3)
    with torch.device("meta"):
        meta = build()
    ours = nt.convert(meta, tile_size=32, batch_tile_size=8, init_device=device)
    assert not any(p.is_meta for p in ours.parameters())
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b.to(a.device)), name
    assert all(p.device.type == torch.device(device).type for p in ours.parameters())
    ids = torch.randint(0, 50, (3, 7), device=device)
    ref64 = copy.deepcopy(ref).double()
    assert_close_as_torch(ours(ids), ref(ids), ref64(ids))


def test_meta_gpt2_with_hf_init_trains(device):
    cfg = transformers.GPT2Config(n_layer=2, n_embd=96, n_head=6, vocab_size=1000, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(cfg)
    n = sum(p.numel() for p in meta.parameters())
    ours = nt.convert(meta, tile_size=300, batch_tile_size=32, init=meta._init_weights, init_device=device)
    assert sum(p.numel() for p in ours.parameters()) == n
    assert ours.lm_head.weight is ours.transformer.wte.weight
    w = ours.transformer.h[1].mlp.c_fc.weight.materialize()
    assert abs(w.std().item() - 0.02) < 0.002 and ours.transformer.h[0].ln_1.weight.materialize().eq(1).all()
    opt = nt.optim.AdamW(ours.parameters(), lr=3e-3)
    ids = torch.randint(0, 1000, (2, 32), device=device)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = ours(ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(1000)) < 0.3, losses  # HF's N(0, 0.02) init: about uniform predictions
    assert losses[-1] < losses[0] - 1.0, losses


def test_meta_model_errors_before_changing_anything():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(cfg)
        odd = nn.Sequential(nn.Linear(4, 4), nn.Conv2d(1, 1, 1))
    with pytest.raises(TypeError, match="reset_parameters.*init="):
        nt.convert(hf)  # transformers' Conv1D has no reset_parameters
    assert type(hf.transformer.h[0].attn.c_attn).__name__ == "Conv1D" and hf.lm_head.weight.is_meta
    with pytest.raises(ValueError, match=r"still on the meta device: 1\.weight, 1\.bias"):
        nt.convert(odd)
    assert type(odd[0]) is nn.Linear


def test_what_nntile_keeps_about_a_model_is_beside_it_and_goes_with_it():
    """convert() under a plan, a step of torch's AdamW: no `_nntile_*` attribute on the model, its modules, the
    optimizer or the step counters (the owner records hold them: owners.py); convert_report() and streamer() still
    find theirs; a deepcopy of a converted GPT-2 attention falls back to its own original forward; and the records
    go with the model."""
    from nntile_torch import owners
    from nntile_torch.streaming import streamer
    ref = gpt2("cpu", n_layer=2)
    plan = nt.plan(ref, batch=2, seq=16, precision="fp32", checkpointing=True)
    model = plan.apply(copy.deepcopy(ref))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1000, (2, 16))
    model(ids, labels=ids).loss.backward()
    opt.step()
    for obj in [*model.modules(), opt, *[s["step"] for s in opt.state.values()]]:
        assert not [k for k in vars(obj) if k.startswith("_nntile_")], type(obj)
    assert nt.convert_report(model).all_tiled and streamer(model).plan is plan
    from nntile_torch.streaming import checkpoint_blocks  # a model without gradient_checkpointing_enable's way
    dense = copy.deepcopy(ref)
    checkpoint_blocks(dense, "transformer.h")
    wrapped = dense.transformer.h[0].forward
    checkpoint_blocks(dense, "transformer.h")  # once only
    assert owners.module_record(dense.transformer.h[0], create=False).checkpointed
    assert dense.transformer.h[0].forward is wrapped and "_nntile_checkpointed" not in vars(dense.transformer.h[0])
    attn = copy.deepcopy(model.transformer.h[0].attn)
    with torch.no_grad():
        attn.c_proj.weight.zero_()  # the copy's own output projection: its output is then its bias
    out = attn(torch.randn(2, 16, 96), output_attentions=True)  # not covered: the original forward runs
    torch.testing.assert_close(out[0].detach().float(), attn.c_proj.bias.detach().float().expand(2, 16, 96))
    n = len(owners._MODULES)
    del model, opt, attn
    gc.collect()
    assert len(owners._MODULES) < n


def test_convert_without_a_plan_warns_when_adamws_state_outgrows_the_gpus(monkeypatch):
    """convert() without a memory plan says so, naming nt.plan, when AdamW's float32 weights, gradients and moments
    of the converted parameters (16 bytes each, 18 with bf16 matmuls' weight copies) exceed the GPUs' memory, and
    only then: checked on a pretend machine (the capacity reading replaced), at one byte under and at the bound, with
    one GPU and two, and without a GPU."""
    import warnings
    from nntile_torch import accounting
    from nntile_torch.tensor import TileTensor
    machine = {}
    monkeypatch.setattr(accounting, "machine_capacity",
                        lambda disk_limit=None: accounting.Capacity(machine["gpu"], 2**34, 0, machine["gpus"], 1))

    def advice(precision="fp32"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = nt.convert(gpt2("cpu", n_embd=48, n_head=4), tile_size=48, precision=precision)
        said = [str(w.message) for w in caught if "memory plan" in str(w.message)]
        count = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if isinstance(p, TileTensor))
        return said, count

    machine.update(gpu=2**40, gpus=1)
    said, count = advice()
    assert said == [] and count > 0
    for gpus in (1, 2):
        machine.update(gpu=16 * count // gpus - 1, gpus=gpus)
        said, _ = advice()
        assert len(said) == 1 and f"{count:,} parameters" in said[0] and "nt.plan(model, batch, seq" in said[0], said
        machine.update(gpu=16 * count // gpus, gpus=gpus)
        assert advice()[0] == []
    machine.update(gpu=16 * count, gpus=1)
    assert len(advice("bf16")[0]) == 1  # bf16 matmuls keep a bf16 copy of each weight too: 18 bytes
    machine.update(gpu=0, gpus=0)  # no GPU: host RAM is the only node, nothing to advise
    assert advice()[0] == []
