"""nt.plan(): the memory plan's bytes against the tiles a step really makes, its choices for the H200's models, the
infeasible case (InsufficientMemoryError before anything is allocated), and training under a plan (streaming
hooks, host blocks, checkpointing) against training without one, bit for bit."""
import math
import time

import pytest
import torch

import nntile_torch as nt
from nntile_torch.plan import GiB, activation_bytes, model_facts

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")


def gpt2(n_layer=3, n_embd=96, n_head=6, vocab=1000, n_positions=64, seed=0, device="cpu"):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                                  n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(device)


def meta_gpt2(layers, hidden, heads, vocab=50257, positions=1024):
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=positions,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


H200 = dict(gpu_memory=int(125.8 * GiB), host_memory=int(109.8 * GiB))  # nt.init's defaults on that machine


def live_by_kind():
    kinds = {"parameters": 0, "moments": 0, "bf16 copies": 0}
    for name, dtype, nbytes in nt._C.live_tile_tensors():
        if name in ("weight", "bias"):
            kinds["parameters"] += nbytes
        elif name in ("exp_avg", "exp_avg_sq"):
            kinds["moments"] += nbytes
        elif name.endswith(".bf16") and name.startswith(("weight", "bias")):
            kinds["bf16 copies"] += nbytes
    return kinds


def test_model_facts_of_gpt2():
    """Every parameter once (the tied head with the token embedding), in its block; widths from the config."""
    model = gpt2()
    f = model_facts(model)
    assert f.n_params == sum(p.numel() for p in model.parameters())
    assert (f.n_layer, f.width, f.vocab, f.inner, f.blocks_path) == (3, 96, 1000, 384, "transformer.h")
    by_name = {p.name: p for p in f.params}
    assert by_name["transformer.wte.weight"].matmul and not by_name["transformer.wpe.weight"].matmul
    assert by_name["transformer.h.2.attn.c_attn.weight"].block == 2 and by_name["transformer.ln_f.bias"].block == -1
    assert not by_name["transformer.h.0.ln_1.weight"].matmul


@pytest.mark.parametrize("precision,state_dtype,master,ckpt", [("fp32", torch.float32, None, None),
                                                               ("bf16", torch.bfloat16, None, None),
                                                               ("bf16", torch.bfloat16, None, True),
                                                               ("bf16", torch.bfloat16, torch.bfloat16, None)],
                         ids=["fp32", "bf16-moments", "bf16-per-use-copies", "bf16-masters"])
