"""Fuzzing the memory limits on CPUs, in bounded time: random small GPT-2 shapes, tile sizes, worker counts and host
limits, with and without a disk node. Each run either ends with the weights of the same model trained without any
limit (on one worker), bit for bit, or refuses with the named error (InsufficientMemoryError, or the "out of memory:
live tiles would take" of a tile tensor that fits in no memory node) within seconds; none may hang (each run is a
process killed past its time limit, which fails the test).

NNTILE_FUZZ_SEED and NNTILE_FUZZ_RUNS draw other or more configurations (a longer hunt than the suite's)."""
import json
import os
import random
import time

import pytest
import torch

from conftest import run_python

pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")

_RUN = """
import json, os, sys, time, torch, transformers, nntile_torch as nt
c = json.loads(os.environ["NNTILE_FUZZ_CONFIG"])
t0 = time.monotonic()
disk = dict(disk_path=c["disk"], disk_limit="256MiB") if c["disk"] else {}
nt.init(ncpus=c["ncpus"], ncuda=0, host_memory_limit=c["host"] or None, **disk)
torch.manual_seed(c["seed"])
cfg = transformers.GPT2Config(n_layer=c["layers"], n_embd=c["width"], n_head=c["heads"], vocab_size=c["vocab"],
    n_positions=c["seq"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg)
try:
    ours = nt.convert(model, tile_size=c["tile"], batch_tile_size=c["batch_tile"])
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-3)
    for s in range(2):
        ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=torch.Generator().manual_seed(s))
        loss = ours(ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
    w = torch.cat([v.detach().flatten() for v in ours.state_dict().values()])
    nt.synchronize()
except nt.InsufficientMemoryError as e:
    print("refused", round(time.monotonic() - t0, 1), "InsufficientMemoryError", str(e)[:300]); sys.exit(0)
except RuntimeError as e:
    if "out of memory: live tiles would take" not in str(e):
        raise
    print("refused", round(time.monotonic() - t0, 1), "RuntimeError", str(e)[:300]); sys.exit(0)
torch.save(w, c["out"])
print("trained", float(loss))
"""


def _configs(rng, n, tmp_path):
    for i in range(n):
        heads = rng.choice([1, 2, 4])
        width = heads * rng.choice([8, 16, 24])
        seq = rng.choice([8, 13, 16])
        batch = rng.choice([1, 2, 3])
        shape = dict(layers=rng.choice([1, 2, 3]), width=width, heads=heads, vocab=rng.choice([64, 101, 256]),
                     seq=seq, batch=batch, seed=i,
                     tile=rng.choice([width, 2 * width, 3 * width, 4 * width, 256]),  # a whole row or several tiles
                     batch_tile=rng.choice([seq, batch * seq]))
        params = 4 * (shape["vocab"] + seq + 12 * shape["layers"] * width) * width
        host = max(2**20, int(params * rng.choice([0.5, 1, 2, 4, 8, 32]))) >> 20 << 20
        disk = rng.random() < 0.5
        if disk:
            os.makedirs(tmp_path / f"disk{i}", exist_ok=True)
        yield dict(shape, ncpus=rng.choice([1, 2, 3]), host=f"{max(1, host >> 20)}MiB",
                   disk=str(tmp_path / f"disk{i}") if disk else "", out=str(tmp_path / f"w{i}.pt"))


def test_random_shapes_tiles_workers_and_limits_train_the_same_or_refuse_and_never_hang(tmp_path):
    rng = random.Random(int(os.environ.get("NNTILE_FUZZ_SEED", "35")))
    runs = int(os.environ.get("NNTILE_FUZZ_RUNS", "4"))
    outcomes = []
    for c in _configs(rng, runs, tmp_path):
        t0 = time.monotonic()
        rc, out, err = _run(c)
        assert rc == 0, f"{c}: exit {rc}: {err[-3000:]}"
        if out.startswith("refused"):
            assert float(out.split()[1]) < 30, (c, out)  # refused quickly, not after a long struggle
            outcomes.append(f"{c['host']}{' + disk' if c['disk'] else ''}: refused ({out.split()[2]})")
            continue
        assert out.startswith("trained"), (c, out, err[-2000:])
        ref = dict(c, ncpus=1, host="", disk="", out=c["out"] + ".ref")  # no limit, one worker
        rc, out_ref, err = _run(ref)
        assert rc == 0 and out_ref.startswith("trained"), (ref, out_ref, err[-3000:])
        assert torch.equal(torch.load(c["out"]), torch.load(ref["out"])), c
        outcomes.append(f"{c['host']}{' + disk' if c['disk'] else ''}: trained the same in {time.monotonic() - t0:.0f} s")
    print(outcomes)  # pytest -s shows what the draws did


def _run(c):
    return run_python(_RUN, 120, env={"STARPU_SILENT": "1", "NNTILE_FUZZ_CONFIG": json.dumps(c)},
                      what=f"the fuzz run {c}")
