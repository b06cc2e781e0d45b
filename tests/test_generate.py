"""Hugging Face's generate() on converted models (GPT-2, and Llama built from a tiny config): greedy and top-k sampling,
with and without the key/value cache, the same tokens as the unconverted model; no weight is gathered into a dense
tensor; the cache's keys and values are tiles; what still runs as torch code is the sampling on the (B, V) logits
of the last position (one host wait per token), in generate()'s own code: named in the report's outside_ops, not a
fallback (strict mode lets it run)."""
import copy
import warnings

import pytest
import torch

import nntile_torch as nt

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")

VOCAB, PROMPT, NEW = 97, 7, 8
# One row tile for every length the prompt reaches without a cache (attention's tiles hold whole sequences, as
# nanoGPT's generate test); the cache keeps its own tiles of whole sequences, so any batch_tile_size serves it.
TILES = dict(tile_size=384, batch_tile_size=1024)
# What generate() computes on the (B, V) logits, as torch code on their materialized tiles: greedy's argmax, top-k's
# topk / lt / masked_fill (its softmax and multinomial then run on the dense result).
SAMPLING_OPS = {False: {"argmax.default"}, True: {"topk.default", "lt.Tensor", "masked_fill.Scalar"}}


def gpt2(device, impl="sdpa"):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                  attn_implementation=impl, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(device).eval()


def llama(device, impl="sdpa"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation=impl, bos_token_id=0, eos_token_id=None, pad_token_id=None)
    # pad_token_id None: with one the token table gets a padding_idx, which has no tile version (generate pads by 0)
    return transformers.LlamaForCausalLM(cfg).to(device).eval()