def test_plan_bytes_are_what_the_tiles_take(precision, state_dtype, master, ckpt):
    """After a step under the plan, the live tiles of each persistent kind (parameters, moments, bf16 copies) take
    exactly the plan's bytes, and the step's peak of all tiles is within the plan's estimate of it (+-35%). With
    checkpointing in bf16 the blocks' weights keep no bf16 copy between steps (made per use): only the tied
    embedding's is left."""
    import gc
    gc.collect()
    model = gpt2(n_layer=4)
    plan = nt.plan(model, batch=3, seq=37, precision=precision, state_dtype=state_dtype, master_dtype=master,
                   checkpointing=ckpt)
    assert plan.state_dtype == state_dtype and not plan.beyond_gpu
    assert plan.master_dtype == (master or torch.float32)
    assert plan.bf16_per_use == bool(ckpt)
    if ckpt:
        assert plan.persistent_bytes()["bf16 copies"] == 2 * 1000 * 96
        assert len(plan.bf16_per_use_parameter_names()) == 4 * 4
    before = live_by_kind()
    nt.reset_peak_stats()
    base = nt.stats()["tile_bytes"]
    ours = nt.convert(model, precision=precision, tile_size=384, batch_tile_size=37, plan=plan)
    opt = nt.optim.AdamW(ours.parameters(), lr=1e-3, plan=plan)
    ids = torch.randint(0, 1000, (3, 37), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        loss = ours(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    nt.synchronize()
    del loss
    gc.collect()
    after = live_by_kind()
    want = plan.persistent_bytes()
    for kind in want:
        assert after[kind] - before[kind] == want[kind], (kind, after[kind] - before[kind], want[kind])
    peak = nt.stats()["peak_tile_bytes"] - base
    planned = sum(want.values()) + plan.tiers["host"].get("activations", 0) + plan.tiers["host"].get(
        "gradients in flight", 0)
    print("peak", peak, "planned", planned, peak / planned)
    assert 0.65 * planned <= peak <= 1.35 * planned, (peak, planned)
    del ours, opt
    gc.collect()


def test_plan_for_the_h200_models():
    """The H200's capacities: GPT-2 XL at batch 8 fits on the GPU as it is (exact: fp32 moments, no checkpointing,
    updates in step()); 13B at batch 32 needs checkpointing and puts its last blocks' state in host RAM with updates
    inside backward; 20B at batch 8 too; each plan's tiers fit their capacities; print() reads them out."""
    xl = nt.plan(meta_gpt2(48, 1600, 25), batch=8, seq=1024, **H200)
    assert (xl.state_dtype, xl.checkpointing, xl.step_in_backward, xl.host_blocks) == (torch.float32, False, False, 0)
    assert xl.traffic["pcie_to_gpu"] == 0 and xl.submission_window is None
    for layers, hidden, heads, batch in ((40, 5120, 40, 32), (44, 6144, 48, 8)):
        p = nt.plan(meta_gpt2(layers, hidden, heads), batch=batch, seq=1024, **H200)
        assert p.checkpointing and p.step_in_backward and 0 < p.host_blocks < layers, p
        assert p.bytes("gpu") <= H200["gpu_memory"] and p.bytes("host") <= H200["host_memory"]
        assert p.traffic["pcie_to_gpu"] > 0 and p.times["step_s"] >= max(p.times["gpu_s"], p.times["pcie_s"])
        names = p.host_parameter_names()
        assert names and all(f"transformer.h.{layers - 1}." in n or any(
            f"transformer.h.{b}." in n for b in p.host_block_indices) for n in names)
        text = str(p)
        assert "host RAM" in text and "predicted: step" in text and "gpu" in text
    assert p.summary()["host_blocks"] == p.host_blocks


def test_plan_updates_host_blocks_where_it_predicts_faster(monkeypatch):
    """20B at batch 16 on the H200: the CPU updates of its host blocks (~9 s at the measured 25 GB/s) bound the step
    when its host blocks are updated by CPU workers; the plan updates them on the GPU instead (their master weights
    and moments cross PCIe both ways, ~2.7 s, under the GPU's ~6 s), and predicts a shorter step. Pinned to the CPU
    it is the old placement, with CPU workers; the GPU-updated plan needs none, and counts the streamed state. The
    plan's own choice updates some host blocks on the GPU (and may leave the last ones to CPU workers: mixed)."""
    model = meta_gpt2(44, 6144, 48)
    best = nt.plan(model, batch=16, seq=1024, **H200)
    auto = nt.plan(model, batch=16, seq=1024, host_update="gpu", **H200)
    cpu = nt.plan(model, batch=16, seq=1024, host_update="cpu", **H200)
    assert best.host_update in ("gpu", "mixed") and best.predicted_step_s() <= auto.predicted_step_s()
    assert auto.host_update == "gpu" and cpu.host_update == "cpu" and auto.host_blocks and cpu.host_blocks
    assert cpu.times["host_update_s"] > cpu.times["gpu_s"] and auto.times["host_update_s"] == 0
    assert auto.predicted_step_s() < cpu.predicted_step_s()
    # the GPU blocks' bf16 copies made per use (checkpointing) leave room for more blocks on the GPU
    kept = nt.plan(model, batch=16, seq=1024, host_update="gpu", bf16_per_use=False, **H200)
    assert auto.bf16_per_use and not kept.bf16_per_use and auto.host_blocks < kept.host_blocks
    assert "bf16 copies made per use" in auto.tiers["gpu"] and "bf16 copies made per use" not in kept.tiers["gpu"]
    # 13B at batch 32: the CPU updates (8.2 s) sit about level with the GPU's 8 s; updating on the GPU costs more
    # than it saves there (measured 10.06 s against 7.39 with the CPU's): the plan keeps (nearly all of) them on CPU
    # workers
    p13 = nt.plan(meta_gpt2(40, 5120, 40), batch=32, seq=1024, **H200)
    assert p13.host_update in ("cpu", "mixed") and p13.cpu_update_blocks >= p13.host_blocks - 2, p13
    # beyond GPU memory one worker per GPU (the streaming's order was measured so); a model that fits takes
    # init's default (two streams per GPU)
    xl = nt.plan(meta_gpt2(48, 1600, 25), batch=8, seq=1024, **H200)
    assert p13.init_kwargs()["streams_per_gpu"] == 1 and "streams_per_gpu" not in xl.init_kwargs()
    monkeypatch.setattr(nt.runtime, "_USER_WORKERS_PER_CUDA", "2")  # the user's STARPU_NWORKER_PER_CUDA wins
    assert "streams_per_gpu" not in p13.init_kwargs()
    assert auto.times["step_s"] >= max(auto.times["gpu_s"], auto.times["pcie_s"])
    host = [p for p in auto.facts.params if p.name in set(auto.host_parameter_names())]
    n_host, n_matmul = sum(p.numel for p in host), sum(p.numel for p in host if p.matmul)
    assert auto.traffic["pcie_to_host"] == n_host * (4 + 4) + 2 * n_matmul  # master, bf16 moments, bf16 copy
    assert auto.traffic["pcie_to_gpu"] == n_host * (2 * 2 + 4 + 4)  # bf16 weights twice, master and moments
    streamed = "streamed state (GPU updates)"
    assert auto.tiers["gpu"][streamed] > 0 and streamed not in cpu.tiers["gpu"]
    assert "ncpus" in cpu.init_kwargs() and "ncpus" not in auto.init_kwargs() and "ncpus" in best.init_kwargs() \
        or best.host_update == "gpu"
    assert "on the GPU" in str(auto) and "CPU workers" in str(cpu)
    with pytest.raises(ValueError, match="host_update"):
        nt.plan(model, batch=16, seq=1024, host_update="disk", **H200)
    xl = nt.plan(meta_gpt2(48, 1600, 25), batch=8, seq=1024, **H200)
    assert xl.host_update is None and xl.summary()["host_update"] is None  # nothing in host RAM


def test_plan_splits_host_updates_between_cpu_workers_and_the_gpu():
    """A mixed plan: of the host blocks, the last ones are updated by CPU workers (their gradients come first in the
    backward: the CPU has the rest of the step for them), the others on the GPU; the traffic and the CPU time are
    those of each part; AdamW gets the CPU part as offload_update. Pins: host_update, cpu_update_blocks."""
    model = meta_gpt2(40, 5120, 40)
    mixed = nt.plan(model, batch=32, seq=1024, host_update="mixed", **H200)
    k, c = mixed.host_blocks, mixed.cpu_update_blocks
    assert mixed.host_update == "mixed" and 0 < c < k
    assert mixed.cpu_update_block_indices == list(range(40 - c, 40))
    assert mixed.gpu_update_block_indices == list(range(40 - k, 40 - c))
    params = {p.name: p for p in mixed.facts.params}
    on_cpu = set(mixed.cpu_update_parameter_names())
    on_gpu = set(mixed.host_parameter_names()) - on_cpu
    assert on_cpu and on_gpu and all(params[n].block >= 40 - c for n in on_cpu)
    numel = lambda names, matmul=False: sum(params[n].numel for n in names if params[n].matmul or not matmul)  # noqa
    state = 4 + (8 if mixed.state_dtype == torch.float32 else 4)  # master weight and moments, bytes per parameter
    assert mixed.traffic["pcie_to_host"] == 4 * numel(on_cpu) + state * numel(on_gpu) + 2 * numel(on_gpu, True)
    assert mixed.traffic["pcie_to_gpu"] == 4 * numel(on_cpu | on_gpu) + state * numel(on_gpu)
    touched = 18 + 2 * (state - 4)  # gradient; master, moments and bf16 copy read and written
    assert mixed.times["host_update_s"] == pytest.approx(numel(on_cpu) * touched / mixed.rates.host_update_bytes_s)
    assert "ncpus" in mixed.init_kwargs() and f"but the last {c}" in str(mixed)
    assert mixed.summary()["cpu_update_blocks"] == c and mixed.summary()["host_update"] == "mixed"
    pinned = nt.plan(model, batch=32, seq=1024, cpu_update_blocks=3, **H200)
    assert pinned.cpu_update_blocks == 3 and pinned.host_blocks > 3
    with pytest.raises(ValueError, match="cpu_update_blocks"):
        nt.plan(model, batch=32, seq=1024, host_update="gpu", cpu_update_blocks=2, **H200)
    with pytest.raises(ValueError, match="exceeds"):
        nt.plan(model, batch=32, seq=1024, host_blocks=2, cpu_update_blocks=3, **H200)
    with pytest.raises(ValueError, match="pinned choices"):
        nt.plan(model, batch=32, seq=1024, host_blocks=1, host_update="mixed", **H200)


def test_plan_takes_bf16_master_weights_only_when_fp32_fits_nowhere():
    """30B at batch 16 on the H200 box: fp32 master weights fit in no placement (GPU + host RAM 235 GiB, the state
    279 GiB); the plan keeps the blocks' matmul weights as bf16 master weights (2 + 4 bytes each: no separate copy)
    and says so. master_dtype=torch.float32 refuses that (InsufficientMemoryError naming the way out); 20B keeps fp32
    masters unless asked; bf16 masters need precision bf16 and bf16 moments."""
    model = meta_gpt2(48, 7168, 56)
    p = nt.plan(model, batch=16, seq=1024, **H200)
    assert p.master_dtype == torch.bfloat16 and p.state_dtype == torch.bfloat16 and p.beyond_gpu
    assert p.bytes("gpu") <= H200["gpu_memory"] and p.bytes("host") <= H200["host_memory"]
    # a CPU-updated bf16 master's GPU buffer stays allocated, stale, between its update and the next forward (30B
    # with 21 CPU-updated blocks on the H200: 24.1 GiB measured, memory_plan_v3; that placement, chosen before these
    # bytes were counted, does not fit the H200's GPU by them: here on a larger one)
    by_hand = nt.plan(model, batch=16, seq=1024, host_blocks=28, cpu_update_blocks=21, gpu_memory="200GiB",
                      host_memory=H200["host_memory"])
    cpu_mm = sum(q.numel for q in by_hand.facts.params if q.matmul and q.block >= 48 - 21)
    assert by_hand.tiers["gpu"]["stale bf16 masters (CPU-updated)"] == 2 * cpu_mm
    assert abs(2 * cpu_mm / GiB - 24.1) < 0.1
    assert "stale bf16 masters (CPU-updated)" not in nt.plan(model, batch=16, seq=1024, host_update="gpu",
                                                             **H200).tiers["gpu"]
    assert "bf16 for the blocks' matmul weights" in str(p) and "fit in no placement" in str(p)
    names = set(p.bf16_master_parameter_names())
    params = {q.name: q for q in p.facts.params}
    assert names and all(params[n].block >= 0 and params[n].matmul for n in names)
    assert "transformer.wte.weight" not in names and "transformer.h.0.ln_1.weight" not in names
    numel = sum(q.numel for q in p.facts.params)
    in_bf16 = sum(params[n].numel for n in names)
    assert p.persistent_bytes() == {"parameters": 4 * numel - 2 * in_bf16, "moments": 4 * numel,
                                    "bf16 copies": 2 * params["transformer.wte.weight"].numel}
    with pytest.raises(nt.InsufficientMemoryError, match="master_dtype=torch.bfloat16"):
        nt.plan(model, batch=16, seq=1024, master_dtype=torch.float32, **H200)
    assert nt.plan(meta_gpt2(44, 6144, 48), batch=16, seq=1024, **H200).master_dtype == torch.float32
    pinned = nt.plan(meta_gpt2(44, 6144, 48), batch=16, seq=1024, master_dtype=torch.bfloat16, **H200)
    assert pinned.master_dtype == torch.bfloat16 and "fit in no placement" not in str(pinned)
    fp32 = nt.plan(meta_gpt2(44, 6144, 48), batch=16, seq=1024, **H200)
    assert pinned.persistent_bytes()["parameters"] < fp32.persistent_bytes()["parameters"]
    with pytest.raises(ValueError, match="precision"):
        nt.plan(model, batch=16, seq=1024, precision="tf32", master_dtype=torch.bfloat16, **H200)
    with pytest.raises(ValueError, match="moments"):
        nt.plan(model, batch=16, seq=1024, master_dtype=torch.bfloat16, state_dtype=torch.float32, **H200)
    with pytest.raises(ValueError, match="master_dtype"):
        nt.plan(model, batch=16, seq=1024, master_dtype=torch.float16, **H200)


def test_infeasible_model_raises_before_anything_and_says_what_would_fit():
    """A model that fits nowhere raises InsufficientMemoryError at once, naming the tier and bytes missing and
    what would help; the model is untouched and no task was submitted."""
    model = meta_gpt2(48, 7168, 56)  # 30B
    tasks = nt.stats()["tasks_submitted"]
    t0 = time.monotonic()
    with pytest.raises(nt.InsufficientMemoryError) as e:
        nt.plan(model, batch=16, seq=1024, gpu_memory="40GiB", host_memory="60GiB")
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert "missing" in msg and "What would make it fit" in msg, msg
    assert e.value.missing and all(b > 0 for b in e.value.missing.values())
    assert e.value.fixes == [{"gpu_memory": e.value.fixes[0]["gpu_memory"]}]  # nothing else alone would do
    nt.plan(model, batch=16, seq=1024, gpu_memory=e.value.fixes[0]["gpu_memory"], host_memory="60GiB")
    assert all(p.is_meta for p in model.parameters()) and nt.stats()["tasks_submitted"] == tasks
    # the same model fits with a disk node large enough, or pinned to bf16 moments it needs less
    fits = nt.plan(model, batch=1, seq=1024, gpu_memory="40GiB", host_memory="60GiB", disk_limit="400GiB")
    assert fits.tiers["disk"] and fits.traffic["disk"] > 0


@pytest.mark.parametrize("precision,pins", [("fp32", {}), ("bf16", {}), ("bf16", {"state_dtype": torch.float32}),
                                            ("fp32", {"checkpointing": False, "step_in_backward": False})],
                         ids=["fp32", "bf16", "bf16-fp32-moments", "fp32-pinned"])
def test_what_would_make_it_fit_is_checked_by_planning_again(monkeypatch, precision, pins):
    """Each change the error names makes the plan fit when made alone (.fixes); at precision fp32 it suggested
    master_dtype=torch.bfloat16, which the plan rejects there, and "a disk node of at least 0 GiB"."""
    import importlib
    placement = importlib.import_module("nntile_torch.placement")
    accounting = importlib.import_module("nntile_torch.accounting")
    host = 40 * 2**20
    monkeypatch.setattr(placement, "machine_capacity", lambda disk=None: accounting.Capacity(0, host, disk or 0, 0, 2))
    model = gpt2(n_layer=2)
    with pytest.raises(nt.InsufficientMemoryError) as e:
        nt.plan(model, batch=8, seq=64, precision=precision, **pins)
    msg = str(e.value)
    assert e.value.fixes and " 0 GiB" not in msg and " 0 KiB" not in msg, msg
    assert ("master_dtype" in msg) == (precision == "bf16" and any("master_dtype" in f for f in e.value.fixes)), msg
    assert any("disk_limit" in f for f in e.value.fixes) and any("host_memory" in f for f in e.value.fixes)
    for fix in e.value.fixes:
        kw = dict(pins, precision=precision, batch=8)
        if fix.get("master_dtype") is not None:
            kw.pop("state_dtype", None)
        kw.update(fix)
        nt.plan(model, seq=64, **kw)  # fits
        for arg in ("disk_limit", "host_memory"):  # and the least that does, within 1/16 of what it adds
            if arg in fix:
                less = fix[arg] - max(2**20, (fix[arg] - (0 if arg == "disk_limit" else host)) // 8)
                with pytest.raises(nt.InsufficientMemoryError):
                    nt.plan(model, seq=64, **dict(kw, **{arg: less}))


def test_convert_of_a_model_that_fits_nowhere_raises_the_named_error_and_changes_nothing():
    """convert() under a host limit its parameters cannot fit in raises InsufficientMemoryError (as nt.plan does),
    before any module is swapped, with sizes that would make it fit; it raised a RuntimeError from the first tile
    tensor that did not fit, with the model half converted."""
    from conftest import run_python
    code = (
        "import torch, nntile_torch as nt\n"
        "nt.init(ncpus=1, ncuda=0, host_memory_limit='16MiB')\n"
        "model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])  # 32 MiB of float32\n"
        "try:\n"
        "    nt.convert(model)\n"
        "except nt.InsufficientMemoryError as e:\n"
        "    print('refused', e.missing['host'], all(type(m) is torch.nn.Linear for m in model), nt.stats()['tile_bytes'])\n"
        "    print(e)\n"
        "nt.shutdown(); nt.init(ncpus=1, ncuda=0, host_memory_limit='40MiB')\n"
        "nt.convert(model); print('fits', nt.stats()['tile_bytes'])\n")
    rc, out, err = run_python(code, 120, what="convert under a 16 MiB host limit")
    assert rc == 0, err[-3000:]
    assert f"refused {16 * 2**20 + 8 * 4 * 1024} True 0" in out, out  # 32 MiB + biases - 16 MiB; nothing swapped
    assert "host_memory_limit of at least 32.0 MiB" in out and "disk node" in out and "of at least 16.0 MiB" in out, out
    assert f"fits {8 * 4 * (1024 * 1024 + 1024)}" in out, out


def test_plan_init_applies_the_capacities_given_to_the_plan(tmp_path):
    """plan.init() starts the runtime with the limits the plan was made for (host_memory -> host_memory_limit,
    disk_limit -> a disk node, whose directory plan.init needs); it left the host limit unset. A runtime running
    with other limits is refused rather than trained under a plan that counts on memory it does not have."""
    from conftest import run_python
    code = (
        "import torch, nntile_torch as nt\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 64))\n"
        "plan = nt.plan(model, batch=2, seq=8, precision='fp32', host_memory='1GiB', disk_limit='64MiB')\n"
        "try:\n"
        "    plan.init()\n"
        "except ValueError as e:\n"
        "    print('needs', e)\n"
        f"plan.init(disk_path={str(tmp_path)!r})\n"
        "i = nt.info()\n"
        "print('limits', i['host_memory_limit_bytes'], i['settings']['disk_limit'], nt.memory_nodes()[0]['total_bytes'])\n"
        "plan.init(disk_path='ignored: running with these limits already')\n"
        "other = nt.plan(model, batch=2, seq=8, precision='fp32', host_memory='2GiB')\n"
        "try:\n"
        "    other.init()\n"
        "except RuntimeError as e:\n"
        "    print('refused', e)\n")
    rc, out, err = run_python(code, 120, what="plan.init")
    assert rc == 0, err[-3000:]
    assert "needs the plan counts on a disk node of 64.0 MiB (disk_limit): pass its directory" in out, out
    assert f"limits {2**30} {64 * 2**20} {2**30}" in out, out
    assert "refused nntile_torch is running with other memory limits" in out and "'host_memory_limit'" in out, out


def test_plan_apply_starts_the_runtime_with_the_plans_settings_and_converts():
    """plan.apply(model) alone: the runtime started with the plan's limits (as plan.init() would), the model converted
    at the plan's precision with its hooks, and plan.optimizer() an AdamW with the plan's choices."""
    from conftest import run_python
    code = (
        "import torch, nntile_torch as nt\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))\n"
        "plan = nt.plan(model, batch=2, seq=8, precision='tf32', host_memory='1GiB')\n"
        "ours = plan.apply(model, tile_size=64)\n"
        "opt = plan.optimizer(ours.parameters(), lr=1e-3)\n"
        "print('limit', nt.info()['host_memory_limit_bytes'], type(ours[0]).__module__, nt.streamer(ours).plan is plan,\n"
        "      type(opt).__name__, opt.state_dtype == plan.state_dtype)\n"
        "ours(torch.randn(2, 8, 64)).sum().backward(); opt.step()\n"
        "print('stepped')\n")
    rc, out, err = run_python(code, 120, what="plan.apply")
    assert rc == 0, err[-3000:]
    assert f"limit {2**30} nntile_torch.nn.linear True AdamW True" in out and "stepped" in out, out


def test_plan_apply_and_optimizer_train_as_the_three_calls_did(device):
    """plan.apply(model, ...) and plan.optimizer(params, ...) give the model and optimizer of nt.convert(plan=) and
    AdamW(plan=) (the spellings before them, still working): the same losses and weights, bit for bit, under a plan
    with host blocks; a placement argument against the plan is refused by plan.optimizer as by AdamW."""
    import warnings
    plan = nt.plan(gpt2(n_layer=4), batch=4, seq=37, precision="bf16", gpu_memory="1GiB", host_blocks=2,
                   checkpointing=True, state_dtype=torch.bfloat16, host_update="cpu")
    ours = plan.apply(gpt2(n_layer=4, device=device), tile_size=384, batch_tile_size=37)
    twin = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37, plan=plan)
    assert nt.streamer(ours).plan is plan and nt.streamer(twin).plan is plan
    if device == "cpu":
        nt.streamer(ours).nodes = nt.streamer(twin).nodes = [0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few CPU workers beside a GPU: a speed warning
        opt = plan.optimizer(ours.parameters(), lr=1e-3)
        opt_t = nt.optim.AdamW(twin.parameters(), lr=1e-3, plan=plan)
    assert opt.offload_update == opt_t.offload_update == "cpu"
    assert _train(ours, opt, device=device) == _train(twin, opt_t, device=device)
    for (n, a), b in zip(ours.named_parameters(), twin.parameters()):
        assert torch.equal(a.materialize(), b.materialize()), n
    with pytest.raises(ValueError, match="contradicts the plan"):
        plan.optimizer(ours.parameters(), state_dtype=torch.float32)


def test_plan_rejects_bad_arguments():
    model = gpt2(n_layer=2)
    with pytest.raises(ValueError, match="batch"):
        nt.plan(model, batch=0, seq=8)
    with pytest.raises(ValueError, match="precision"):
        nt.plan(model, batch=1, seq=8, precision="fp16")
    with pytest.raises(ValueError, match="state_dtype"):
        nt.plan(model, batch=1, seq=8, state_dtype=torch.float16)
    with pytest.raises(ValueError, match="host_blocks"):
        nt.plan(model, batch=1, seq=8, host_blocks=3, gpu_memory="1GiB")
    plan = nt.plan(model, batch=1, seq=8, precision="bf16")
    with pytest.raises(ValueError, match="precision"):
        nt.convert(gpt2(n_layer=2), precision="fp32", plan=plan)


def test_activation_estimate_grows_as_the_model_keeps():
    f = model_facts(gpt2(n_layer=4))
    full, ckpt = activation_bytes(f, 8, 64, "fp32", False), activation_bytes(f, 8, 64, "fp32", True)
    assert ckpt < full and activation_bytes(f, 16, 64, "fp32", False) == 2 * full
    assert activation_bytes(f, 8, 64, "bf16", False) < full


def _gpt2_formula(L, c, f, v, batch, seq, precision, checkpointing, heads):
    """The activation bytes and FLOPs plan.py computed for every model before modules described themselves (GPT-2's
    block written out), kept here as the reference the sums of the descriptions must equal on GPT-2; since then the
    attention also keeps a float32 log-sum-exp per head and token."""
    x = 2 if precision == "bf16" else 4
    kept = 4 * c + x * c + 12 * c + 4 * c + 4 * heads + x * c + 4 * c + x * c + 4 * f + x * f
    grads = 12 * c + 4 * f + 4 * c
    head = 4 * c + x * c + 8 * v + x * v
    stored = 4 * c * L if checkpointing else kept * L
    block = grads + (kept if checkpointing else 0)
    act = batch * seq * (stored + max(head, block) + 8 + 4 * c)
    return act


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_plan_summed_from_module_descriptions_equals_the_gpt2_formula(precision):
    """GPT-2's modules describe themselves (nntile_torch/costs.py: LayerNorm, Conv1D, Linear, GPT-2's attention and
    MLP, the block), before convert() and after: the plan's activation bytes, checkpoints and FLOPs summed from them
    are, to the byte and the FLOP, those of the GPT-2 formula the plan used before."""
    from nntile_torch.plan import model_facts
    shapes = [(3, 96, 6, 1000, 1024), (48, 1600, 25, 50257, 1024), (44, 6144, 48, 50257, 1024)]
    for L, c, h, v, seq in shapes:
        f = model_facts(meta_gpt2(L, c, h, vocab=v))
        costs = f.costs(precision, seq)
        for batch, ckpt in ((1, False), (16, True), (3, False)):
            assert activation_bytes(f, batch, seq, precision, ckpt) == _gpt2_formula(L, c, 4 * c, v, batch, seq,
                                                                                      precision, ckpt, h)
        assert costs.matmul_flops == 2 * sum(p.numel for p in f.params if p.matmul)
        assert costs.attention_flops == 4 * L * c * seq
        assert [b.checkpoint for b in costs.blocks] == [4 * c] * L
    model = gpt2(n_layer=3)
    before = model_facts(model)
    nt.convert(model, precision=precision, tile_size=384, batch_tile_size=37)
    after = model_facts(model)
    assert [p.matmul for p in before.params] == [p.matmul for p in after.params]
    for facts in (before, after):
        assert facts.costs(precision, 37) == before.costs(precision, 37)
        assert activation_bytes(facts, 3, 37, precision, False) == _gpt2_formula(3, 96, 384, 1000, 3, 37, precision,
                                                                                 False, 6)


def test_a_new_module_form_brings_its_own_description(monkeypatch):
    """A block with a module of a form the plan has never seen: a made-up gated projection with its own
    plan_costs (a matmul keeping its input and its gate), and an RMSNorm-like torch module described by
    register_form. The plan counts exactly what they say: their kept bytes in the activations, their FLOPs in the
    GPU time, the gate's weight as a matmul weight (a bf16 copy in bf16 mode); a module that describes nothing costs
    nothing."""
    from torch import nn
    from nntile_torch import costs as costs_mod
    from nntile_torch.costs import Costs
    from nntile_torch.plan import model_facts

    class Gate(nn.Module):  # y = x * sigmoid(x @ W): keeps x and the gate
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(width, width))

        def plan_costs(self, precision, seq):
            w = self.weight.shape[0]
            return Costs(kept=(2 if precision == "bf16" else 4) * w + 4 * w, backward=4 * w,
                         matmul_flops=2 * w * w, matmul_weights=("weight",))

    class RMSNorm(nn.Module):  # a torch module one cannot give a method: described by registration
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

    monkeypatch.setattr(costs_mod, "_FORMS", list(costs_mod._FORMS))
    costs_mod.register_form(lambda m: isinstance(m, RMSNorm), lambda m, precision, seq: Costs(kept=4 * m.weight.numel() + 4))

    L, c, v, batch, seq = 4, 256, 500, 8, 128  # a small vocabulary: a block's backward, not the head, is the peak
    base = meta_gpt2(L, c, 8, vocab=v)
    extra = meta_gpt2(L, c, 8, vocab=v)
    with torch.device("meta"):
        for block in extra.transformer.h:
            block.gate = Gate(c)
            block.ln_2 = RMSNorm(c)  # in place of a LayerNorm (4 x width): 4 more bytes per token
            block.plain = nn.Identity()  # describes nothing
    f0, f1 = model_facts(base), model_facts(extra)
    gate_names = {p.name for p in f1.params if p.name.endswith(".gate.weight")}
    assert len(gate_names) == L and all(p.matmul for p in f1.params if p.name in gate_names)
    for precision in ("fp32", "bf16"):
        x = 2 if precision == "bf16" else 4
        added = (x * c + 4 * c) + 4  # the gate's kept bytes, the norm's 4 more
        # every block keeps them; the peak, in one block's backward, holds the gate's gradient too
        assert activation_bytes(f1, batch, seq, precision, False) - activation_bytes(f0, batch, seq, precision, False) \
            == batch * seq * (L * added + 4 * c)
        # with checkpointing the blocks keep their inputs alone; the one in its backward holds them all again
        assert activation_bytes(f1, batch, seq, precision, True) - activation_bytes(f0, batch, seq, precision, True) \
            == batch * seq * (added + 4 * c)
        assert f1.costs(precision, seq).matmul_flops - f0.costs(precision, seq).matmul_flops == L * 2 * c * c
    kw = dict(batch=batch, seq=seq, precision="bf16", gpu_memory="64GiB", host_memory="64GiB", checkpointing=False,
              state_dtype=torch.float32, step_in_backward=False, host_blocks=0)
    p0, p1 = nt.plan(base, **kw), nt.plan(extra, **kw)
    assert p1.tiers["gpu"]["activations"] - p0.tiers["gpu"]["activations"] == batch * seq * (L * (6 * c + 4) + 4 * c)
    assert p1.persistent_bytes()["bf16 copies"] - p0.persistent_bytes()["bf16 copies"] == 2 * L * c * c
    # the gate's FLOPs; and the made-up norm says no elementwise bytes where the LayerNorm said 8 x width
    from nntile_torch.costs import GPT2_BLOCK_ELEMENTWISE
    assert p1.times["gpu_s"] - p0.times["gpu_s"] == pytest.approx(
        3 * L * 2 * c * c * batch * seq / p0.rates.gemm("bf16")
        - p0.rates.per_layer_token_width_s * L * 8 * c / GPT2_BLOCK_ELEMENTWISE * batch * seq)


def test_plan_uses_rates_measured_on_this_gpu_when_cached(tmp_path, monkeypatch):
    """Rates measured on a GPU model are cached (under STARPU_HOME, else ~/.cache) and the plan uses them on that
    GPU model, the H200's constants for what was not measured; a GPU model without a cache entry is measured on the
    first plan (the H200 keeps its defaults); print(plan) names them. NNTILE_PLAN_RATES=defaults (the tests' setting) ignores the cache."""
    from nntile_torch import rates
    monkeypatch.setenv("STARPU_HOME", str(tmp_path / "starpu"))
    assert rates.cache_path() == str(tmp_path / "starpu" / ".nntile_torch" / "rates.json")
    monkeypatch.delenv("STARPU_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert rates.cache_path() == str(tmp_path / "cache" / "nntile_torch" / "rates.json")
    assert rates.load("Fake GPU") is None  # nothing cached
    rates.save("Fake GPU", {"gemm_flops": 340e12, "pcie_bytes_s": 24e9}, date="2026-12-04")
    rates.save("Other GPU", {"gemm_flops": 1e15})
    got = rates.load("Fake GPU")
    assert got.gemm_flops == 340e12 and got.pcie_bytes_s == 24e9 and got.hbm_bytes_s == rates.Rates().hbm_bytes_s
    assert got.source == "measured on Fake GPU 2026-12-04" and rates.load("H200") is None
    with pytest.raises(ValueError, match="not a measured rate"):
        rates.save("Fake GPU", {"disk_bytes_s": 1e9})
    model = meta_gpt2(40, 5120, 40)
    kw = dict(batch=32, seq=1024, host_blocks=20, cpu_update_blocks=20, checkpointing=True, **H200)
    defaults = nt.plan(model, **kw)
    assert defaults.rates == rates.Rates() and "rates: H200 defaults" in str(defaults)
    monkeypatch.setattr(rates, "_device_name", lambda: "Fake GPU")
    assert nt.plan(model, **kw).rates == rates.Rates()  # NNTILE_PLAN_RATES=defaults
    monkeypatch.delenv("NNTILE_PLAN_RATES", raising=False)
    measured = nt.plan(model, **kw)
    assert measured.rates == got and "rates: measured on Fake GPU 2026-12-04" in str(measured)
    assert measured.times["pcie_s"] == pytest.approx(2 * defaults.times["pcie_s"])  # half the copy rate
    assert measured.times["gpu_s"] > defaults.times["gpu_s"]  # half the bf16 GEMM rate
    # A GPU model with nothing cached is measured once, on the first plan, and cached; the H200 keeps its defaults.
    calls = []
    monkeypatch.setattr(rates, "measure", lambda: calls.append(1) or {"gemm_flops": 500e12, "hbm_bytes_s": 2e12})
    monkeypatch.setattr(rates, "_device_name", lambda: "Unmeasured GPU")
    first = nt.plan(model, **kw)
    assert calls == [1] and first.rates.gemm_flops == 500e12 and first.rates.pcie_bytes_s == rates.Rates().pcie_bytes_s
    assert nt.plan(model, **kw).rates == first.rates and calls == [1]  # cached: not measured again
    assert "rates: measured on Unmeasured GPU" in str(first)
    monkeypatch.setattr(rates, "_device_name", lambda: "NVIDIA H200")
    assert nt.plan(model, **kw).rates == rates.Rates() and calls == [1]
    (tmp_path / "cache" / "nntile_torch" / "rates.json").write_text("{not json")
    monkeypatch.setattr(rates, "_device_name", lambda: "Fake GPU")
    assert nt.plan(model, **kw).rates.gemm_flops == 500e12 and calls == [1, 1]  # a broken cache: measured again
    def fails():
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(rates, "measure", fails)
    monkeypatch.setattr(rates, "_device_name", lambda: "Busy GPU")
    with pytest.warns(UserWarning, match="could not measure Busy GPU's rates"):
        assert nt.plan(model, **kw).rates == rates.Rates()
    small = nt.plan(gpt2(n_layer=2), batch=2, seq=8, host_memory="1GiB", gpu_memory=None)
    if not small.capacity.gpu_bytes:  # no GPU tier: the CPU's estimates, said so
        assert "rates: CPU estimates" in str(small)


def _train(model, opt, steps=3, device="cpu"):
    losses = []
    for s in range(steps):
        ids = torch.randint(0, 1000, (4, 37), generator=torch.Generator().manual_seed(s)).to(device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("where", ["cpu", "gpu", "mixed"])
def test_training_under_a_plan_with_host_blocks_is_bit_for_bit_the_same(device, where, monkeypatch):
    """A plan with its last two blocks in host RAM (on a CPU-only machine the weights are "streamed" to host RAM,
    memory node 0, which runs the same prefetch, won't-use, fetch and throttle calls; on a GPU to the GPU):
    checkpointing, updates inside backward and host updates (by CPU workers, on the GPU with the state fetched ahead
    and written back, or the last block by CPU workers and the other on the GPU) give exactly the losses and weights
    of the same choices made by hand, without the hooks. With GPU updates every such parameter's weight, moments and
    bf16 copy are sent back to host RAM after each update (on a GPU: found valid there; on the CPU, where host RAM is
    the only node and residency says nothing, the write-back requests are counted)."""
    import warnings
    plan = nt.plan(gpt2(n_layer=4), batch=4, seq=37, precision="bf16", gpu_memory="1GiB", host_blocks=2,
                   checkpointing=True, state_dtype=torch.bfloat16, host_update=where)
    assert plan.host_blocks == 2 and plan.step_in_backward and plan.host_block_indices == [2, 3]
    assert plan.host_update == where and plan.summary()["host_update"] == where
    assert plan.cpu_update_block_indices == {"cpu": [2, 3], "gpu": [], "mixed": [3]}[where]
    per_use = set(plan.bf16_per_use_parameter_names())  # the GPU blocks' matmul weights: copies made per use
    assert plan.bf16_per_use and len(per_use) == 2 * 4 and all(n.startswith(("transformer.h.0.", "transformer.h.1."))
                                                               for n in per_use)
    ours = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37, plan=plan)
    assert plan.beyond_gpu and all(nt.param_state(p).cast_apart for p in ours.parameters())  # casts as their own tasks
    if device == "cpu":
        nt.streamer(ours).nodes = [0]
    nt.streamer(ours).state_ahead = 0  # the early state fetch too (off by default)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few CPU workers beside a GPU: a speed warning
        opt = nt.optim.AdamW(ours.parameters(), lr=1e-3, plan=plan)
    update_on = {n: nt.param_state(p).update_on for n, p in ours.named_parameters()}
    assert opt.offload_update == where and ("cpu" in update_on.values()) == (where != "gpu") \
        and ("streamed" in update_on.values()) == (where != "cpu")
    host = {n for n, on in update_on.items() if on != "any"}
    on_gpu = {n for n, on in update_on.items() if on == "streamed"}
    assert host == {n for n, p in ours.named_parameters() if nt.param_state(p).home == "host"}
    assert host == set(plan.host_parameter_names()) and all(n.startswith(("transformer.h.2.", "transformer.h.3."))
                                                              for n in host)
    assert on_gpu == host - set(plan.cpu_update_parameter_names())
    twin = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37)
    twin.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = where if where != "mixed" else [p for n, p in twin.named_parameters()
                                                if n in host and n not in on_gpu]
        opt_t = nt.optim.AdamW(twin.parameters(), lr=1e-3, step_in_backward=True, state_dtype=torch.bfloat16,
                               offload=[p for n, p in twin.named_parameters() if n in host], offload_update=split)
    assert opt_t.offload_update == where
    written_back = []  # tiles asked back to host RAM (node 0), in order
    prefetch = nt._C.TileTensor.prefetch

    def spy(tiles, node):
        if node == 0:
            written_back.append(tiles)
        return prefetch(tiles, node)
    monkeypatch.setattr(nt._C.TileTensor, "prefetch", spy)
    assert _train(ours, opt, device=device) == _train(twin, opt_t, device=device)
    monkeypatch.undo()
    # the GPU updates' state was fetched ahead in the backward of steps 2 and 3 (master weight and two moments)
    per_step = 3 * len(on_gpu) * (1 if device == "cpu" else len(nt._C.cuda_memory_nodes()))
    assert nt.streamer(ours).state_fetches == 2 * per_step
    nt._C.wait_all()
    for (n, a), b in zip(ours.named_parameters(), twin.parameters()):
        if n in on_gpu:  # written back: valid in host RAM (node 0), every tile
            st = opt.state[a]
            tiles = [a.tiles, st["exp_avg"].tiles, st["exp_avg_sq"].tiles]
            assert list(nt.param_state(a).update_state()) == tiles[:3]  # what the streaming fetches
            if a.dim() == 2:
                tiles.append(nt.param_state(a).bf16_copy[1])
            for t in tiles:  # each asked back once per step (the bf16 copy is new each step: the last one's)
                times = sum(x is t for x in written_back)
                assert times == (1 if t is tiles[-1] and a.dim() == 2 else 3), (n, t.name, times)
            for t in tiles:  # the write-back is an asynchronous acquisition: a moment after the tasks
                deadline = time.monotonic() + 10
                while not all(0 in nodes for nodes in t.valid_nodes()) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert all(0 in nodes for nodes in t.valid_nodes()), (n, t.name, t.valid_nodes())
        if n in per_use:  # no copy kept (the twin's, made by hand without a plan, is)
            assert nt.param_state(a).bf16_copy is None and nt.param_state(b).bf16_copy is not None, n
        assert torch.equal(a.materialize(), b.materialize()), n
    with pytest.raises(ValueError, match="contradicts the plan"):
        nt.optim.AdamW(ours.parameters(), plan=plan, state_dtype=torch.float32)
    with pytest.raises(ValueError, match="contradicts the plan"):
        nt.optim.AdamW(ours.parameters(), plan=plan, offload_update="cpu" if where == "gpu" else "gpu")
    with pytest.raises(ValueError, match="offload_update"):
        nt.optim.AdamW(twin.parameters(), offload_update="disk")


@pytest.mark.parametrize("state", [torch.bfloat16, torch.uint8], ids=["moments=bf16", "moments=8bit"])
@pytest.mark.parametrize("where", ["cpu", "gpu"])
def test_training_with_bf16_master_weights_under_a_plan_is_the_same_as_by_hand(device, where, state):
    """master_dtype=torch.bfloat16 in a plan with two host blocks: convert() keeps exactly the blocks' matmul weights
    as bf16 tiles (float32 to torch; the embeddings, norms and biases stay fp32), the host blocks' made in host RAM;
    the training is bit for bit the same as the same choices made by hand (ParamState.keep_bf16_master, AdamW with bf16
    or 8-bit states, host updates), and the bf16 weights move."""
    import warnings
    plan = nt.plan(gpt2(n_layer=4), batch=4, seq=37, precision="bf16", gpu_memory="1GiB", host_blocks=2,
                   checkpointing=True, host_update=where, master_dtype=torch.bfloat16, state_dtype=state)
    assert plan.master_dtype == torch.bfloat16 and plan.state_dtype == state
    names = set(plan.bf16_master_parameter_names())
    ours = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37, plan=plan)
    if device == "cpu":
        nt.streamer(ours).nodes = [0]
    kept = {n for n, p in ours.named_parameters() if p.tiles.dtype == "bfloat16"}
    start = {n: p.materialize().clone() for n, p in ours.named_parameters() if n in names}
    assert kept == names and len(names) == 4 * 4 and all(p.dtype == torch.float32 for p in ours.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few CPU workers beside a GPU: a speed warning
        opt = nt.optim.AdamW(ours.parameters(), lr=1e-3, plan=plan)
    host = set(plan.host_parameter_names())
    twin = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37)
    twin.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for n, p in twin.named_parameters():
        if n in names:
            nt.param_state(p).keep_bf16_master(on_host=n in host)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt_t = nt.optim.AdamW(twin.parameters(), lr=1e-3, step_in_backward=True, state_dtype=state,
                               offload=[p for n, p in twin.named_parameters() if n in host], offload_update=where)
    losses = _train(ours, opt, steps=4, device=device)
    assert losses == _train(twin, opt_t, steps=4, device=device)
    for (n, a), b in zip(ours.named_parameters(), twin.parameters()):
        assert torch.equal(a.materialize(), b.materialize()), n
    assert all(not torch.equal(start[n], p.materialize()) for n, p in ours.named_parameters() if n in names)
    sd = ours.state_dict()
    assert all(v.dtype == torch.float32 for v in sd.values())


def test_plan_homes_checkpoints_in_host_ram_only_when_asked():
    """host_checkpoints=True: checkpointing's block inputs (4 x width bytes per token and block) leave the GPU for
    host RAM, all but the lookahead + 2 blocks' around the one computing, and cross PCIe once each way; it needs
    checkpointing and a GPU tier. The plan does not take it by itself (it stalled at 13B batch 96 on the H200): the
    InsufficientMemoryError there names it as a fix, since it would fit by the arithmetic."""
    model = meta_gpt2(40, 5120, 40)
    base = nt.plan(model, batch=32, seq=1024, host_blocks=17, cpu_update_blocks=17, host_checkpoints=False, **H200)
    home = nt.plan(model, batch=32, seq=1024, host_blocks=17, cpu_update_blocks=17, host_checkpoints=True, **H200)
    assert not base.host_checkpoints and home.host_checkpoints and home.checkpointing
    stored = 4 * 5120 * 40 * 32 * 1024
    kept = (home.lookahead + 2) * stored // 40
    assert base.tiers["gpu"]["activations"] - home.tiers["gpu"]["activations"] == stored - kept
    assert home.tiers["host"]["checkpoints (block inputs)"] == stored
    assert home.traffic["pcie_to_gpu"] - base.traffic["pcie_to_gpu"] == stored
    assert home.traffic["pcie_to_host"] - base.traffic["pcie_to_host"] == stored
    assert "checkpoints: every block's input in host RAM" in str(home) and home.summary()["host_checkpoints"]
    assert "(host_checkpoints=True)" in str(home)
    assert not nt.plan(model, batch=32, seq=1024, **H200).host_checkpoints  # fits without: not taken
    with pytest.raises(nt.InsufficientMemoryError, match="host_checkpoints=True"):  # would fit with them: named
        nt.plan(model, batch=96, seq=1024, **H200)
    big = nt.plan(model, batch=96, seq=1024, host_checkpoints=True, **H200)
    assert big.host_checkpoints and big.bytes("gpu") <= H200["gpu_memory"] and big.bytes("host") <= H200["host_memory"]
    with pytest.raises(nt.InsufficientMemoryError) as e:  # pinned off: not named
        nt.plan(model, batch=96, seq=1024, host_checkpoints=False, **H200)
    assert "host_checkpoints" not in str(e.value)
    with pytest.raises(nt.InsufficientMemoryError) as e:  # would not fit even with them: not named
        nt.plan(model, batch=512, seq=1024, **H200)
    assert "host_checkpoints" not in str(e.value)
    with pytest.raises(ValueError, match="checkpointing=False"):
        nt.plan(model, batch=8, seq=1024, host_checkpoints=True, checkpointing=False, **H200)
    if not torch.cuda.is_available():  # this machine's capacity has no GPU tier
        with pytest.raises(ValueError, match="GPU tier"):
            nt.plan(model, batch=8, seq=1024, host_checkpoints=True, host_memory="4TiB")
    with pytest.raises(ValueError, match="host_checkpoints"):
        nt.plan(model, batch=8, seq=1024, host_checkpoints="yes", **H200)


def test_training_with_checkpoints_in_host_ram_is_bit_for_bit_the_same(device):
    """A plan with host_checkpoints (lookahead 1, 4 blocks): in the forward the inputs of blocks 0 and 1 go to host
    RAM (memory node 0) once the GPU is past them, in the backward every block's input is fetched back ahead of its
    recompute (on a CPU-only machine to node 0 as well: the same calls); the losses and weights are those of the same
    choices made by hand without the hooks."""
    import warnings
    plan = nt.plan(gpt2(n_layer=4), batch=4, seq=37, precision="bf16", gpu_memory="1GiB", host_blocks=0,
                   checkpointing=True, host_checkpoints=True, lookahead=1)
    assert plan.host_checkpoints and not plan.beyond_gpu
    ours = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37, plan=plan)
    streamer = nt.streamer(ours)
    if device == "cpu":
        streamer.nodes = [0]
    twin = nt.convert(gpt2(n_layer=4, device=device), precision="bf16", tile_size=384, batch_tile_size=37)
    twin.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = nt.optim.AdamW(ours.parameters(), lr=1e-3, plan=plan)
        opt_t = nt.optim.AdamW(twin.parameters(), lr=1e-3, **plan.adamw_kwargs(twin.parameters()))
    assert _train(ours, opt, device=device) == _train(twin, opt_t, device=device)
    for (n, a), b in zip(ours.named_parameters(), twin.parameters()):
        assert torch.equal(a.materialize(), b.materialize()), n
    gpus = 1 if device == "cpu" else len(nt._C.cuda_memory_nodes())
    assert streamer.checkpoint_moves == 3 * (2 + 4 * gpus)  # per step: 2 inputs to host RAM, 4 fetched back


