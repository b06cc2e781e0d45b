"""CPU smoke test of the benchmark harness: python -m benchmarks.run at the tiny config on every backend (each in
its own process; those that cannot run here are recorded as unavailable with a reason), each model family
(hf, hf-tanh, nanogpt) on torch and nntile with the harness's optimizer and the script's own (useropt), the
torch.compile variants, a capacity search that hits a (capped) out-of-memory, and python -m benchmarks.report on
the results."""
import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.configs import CONFIGS, flops_per_token, param_count
from benchmarks.run import code_commit, machine_name, parse_backends

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A fixed warm-up (--max-warmup 1): the attempts' losses are compared step by step.
TINY = ["--config", "tiny", "--precision", "tf32", "--batch", "4", "--seq", "32", "--steps", "2", "--warmup", "1",
        "--max-warmup", "1", "--cpu", "--timeout", "150"]
FIELDS = ("machine", "backend", "variant", "model", "config", "params", "layers", "hidden", "precision", "gpus",
          "batch", "seq", "mode", "status", "reason", "tokens_per_s", "tflops", "mfu", "step_s", "peak_gpu_bytes",
          "peak_host_bytes", "loss", "losses", "numerics")


def harness(*args, cwd, timeout=400, **env_vars):
    # The harness records every NNTILE_* variable set as an attempt's setting: none from this process goes along
    # (conftest's pin of the plan's rates; the patched StarPU's settings that a runtime started by an earlier test
    # exports while it runs), only what a test gives.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NNTILE_")}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_vars)
    r = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout, check=False)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    run_out = harness("benchmarks.run", "--backend", "torch,nntile,fsdp,fsdp2,fsdp:offload,fsdp2:offload,deepspeed",
                      *TINY, "--out", str(out), cwd=out)
    # Capacity: tiny fits under a 5 GiB address-space cap, large (774M parameters) does not; xl is never tried.
    cap_out = harness("benchmarks.run", "--mode", "capacity", "--backend", "torch", *TINY, "--config", "xl,large,tiny",
                      "--host-memory-cap", "5GiB", "--out", str(out), cwd=out)
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {"out": out, "stdout": run_out, "cap_stdout": cap_out, "recs": recs,
            "by": {(r["mode"], r["backend"], r["variant"]): r for r in recs}}


def test_every_attempt_is_recorded_with_its_fields(bench):
    recs = [r for r in bench["recs"] if r["mode"] == "throughput"]
    assert [(r["backend"], r["variant"]) for r in recs] == [
        ("torch", "plain"), ("nntile", "plain"), ("fsdp", "plain"), ("fsdp2", "plain"), ("fsdp", "offload"),
        ("fsdp2", "offload"), ("deepspeed", "offload")]
    for r in recs:
        missing = [k for k in FIELDS if k not in r]
        assert not missing, f"{r['backend']}: missing {missing}"
        assert r["status"] in ("ok", "unavailable"), f"{r['backend']}:{r['variant']}: {r['status']}: {r['reason']}"
        assert r["machine"] == "cpu" and r["gpus"] == 0 and r["mfu"] is None and r["peak_gpu_bytes"] is None
        assert (r["config"], r["params"], r["layers"], r["hidden"]) == ("tiny", 118528, 2, 64)
        if r["status"] == "unavailable":
            assert r["reason"], r
        assert r["code_commit"] == code_commit() and r["code_commit"], r["code_commit"]
        assert r["model"] == "hf"
    # One progress line per attempt, then the table.
    progress = [ln for ln in bench["stdout"].splitlines() if ln.startswith("[")]
    assert len(progress) == 7 and all(" ok: " in ln or " unavailable: " in ln for ln in progress), progress
    assert "| backend | variant |" in bench["stdout"]


def test_torch_and_nntile_train_the_same_model_on_the_same_batches(bench):
    t, n = bench["by"]["throughput", "torch", "plain"], bench["by"]["throughput", "nntile", "plain"]
    for r in (t, n):
        assert r["status"] == "ok", r["reason"]
        assert r["env"]["params_counted"] == r["params"] == param_count("tiny", 32)
        assert len(r["losses"]) == 3 and all(math.isfinite(v) for v in r["losses"]) and r["warmup_used"] == 1
        assert len(r["gc_ms"]) == 3 and all(v >= 0 for v in r["gc_ms"])
        assert r["step_mean_s"] == pytest.approx(sum(r["step_times"][1:]) / 2)
        assert r["loss"] == r["losses"][-1]
        assert 4.5 < r["losses"][0] < 6.5  # about ln(256) for a fresh model
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(4 * 32 / r["step_s"])
        assert r["tflops"] == pytest.approx(flops_per_token(r["params"], 2, 64, 32) * r["tokens_per_s"] / 1e12)
        assert r["peak_host_bytes"] > 2**20
    # Same seed, same weights, same ids, fp32 on the CPU: the same loss at every step.
    for a, b in zip(t["losses"], n["losses"]):
        assert abs(a - b) <= 1e-4, (t["losses"], n["losses"])
    assert n["env"]["tile_size"] >= 3 * 64 and n["env"]["batch_tile_size"] == 32 and n["env"]["starpu"]
    assert t["numerics"] == {"matmul": "tf32", "master": "fp32", "moments": "fp32", "state_on": "cpu"}
    assert n["numerics"] == {"matmul": "tf32", "master": "fp32", "moments": "fp32", "by": "the memory plan"}
    # nt.optim.AdamW's step waits for nothing: the one host wait of a step is the harness reading the loss
    assert n["host_waits"] == [1, 1, 1] and all(k > 0 for k in n["tasks"])
    assert n["env"]["convert"]["dense"] == [] and n["env"]["convert"]["dense_ops"] == {}


def test_sharded_backends_match_torch_or_say_why_not(bench):
    t = bench["by"]["throughput", "torch", "plain"]
    for b in ("fsdp", "fsdp2", "deepspeed"):
        v = "offload" if b == "deepspeed" else "plain"
        r = bench["by"]["throughput", b, v]
        if r["status"] == "unavailable":
            assert r["reason"]
            continue
        assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
        if b != "deepspeed":  # one rank: the same model and batches as torch
            assert abs(r["losses"][0] - t["losses"][0]) <= 1e-4
    for b in ("fsdp", "fsdp2"):
        r = bench["by"]["throughput", b, "offload"]
        assert r["status"] == "unavailable" and "GPU" in r["reason"]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """hf-tanh and nanogpt (hf is the bench fixture's) on torch and nntile, with the harness's optimizer and with
    the script's own (useropt)."""
    out = tmp_path_factory.mktemp("families")
    harness("benchmarks.run", "--model", "hf-tanh,nanogpt", "--backend",
            "torch,torch:useropt,nntile,nntile:useropt,nntile:fp32state", *TINY, "--out", str(out), cwd=out)
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["model"], r["backend"], r["variant"]): r for r in recs}