def prompt(device, padded=False):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (3, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    if padded:  # left padding, as generation pads
        mask[0, :3] = 0
        mask[2, :1] = 0
    return (ids * mask).to(device), mask.to(device)


class GatheredWeights:
    """Records the parameters whose tiles are gathered into a dense tensor (TileTensor.materialize, the one way tiles
    become a dense tensor) while it is entered; views of a weight (its transpose) count as the weight."""

    def __init__(self, model, monkeypatch):
        self.names = {id(p.tiles): n for n, p in model.named_parameters() if isinstance(p, nt.TileTensor)}
        self.gathered = []
        original = nt.TileTensor.materialize

        def materialize(t):
            if id(t.tiles) in self.names:
                self.gathered.append(self.names[id(t.tiles)])
            return original(t)
        monkeypatch.setattr(nt.TileTensor, "materialize", materialize)


def generate(ours, ref, ids, mask, monkeypatch, **kw):
    """ours.generate and ref.generate from the same seed; returns (ours' output, ref's tokens, host waits, weights
    gathered, (dense ops, ops outside forward) of ours' report during the call)."""
    report = nt.convert_report(ours)
    report.dense_ops.clear()
    report.outside_ops.clear()
    gathered = GatheredWeights(ours, monkeypatch)
    kw = dict(max_new_tokens=NEW, attention_mask=mask, return_dict_in_generate=True, pad_token_id=0, **kw)
    before = nt.stats()["blocking_waits"]
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cache that falls back warns once; checked below
        out = ours.generate(ids, **kw)
    waits = nt.stats()["blocking_waits"] - before
    monkeypatch.undo()
    torch.manual_seed(1)
    expected = ref.generate(ids, **kw).sequences
    return out, expected, waits, gathered.gathered, (dict(report.dense_ops), dict(report.outside_ops))


def assert_in_tiles(out, waits, gathered, ops, sample, cache, layers=2):
    assert gathered == [], f"weights gathered into dense tensors: {sorted(set(gathered))}"
    dense_ops, outside_ops = ops
    assert dense_ops == {}, dense_ops  # nothing dense inside the model's forward
    # only the sampling on the logits, in generate()'s own code (a method of the model, outside forward), once per token
    assert {m.split(".")[-1] for m, _ in outside_ops} <= {"generate", "_sample"}, outside_ops
    assert {op for _, op in outside_ops} <= SAMPLING_OPS[sample], outside_ops
    assert all(n == NEW for n in outside_ops.values()), outside_ops
    assert waits <= NEW, waits  # reading each token's (B, V) logits
    if cache:
        kv = out.past_key_values
        assert len(kv.layers) == layers and kv.get_seq_length() == PROMPT + NEW - 1
        for layer in kv.layers:
            assert isinstance(layer.keys, nt.TileTensor) and isinstance(layer.values, nt.TileTensor)
    else:
        assert out.past_key_values is None


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "top-k"])
def test_gpt2_generate_in_tiles(device, sample, cache, monkeypatch):
    """Greedy and top-k sampling (torch's generator draws only in the sampler, so the seeded streams align), with and
    without the cache: the unconverted model's tokens, no weight gathered, only the sampling as torch code."""
    ref = gpt2(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES).eval()  # the sampling is no fallback: it runs
    ids, mask = prompt(device)
    kw = dict(do_sample=True, top_k=10) if sample else dict(do_sample=False)
    out, expected, waits, gathered, ops = generate(ours, ref, ids, mask, monkeypatch, use_cache=cache, **kw)
    assert torch.equal(out.sequences, expected)
    assert_in_tiles(out, waits, gathered, ops, sample, cache)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_generate_without_cache_and_small_row_tiles_stays_in_tiles(device, model, monkeypatch):
    """Without the cache every call sees a longer sequence (7 to 14 positions of 3 prompts); with 16 rows per
    activation tile most lengths do not divide the tile, so the activation tiles take the whole sequences that fit
    (config.sequence_rows): attention stays a tile task (strict mode: a fallback would raise), the same tokens."""
    ref = gpt2(device) if model == "gpt2" else llama(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, tile_size=384, batch_tile_size=16).eval()
    ids, mask = prompt(device)
    out, expected, waits, gathered, ops = generate(ours, ref, ids, mask, monkeypatch, use_cache=False,
                                                   do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert_in_tiles(out, waits, gathered, ops, False, False)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_cache_writes_new_rows_in_place_and_moves_when_full(device, model, monkeypatch):
    """The cache's tiles have room past their length: each step after the prompt writes its rows in place (one
    scatter task per stored tensor and layer, no gather, no add); with room for only 2 more positions (room_for
    patched) it moves into new tiles every few steps, in-place steps between: the unconverted model's tokens both
    ways."""
    from collections import Counter
    from nntile_torch.nn import kv_cache
    ref = gpt2(device) if model == "gpt2" else llama(device)
    stored = 1 if model == "gpt2" else 2  # GPT-2 keeps the qkv rows; Llama k and v
    for small in (False, True):
        if small:
            monkeypatch.setattr(kv_cache, "room_for", lambda total: total + 2)
        ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES).eval()
        ids, mask = prompt(device)
        with nt.task_trace() as records:
            out = ours.generate(ids, max_new_tokens=NEW, attention_mask=mask, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True)
        expected = ref.generate(ids, max_new_tokens=NEW, attention_mask=mask, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected.sequences)
        for ours_layer, ref_layer in zip(out.past_key_values.layers, expected.past_key_values.layers):
            for got, want in ((ours_layer.keys, ref_layer.keys), (ours_layer.values, ref_layer.values)):
                assert isinstance(got, nt.TileTensor) and got.shape == want.shape
                torch.testing.assert_close(got.materialize(), want, rtol=1e-5, atol=1e-5)  # the views read the cache
        names = Counter(r["name"] for r in records)
        scatters = names["embedding_backward"]
        if not small:  # room for 7 + 64 -> 128 positions: every step after the prompt in place
            assert scatters == 2 * stored * (NEW - 1), names
        else:  # lengths 7, 8, ..., 14 in rooms of 9, 12, 15: moves at 10 and 13, the other 5 steps in place
            assert scatters == 2 * stored * 5, names
        layer = out.past_key_values.layers[0]
        assert layer.keys.shape[-2] == PROMPT + NEW - 1
        monkeypatch.undo()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_gpt2_generate_left_padded_with_cache(device, impl, monkeypatch):
    """Left-padded prompts with the cache, both mask forms (boolean for sdpa, additive float for eager): the cache's
    attention takes Hugging Face's mask rows for the new positions; small activation tiles (sequences split between
    tiles) do not matter to it, as it keeps its own tiles of whole sequences."""
    ref = gpt2(device, impl)
    ours = nt.convert(copy.deepcopy(ref), tile_size=384, batch_tile_size=8).eval()
    ids, mask = prompt(device, padded=True)
    out, expected, waits, gathered, ops = generate(ours, ref, ids, mask, monkeypatch, do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert_in_tiles(out, waits, gathered, ops, False, True)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_llama_generate_in_tiles(device, cache, monkeypatch):
    """Llama (grouped-query attention, rotary embeddings): the cache holds k and v after the rotary embedding."""
    ref = llama(device)
    ours = nt.convert(copy.deepcopy(ref), strict=True, **TILES).eval()
    ids, mask = prompt(device, padded=cache)
    out, expected, waits, gathered, ops = generate(ours, ref, ids, mask, monkeypatch, use_cache=cache,
                                                         do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert_in_tiles(out, waits, gathered, ops, False, cache)


def test_generate_cache_fallback_is_named(device, monkeypatch):
    """qkv tiles that do not hold whole rows (tile_size below 3 x the width): the cache cannot be kept in tiles; the
    original attention runs on materialized activations (correct, with waits), named in the report; still no weight
    is gathered."""
    ref = gpt2(device)
    ours = nt.convert(copy.deepcopy(ref), tile_size=64, batch_tile_size=1024).eval()
    ids, mask = prompt(device)
    out, expected, waits, gathered, (dense_ops, _) = generate(ours, ref, ids, mask, monkeypatch, do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert gathered == []
    assert dense_ops[("transformer.h.0.attn", "attention (key/value cache with qkv tiles (21, 64) that do not hold "
                                              "whole rows)")] == 1
    assert any("key/value cache holding dense tensors" in op for _, op in dense_ops)


# --- the cached attention kernel: new queries over the cache's keys -------------------------------------------------

def _tiles_of(x, row_tile):
    from nntile_torch.tensor import new_tiles
    t = new_tiles(list(x.shape), [row_tile, x.shape[1]])
    t.from_dense(x.contiguous())
    return t


@pytest.mark.parametrize("q_len,kv_len,heads,kv_heads,packed,bf16", [
    (1, 7, 4, 2, False, False), (3, 11, 6, 3, False, False), (5, 5, 2, 2, False, False), (1, 9, 3, 3, True, False),
    (2, 13, 3, 3, True, False), (3, 10, 4, 1, False, True), (2, 9, 3, 3, True, True)],
    ids=lambda v: str(v))
@pytest.mark.parametrize("room", [0, 3], ids=["full", "room"])
def test_cached_attention_matches_sdpa(device, q_len, kv_len, heads, kv_heads, packed, bf16, room):
    """_C.cached_attention_forward against torch's scaled_dot_product_attention (float64 reference) on awkward shapes:
    grouped-query heads, q, k, v as column ranges of packed qkv rows (GPT-2's cache) or tensors of their own (Llama's),
    a padding-and-causal mask, several sequences per tile and a last tile with fewer, bf16; and k, v in a cache with
    room: `room` more rows per sequence (kv_rows), filled with large values that must not be read."""
    from nntile_torch import _C
    from nntile_torch.tensor import new_tiles
    g = torch.Generator().manual_seed(q_len * 100 + kv_len)
    nseq, hd, per_tile = 5, 6, 2
    if packed:  # q from the new rows' first third, k and v from the cache's second and third
        qkv_new = torch.randn(nseq * q_len, 3 * heads * hd, generator=g)
        qkv_all = torch.randn(nseq * kv_len, 3 * heads * hd, generator=g)
        q, k, v = qkv_new[:, :heads * hd], qkv_all[:, heads * hd:2 * heads * hd], qkv_all[:, 2 * heads * hd:]
    else:
        q = torch.randn(nseq * q_len, heads * hd, generator=g)
        k, v = (torch.randn(nseq * kv_len, kv_heads * hd, generator=g) for _ in range(2))
    # new query i of a sequence sees keys up to kv_len - q_len + i, not the first `pad` (left padding)
    pads = torch.tensor([0, 2, 1, 0, 3])
    pos = torch.arange(kv_len)
    keep = (pos[None, None, :] <= kv_len - q_len + torch.arange(q_len)[None, :, None]) & \
        (pos[None, None, :] >= pads[:, None, None])
    mask = torch.zeros(nseq, q_len, kv_len).masked_fill_(~keep, float("-inf"))
    scale = 0.37
    heads_of = lambda x, n, t: x.double().reshape(nseq, t, n, hd).transpose(1, 2)  # noqa: E731
    rnd = (lambda x: x.bfloat16().double()) if bf16 else (lambda x: x)
    kr, vr = (rnd(heads_of(z, kv_heads, kv_len)).repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(rnd(heads_of(q, heads, q_len)), kr, vr,
                                                           attn_mask=mask[:, None].double(), scale=scale)
    ref = ref.transpose(1, 2).reshape(nseq * q_len, heads * hd)
    dev = torch.device(device)
    rows = kv_len + room

    def roomy(z):  # (nseq * kv_len, C) -> (nseq * rows, C), each sequence's rows followed by `room` rows of 1e4
        z = z.reshape(nseq, kv_len, -1)
        return torch.cat([z, torch.full((nseq, room, z.shape[-1]), 1e4)], 1).reshape(nseq * rows, -1)
    if packed:
        qt, vt = _tiles_of(qkv_new.to(dev), per_tile * q_len), None
        kt = _tiles_of(roomy(qkv_all).to(dev), per_tile * rows)
        cols = (0, heads * hd, 2 * heads * hd)
    else:
        qt, kt, vt = (_tiles_of(z.to(dev), per_tile * n) for z, n in ((q, q_len), (roomy(k), rows), (roomy(v), rows)))
        cols = (0, 0, 0)
    mt = _tiles_of(mask.reshape(nseq * q_len, kv_len).to(dev), per_tile * q_len)
    y = new_tiles([nseq * q_len, heads * hd], [per_tile * q_len, heads * hd])
    _C.cached_attention_forward(qt, kt, vt, mt, y, q_len, kv_len, heads, kv_heads, hd, *cols, scale, bf16,
                                kv_rows=rows if room else 0)
    out = y.to_dense(dev).cpu().double()
    tol = 2e-2 if bf16 else 1e-5
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_cached_attention_checks_its_arguments():
    from nntile_torch import _C
    from nntile_torch.tensor import new_tiles
    q, y, m = new_tiles([4, 24], [2, 24]), new_tiles([4, 24], [2, 24]), new_tiles([4, 10], [2, 10])
    k = new_tiles([20, 12], [10, 12])
    with pytest.raises(RuntimeError, match="multiple of key/value heads"):
        _C.cached_attention_forward(q, k, k, m, y, 2, 10, 4, 3, 6, 0, 0, 0, 1.0)
    with pytest.raises(RuntimeError, match="k and v must hold 2 sequences of 9 rows"):
        _C.cached_attention_forward(q, k, k, new_tiles([4, 9], [2, 9]), y, 2, 9, 4, 2, 6, 0, 0, 0, 1.0)
    with pytest.raises(RuntimeError, match="heads past the end of a row"):
        _C.cached_attention_forward(q, k, None, m, y, 2, 10, 4, 2, 6, 0, 6, 6, 1.0)
    with pytest.raises(RuntimeError, match=r"kv_rows \(9\) must be at least kv_len \(10\)"):
        _C.cached_attention_forward(q, k, k, m, y, 2, 10, 4, 2, 6, 0, 0, 0, 1.0, kv_rows=9)
    with pytest.raises(RuntimeError, match="k and v must hold 2 sequences of 12 rows"):
        _C.cached_attention_forward(q, k, k, m, y, 2, 10, 4, 2, 6, 0, 0, 0, 1.0, kv_rows=12)
    with pytest.raises(RuntimeError, match="whole sequences of 3 queries"):
        _C.cached_attention_forward(q, k, k, m, y, 3, 10, 4, 2, 6, 0, 0, 0, 1.0)