def test_offload_fraction_takes_the_last_parameters():
    model = nt.convert(gpt2(n_layer=4), tile_size=384, batch_tile_size=37)
    opt = nt.optim.AdamW(model.parameters(), offload=0.3)
    tiled = [p for p in model.parameters() if isinstance(p, nt.TileTensor)]
    chosen = [i for i, p in enumerate(tiled) if nt.param_state(p).on_host]
    assert chosen == list(range(len(tiled) - len(chosen), len(tiled)))
    assert sum(tiled[i].numel() for i in chosen) >= 0.3 * sum(p.numel() for p in tiled)


_RANDOM_LIMITS = (
    "import os, sys, torch, transformers, nntile_torch as nt\n"
    "host, disk, pin = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "nt.init(ncpus=2, ncuda=0, host_memory_limit=host, disk_path=disk if disk != '-' else None,\n"
    "        disk_limit='256MiB' if disk != '-' else None)\n"
    "torch.manual_seed(0)\n"
    "cfg = transformers.GPT2Config(n_layer=3, n_embd=128, n_head=4, vocab_size=512, n_positions=32,\n"
    "    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)\n"
    "model = transformers.GPT2LMHeadModel(cfg)\n"
    "try:\n"
    "    kw = {} if pin == '-' else dict(zip(('state_dtype', 'step_in_backward', 'checkpointing'),\n"
    "        (getattr(torch, pin.split(',')[0]), pin.split(',')[1] == '1', pin.split(',')[2] == '1')))\n"
    "    plan = nt.plan(model, batch=4, seq=32, precision='fp32', **kw)\n"
    "except nt.InsufficientMemoryError as e:\n"
    "    print('infeasible', e.missing); sys.exit(0)\n"
    "ours = nt.convert(model, tile_size=128, batch_tile_size=32, plan=plan)\n"
    "opt = nt.optim.AdamW(ours.parameters(), lr=1e-3, plan=plan)\n"
    "for s in range(3):\n"
    "    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(s))\n"
    "    loss = ours(ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad()\n"
    "w = torch.cat([v.flatten() for v in ours.state_dict().values()])\n"
    "torch.save(w, os.environ['OUTFILE'])\n"
    "print('trained', float(loss), 'pin', ','.join((str(plan.state_dtype).split('.')[1],\n"
    "    str(int(plan.step_in_backward)), str(int(plan.checkpointing)))))\n")


def test_random_memory_limits_train_the_same_or_refuse_and_never_hang(tmp_path):
    """Under host limits drawn at random (with and without a disk node), a planned training either refuses up
    front (InsufficientMemoryError) or ends with the weights of an unlimited run of the same choices (moments'
    dtype, in-backward updates, checkpointing: a tighter limit may make the plan pick others), bit for bit; a run
    past its time limit fails the test instead of hanging it."""
    import os
    import random
    import subprocess
    import sys
    rng = random.Random(7)

    def run(host, disk, tag, pin="-"):
        out = tmp_path / f"w_{tag}.pt"
        try:
            r = subprocess.run([sys.executable, "-c", _RANDOM_LIMITS, host, disk, pin], capture_output=True, text=True,
                               timeout=240, env=dict(os.environ, OUTFILE=str(out), STARPU_SILENT="1"))
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"host limit {host}, disk {disk}: no end within 240 s: {(e.stderr or b'')[-1500:]!r}")
        assert r.returncode == 0, r.stderr[-3000:]
        return (torch.load(out) if "trained" in r.stdout else None), r.stdout
    references = {}
    for i in range(3):
        disk = "-"
        if i % 2 == 0:
            disk = str(tmp_path / f"disk{i}")
            os.makedirs(disk)
        host = f"{rng.choice([8, 12, 16, 24, 48])}MiB"
        w, out = run(host, disk, i)
        if w is None:
            assert "infeasible" in out
            continue
        pin = out.split("pin")[1].split()[0]
        if pin not in references:
            references[pin], _ = run("4GiB", "-", f"ref{i}", pin)
        assert torch.equal(w, references[pin]), (host, disk, pin)