@pytest.mark.parametrize("model", ["hf-tanh", "nanogpt"])
def test_each_model_family_trains_the_same_on_torch_and_nntile(families, model):
    from benchmarks.configs import model_vocab
    runs = {k[1:]: r for k, r in families.items() if k[0] == model}
    assert set(runs) == {("torch", "plain"), ("torch", "useropt"), ("nntile", "plain"), ("nntile", "useropt"),
                         ("nntile", "fp32state")}
    for (b, v), r in runs.items():
        assert r["status"] == "ok", f"{model} {b}:{v}: {r['reason']}"
        assert r["params"] == param_count("tiny", 32, model) == r["env"]["params_counted"]
        assert r["vocab"] == model_vocab("tiny", model) == 256  # nanoGPT pads to a multiple of 64: 256 stays
        assert len(r["losses"]) == 3 and 4.5 < r["losses"][0] < 6.5
        assert r["numerics"]["master"] == r["numerics"]["moments"] == "fp32"
    for v, w in (("plain", "plain"), ("useropt", "useropt"), ("plain", "fp32state")):
        t, n = runs["torch", v], runs["nntile", w]  # same weights, ids and optimizer: the same losses (fp32, CPU)
        assert max(abs(a - b) for a, b in zip(t["losses"], n["losses"])) <= 1e-4, (w, t["losses"], n["losses"])
    assert runs["nntile", "fp32state"]["env"]["plan"]["state_dtype"] == "float32"
    assert runs["nntile", "fp32state"]["numerics"]["by"] == "the memory plan"
    # useropt is another optimizer (nanoGPT's groups and betas, clipping): the same first loss, then others
    assert runs["torch", "useropt"]["losses"][0] == pytest.approx(runs["torch", "plain"]["losses"][0], abs=1e-6)
    assert abs(runs["torch", "useropt"]["losses"][2] - runs["torch", "plain"]["losses"][2]) > 1e-6
    assert "clip_grad_norm_" in runs["nntile", "useropt"]["env"]["optimizer"]
    assert "clip_grad_norm_" in runs["torch", "useropt"]["env"]["optimizer"]
    assert runs["nntile", "plain"]["env"]["optimizer"] == "nntile_torch.optim.AdamW"
    # convert() left nothing dense (the script's own optimizer runs outside the model: not counted there)
    for v in ("plain", "useropt"):
        assert runs["nntile", v]["env"]["convert"]["dense"] == []
        assert len(runs["nntile", v]["host_waits"]) == 3


def test_hf_tanh_is_the_same_model_as_hf(bench, families):
    """gelu_pytorch_tanh is gelu_new's function in one kernel: the same weights and losses up to rounding."""
    hf, tanh = bench["by"]["throughput", "torch", "plain"], families["hf-tanh", "torch", "plain"]
    assert hf["params"] == tanh["params"]
    assert max(abs(a - b) for a, b in zip(hf["losses"], tanh["losses"])) <= 1e-4


def test_every_model_family_converts_strictly_on_cpu():
    """nt.convert(strict=True) takes each family whole (nothing left as torch code) and gives torch's loss and
    gradients (fp32 on the CPU)."""
    import torch

    import nntile_torch as nt
    from benchmarks import models
    from benchmarks.configs import MODEL_FAMILY
    tiny = {"gpt2": "tiny", "llama": "llama-tiny", "qwen2": "qwen2-tiny"}  # each family's CPU shape
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    for model in models.MODELS:
        torch.manual_seed(0)
        dense = models.build(model, tiny[MODEL_FAMILY[model]], 32)
        ref = models.build(model, tiny[MODEL_FAMILY[model]], 32)
        ref.load_state_dict(dense.state_dict())
        converted = nt.convert(dense, strict=True)
        loss, want = models.loss(model, converted, ids), models.loss(model, ref, ids)
        loss.backward()
        want.backward()
        assert float(loss.detach()) == pytest.approx(float(want.detach()), abs=1e-5), model
        report = nt.convert_report(converted)
        assert report.all_tiled, (model, str(report))
        got = dict(converted.named_parameters())
        for name, p in ref.named_parameters():
            g = got[name].grad
            g = g.materialize() if hasattr(g, "materialize") else g
            assert torch.allclose(g, p.grad, atol=1e-5), (model, name)


def test_compile_variants_run_and_time_their_compile_apart(tmp_path):
    """torch.compile on torch (whole model), fsdp2 (per block, then fully_shard) and fsdp (the FSDP1 model), here on
    the CPU (inductor's C++ backend): the same losses as eager torch, the compile time recorded as compile_s beside
    the step time, its kernels in TORCHINDUCTOR_CACHE_DIR."""
    cache = tmp_path / "inductor"
    harness("benchmarks.run", "--model", "nanogpt", "--backend",
            "torch,torch:compile,fsdp2:compile,fsdp:compile+useropt",
            *TINY, "--timeout", "400", "--out", str(tmp_path), cwd=tmp_path, timeout=1500,
            TORCHINDUCTOR_CACHE_DIR=str(cache))
    recs = {(r["backend"], r["variant"]): r for r in
            (json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines())}
    eager = recs["torch", "plain"]
    assert eager["status"] == "ok" and "compile_s" not in eager and "compile" not in eager["env"]
    for key in (("torch", "compile"), ("fsdp2", "compile"), ("fsdp", "compile+useropt")):
        r = recs[key]
        assert r["status"] == "ok", (key, r["reason"])
        assert r["env"]["compile"]["inductor_cache"] == str(cache)
        assert r["compile_s"] > 0 and r["first_step_s"] > r["step_s"]
        assert r["losses"][0] == pytest.approx(eager["losses"][0], abs=1e-4)
    for key in (("torch", "compile"), ("fsdp2", "compile")):  # the same optimizer as eager: every step alike
        assert max(abs(a - b) for a, b in zip(recs[key]["losses"], eager["losses"])) <= 1e-4
    assert any(cache.iterdir())  # the compiled kernels are kept there


def test_capacity_search_stops_at_the_first_failure(bench):
    cap = [r for r in bench["recs"] if r["mode"] == "capacity"]
    assert [(r["config"], r["status"]) for r in cap] == [("tiny", "ok"), ("large", "oom")], cap
    assert "allocate" in cap[1]["reason"]
    assert "capacity torch:plain tf32: tiny" in bench["cap_stdout"]


