"""Smoke tests: the benchmarks and the main-job example run end to end at a tiny size and write their results."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=env, check=True, capture_output=True,
                          text=True, timeout=300)


def test_gemm_benchmark(tmp_path):
    run("benchmarks.gemm", "--size", "300", "--tiles", "128", "--reps", "2", "--warmup", "1", "--overhead-tasks",
        "500", "--out", "g.json", tmp_path=tmp_path)
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["gemm"][0]["rel_error"] < 1e-5 and d["gemm"][0]["nntile_tflops"] > 0
    assert d["task_overhead"][0]["tasks_per_s"] > 0


def test_linear_benchmark(tmp_path):
    run("benchmarks.linear", "--layers", "2", "--width", "96", "--rows", "70", "--tile", "32", "--precision", "fp32",
        "--reps", "2", "--warmup", "1", "--out", "l.json", tmp_path=tmp_path)
    d = json.loads((tmp_path / "l.json").read_text())
    assert d["nntile_s"] > 0 and d["torch_s"] > 0


def test_generate_benchmark(tmp_path):
    """benchmarks.generate on the tiny GPT-2 and Llama shapes: in fp32 the converted model's greedy tokens are torch's,
    with and without the cache, one host wait per token or so (reading each token's logits)."""
    for config in ("tiny", "llama-tiny"):
        run("benchmarks.generate", "--config", config, "--batch", "2", "--prompt", "9", "--new", "5", "--json",
            "g.json", tmp_path=tmp_path)
        rows = json.loads((tmp_path / "g.json").read_text())["rows"]
        assert [r["cache"] for r in rows] == [True, False]
        for r in rows:
            assert r["tokens_agree"] == 1.0 and r["torch_tokens_s"] > 0 and r["nntile_tokens_s"] > 0, r
            assert r["host_waits_per_token"] <= 1.5, r


def test_submission_benchmark(tmp_path):
    tasks = {}
    for model in ("hf", "nanogpt"):
        run("benchmarks.submission", "--model", model, "--layers", "2", "--width", "16", "--steps", "3", "--out",
            f"{model}.json", tmp_path=tmp_path)
        d = json.loads((tmp_path / f"{model}.json").read_text())
        assert d["model"] == model and d["tasks_per_step"] > 0
        assert d["forward_backward_s"] > 0 and d["optimizer_step_s"] > 0 and d["us_per_task"] > 0
        assert 0 < d["forward_backward_cpu_s"] and d["torch_forward_backward_s"] > 0 and d["torch_optimizer_step_s"] > 0
        tasks[model] = (d["params"], d["tasks_per_step"])
    # 12 parameters per block, two embeddings, the final norm's two (both heads tied); the same tasks per step
    assert tasks["hf"] == tasks["nanogpt"] and tasks["hf"][0] == 2 * 12 + 4


def test_decode_submission_benchmark(tmp_path):
    run("benchmarks.decode_submission", "--layers", "2", "--width", "16", "--batch", "2", "--prompt", "5", "--new", "3",
        "--rounds", "1", "--out", "d.json", tmp_path=tmp_path)
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["layers"] == 2 and d["ms_per_token"] > 0 and d["torch_ms_per_token"] > 0
    assert 2 * 10 <= d["tasks_per_token"] <= 2 * 14 + 8, d  # about a dozen tasks per layer, a few per token


def test_mlp_example(tmp_path):
    out = run("nntile_torch.examples.mlp", "--steps", "5", "--width", "64", "--device", "cpu", "--out", "run",
              tmp_path=tmp_path)
    log = json.loads((tmp_path / "run" / "log.json").read_text())
    assert len(log["steps"]) == 5
    assert all(abs(s["loss"] - s["torch_loss"]) <= 1e-5 * s["torch_loss"] + 1e-7 for s in log["steps"])
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    assert "final loss" in out.stdout


def test_compare_runs(tmp_path):
    """Two training logs on one plot: the last window's mean loss and the gap to the first run, a PNG and a JSON;
    a label count that does not match the logs is refused."""
    from benchmarks.compare_runs import main, moving_average
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    paths = []
    for name, scale in (("a", 1.0), ("b", 1.1)):
        log = {"args": {"name": name}, "steps": [{"step": i, "loss": scale * (5.0 - i / 10)} for i in range(20)]}
        paths.append(str(tmp_path / f"{name}.json"))
        with open(paths[-1], "w") as f:
            json.dump(log, f)
    main(paths + ["--labels", "first", "second", "--window", "5", "--out", str(tmp_path / "c.png"),
                  "--json", str(tmp_path / "c.json")])
    summary = json.load(open(tmp_path / "c.json"))
    first, second = summary["runs"]
    assert first["final_mean_loss"] == pytest.approx(5.0 - 1.7) and first["minus_first"] == 0
    assert second["relative_to_first"] == pytest.approx(0.1) and os.path.getsize(tmp_path / "c.png") > 0
    with pytest.raises(SystemExit):
        main(paths + ["--labels", "only one"])


def test_timeline_summary(tmp_path):
    """benchmarks/timeline.py's arithmetic on a hand-made trace: kernel time as the union over streams, idle time split
    by whether a copy ran, bytes per direction and per bucket."""
    from benchmarks.timeline import plot, report, summarize

    def ev(cat, name, ts_ms, dur_ms, nbytes=None):
        e = {"ph": "X", "cat": cat, "name": name, "ts": ts_ms * 1000.0, "dur": dur_ms * 1000.0}
        if nbytes is not None:
            e["args"] = {"bytes": nbytes}
        return e
    trace = [ev("kernel", "sm90_xmma_gemm_bf16", 0, 40), ev("kernel", "elementwise", 30, 20),  # busy 0-50 ms
             ev("kernel", "adamw_bf16_kernel", 80, 20),                                        # busy 80-100
             ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 40, 20, 2e9),                  # 40-60: 1 idle ms..
             ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 55, 10, 1e9),                  # 55-65
             ev("cpu_op", "aten::mm", 0, 500), {"ph": "i", "name": "marker", "ts": 1},
             ev("cuda_runtime", "cudaHostAlloc", 10, 30), ev("cuda_runtime", "cudaHostAlloc", 60, 10),
             ev("cuda_runtime", "cudaLaunchKernel", 0, 1)]
    s = summarize(trace, bucket_s=0.05)
    assert s["wall_s"] == pytest.approx(0.1)
    assert s["kernel_busy_s"] == pytest.approx(0.07)
    assert s["gpu_idle_s"] == pytest.approx(0.03)
    assert s["gpu_idle_while_copying_s"] == pytest.approx(0.015)  # 50-65 ms
    assert s["gpu_idle_no_copy_s"] == pytest.approx(0.015)
    assert s["h2d_gb"] == pytest.approx(2.0) and s["d2h_gb"] == pytest.approx(1.0)
    assert s["h2d_gbps_when_active"] == pytest.approx(100.0)
    assert s["both_directions_s"] == pytest.approx(0.005)
    assert s["kernel_s_by_kind"] == pytest.approx({"matmul": 0.04, "other": 0.02, "optimizer": 0.02})
    assert s["busy"] == pytest.approx([1.0, 0.4, 0.0])
    assert s["optimizer"] == pytest.approx([0.0, 0.4, 0.0])
    assert s["h2d_gbps"] == pytest.approx([20.0, 20.0, 0.0])  # 1 GB in each 50 ms bucket
    assert s["d2h_gbps"] == pytest.approx([0.0, 20.0, 0.0])
    assert s["runtime_calls"][0] == {"name": "cudaHostAlloc", "count": 2, "s": pytest.approx(0.04)}
    assert "kernels busy 0.070 s (70%)" in report(s) and "cudaHostAlloc 2x 0.040 s" in report(s)
    plot(s, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert "error" in summarize([ev("cpu_op", "x", 0, 1)])
    # ATen's memory-efficient attention kernels carry "cutlass" in their names: attention, not matmul
    s = summarize([ev("kernel", "fmha_cutlassB_bf16_aligned_64x64_k64_sm80", 0, 10),
                   ev("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 10, 5),
                   ev("kernel", "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn", 15, 5)], bucket_s=0.05)
    assert s["kernel_s_by_kind"] == pytest.approx({"attention": 0.015, "matmul": 0.005})


def test_timeline_cpu_lanes(tmp_path):
    """The timeline's CPU lanes: StarPU's CPU workers' time apart from other threads', StarPU's CUDA driver (it polls)
    left out, each thread's time between two samples spread over that interval; and the sampler reads this process's
    threads (a busy one shows)."""
    import threading
    import time
    from benchmarks.timeline import ThreadSampler, plot, report, summarize, thread_lanes
    ms = 1_000_000
    samples = [(0.00, {"1": ("python3", 0), "2": ("CPU 0", 0), "3": ("CPU 1", 0), "4": ("CUDA 0", 0)}),
               (0.05, {"1": ("python3", 10 * ms), "2": ("CPU 0", 50 * ms), "3": ("CPU 1", 0),
                       "4": ("CUDA 0", 50 * ms)}),
               (0.10, {"1": ("python3", 10 * ms), "2": ("CPU 0", 100 * ms), "3": ("CPU 1", 25 * ms),
                       "4": ("CUDA 0", 100 * ms), "5": ("CPU 2", 0)})]  # thread 5 appears: no time counted yet
    lanes = thread_lanes(samples, 0.05, 3)
    assert lanes["cpu_workers"] == 2  # the ones seen running between two samples
    assert lanes["cpu_workers_busy"] == pytest.approx([1.0, 1.5, 0.0])
    assert lanes["other_threads_busy"] == pytest.approx([0.2, 0.0, 0.0])
    assert lanes["cpu_workers_busy_core_s"] == pytest.approx(0.125)
    trace = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0.0, "dur": 100000.0}]
    s = summarize(trace, bucket_s=0.05, thread_samples=samples)
    assert s["cpu_workers_busy"] == pytest.approx([1.0, 1.5]) and "CPU: 2 StarPU CPU workers ran 0.1" in report(s)
    plot(s, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 1000
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"):
        pytest.skip("no /proc schedstat here: the sampler records nothing (checked above on given samples)")
    stop, named = threading.Event(), threading.Event()

    def spin():
        import ctypes
        ctypes.CDLL(None).prctl(15, b"CPU 7", 0, 0, 0)  # PR_SET_NAME: named as a StarPU CPU worker, before sampling
        named.set()
        import hashlib
        block = bytes(1 << 20)
        while not stop.is_set():
            hashlib.sha256(block).digest()  # CPU time with the GIL released: the sampler keeps its pace
    t = threading.Thread(target=spin)
    t.start()
    named.wait()
    sampler = ThreadSampler(period=0.01).start()
    time.sleep(0.3)
    stop.set()
    t.join()
    sampler.stop()
    seen = [snap[tid][1] for _, snap in sampler.samples for tid in snap if snap[tid][0] == "CPU 7"]  # the runtime's
    assert len(seen) >= 2 and max(seen) - min(seen) > 50_000_000  # own CPU workers may run beside it: not counted
    lanes = thread_lanes(sampler.samples, 0.05, 8)
    assert lanes["cpu_workers"] >= 1 and lanes["cpu_workers_busy_core_s"] > 0.05


def test_cpu_adamw_benchmark(tmp_path):
    """benchmarks/cpu_adamw.py builds the CPU AdamW kernel with and without the x86 clones and times both beside
    torch's fused AdamW: every row there, with positive rates, on 1 and 2 threads."""
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    from benchmarks.cpu_adamw import main
    rows = main(["--threads", "2", "--elements", "4096", "--reps", "1", "--json", str(tmp_path / "a.json")])
    got = {(r["build"], r["states"], r["threads"]) for r in rows}
    for threads in (1, 2):
        for build in ("clones", "baseline"):
            assert (build, "fp32", threads) in got and (build, "bf16", threads) in got
        assert ("torch fused", "fp32 (no copy)", threads) in got
    assert all(r["g_elements_s"] > 0 and r["gb_s"] > 0 for r in rows)
    assert json.load(open(tmp_path / "a.json")) == rows


def test_profile_step_plans_where_asked_and_trains_either_way(tmp_path):
    """benchmarks.profile_step: without a GPU, auto leaves the plan off (nothing outgrows a GPU); --plan on builds
    the model on meta, places it with nt.plan and trains it through plan.apply and plan.optimizer (the path a model
    beyond GPU memory takes); both give finite losses that fall over the steps, and the JSON says which path ran."""
    for mode, planned in (("auto", False), ("on", True)):
        out = run("benchmarks.profile_step", "--config", "llama-tiny", "--batch", "2", "--seq", "16", "--steps", "4",
                  "--plan", mode, "--no-profile", "--out", f"{mode}.json", tmp_path=tmp_path)
        d = json.loads((tmp_path / f"{mode}.json").read_text())
        assert d["planned"] is planned, d
        assert ("memory plan" in out.stdout) is planned  # print(plan)'s first line
        losses = [s["loss"] for s in d["steps"]]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