# -- the state's ladder: fp32 -> bf16 moments -> bf16 master weights -> + 8-bit moments -> the disk node -------------
LADDER = [(torch.float32, torch.float32, False), (torch.float32, torch.bfloat16, False),
          (torch.bfloat16, torch.bfloat16, False), (torch.bfloat16, torch.uint8, False),
          (torch.bfloat16, torch.uint8, True)]


def _capped(model, gpu_gib, host_gib, disk_gib=0, batch=8, **pins):
    """nt.plan on fixed rates and given capacities: the plan's pure-Python accounting, no memory of this machine."""
    from nntile_torch.plan import Capacity, Rates
    cap = Capacity(int(gpu_gib * GiB), int(host_gib * GiB), int(disk_gib * GiB), 1 if gpu_gib else 0, 14)
    return nt.plan(model, batch=batch, seq=1024, rates=Rates(), _cap=cap, **pins)


def _rung(p):
    return LADDER.index((p.master_dtype, p.state_dtype, bool(p.tiers.get("disk"))))


def test_moment_bytes_per_parameter_of_each_state():
    """The plan's bytes per parameter of each (master, moments) pair are AdamW's: moments 8, 4, 2 + 8/256; a bf16
    master weight 2 bytes and no bf16 copy; the persistent bytes of plans pinned to each rung add up so."""
    from nntile_torch.accounting import MOMENT_BYTES, state_bytes
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        assert MOMENT_BYTES[dtype] == nt.optim.state_bytes_per_param(dtype)
    n, mm = 1024 * 1000, 1000 * 1000  # elements, of which matmul weights
    assert state_bytes(n, mm, "bf16", 8, False) == 12 * n + 2 * mm
    assert state_bytes(n, mm, "bf16", 4, False) == 8 * n + 2 * mm
    assert state_bytes(n, mm, "bf16", 4, True) == 8 * n - 2 * mm  # matmul weights: 2 + 4
    assert state_bytes(n, mm, "bf16", MOMENT_BYTES[torch.uint8], True) == 6 * n + n // 32 - 2 * mm  # 2 + 2.03
    assert state_bytes(n, mm, "fp32", MOMENT_BYTES[torch.uint8], False) == 6 * n + n // 32
    model = meta_gpt2(4, 512, 8)
    numel = sum(q.numel() for q in model.parameters())
    for master, state, _ in LADDER[:4]:
        p = _capped(model, 80, 100, master_dtype=master, state_dtype=state)
        assert (p.master_dtype, p.state_dtype) == (master, state) and not p.steps and "why" not in str(p)
        got = p.persistent_bytes()
        assert got["moments"] == math.ceil(MOMENT_BYTES[state] * numel), state
        in_bf16 = sum(q.numel for q in p.facts.params if q.name in set(p.bf16_master_parameter_names()))
        assert got["parameters"] == 4 * numel - 2 * in_bf16 and (in_bf16 > 0) == (master == torch.bfloat16)


