"""Many starts and stops of the runtime in one process (a notebook, a sweep, a test suite): each start with other
settings trains the same tiny GPT-2 to the same losses as the first start with those settings did, and a stopped
runtime gives back what it held (GPU memory, threads, file descriptors), so the hundredth start is the first's."""
import os

import pytest
import torch
import transformers

import nntile_torch as nt

# The settings the suite cycles through: worker counts, one or two CUDA workers per GPU, a tight GPU or host limit
# (StarPU evicts), another scheduler, no submission window.
SETTINGS = [
    dict(),
    dict(ncpus=2),
    dict(streams_per_gpu=1),
    dict(max_submitted_tasks=0),
    dict(scheduler="eager"),
    dict(limit="24MiB"),
]
CYCLES = 18


def _gpt2(device):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=96, n_head=4, vocab_size=211, n_positions=37, attn_pdrop=0.0,
                                  resid_pdrop=0.0, embd_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg).to(device)


def _train(device, steps=2):
    model = nt.convert(_gpt2(device), tile_size=288, batch_tile_size=37, strict=True)
    opt = nt.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 211, (3, 37), generator=g).to(device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _init(device, s):
    s = dict(s)
    limit = s.pop("limit", None)
    if device == "cpu":
        s.pop("streams_per_gpu", None)
        nt.init(ncuda=0, **({"host_memory_limit": "64MiB"} if limit else {}), **s)
    else:  # a GPU share well above the model: StarPU 1.3.10 can hang copying a CUDA tensor into tiles on a GPU share
        # of 24 MiB (seen on the H200; the host-wait monitor reports it), which is not what this test is about
        nt.init(**({"cuda_memory_limit": "256MiB"} if limit else {}), **s)


def _held():
    """What a stopped runtime must not keep growing: open file descriptors, threads, and (with a GPU) device memory
    in use, in MiB."""
    used = 0
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        used = (total - free) >> 20
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task")), used


def test_many_restarts_with_other_settings_train_the_same(device):
    nt.shutdown()
    first = {}
    held = []
    try:
        for i in range(CYCLES):
            s = SETTINGS[i % len(SETTINGS)]
            print(f"restart {i}: {s}", flush=True)  # which start a hang or crash came in (pytest -s shows it)
            _init(device, s)
            losses = _train(device)
            nt.shutdown()
            torch.cuda.empty_cache() if device == "cuda" else None
            key = tuple(sorted(s.items()))
            if key in first:
                assert losses == pytest.approx(first[key], rel=1e-5), (i, s)
            else:
                first[key] = losses
            held.append(_held())
    finally:
        nt.shutdown()
    # After a first round of every setting (pools and caches made once), nothing grows with each restart.
    base = held[len(SETTINGS) - 1]
    last = held[-1]
    assert last[0] <= base[0] + 2, f"file descriptors grew over restarts: {held}"
    assert last[1] <= base[1] + 2, f"threads grew over restarts: {held}"
    assert last[2] <= base[2] + 256, f"GPU memory in use grew over restarts (MiB): {[h[2] for h in held]}"