def test_warm_up_goes_on_while_memory_grows():
    """Untimed steps: at least the asked ones; one more while the last raised a peak by more than 1%, up to the most.
    13B on the H200 (call 2 of inside_gpu_v4): host RAM 96.4, 102.7, 108.0, 108.0 GiB after steps 0-3 (steps 1-2
    took 10.9 and 11.4 s, step 3 6.8 s): step 3 is the first that raised none, and timing starts after it."""
    from benchmarks.worker import WarmUp

    def used(peaks, steps=2, most=6):
        w = WarmUp(steps, most)
        s = 0
        while s < w.steps and s < len(peaks):
            w.after_step(s, peaks[s])
            s += 1
        return w.steps

    assert used([(96.4, 133.0), (102.7, 134.4), (108.0, 134.8), (108.0, 135.0)]) == 4
    assert used([(1.5, 62.0), (1.5, 62.4), (1.5, 62.4)]) == 2  # XL in GPU memory: step 1 settled (0.6%)
    assert used([(1.0, 10.0), (1.0, 10.0), (1.0, 11.0), (1.0, 11.0)]) == 2  # growth after warm-up is not looked at
    assert used([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0)], most=3) == 3  # never past the most
    assert used([(1.0, 1.0), (2.0, 1.0)], steps=2, most=2) == 2  # most = steps: fixed
    assert used([(5.0, 0.0), (5.0, 0.0)], steps=1) == 2  # step 0 raised the peaks from nothing
    assert used([(1.0, 0.0)], steps=0) == 0  # no warm-up asked: none
    # ranks agree: a rank whose memory settled still warms up when another's grew
    w = WarmUp(1, 4)
    assert w.after_step(0, (1.0,), any_rank=lambda flag: True) and w.steps == 2
    assert not w.after_step(1, (1.0,), any_rank=lambda flag: flag) and w.steps == 2


def test_full_collections_are_timed_and_younger_ones_not():
    import gc

    from benchmarks.worker import FullCollections
    c = FullCollections()
    try:
        garbage = [[] for _ in range(100_000)]
        for a, b in zip(garbage, garbage[1:]):
            a.append(b)  # a long chain to scan
        c.take()  # building it may have run collections of its own
        gc.collect(0)
        gc.collect(1)
        assert c.take() == 0.0
        gc.collect()
        assert c.take() > 0.0
        assert c.take() == 0.0  # taken
    finally:
        c.close()
    gc.collect()
    assert c.take() == 0.0  # no longer listening


def test_max_warmup_below_warmup_is_refused():
    from benchmarks.run import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--warmup", "3", "--max-warmup", "2"])
    assert parse_args(["--warmup", "3"]).max_warmup == 7


def test_capacity_needs_two_steps():
    from benchmarks.run import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--mode", "capacity", "--warmup", "0", "--steps", "1"])
    assert parse_args(["--mode", "capacity", "--warmup", "1", "--steps", "1"]).steps == 1
    assert parse_args(["--warmup", "0", "--steps", "1"]).steps == 1  # throughput: any count


def test_repeated_attempts_run_in_rounds_and_report_their_median(tmp_path):
    from benchmarks.report import latest, throughput_table
    from benchmarks.run import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--repeat", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--mode", "capacity", "--repeat", "2"])
    dry = harness("benchmarks.run", "--backend", "torch,nntile", *TINY, "--repeat", "2", "--dry-run", cwd=tmp_path)
    assert [line.split()[0] for line in dry.splitlines()] == ["torch:plain", "nntile:plain"] * 2  # rounds
    assert "(round 2 of 2)" in dry.splitlines()[-1]
    harness("benchmarks.run", "--backend", "torch", *TINY, "--repeat", "2", "--out", str(tmp_path), cwd=tmp_path)
    recs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2] and {r["rounds"] for r in recs} == {2}
    assert len({r["series"] for r in recs}) == 1 and all(r["status"] == "ok" for r in recs)
    (row,) = latest(recs, "throughput")
    assert row["runs"] == sorted(r["tokens_per_s"] for r in recs) and row["tokens_per_s"] == row["runs"][0]
    # synthetic: the median of three of one series, an older single record of the same setting replaced by it,
    # a later series apart from the first, a failed run counted
    base = {k: recs[0][k] for k in ("mode", "backend", "variant", "config", "precision", "batch", "seq", "gpus",
                                    "params")}
    runs = [dict(base, status="ok", tokens_per_s=t, series="s1") for t in (30.0, 10.0, 20.0)]
    failed = dict(base, status="error", tokens_per_s=None, series="s1")
    (m,) = latest([dict(base, status="ok", tokens_per_s=99.0)] + runs + [failed], "throughput")
    assert m["tokens_per_s"] == 20.0 and m["runs"] == [10.0, 20.0, 30.0] and m["runs_failed"] == 1
    assert "20 (median of 3: 10-30, 1 failed)" in throughput_table([m])
    later = [dict(base, status="ok", tokens_per_s=t, series="s2") for t in (5.0, 7.0)]
    assert latest(runs + later, "throughput")[0]["runs"] == [5.0, 7.0]