def test_plan_makes_the_state_compact_only_as_far_as_needed():
    """A 12-block GPT-2 of width 8192 (9.7B parameters) on a 40 GiB GPU with ever less host RAM, then a disk node: the
    plan takes, in order, fp32 state, bf16 moments, bf16 master weights, bf16 master weights with 8-bit moments, the
    disk node; each only when the one before fits in no placement (pinned to it, the plan raises), each step printed
    with its reason, one line per step."""
    model = meta_gpt2(12, 8192, 64)
    seen = {}
    for host in range(160, 26, -6):
        p = _capped(model, 40, host)
        seen.setdefault(_rung(p), (host, p))
    with pytest.raises(nt.InsufficientMemoryError):
        _capped(model, 40, 24)
    disk = _capped(model, 40, 24, disk_gib=400)
    seen.setdefault(_rung(disk), (24, disk))
    assert sorted(seen) == [0, 1, 2, 3, 4], {k: v[0] for k, v in seen.items()}
    hosts = [seen[i][0] for i in range(4)]
    assert hosts == sorted(hosts, reverse=True)  # less host RAM, more compact state, never the other way
    for i, (host, p) in seen.items():
        master, state, disk_used = LADDER[i]
        assert (p.master_dtype, p.state_dtype, bool(p.tiers.get("disk"))) == (master, state, disk_used)
        why = [line for line in str(p).splitlines() if line.startswith("  why ")]
        assert len(why) == i == len(p.steps), str(p)
        if i:
            prev_master, prev_state, _ = LADDER[i - 1]
            with pytest.raises(nt.InsufficientMemoryError):  # the rung before fits nowhere (without a disk node)
                _capped(model, 40, host, master_dtype=prev_master, state_dtype=prev_state)
            assert "fit in no placement" in why[-1] and "missing)" in why[-1]
    assert str(seen[1][1]).count("why bf16 moments: fp32 master weights and moments fit in no placement") == 1
    assert "why bf16 master weights (and bf16 moments): bf16 moments fit" in str(seen[2][1])
    assert "why bf16 master weights and 8-bit moments: bf16 master weights (and bf16 moments) fit" in str(seen[3][1])
    assert "moments: 8-bit block-wise" in str(seen[3][1]) and "AdamW moments uint8" in str(seen[3][1])
    assert "why the disk node: bf16 master weights and 8-bit moments fit in no placement in GPU and host RAM" \
        in str(seen[4][1])
    # the disk node, when there is one, is used only after every rung without it: with room enough, not at all
    assert _rung(_capped(model, 40, hosts[3], disk_gib=400)) == 3
    assert _rung(_capped(model, 40, hosts[0], disk_gib=400)) == 0
    # the plan's optimizer takes the 8-bit moments (AdamW(state_dtype=torch.uint8) with bf16 master weights)
    assert seen[3][1].adamw_kwargs([])["state_dtype"] == torch.uint8


