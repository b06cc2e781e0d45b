"""The host pool (csrc/host_pool.cpp): StarPU's host buffers come from slabs kept for the runtime's life (pinned
with GPUs), best fit, neighbours merged when freed. The allocator alone on random sizes, then training with the
pool against training without it (NNTILE_HOST_POOL=0): the same losses, no new slab once the first step made them."""
import ctypes
import json
import random

import pytest

import nntile_torch as nt
from conftest import run_python

C = nt._C
PAGE = 4096


def test_pool_allocator_best_fit_merge_and_reuse():
    """Random sizes (1 byte to beyond a slab) allocated and freed in random order: every buffer page-aligned, inside
    no other live one, its bytes intact while others come and go; all freed, each slab is one free block again; the
    same sizes again reuse the slabs (no new slab); a larger-than-slab buffer gets a slab of its own size."""
    slab = 1 << 20
    C.host_pool_test_reset(slab)
    rng = random.Random(0)
    live = {}  # address -> (size, fill byte)

    def check_all():
        spans = sorted((a, a + ((n + PAGE - 1) // PAGE) * PAGE) for a, (n, _) in live.items())
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            assert a1 <= b0, "two live buffers overlap"
        for a, (n, fill) in live.items():
            assert ctypes.string_at(a, min(n, 64)) == bytes([fill]) * min(n, 64)
            assert ctypes.string_at(a + n - min(n, 64), min(n, 64)) == bytes([fill]) * min(n, 64)

    sizes = [1, 7, PAGE - 1, PAGE, PAGE + 1, 5000, 65536, 300_001, slab // 2, slab - 100, slab, 3 * slab + 17]
    for round_ in range(3):
        big = C.host_pool_test_alloc(3 * slab + 17)  # larger than a slab: one of its own (2 MiB steps)
        ctypes.memset(big, 9, 3 * slab + 17)
        live[big] = (3 * slab + 17, 9)
        for _ in range(60):
            if live and rng.random() < 0.45:
                a = rng.choice(list(live))
                C.host_pool_test_free(a)
                del live[a]
            else:
                n = rng.choice(sizes) if rng.random() < 0.5 else rng.randint(1, 2 * slab)
                a = C.host_pool_test_alloc(n)
                assert a % PAGE == 0 and a not in live
                fill = rng.randint(1, 255)
                ctypes.memset(a, fill, n)
                live[a] = (n, fill)
        check_all()
        for a in list(live):
            C.host_pool_test_free(a)
            del live[a]
        st = C.host_pool_test_stats()
        assert st["live_bytes"] == 0 and st["fallbacks"] == 0
        if round_ == 0:
            slabs_after_first = st["slab_allocations"]
            assert st["largest_free"] == 4 * slab  # the large buffer's slab (3 MiB + 17 B in 2 MiB steps), whole again
    # later rounds drew the same kinds of sizes: mostly served from the slabs made before
    assert C.host_pool_test_stats()["slab_allocations"] <= slabs_after_first + 4
    # after everything is freed, one block of a slab's size is free: a slab-sized buffer fits without a new slab
    before = C.host_pool_test_stats()["slab_allocations"]
    a = C.host_pool_test_alloc(slab)
    assert C.host_pool_test_stats()["slab_allocations"] == before
    C.host_pool_test_free(a)
    with pytest.raises(ValueError, match="not a buffer"):
        C.host_pool_test_free(a)  # twice
    C.host_pool_test_reset(slab)


_TRAIN = """
import json, os, torch, nntile_torch as nt
nt.init(ncpus=2, ncuda=0, host_memory_limit='64MiB')
torch.manual_seed(0)
layers = [nt.nn.Linear(200, 200, tile_size=64, precision='fp32') for _ in range(3)]
opt = nt.optim.AdamW([p for m in layers for p in m.parameters()], lr=1e-2)
x = torch.randn(37, 200)
out = {'losses': [], 'slabs': []}
for _ in range(4):
    y = x
    for m in layers:
        y = torch.tanh(m(y))
    loss = (y * y).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    out['losses'].append(float(loss))
    out['slabs'].append(nt.stats()['host_pool']['slab_allocations'])
st = nt.stats()['host_pool']
out.update(enabled=st['enabled'], live=st['live_bytes'], allocations=st['allocations'], fallbacks=st['fallbacks'])
del layers, opt, y, loss
nt.shutdown()
out['slabs_after_shutdown'] = nt.stats()['host_pool']['slabs']
print('RESULT', json.dumps(out))
"""


def _run(pool):
    rc, out, err = run_python(_TRAIN, timeout=240, env={"NNTILE_HOST_POOL": pool})
    assert rc == 0, err[-3000:]
    return json.loads(out.split("RESULT", 1)[1])


def test_training_with_the_pool_is_the_same_and_makes_no_slab_after_the_first_step():
    on, off = _run("1"), _run("0")
    assert on["enabled"] and not off["enabled"]
    assert on["losses"] == off["losses"]
    assert on["allocations"] > 0 and on["live"] > 0 and on["fallbacks"] == 0
    assert on["slabs"][-1] == on["slabs"][0] and on["slabs"][0] >= 1  # steady state: buffers reused from the slabs
    assert on["slabs_after_shutdown"] == 0  # given back at shutdown