def test_report_writes_table_and_plots(bench):
    out = bench["out"]
    stdout = harness("benchmarks.report", str(out), cwd=out)
    assert "wrote results.md" in stdout
    md = (out / "results.md").read_text()
    assert "## Throughput" in md and "## Capacity" in md and "| tiny |" in md
    assert "| torch | plain | tf32 | 4 x 32 | tiny |" in md
    for png in ("throughput.png", "capacity.png", "loss.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_sets_nntile_beside_each_peers_fastest_variant_with_numerics():
    """Per model family: every nntile variant, each peer's fastest variant, numerics other than fp32 in bold with the
    plan named; records from before the model and numerics fields read as Hugging Face's model, their numerics
    from the variant or the plan."""
    from benchmarks.report import numerics_text, peers, peers_table, throughput_table
    base = {"mode": "throughput", "config": "xl", "params": 1557611200, "precision": "bf16", "gpus": 1, "batch": 8,
            "seq": 1024, "status": "ok", "step_s": 0.3, "warmup": 2, "warmup_used": 2}
    fp32 = {"matmul": "bf16", "master": "fp32", "moments": "fp32"}

    def row(backend, variant, tokens, model="hf", **kw):
        return dict(base, backend=backend, variant=variant, model=model, tokens_per_s=tokens,
                    **{"numerics": fp32, **kw})
    rows = [row("nntile", "plain", 28000.0, numerics=dict(fp32, by="the memory plan"), host_waits=[9, 9, 1, 1, 2]),
            row("torch", "plain", 23000.0), row("torch", "compile", 38900.0, compile_s=95.2),
            row("fsdp2", "plain", 25000.0), row("fsdp2", "compile", 24000.0),
            row("nntile", "useropt", 9900.0, model="nanogpt"),
            row("torch", "compile+useropt", 42900.0, model="nanogpt"),
            row("fsdp", "plain", 20000.0, model="hf-tanh"),  # no nntile row: no group
            row("deepspeed", "offload", 1.0, status="error")]
    groups = peers(rows)
    assert [(g[0][0], [(r["backend"], r["variant"]) for r in g[1]]) for g in groups] == [
        ("hf", [("torch", "compile"), ("nntile", "plain"), ("fsdp2", "plain")]),
        ("nanogpt", [("torch", "compile+useropt"), ("nntile", "useropt")])]
    table = peers_table(groups)
    assert "| torch | compile (fastest of 2) | master fp32, moments fp32 | 38,900 | 0.300 | 95 | - | 1.00x |" in table
    assert "| nntile | plain | master fp32, moments fp32 (plan) | 28,000 | 0.300 | - | 2 | 0.72x |" in table
    assert "| nanogpt | xl bf16 | 1 | 8 x 1024 | nntile | useropt |" in table and "| 0.23x |" in table
    # the plan's compact numerics, in the row; older records without the field
    compact = row("nntile", "plain", 1.0, numerics={"matmul": "bf16", "master": "bf16 (blocks' matmul weights)",
                                                    "moments": "bf16", "by": "the memory plan"})
    assert numerics_text(compact) == "master **bf16 (blocks' matmul weights)**, moments **bf16** (plan)"
    old = {k: v for k, v in row("nntile", "bf16state+stepbwd", 1.0).items() if k not in ("model", "numerics")}
    assert numerics_text(old) == "master fp32, moments **bf16**"
    old_plan = dict(old, variant="plain", env={"plan": {"state_dtype": "bfloat16", "master_dtype": "float32"}})
    assert numerics_text(old_plan) == "master fp32, moments **bf16** (plan)"
    assert numerics_text({k: v for k, v in row("fsdp2", "plain", 1.0).items() if k != "numerics"}) == \
        "master fp32, moments fp32"
    assert "| hf | xl | 1.56B | nntile | bf16state+stepbwd | bf16 | master fp32, moments **bf16** |" in \
        throughput_table([old])


def test_capacity_table_compares_nntile_with_each_peer_at_equal_numerics():
    """Issue 39: each peer's largest model with the numerics it used (its own memory savers: CPU offload, torchao's
    low-bit state), nntile's largest at fp32 state and at compact state, and nntile / peer where the numerics
    match; a ladder that ended before any failure is a lower bound."""
    from benchmarks.report import capacity, capacity_compare, capacity_compare_table, capacity_table
    fp32 = {"matmul": "bf16", "master": "fp32", "moments": "fp32"}

    def rec(backend, variant, config, status="ok", numerics=None):
        return {"mode": "capacity", "backend": backend, "variant": variant, "model": "hf", "config": config,
                "params": param_count(config, 1024), "precision": "bf16", "batch": 8, "seq": 1024, "gpus": 1,
                "status": status, "reason": None if status == "ok" else "CUDA out of memory", "step_s": 1.0,
                "numerics": numerics}
    compact = {"matmul": "bf16", "master": "bf16 (blocks' matmul weights)", "moments": "bf16",
               "by": "the memory plan"}
    records = [rec("fsdp2", "ckpt+offload", "9.4b", numerics=dict(fp32, state_on="cpu")),
               rec("fsdp2", "ckpt+offload", "13b", "oom"),  # failed before its worker said: from the variant
               rec("torch", "ao8bit", "6.7b", numerics=dict(fp32, moments="uint8 block-wise (256)", state_on="gpu")),
               rec("torch", "ao8bit", "9.4b", "oom"),
               rec("deepspeed", "ckpt+offload", "20b", numerics=dict(fp32, state_on="cpu")),
               rec("deepspeed", "ckpt+offload", "30b", "error"),
               rec("nntile", "fp32state", "30b", numerics=dict(fp32, by="the memory plan")),
               rec("nntile", "fp32state", "37b", "oom"),
               rec("nntile", "plain", "58b", numerics=compact)]  # the ladder's top: none failed
    caps = capacity(records)
    table = capacity_table(caps)
    assert "| hf | fsdp2 | ckpt+offload | bf16 | 8 x 1024 | 9.4b | 9.41B | 1.00 | 13b (12.85B): oom: CUDA out of " \
           "memory | master fp32, moments fp32, state on CPU |" in table
    assert "| master fp32, moments **uint8 block-wise (256)** |" in table
    compare = capacity_compare_table(capacity_compare(caps))
    lines = compare.splitlines()
    assert lines[2].startswith("| hf | bf16 | 8 x 1024 | nntile | plain | master **bf16 (blocks' matmul weights)**, "
                               "moments **bf16** (plan) | 58b (58.41B), none failed | - | - |")
    assert "| deepspeed | ckpt+offload | master fp32, moments fp32, state on CPU | 20b (20.25B) | fp32state: 30b " \
           "(29.97B) | 1.48x |" in compare
    assert "| fsdp2 | ckpt+offload | master fp32, moments fp32, state on CPU | 9.4b (9.41B) | fp32state: 30b " \
           "(29.97B) | 3.18x |" in compare
    assert "| torch | ao8bit | master fp32, moments **uint8 block-wise (256)** | 6.7b (6.65B) | no nntile run at " \
           "these numerics | - |" in compare
    assert ("- hf bf16, batch 8 x 1024: nntile's largest at fp32 state 30b (29.97B) (fp32state); at compact state "
            "58b (58.41B), none failed (plain, master bf16, moments bf16)") in compare
    # a peer whose ladder ended first: nntile / peer is at most the ratio shown
    caps = capacity(records + [rec("deepspeed", "ckpt+offload", "30b")])
    assert "| 30b (29.97B), none failed | fp32state: 30b (29.97B) | <= 1.00x |" in \
        capacity_compare_table(capacity_compare(caps))


def test_table_shows_a_mean_the_median_hides_and_a_longer_warm_up():
    from benchmarks.report import throughput_table
    base = {"config": "xl", "params": 1557611200, "backend": "nntile", "variant": "plain", "precision": "bf16",
            "gpus": 1, "batch": 8, "seq": 1024, "status": "ok", "tokens_per_s": 29229.0, "tflops": 300.7, "mfu": 0.38,
            "peak_gpu_bytes": 2**36, "peak_host_bytes": 2**30, "loss": 10.8955, "warmup": 2}
    even = dict(base, step_s=0.268, step_mean_s=0.267, warmup_used=2)
    uneven = dict(base, step_s=0.280, step_mean_s=0.318, warmup_used=4, backend="torch")
    table = throughput_table([even, uneven])
    assert "| 0.268 |" in table  # even steps: the median alone
    assert "| 0.280 (mean 0.318) (4 warm-up) |" in table
    assert "| 0.280 |" in throughput_table([dict(base, step_s=0.280)])  # records from before these fields


def test_backend_and_variant_parsing():
    assert parse_backends("torch,fsdp:offload+ckpt,deepspeed", None) == [
        ("torch", "plain"), ("fsdp", "ckpt+offload"), ("deepspeed", "offload")]
    assert parse_backends("deepspeed:gpu,deepspeed:nvme", None) == [("deepspeed", "gpu"), ("deepspeed", "nvme")]
    assert parse_backends("torch,fsdp2", ["plain", "offload"]) == [
        ("torch", "plain"), ("fsdp2", "plain"), ("fsdp2", "offload")]
    with pytest.raises(ValueError, match="no variant flag"):
        parse_backends("torch:offload", None)
    assert parse_backends("nntile:hostckpt", None) == [("nntile", "hostckpt")]
    with pytest.raises(ValueError, match="change the memory plan"):
        parse_backends("nntile:hostckpt+ckpt", None)
    with pytest.raises(ValueError, match="unknown backend"):
        parse_backends("megatron", None)
    assert parse_backends("torch:compile+useropt,fsdp:compile,fsdp2:useropt+compile,nntile:useropt", None) == [
        ("torch", "compile+useropt"), ("fsdp", "compile"), ("fsdp2", "compile+useropt"), ("nntile", "useropt")]
    assert parse_backends("nntile:useropt+ckpt", None) == [("nntile", "ckpt+useropt")]  # by hand: no plan
    with pytest.raises(ValueError, match="torch.optim.AdamW"):
        parse_backends("nntile:useropt+bf16state", None)  # moments of nt.optim.AdamW's
    with pytest.raises(ValueError, match="no variant flag"):
        parse_backends("nntile:compile", None)
    assert parse_backends("nntile:fp32state", None) == [("nntile", "fp32state")]  # the plan held to fp32 numerics
    with pytest.raises(ValueError, match="one of them"):
        parse_backends("nntile:fp32state+bf16master", None)
    with pytest.raises(ValueError, match="change the memory plan"):
        parse_backends("nntile:fp32state+bf16state", None)
    with pytest.raises(ValueError, match="no variant flag"):
        parse_backends("deepspeed:compile", None)
    assert machine_name("NVIDIA H200") == "h200" and machine_name("NVIDIA H100 80GB HBM3") == "h100"
    assert machine_name(None) == "cpu"
    # Exact counts of the named shapes (tied LM head), e.g. GPT-2 small and XL.
    assert param_count("gpt2", 1024) == 124_439_808 and param_count("xl", 1024) == 1_557_611_200
    assert CONFIGS["20b"].heads == 48 and 19e9 < param_count("20b", 1024) < 21e9
    # nanoGPT's vocab: GPT-2's padded to 50304, the rest the same
    assert param_count("xl", 1024, "nanogpt") == 1_557_611_200 + (50304 - 50257) * 1600
    assert param_count("xl", 1024, "hf-tanh") == param_count("xl", 1024)


def test_model_and_compile_options_are_checked():
    from benchmarks.run import parse_args
    assert parse_args([]).models == ["hf"]
    assert parse_args(["--model", "hf, nanogpt"]).models == ["hf", "nanogpt"]
    with pytest.raises(SystemExit):
        parse_args(["--model", "gpt3"])
    with pytest.raises(SystemExit):  # a GPT-2 shape under a Llama model (tests/test_bench_llama.py says more)
        parse_args(["--model", "llama", "--config", "xl"])
    with pytest.raises(SystemExit):  # the first step compiles: it must not be timed
        parse_args(["--backend", "torch:compile", "--warmup", "0"])
    assert parse_args(["--backend", "torch:compile", "--warmup", "1"]).pairs == [("torch", "compile")]


def test_dry_run_lists_every_model(tmp_path):
    dry = harness("benchmarks.run", "--backend", "nntile,torch:compile", "--model", "hf,nanogpt", "--config", "xl",
                  "--dry-run", cwd=tmp_path)
    assert dry.splitlines() == ["nntile:plain hf xl bf16", "torch:compile hf xl bf16", "nntile:plain nanogpt xl bf16",
                                "torch:compile nanogpt xl bf16"]


def test_nntile_meta_build_and_bf16_state_variant(tmp_path):
    """--init-device meta (what large models get on a GPU): built module by module into tiles with Hugging
    Face's init; bf16state: AdamW with bf16 moments; offload: those updates on CPU workers. Trains from about
    ln(vocab); other backends refuse meta."""
    harness("benchmarks.run", "--backend", "nntile:stepbwd+bf16state+offload,torch", *TINY, "--init-device", "meta",
            "--offload-fraction", "0.5", "--model", "hf,nanogpt", "--out", str(tmp_path), cwd=tmp_path)
    recs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["model"] for r in recs] == ["hf", "hf", "nanogpt", "nanogpt"]
    for n, t in (recs[:2], recs[2:]):  # each family's own init, module by module
        assert (n["backend"], n["variant"], n["status"]) == ("nntile", "bf16state+offload+stepbwd", "ok"), n["reason"]
        assert n["env"]["init_device"] == "meta" and n["env"]["params_counted"] == n["params"]
        assert 5.0 < n["losses"][0] < 6.1 and all(math.isfinite(v) for v in n["losses"])
        assert n["numerics"]["moments"] == "bf16" and "by" not in n["numerics"]
        assert t["status"] == "unavailable" and "nntile only" in t["reason"]