def test_pinned_state_leaves_out_the_rungs_that_disagree():
    """state_dtype / master_dtype pins: only their rungs; fp32 master weights with 8-bit moments where bf16 master
    weights are out (pinned fp32 or another precision); bf16 master weights with fp32 moments refused by name."""
    from nntile_torch.placement import state_rungs
    f32, bf16, u8 = torch.float32, torch.bfloat16, torch.uint8
    assert state_rungs(None, None) == [(f32, f32), (f32, bf16), (bf16, bf16), (bf16, u8)]
    assert state_rungs(None, f32) == [(f32, f32), (f32, bf16), (f32, u8)]
    assert state_rungs(None, None, bf16_masters=False) == [(f32, f32), (f32, bf16), (f32, u8)]
    assert state_rungs(u8, None) == [(f32, u8), (bf16, u8)]
    assert state_rungs(bf16, bf16) == [(bf16, bf16)]
    model = meta_gpt2(12, 8192, 64)
    tf32 = _capped(model, 40, 60, precision="tf32")  # no bf16 masters at tf32: 8-bit moments on fp32 masters
    assert (tf32.master_dtype, tf32.state_dtype) == (f32, u8) and "why 8-bit moments: bf16 moments fit" in str(tf32)
    with pytest.raises(ValueError, match="compact moments"):
        _capped(model, 40, 60, master_dtype=bf16, state_dtype=f32)


def test_nothing_fits_names_the_closest_state_and_real_fixes():
    """When no rung fits, the error's closest placement is the most compact state's (bf16 master weights, 8-bit
    moments), with the disk node's bytes where one was counted; what it suggests each fits when tried, never a bf16
    master weight at a precision that cannot have one, never a disk node of 0 bytes."""
    model = meta_gpt2(12, 8192, 64)
    with pytest.raises(nt.InsufficientMemoryError) as e:
        _capped(model, 40, 24)
    msg = str(e.value)
    assert "Closest (moments uint8, master weights bfloat16" in msg and " 0 GiB" not in msg, msg
    assert "disk node of at least" in msg and e.value.fixes
    for fix in e.value.fixes:
        kw = {k: v for k, v in fix.items() if k not in ("gpu_memory", "host_memory", "disk_limit")}
        caps = dict(gpu_gib=fix.get("gpu_memory", 40 * GiB) / GiB, host_gib=fix.get("host_memory", 24 * GiB) / GiB,
                    disk_gib=fix.get("disk_limit", 0) / GiB)
        if "disk_limit" in fix:
            assert fix["disk_limit"] > 0
        p = _capped(model, caps["gpu_gib"], caps["host_gib"], caps["disk_gib"], **kw)
        assert p.bytes("gpu") <= p.capacity.gpu_bytes
    with pytest.raises(nt.InsufficientMemoryError) as e:
        _capped(model, 40, 24, precision="tf32")
    assert "master_dtype" not in str(e.value) and "Closest (moments uint8, master weights float32" in str(e.value)
    with pytest.raises(nt.InsufficientMemoryError) as e:  # pinned fp32 moments: the next compact ones named
        _capped(model, 40, 100, state_dtype=torch.float32)
    assert {"state_dtype": torch.bfloat16} in e.value.fixes or {"state_dtype": torch.uint8} in e.value.fixes