def test_a_stall_report_is_the_reason_of_a_failed_attempt():
    from benchmarks.run import last_error_line
    log = ("setup: 8.0 s\nnntile_torch: no StarPU task finished for 60.0 s (812 tasks pending, 3 ready). Memory nodes: "
           "NUMA 0 (no limit); CUDA 0 125.8 of 125.8 GiB used; ...\n[starpu][watchdog_func] Crashing the process\n")
    assert last_error_line(log).startswith("stalled: nntile_torch: no StarPU task finished for 60.0 s")
    assert last_error_line("x\nRuntimeError: boom\nmore") == "RuntimeError: boom"


def test_a_failed_attempt_keeps_how_far_it_came():
    from benchmarks.run import log_progress, progress_words, signal_reason
    log = ("cmd\n{}\nsetup: 87.2 s (weights built on meta)\n[transformers] note\nstep 0: 6.705 s, loss 11.8470\n"
           "step 1: 58.483 s, loss 11.9506, peak GPU 130.2 GiB, peak tiles 101.5 GiB, peak host 40.0 GiB\n"
           "step 2: 49.952 s, loss nan\n")
    prog = log_progress(log)
    assert prog["setup_s"] == 87.2 and prog["step_times"] == [6.705, 58.483, 49.952]
    assert prog["losses"][:2] == [11.847, 11.9506] and math.isnan(prog["losses"][2])
    assert prog["peak_gpu_bytes"] == int(130.2 * 2**30) and prog["peak_tile_bytes"] == int(101.5 * 2**30)
    assert progress_words(prog) == "setup 87 s, 3 steps (last 50.0 s)"
    assert progress_words(log_progress("setup: 3.0 s\n")) == "setup 3 s, no step finished"
    assert progress_words(log_progress("Traceback\n")) == ""
    ds = "cmd\nDeepSpeedCPUAdam: loading (compiled on first use)\nW1201 Received 15 death signal\n"
    assert progress_words(log_progress(ds)) == "during 'DeepSpeedCPUAdam: loading (compiled on first use)'"
    slow = log + ("step 3 still running after 30 s; memory nodes: NUMA 0: 1.0 of 2.0 GiB used, tile buffers 0.5 GiB\n"
                  "step 3 still running after 60 s; memory nodes: NUMA 0: 2.0 of 2.0 GiB used, tile buffers 1.5 GiB\n")
    assert log_progress(slow)["memory_nodes"] == "NUMA 0: 2.0 of 2.0 GiB used, tile buffers 1.5 GiB"
    stall = ("nntile_torch: no StarPU task finished for 60.0 s (9 tasks pending, 0 ready). Memory nodes: NUMA 0: 2.0 "
             "of 2.0 GiB used, tile buffers 2.0 GiB (valid 1.0). A memory node at its limit is ...\n")
    assert log_progress(stall)["memory_nodes"] == "NUMA 0: 2.0 of 2.0 GiB used, tile buffers 2.0 GiB (valid 1.0)"
    advised = slow + ("step 3 still running after 120 s; memory nodes: NUMA 0: 2.0 of 2.0 GiB used, other 1.2 GiB. "
                      "At their limit: NUMA 0. Memory held outside live tiles ...\n")
    assert log_progress(advised)["memory_nodes"] == "NUMA 0: 2.0 of 2.0 GiB used, other 1.2 GiB"
    assert log_progress(log)["memory_nodes"] is None
    assert signal_reason(-11) == "killed by signal 11 (SIGSEGV, a crash in native code)"
    assert signal_reason(-9).startswith("killed by signal 9 (SIGKILL, out of host memory?")
    assert signal_reason(1) is None and signal_reason(0) is None and signal_reason(None) is None


def test_attempts_that_differ_only_in_settings_stay_apart():
    from benchmarks.report import latest, variant
    from benchmarks.run import attempt_settings
    opts = {"tile_size": None, "host_memory_limit": "105GiB", "offload_fraction": 1.0, "scheduler": None}
    env = {"NNTILE_EVICT_WONT_USE_FIRST": "1", "STARPU_HOME": "/x", "PATH": "/bin", "STARPU_SCHED": "dmda",
           "STARPU_PREFIX": "/opt/x"}
    assert attempt_settings(opts, ["stepbwd"], env) == {"host_memory_limit": "105GiB",
                                                        "NNTILE_EVICT_WONT_USE_FIRST": "1", "STARPU_SCHED": "dmda"}
    assert attempt_settings(opts, ["offload"], {})["offload_fraction"] == 1.0
    assert attempt_settings(None, [], {}) == {}
    base = {"mode": "throughput", "backend": "nntile", "variant": "stepbwd", "config": "13b", "precision": "bf16",
            "batch": 2, "seq": 1024, "gpus": 1}
    a, b = dict(base, settings={}), dict(base, settings={"NNTILE_EVICT_WONT_USE_FIRST": "1"})
    assert len(latest([a, b], "throughput")) == 2 and len(latest([a, dict(a)], "throughput")) == 1
    assert variant(a) == "stepbwd" and variant(b) == "stepbwd NNTILE_EVICT_WONT_USE_FIRST=1"
    assert variant(dict(b, settings={**b["settings"], "STARPU_PREFIX": "/opt/x"})) == variant(b)  # older records


def test_a_slow_nntile_step_reports_its_memory_nodes_in_the_log(capsys):
    """A step past `after` seconds prints the memory nodes (once per doubling), in the form log_progress() keeps
    for an attempt that times out; a step that ends before that prints nothing."""
    import time
    from benchmarks.run import log_progress
    from benchmarks.worker import SlowStepReport
    calls = []
    slow = SlowStepReport(lambda: calls.append(1) or "NUMA 0: 2.0 of 2.0 GiB used", after=0.3)
    try:
        slow.begin(0)
        slow.end()
        time.sleep(1.2)
        assert calls == []
        slow.begin(3)
        time.sleep(2.5)
        slow.end()
    finally:
        slow.stop()
    out = capsys.readouterr().out
    assert 1 <= len(calls) <= 3 and out.count("step 3 still running after") == len(calls), out
    assert log_progress(out)["memory_nodes"] == "NUMA 0: 2.0 of 2.0 GiB used"


def test_code_commit_from_git_or_from_the_carried_file(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_CODE_COMMIT", raising=False)
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                         check=False)
    if git.returncode == 0:  # a checkout (CI clones one): HEAD, marked when tracked files differ
        assert code_commit().split("+")[0] == git.stdout.strip()
    # A copy of the tree without .git (the GPU machine's): what dev/gpu_machine/prepare_carry.sh wrote, or nothing.
    assert code_commit(str(tmp_path)) is None
    (tmp_path / ".carry").mkdir()
    (tmp_path / ".carry" / "code_commit").write_text("abc1234+changes\n")
    assert code_commit(str(tmp_path)) == "abc1234+changes"
    monkeypatch.setenv("BENCH_CODE_COMMIT", "def5678")  # dev/gpu_machine/h200.sh's, which wins over a stale .git
    assert code_commit(str(tmp_path)) == code_commit() == "def5678"


def test_capacity_ladder_climbs_in_steps_of_at_most_1_5x():
    """Issue 39: from 6.7b to the largest GPT-2 shape, consecutive capacity-ladder sizes differ by at most 1.5x, so a
    capacity result says the largest size within 1.5x; the new rungs keep head dim 128, and their counts are the
    model's own (built on meta, as the harness's params_counted)."""
    import torch
    import transformers
    from benchmarks.configs import CAPACITY_LADDER, hf_config
    assert CAPACITY_LADDER == sorted(CAPACITY_LADDER, key=lambda n: param_count(n, 1024))
    top = max((n for n, s in CONFIGS.items() if s.family == "gpt2" and not n.startswith("wide")),
              key=lambda n: param_count(n, 1024))
    assert CAPACITY_LADDER[-1] == top and 55e9 < param_count(top, 1024) < 65e9
    ladder = CAPACITY_LADDER[CAPACITY_LADDER.index("6.7b"):]
    ratios = {f"{a}->{b}": param_count(b, 1024) / param_count(a, 1024) for a, b in zip(ladder, ladder[1:])}
    assert all(1 < r <= 1.5 for r in ratios.values()), ratios
    assert (CONFIGS["45b"].layers, CONFIGS["45b"].hidden, CONFIGS["45b"].heads) == (56, 8192, 64)
    for name in ("9.4b", "15.5b", "37b", "45b", "58b"):
        s = CONFIGS[name]
        assert s.head_dim == 128 and s.heads * 128 == s.hidden, name
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(hf_config(name, 1024))
        assert sum(p.numel() for p in model.parameters()) == param_count(name, 1024), name


def test_memory_saver_variants_parse():
    """The peers' own memory savers: FSDP2's CPUOffloadPolicy and DeepSpeed's offloads with activation
    checkpointing, torchao's optimizers on torch and fsdp2 (one of them; aobf16sr beside a low-bit one), and the
    combinations that cannot mean anything refused with the reason."""
    assert parse_backends("fsdp2:offload+ckpt,deepspeed:offload+ckpt,deepspeed:nvme+ckpt,deepspeed:ckpt", None) == [
        ("fsdp2", "ckpt+offload"), ("deepspeed", "ckpt+offload"), ("deepspeed", "ckpt+nvme")]
    assert parse_backends("torch:ao8bit,torch:ao4bit+aobf16sr,torch:aofp8+ckpt,torch:aobf16sr,torch:aooffload+ckpt,"
                          "fsdp2:offload+ckpt+ao8bit", None) == [
        ("torch", "ao8bit"), ("torch", "ao4bit+aobf16sr"), ("torch", "aofp8+ckpt"), ("torch", "aobf16sr"),
        ("torch", "aooffload+ckpt"), ("fsdp2", "ao8bit+ckpt+offload")]
    for bad, why in [("torch:ao8bit+ao4bit", "one of them"), ("torch:aooffload+aobf16sr", "not with aobf16sr"),
                     ("torch:useropt+ao8bit", "useropt"), ("fsdp2:aooffload", "for one GPU"),
                     ("fsdp:ao8bit", "no variant flag"), ("deepspeed:ao4bit", "no variant flag"),
                     ("nntile:ao8bit", "no variant flag")]:
        with pytest.raises(ValueError, match=why):
            parse_backends(bad, None)
    from benchmarks.configs import peer_numerics
    assert peer_numerics("fsdp2", ["ckpt", "offload"]) == {"master": "fp32", "moments": "fp32", "state_on": "cpu"}
    assert peer_numerics("deepspeed", ["ckpt", "nvme"])["state_on"] == "nvme"
    assert peer_numerics("deepspeed", ["gpu"])["state_on"] == "gpu"
    assert peer_numerics("torch", ["ao4bit", "aobf16sr"]) == {
        "master": "bf16 (stochastic rounding)", "moments": "4-bit block-wise (128)", "state_on": "gpu"}
    assert peer_numerics("torch", ["aobf16sr"])["moments"] == "bf16"
    assert peer_numerics("torch", ["aooffload"]) == {"master": "fp32", "moments": "fp32", "state_on": "cpu"}


@pytest.mark.parametrize("model", ["hf", "nanogpt"])
def test_checkpointing_flag_is_recorded_as_what_it_did(model):
    """ckpt (every peer, beside their offloads) turns checkpointing on and the record says how: a flag that did
    nothing would read as a memory saver that was there."""
    from benchmarks import worker
    worker.BUILT.clear()
    net = worker.build_model({"seed": 0, "model": model, "config": "tiny", "seq": 32, "flags": ["ckpt"]}, "cpu")
    done = worker.BUILT["checkpointing"]
    if model == "hf":
        assert net.is_gradient_checkpointing and "gradient_checkpointing_enable" in done
    else:
        assert "torch.utils.checkpoint" in done


def test_torchao_variants_without_torchao_are_unavailable_with_how_to_install(monkeypatch):
    """No torchao: the harness records the attempt as unavailable (never a crash), saying how to install it; a
    torchao that is there but does not import is unavailable in the worker, with the same advice."""
    import importlib.util
    from types import SimpleNamespace
    from benchmarks import run
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    args = SimpleNamespace(nvme_path=None, batch=4)
    a = {"backend": "torch", "variant": "ao8bit", "precision": "bf16"}
    assert "pip install --no-deps torchao" in run.precheck(a, True, args, 1)
    # with torchao there (whether or not this machine has it): the harness's own checks of the variants
    present = SimpleNamespace(name="torchao")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: present if name == "torchao" else real(name, *a))
    assert "needs a GPU" in run.precheck(dict(a, variant="aooffload"), True, args, 1)
    assert "--precision bf16 only" in (run.precheck(dict(a, variant="aobf16sr", precision="tf32"), True, args, 1))
    monkeypatch.undo()
    # the worker's own check, where the harness's found a torchao that does not import (built for another torch)
    import torch
    from benchmarks import worker
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # its import raises ImportError
    spec = {"flags": ["ao8bit"], "lr": 1e-4, "weight_decay": 0.01, "precision": "bf16"}
    with pytest.raises(worker.Unavailable, match="torchao not importable .*pip install --no-deps torchao"):
        worker.torchao_optimizer(spec, [torch.nn.Parameter(torch.zeros(4096))], False)


TORCHAO_PIN = "torchao==0.18.0"  # a pure-Python wheel that imports with the torch scripts/setup.sh installs


def test_torchao_8bit_adamw_trains_on_cpu(tmp_path, monkeypatch):
    """torch:ao8bit at the tiny config on the CPU (torchao compiles its step with inductor's C++ backend): the same
    weights and batches as torch's AdamW, so the same first loss, then 8-bit moments recorded in the numerics.
    torchao is a peer's optimizer, not nntile's: where it is not installed, this test installs it into a folder of
    its own (pip, --no-deps) that only the harness it starts sees, so the rest of the suite runs without it."""
    import importlib.util
    if importlib.util.find_spec("torchao") is None:
        site = tmp_path / "site"
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--target", str(site), TORCHAO_PIN], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"pip install {TORCHAO_PIN} failed:\n{r.stdout}\n{r.stderr}"
        monkeypatch.setenv("PYTHONPATH", str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    harness("benchmarks.run", "--backend", "torch,torch:ao8bit", *TINY, "--out", str(out), cwd=tmp_path,
            timeout=600)
    recs = {r["variant"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert recs["ao8bit"]["status"] == "ok", recs["ao8bit"]["reason"]
    opt = recs["ao8bit"]["env"]["optimizer"]
    assert opt.startswith("torchao ") and "AdamW8bit" in opt
    assert recs["ao8bit"]["numerics"] == {"matmul": "tf32", "master": "fp32", "moments": "uint8 block-wise (256)",
                                          "state_on": "cpu"}  # a CPU-only run's state is in host RAM
    assert recs["ao8bit"]["losses"][0] == pytest.approx(recs["plain"]["losses"][0], rel=1e-6)
    assert all(math.isfinite(v) for v in recs["ao8bit"]["losses"])


def test_nvme_param_swap_buffers_hold_every_parameter():
    """DeepSpeed's NVMe parameter swap failed on the H200 with its defaults: buffers smaller than the 2.7B token
    embedding, and all of them taken by 1e9 live parameters. The settings hold the largest parameter of each
    config, and the most swapped parameters that fit in the live plus prefetched count (consecutive ones, as
    the blocks run) fit in the buffers with the two embeddings."""
    import torch
    import transformers
    from benchmarks.configs import hf_config
    from benchmarks.worker import nvme_param_swap
    for name in ("tiny", "xl", "2.7b", "6.7b", "13b"):
        swap = nvme_param_swap(name, 1024)
        op, zero = swap["offload_param"], swap["zero"]
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(hf_config(name, 1024))
        swapped = [p.numel() for n, p in model.named_parameters()
                   if ".h." in n and p.numel() > zero["stage3_param_persistence_threshold"]]
        assert max(p.numel() for p in model.parameters()) <= op["buffer_size"], name
        limit = (zero["stage3_max_live_parameters"] + zero["stage3_prefetch_bucket_size"]
                 + zero["stage3_max_reuse_distance"])
        most = 0
        for i in range(len(swapped)):
            total, n = 0, 0
            for k in swapped[i:]:
                if total + k > limit:
                    break
                total, n = total + k, n + 1
            most = max(most, n)
        assert 8 <= most and most + 1 + 2 <= op["buffer_count"], (name, most)
    assert nvme_param_swap("2.7b", 1024)["offload_param"]["buffer_size"] == 50257 * 2560


def test_dropout_reaches_every_family_and_the_attempt_name():
    """--dropout sets every dropout of the model (HF GPT-2's three, nanoGPT's one knob, the Llama family's attention
    one): a dropout benchmark that ran without dropout would compare a step with itself."""
    import torch

    from benchmarks import models
    from benchmarks.configs import MODEL_FAMILY
    tiny = {"gpt2": "tiny", "llama": "llama-tiny", "qwen2": "qwen2-tiny"}
    for model in models.MODELS:
        for p in (0.0, 0.15):
            net = models.build(model, tiny[MODEL_FAMILY[model]], 32, dropout=p)
            rates = {m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)}
            if model == "nanogpt":
                assert net.config.dropout == p and rates == {p}, model
            elif MODEL_FAMILY[model] == "gpt2":
                c = net.config
                assert (c.attn_pdrop, c.resid_pdrop, c.embd_pdrop) == (p, p, p) and rates == {p}, model
            else:
                assert net.config.attention_dropout == p, model
    bad = subprocess.run([sys.executable, "-m", "benchmarks.run", "--dropout", "1.0", "--dry-run"],
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert bad.returncode == 2 and "--dropout must be in [0, 1)" in bad.stderr


def test_attention_dropout_alone_reaches_every_family_and_the_attempt_name():
    """--dropout-on attention sets the attention's dropout alone (on its probabilities: HF GPT-2's attn_pdrop,
    nanoGPT's SDPA dropout_p and attn_dropout, the Llama family's attention dropout), every other dropout 0: the
    issue's "attention dropout 0.1" step, apart from the residual and embedding dropouts. The attempt's name says
    which; a misspelt choice is an error."""
    import argparse

    import torch

    from benchmarks import models
    from benchmarks.configs import MODEL_FAMILY
    from benchmarks.run import dropout_suffix
    tiny = {"gpt2": "tiny", "llama": "llama-tiny", "qwen2": "qwen2-tiny"}
    p = 0.15
    for model in models.MODELS:
        net = models.build(model, tiny[MODEL_FAMILY[model]], 32, dropout=p, dropout_on="attention")
        if model == "nanogpt":
            attn = [b.attn for b in net.transformer.h]
            assert all(a.dropout == p and a.attn_dropout.p == p and a.resid_dropout.p == 0.0 for a in attn), model
            assert net.transformer.drop.p == 0.0 and all(b.mlp.dropout.p == 0.0 for b in net.transformer.h), model
        elif MODEL_FAMILY[model] == "gpt2":
            c = net.config
            assert (c.attn_pdrop, c.resid_pdrop, c.embd_pdrop) == (p, 0.0, 0.0), model
            assert all(b.attn.attn_dropout.p == p and b.attn.resid_dropout.p == 0.0 for b in net.transformer.h), model
            assert net.transformer.drop.p == 0.0, model
        else:
            assert net.config.attention_dropout == p, model
        rates = {m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)}
        assert rates <= {0.0, p}, (model, rates)
    with pytest.raises(ValueError, match="dropout_on must be one of all, attention"):
        models.build("hf", "tiny", 32, dropout=p, dropout_on="residual")
    names = [dropout_suffix(argparse.Namespace(dropout=d, dropout_on=on))
             for d, on in ((0.0, "all"), (0.1, "all"), (0.1, "attention"), (0.0, "attention"))]
    assert names == ["", "_drop0.1", "_attndrop0.1", ""]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.run", "--dropout-on", "residual", "--dry-run"],
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert bad.returncode == 2 and "--dropout-on" in bad.stderr


def test_report_sets_the_plans_predicted_step_beside_the_measured_one():
    """Each planned nntile row: the plan's predicted step, the measured one, their ratio and whether it is within the
    plan's 15%; rows without a plan (peers, nntile by hand) and failed ones are left out."""
    from benchmarks.report import predictions, predictions_table
    plan = {"host_blocks": 2, "blocks": 48, "state_dtype": "bfloat16", "master_dtype": "float32",
            "checkpointing": True, "step_in_backward": True, "predicted": {"step_s": 0.25}, "rates": "H200 defaults"}
    base = {"mode": "throughput", "config": "xl", "params": 1557611200, "precision": "bf16", "gpus": 1, "batch": 8,
            "seq": 1024, "status": "ok", "model": "hf", "variant": "plain", "backend": "nntile"}
    rows = [dict(base, step_s=0.3, env={"plan": plan}),
            dict(base, step_s=0.26, model="nanogpt", env={"plan": {**plan, "rates": None}}),
            dict(base, step_s=0.3, backend="torch", env={}),
            dict(base, step_s=0.3, variant="stepbwd", env={"plan": None}),
            dict(base, step_s=None, status="error", model="hf-tanh", env={"plan": plan})]
    preds = predictions(rows)
    assert [(r["model"], p) for r, p, _ in preds] == [("hf", 0.25), ("nanogpt", 0.25)]
    table = predictions_table(preds)
    assert ("| hf | xl bf16 | 8 x 1024 | plain | 2/48 host blocks, moments bfloat16, master float32, checkpointing, "
            "updates in backward | 0.250 | 0.300 | 1.20 | **no** | H200 defaults |") in table
    assert "| 0.250 | 0.260 | 1.04 | yes | not recorded |" in table
