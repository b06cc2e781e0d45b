"""Runtime: info(), stats(), argument checks, restart with data kept."""
import os
import re
import shutil
import threading
import time
import warnings

import pytest
import torch

import nntile_torch as nt
from conftest import assert_same_training_runs
from nntile_torch.runtime import parse_bytes


def test_info_describes_the_runtime():
    d = nt.info()
    assert d["starpu_version"].startswith(("1.3.", "1.4."))  # 1.3.10, or 1.4.10 (docs/starpu_versions.md)
    assert d["workers"]["cpu"] + d["workers"]["cuda"] >= 1
    assert any(n["kind"] == "cpu" and n["total_bytes"] > 0 for n in d["memory_nodes"])
    assert isinstance(d["scheduler"], str) and d["scheduler"]


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and nt._C.built_with_cuda), reason="requires CUDA")
def test_default_workers_with_a_gpu_are_two_per_gpu_and_one_cpu():
    nt.shutdown()
    try:
        nt.init(streams_per_gpu=1)
        assert nt.info()["workers"]["cuda"] == nt.info()["gpus"] == torch.cuda.device_count()
        nt.shutdown()
        nt.init()
        d = nt.info()
        n = nt.runtime.streams_per_gpu_setting(None)[0]  # 2, or the user's STARPU_NWORKER_PER_CUDA
        assert d["workers"]["cuda"] == n * torch.cuda.device_count() and d["gpus"] == torch.cuda.device_count()
        assert d["workers"]["cpu"] == 1 and len(d["places"]) == (n * d["gpus"] if n * d["gpus"] > 1 else 0)
        limit = nt.runtime.default_host_memory_limit()
        assert d["host_memory_limit_bytes"] == limit  # with GPUs, host RAM is limited by default
        host = [n for n in d["memory_nodes"] if n["kind"] == "cpu"]
        assert host and all(limit - 2**20 < n["total_bytes"] <= limit for n in host), (host, limit)
    finally:
        nt.shutdown()


def test_default_host_memory_limit():
    """The RAM less max(16 GiB, 1/8), at least half of it; on CPUs alone no default limit."""
    gib = 2**30
    assert nt.runtime.default_host_memory_limit(135_100_000_000) == (135_100_000_000 - 16 * gib) >> 20 << 20  # H200
    assert nt.runtime.default_host_memory_limit(512 * gib) == 448 * gib
    assert nt.runtime.default_host_memory_limit(24 * gib) == 12 * gib
    assert 0 < nt.runtime.default_host_memory_limit() < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    nt.shutdown()
    try:
        nt.init(ncpus=1, ncuda=0)
        assert nt.info()["host_memory_limit_bytes"] is None
        nt.shutdown()
        nt.init(ncpus=1, ncuda=0, host_memory_limit="2GiB")
        assert nt.info()["host_memory_limit_bytes"] == 2 * gib
    finally:
        nt.shutdown()


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and nt._C.built_with_cuda and torch.cuda.device_count() >= 2),
                    reason="requires two GPUs and a CUDA build")
def test_tiles_on_another_gpu_keep_torchs_current_device():
    """StarPU allocates a tile on GPU 1 from the calling thread after switching it to GPU 1; torch's current
    device must not move (it did, and the next "cuda" tensors and copies went wrong)."""
    nt.init()
    torch.cuda.set_device(0)
    for d in (1, 0, 1):
        x = torch.randn(37, 11, device=f"cuda:{d}")
        t = nt.TileTensor.from_dense(x, (8, 5))
        assert torch.cuda.current_device() == 0
        assert torch.equal(t.materialize().cpu(), x.cpu())
        assert torch.cuda.current_device() == 0


def test_parse_bytes():
    assert parse_bytes("8GiB", "x") == 8 * 2**30
    assert parse_bytes("1.5 GB", "x") == 1_500_000_000
    assert parse_bytes(2**21, "x") == 2**21
    assert parse_bytes(None, "x") is None
    for bad in ["8 parsecs", "-3GiB", 1.5, True, "100"]:
        with pytest.raises(ValueError, match="x must"):
            parse_bytes(bad, "x")


@pytest.mark.parametrize("kwargs,match", [
    (dict(ncpus=-2), "ncpus"), (dict(ncuda="one"), "ncuda"), (dict(cuda_memory_limit="lots"), "cuda_memory_limit"),
    (dict(disk_path="/nonexistent-dir-for-nntile"), "disk_path"), (dict(ncpus=0, ncuda=0), "at least one worker"),
    (dict(scheduler=""), "scheduler"), (dict(cpu_tasks="no"), "cpu_tasks"),
])
def test_bad_init_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nt.init(**kwargs)


def test_unknown_attention_kernel_setting_raises(monkeypatch):
    monkeypatch.setenv("NNTILE_ATTENTION", "fastest")
    with pytest.raises(ValueError, match="NNTILE_ATTENTION must be one of auto, cudnn, flash, efficient"):
        nt.init()


def test_disk_limit_beyond_the_free_space_raises(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(ValueError, match=r"disk_limit .* GiB is more than the .* GiB free in"):
        nt.init(disk_path=str(tmp_path), disk_limit=free + 2**30)


def test_disk_limit_below_starpus_smallest_disk_node_raises(tmp_path):
    """StarPU asserts (aborting the process) on a disk node under 16 MiB: init says so instead."""
    with pytest.raises(ValueError,
                       match=r"disk_limit must be at least 16 MiB, StarPU's smallest disk node \(got '14MiB'\)"):
        nt.init(disk_path=str(tmp_path), disk_limit="14MiB")


def test_second_init_with_other_arguments_raises():
    nt.runtime.ensure_init()
    settings = nt.info()["settings"]
    nt.init(**settings_as_args(settings))  # same arguments: fine
    with pytest.raises(RuntimeError, match="already running"):
        nt.init(ncpus=1, scheduler="eager")


def test_cpu_tasks_false_needs_a_gpu_worker():
    nt.shutdown()
    with pytest.raises(RuntimeError, match="needs a CUDA worker"):
        nt.init(ncuda=0, cpu_tasks=False)
    assert not nt.is_running()
    nt.runtime.ensure_init()  # usable again afterwards
    x = torch.randn(5, 3)
    assert torch.equal(nt.TileTensor.from_dense(x, (2, 2)).to_dense(), x)


def settings_as_args(s):
    return {k: (None if v in (-1,) else v) for k, v in s.items()}


def test_restart_keeps_tile_tensors_and_applies_limits(tmp_path):
    x = torch.randn(13, 7)
    t = nt.TileTensor.from_dense(x, (4, 4))
    nt.shutdown()
    assert not nt.is_running()
    nt.init(ncpus=1, host_memory_limit="256MiB", disk_path=tmp_path, disk_limit="64MiB", scheduler="eager")
    try:
        d = nt.info()
        assert d["workers"]["cpu"] == 1 and d["scheduler"] == "eager"
        assert any(n["kind"] == "disk" for n in d["memory_nodes"])
        cpu = [n for n in d["memory_nodes"] if n["kind"] == "cpu"][0]
        assert cpu["total_bytes"] == 256 * 2**20
        assert torch.equal(t.materialize(), x)
        # Work runs on the restarted runtime.
        lin = nt.nn.Linear(7, 5, tile_size=4)
        ref = torch.nn.Linear(7, 5)
        ref.load_state_dict(lin.state_dict())
        assert torch.allclose(lin(x), ref(x), atol=1e-6)
    finally:
        nt.shutdown()
    assert torch.equal(t.materialize(), x)  # lazily restarted with defaults


_WINDOW_VARS = ("STARPU_LIMIT_MAX_SUBMITTED_TASKS", "STARPU_LIMIT_MIN_SUBMITTED_TASKS")


def test_submission_window_from_argument_environment_or_default(monkeypatch):
    for v in _WINDOW_VARS:
        monkeypatch.delenv(v, raising=False)
    cases = [(dict(), {}, (1000, 800)), (dict(max_submitted_tasks=10), {}, (10, 8)),
             (dict(max_submitted_tasks=0), {}, None),
             (dict(), {_WINDOW_VARS[0]: "300"}, (300, 240)),  # the user's MAX alone gets a MIN
             (dict(), {_WINDOW_VARS[0]: "300", _WINDOW_VARS[1]: "100"}, (300, 100)),
             (dict(max_submitted_tasks=50), {_WINDOW_VARS[0]: "300"}, (50, 40)),  # the argument wins
             (dict(), {}, (1000, 800))]  # nothing left behind by the runs before
    try:
        for kwargs, env, expected in cases:
            nt.shutdown()  # restores the environment the runtime started from
            for v in _WINDOW_VARS:
                monkeypatch.delenv(v, raising=False)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            nt.init(ncpus=1, **kwargs)
            got = nt.info()["submission_window"]
            assert (tuple(got) if got is not None else None) == expected, (kwargs, env)
    finally:
        nt.shutdown()
    for bad in (-1, 2.5, True, "100"):
        with pytest.raises(ValueError, match="max_submitted_tasks"):
            nt.init(max_submitted_tasks=bad)


@pytest.mark.parametrize("window", [8, 0])
def test_the_window_bounds_the_tasks_pending(window):
    """With a window of 8 the submitting thread never runs more than 8 + 2 tasks ahead of the single worker
    (StarPU blocks a submission only when more than 8 are pending, so one gets past; nntile's pending count can
    lag StarPU's by a task whose end callback has not run yet); without one it runs far ahead (what the window is
    for), which shows the bound is real."""
    nt.shutdown()
    nt.init(ncpus=1, ncuda=0, max_submitted_tasks=window)
    try:
        t = nt.TileTensor.from_dense(torch.randn(2048, 2048), (2048, 2048))  # ~ms per add on one core
        s0 = nt.stats()["tasks_submitted"]
        u = t + t
        per_op = nt.stats()["tasks_submitted"] - s0
        most = 0
        for _ in range(60):
            u = u + t
            most = max(most, nt.stats()["tasks_pending"])
        torch.testing.assert_close(u.materialize(), 62 * t.materialize(), rtol=1e-5, atol=1e-4)
    finally:
        nt.shutdown()
    assert 1 <= per_op <= 4, per_op
    if window:
        assert 1 <= most <= window + 2, (most, per_op)
    else:
        assert most > 8 + 2, (most, per_op)


def test_other_python_threads_run_while_submission_waits():
    """Submission waiting for the window (inside an op) holds no GIL: a Python thread ticking every millisecond
    ticks through 60 ops that each wait for the single worker at least half as often as while the main thread
    merely sleeps (the same machine's load in both). Holding the GIL it ticked about once per op (30 ticks in
    170 ms against ~150)."""
    nt.shutdown()
    nt.init(ncpus=1, ncuda=0, max_submitted_tasks=2)
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    def ticks_during(work):
        t0, n0 = time.perf_counter(), ticks[0]
        work()
        return ticks[0] - n0, (time.perf_counter() - t0) * 1e3

    th = threading.Thread(target=tick)
    try:
        t = nt.TileTensor.from_dense(torch.randn(2048, 2048), (2048, 2048))
        u = [t + t]
        nt.synchronize()
        th.start()
        base_n, base_ms = ticks_during(lambda: time.sleep(0.2))

        def ops():
            for _ in range(60):
                u[0] = u[0] + t
        n, ms = ticks_during(ops)
        nt.synchronize()
    finally:
        stop.set()
        if th.is_alive():
            th.join()
        nt.shutdown()
    assert ms > 60, ms  # the ops did wait (a few ms each on one core)
    assert n / ms > 0.5 * base_n / base_ms, (n, ms, base_n, base_ms)


def test_a_long_host_wait_is_reported_with_memory_nodes():
    """A host thread waiting to acquire a tile is not a pending task, so StarPU's watchdog never reports it (a wait
    that never ends hung in silence on the H200): past STARPU_WATCHDOG_TIMEOUT (here 0.3 s) it is reported once,
    with the memory nodes; the value read afterwards is still right."""
    import subprocess
    import sys
    script = ("import torch, nntile_torch as nt\n"
              "nt.init(ncpus=1, ncuda=0)\n"
              "t = nt.TileTensor.from_dense(torch.randn(2048, 2048), (2048, 2048))\n"
              "u = t + t\n"
              "for _ in range(300):\n"  # ~1 s of adds on one core, then a read that waits for all of them
              "    u = u + t\n"
              "torch.testing.assert_close(u.materialize(), 302 * t.materialize(), rtol=1e-5, atol=1e-3)\n"
              "print('read ok')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, STARPU_WATCHDOG_TIMEOUT="300000"))
    assert r.returncode == 0 and "read ok" in r.stdout, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if "a host thread has waited" in x]
    assert len(lines) == 1, r.stderr[-2000:]
    assert "a tile on memory node 0 (to read it)" in lines[0] and "Memory nodes: NUMA 0" in lines[0], lines[0]
    assert "It waits for the tasks before it" in lines[0], lines[0]


def test_training_with_a_tiny_window_is_bit_identical(tmp_path):
    """Four AdamW steps under eviction (host limit 24 MiB, disk node) with a window of 6 tasks, where the
    submitting thread (Python's and autograd's) waits all the time, against the default window: same bits."""
    assert_same_training_runs(tmp_path, "a window of 6 against the default",
                              ("tiny", dict(STARPU_LIMIT_MAX_SUBMITTED_TASKS="6", STARPU_LIMIT_MIN_SUBMITTED_TASKS="3")),
                              ("default", {}))


def test_stats_count_tasks_and_waits():
    s0 = nt.stats()
    t = nt.TileTensor.from_dense(torch.randn(8, 8), (4, 4))
    u = t + t
    s1 = nt.stats()
    assert s1["tasks_submitted"] >= s0["tasks_submitted"] + 4  # one per tile
    u.materialize()
    assert nt.stats()["blocking_waits"] == s1["blocking_waits"] + 1
    u.materialize()  # cached: no new wait
    assert nt.stats()["blocking_waits"] == s1["blocking_waits"] + 1


def test_task_trace_records_each_task_and_where_its_gaps_went():
    from benchmarks import dispatch
    x = nt.TileTensor.from_dense(torch.randn(8, 8), (4, 4))
    with nt.task_trace() as records:
        y = x + x  # 4 tasks, then 4 that depend on them
        z = y + y
    assert torch.equal(z.materialize(), 4 * x.materialize())
    assert len(records) == 8 and {r["kind"] for r in records} == {"cpu"}
    marks = ("submit", "push_start", "push_end", "pop_end", "acquire_end", "func_enter", "func_exit", "end",
             "callback")
    for r in records:
        assert r["name"] and r["worker"] >= 0
        times = [r[k] for k in marks]
        assert None not in times and times == sorted(times), r
    with nt.task_trace() as after:  # a trace holds only its own tasks
        pass
    assert after == []
    # gaps: worker 0 finishes a at 10 with b not launched until 31 (b entered the scheduler at 12, ...);
    # c was launched (func_exit 20) before b finished (end 40): no gap there
    a = dict(name="a", worker=0, kind="cuda", func_exit=5.0, end=10.0)
    b = dict(name="b", worker=0, kind="cuda", push_start=12.0, push_end=13.0, pop_end=17.0, acquire_end=19.0,
             func_enter=25.0, func_exit=31.0, end=40.0)
    c = dict(name="c", worker=0, kind="cuda", push_start=1.0, push_end=2.0, pop_end=3.0, acquire_end=4.0,
             func_enter=5.0, func_exit=35.0, end=50.0)
    s = dispatch.summarize([a, b, c])["workers"]["0"]
    assert s["gaps"] == 1 and s["tasks"] == 3
    assert s["median_us_by_stage"] == {"release": 2.0, "push": 1.0, "queue": 4.0, "acquire": 2.0, "driver": 6.0,
                                       "function": 6.0}
    assert "worker 0: 3 tasks, 1 gaps" in dispatch.report(dispatch.summarize([a, b, c]))
    assert dispatch.summarize([a, b, c], kind="cpu")["workers"] == {}
    # a step's brief: submitted from 1 to 12, the last end at 50; the GPU ran a 5-10, b 31-40, c 20-50
    a.update(submit=1.0, start=5.0)
    b.update(submit=12.0, start=31.0)
    c.update(submit=2.0, start=20.0)
    brief = dispatch.step_summary([a, b, c], top=1)
    assert brief["tasks"] == 3 and brief["span_ms"] == 0.049 and brief["submit_ms"] == 0.011
    assert brief["gpu_busy_ms"] == 0.035  # 5-10 and 20-50: b inside c
    assert brief["gap_ms"] == 0.021 and brief["gap_ms_by_stage"]["driver"] == 0.006
    assert brief["longest_gaps"] == [{"after": "a", "before": "b", "us": 21.0, "stage": "driver"}]
    assert brief["longest_tasks"] == [{"name": "c", "us": 30.0}]


def test_disk_node_is_emptied_when_the_process_exits_without_shutdown(tmp_path):
    """Tiles spilled to the disk node are files; a script that ends without nt.shutdown() must not leave them
    behind (the runtime stops StarPU at exit, which deletes them)."""
    import subprocess
    import sys
    code = (
        "import torch, nntile_torch as nt\n"
        f"nt.init(ncpus=1, ncuda=0, host_memory_limit='16MiB', disk_path={str(tmp_path)!r}, disk_limit='256MiB')\n"
        "keep = [nt.TileTensor.from_dense(torch.full((1024, 1024), float(i)), (512, 1024)) for i in range(12)]\n"
        "assert all(float(t.materialize()[1023, 5]) == i for i, t in enumerate(keep))\n"
        "import os\n"
        "print('files while running:', sum(len(f) for _, _, f in os.walk(" + repr(str(tmp_path)) + ")))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split("files while running:")[1]) > 0  # 48 MiB of tiles did not fit in 16 MiB
    left = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert left == [], left[:5]


# A subprocess script's watchdog: exit 3, printing the memory nodes (its nodes()), when `last[0]` (the script's
# progress) is STALL_S seconds old. The first step may take 40 s: it pays one-time costs that are no stall (the first
# Parameter of a tile tensor imports torch.distributed.tensor and sympy, 2 s on an idle 2-core box; CI's loaded box
# once took over 10 s, with nothing yet on the disk).
_STALL_GUARD = (
    "last = [time.monotonic()]\n"
    "def guard():\n"
    "    start = last[0]\n"
    "    while time.monotonic() - last[0] < (float(os.environ['STALL_S']) if last[0] != start else 40.0):\n"
    "        time.sleep(0.2)\n"
    "    print('stalled:', nodes(), flush=True)\n"
    "    os._exit(3)\n"
    "threading.Thread(target=guard, daemon=True).start()\n"
)


# Six AdamW steps of six 640 x 640 fp32 layers (9.4 MiB of weights, 19 of moments) on two CPU workers with host RAM
# limited to 24 MiB and an 18 MiB disk node: the live tiles fit (about 28 MiB at once) with tiles moving to and from
# the disk every step, and AdamW marks the moments it updates won't-use. Prints each step's loss; when no step ends
# for STALL_S seconds, prints the memory nodes in MiB and exits with 3 (the stall report rounds to 0.1 GiB).
_STALE_DISK_TRAINING = (
    "import os, threading, time, torch, nntile_torch as nt\n"
    "limited = os.environ['DISK'] != ''\n"
    "if limited:\n"
    "    nt.init(ncpus=2, ncuda=0, host_memory_limit='24MiB', disk_path=os.environ['DISK'], disk_limit='18MiB',\n"
    "            scheduler='eager')\n"
    "else:\n"
    "    nt.init(ncpus=2, ncuda=0, scheduler='eager')\n"
    "def nodes():\n"
    "    return '; '.join(f\"{n['name']}: {n['used_bytes'] / 2**20:.1f} MiB used, valid {n['valid_bytes'] / 2**20:.1f}, \"\n"
    "                     f\"stale {n['stale_bytes'] / 2**20:.1f}\" for n in nt.memory_nodes())\n"
    + _STALL_GUARD +
    "torch.manual_seed(0)\n"
    "layers = [nt.nn.Linear(640, 640, tile_size=256) for _ in range(6)]\n"
    "opt = nt.optim.AdamW([p for m in layers for p in m.parameters()], lr=1e-2)\n"
    "x = torch.randn(48, 640)\n"
    "disk_most = 0\n"
    "for _ in range(6):\n"
    "    y = x\n"
    "    for m in layers:\n"
    "        y = torch.tanh(m(y))\n"
    "    loss = (y * y).mean()\n"
    "    loss.backward(); opt.step(); opt.zero_grad()\n"
    "    print('loss', loss.item(), flush=True)\n"
    "    last[0] = time.monotonic()\n"
    "    disk_most = max([disk_most] + [n['used_bytes'] for n in nt.memory_nodes() if n['name'].startswith('Disk')])\n"
    "w = torch.cat([v.flatten() for m in layers for v in m.state_dict().values()])\n"
    "torch.save(w, os.environ['OUTFILE'])\n"
    "print('disk most', disk_most)\n")


def test_training_frees_stale_disk_buffers_instead_of_stalling(tmp_path):
    """The 45B GPT-2 stall on an H100 (disk node 44.9 of 45 GiB, 36.6 of it "stale", host RAM and GPU full) in
    miniature. StarPU 1.3.10's starpu_data_wont_use queues a write of a home-less tile to the disk node, which pins
    the tile's host buffer and holds a disk buffer not yet valid until the node has no other request; a fetch from
    the disk waiting for host memory then never gets it. Unpatched (level 2) it stopped within 5 s, three runs of
    three: disk 18.0 of 18 MiB used, 8 to 12 of it such buffers, host RAM full of sole copies. Patched StarPU (level
    3, scripts/patch_starpu.py 8.) leaves the write to the eviction. The weights must equal a run without limits."""
    from conftest import run_python
    from nntile_torch import runtime
    disk = tmp_path / "disk"
    disk.mkdir()
    rc, out, err = run_python(_STALE_DISK_TRAINING, 120, dict(DISK=str(disk), OUTFILE=str(tmp_path / "w.pt"),
                              STALL_S="10", STARPU_WATCHDOG_TIMEOUT="5000000"), what="the stale disk training")
    assert rc == 0 and "stalled" not in out, (f"StarPU patch level {runtime.starpu_patch_level()} (3 has no idle "
                                              f"writes to the disk on won't-use)\n{out[-1500:]}\n{err[-1000:]}")
    assert int(out.split("disk most")[1]) > 12 * 2**20, out  # the disk was used near its limit: the case of the test
    rc, ref_out, err = run_python(_STALE_DISK_TRAINING, 120, dict(DISK="", OUTFILE=str(tmp_path / "ref.pt"),
                                  STALL_S="60"), what="the training without limits")
    assert rc == 0, err[-1500:]
    assert torch.equal(torch.load(tmp_path / "w.pt"), torch.load(tmp_path / "ref.pt"))


# Host RAM limited to 16 MiB and a 24 MiB disk node, one CPU worker. Round r makes 36 MiB of tile tensors (18 of
# 512 x 1024 fp32) in tiles of its own shape, reads them all back, and drops them; what does not fit in host RAM
# goes to the disk. When no round ends for STALL_S seconds, prints the memory nodes in MiB and exits with 3.
_FULL_DISK_ROUNDS = (
    "import os, threading, time, torch, nntile_torch as nt\n"
    "nt.init(ncpus=1, ncuda=0, host_memory_limit='16MiB', disk_path=os.environ['DISK'], disk_limit='24MiB',\n"
    "        scheduler='eager')\n"
    "def nodes():\n"
    "    return '; '.join(f\"{n['name']}: {n['used_bytes'] / 2**20:.1f} MiB used, live tiles \"\n"
    "                     f\"{n['allocated_bytes'] / 2**20:.1f}\" for n in nt.memory_nodes())\n"
    + _STALL_GUARD +
    "for r, tile in enumerate([(256, 1024), (128, 1024), (512, 512)]):\n"
    "    keep = [nt.TileTensor.from_dense(torch.full((512, 1024), float(i)), tile) for i in range(18)]\n"
    "    assert all(float(t.materialize()[511, 5]) == i for i, t in enumerate(keep))\n"
    "    print('round', r, nodes(), flush=True)\n"
    "    last[0] = time.monotonic()\n"
    "    del keep\n"
    "print('done')\n")


def test_a_disk_full_of_freed_buffers_makes_room_instead_of_stalling(tmp_path):
    """A disk node at its limit never ran its reclaim in StarPU 1.3.10: host RAM evicts to a disk only where the disk
    has room already, so nothing is allocated on a full disk, and what fills it stays (freed buffers kept for reuse,
    stale buffers, copies of tiles valid elsewhere: the 45B run's step 1, h100/large_models_v2). Here the first
    round's 22 MiB on the disk are freed buffers once its tensors are dropped, and the second round's tiles (another
    shape: none is reused) need the disk. Patch level 3 stopped in the second round, five runs of five: host RAM
    16.0 of 16 MiB in live tiles, the disk 24.0 of 24 MiB used with 2.0 in live tiles. Level 4 (scripts/
    patch_starpu.py 9.) frees the disk's buffers that hold no sole copy when host RAM reclaims."""
    from conftest import run_python
    from nntile_torch import runtime
    disk = tmp_path / "disk"
    disk.mkdir()
    rc, out, err = run_python(_FULL_DISK_ROUNDS, 60, dict(DISK=str(disk), STALL_S="10",
                              STARPU_WATCHDOG_TIMEOUT="5000000"), what="the full disk rounds")
    assert rc == 0 and "done" in out, (f"StarPU patch level {runtime.starpu_patch_level()} (4 frees a full disk's "
                                       f"buffers that hold no sole copy)\n{out[-1500:]}\n{err[-1000:]}")
    assert out.count("round") == 3, out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not nt._C.built_with_cuda, reason="requires CUDA")
def test_torch_gpu_tensors_outlive_the_first_start_on_a_machine(tmp_path):
    """The first start with a new StarPU home measures the bus; StarPU 1.3.10 then reset the GPU, which freed the
    memory torch had already allocated (the next CUDA call failed with an illegal memory access)."""
    import subprocess
    import sys
    code = ("import torch, nntile_torch as nt\n"
            "x = torch.arange(1000.0, device='cuda')\n"
            "nt.init()\n"
            "t = nt.TileTensor.from_dense(x.reshape(10, 100), (5, 50))\n"
            "assert float((x * 2).sum()) == 999000.0 and torch.equal(t.materialize().reshape(-1), x)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, STARPU_HOME=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(tmp_path.rglob("*.bandwidth")), "StarPU did not measure the bus in the new home"


def test_tiles_beyond_every_memory_node_raise_instead_of_hanging():
    """With a host limit and no lower tier, StarPU would wait forever for memory: creating tiles that cannot
    fit raises; freeing tensors makes room again."""
    nt.shutdown()
    try:
        nt.init(ncpus=1, ncuda=0, host_memory_limit="16MiB")
        keep = [nt.TileTensor.from_dense(torch.full((512, 1024), float(i)), (256, 1024)) for i in range(3)]  # 6 MiB
        with pytest.raises(RuntimeError, match=r"out of memory: live tiles would take 18 MiB .* 16 MiB \(host limit"):
            keep += [nt.TileTensor.from_dense(torch.zeros(1024, 1024), (512, 1024)) for _ in range(3)]
        assert [float(t.materialize()[511, 7]) for t in keep[:3]] == [0.0, 1.0, 2.0]
        del keep[1:]
        import gc
        gc.collect()
        more = nt.TileTensor.from_dense(torch.ones(1024, 1024), (512, 1024))  # 4 MiB more fits now
        assert float(more.materialize().sum()) == 1024 * 1024
    finally:
        nt.shutdown()


def test_memory_nodes_count_each_tile_where_its_copies_are():
    """memory_nodes(): a tile written on the host has a valid buffer there, its only copy; reading it keeps one
    copy; dropping the tensor gives its bytes back. memory_nodes_report() is the stall report's text."""
    nt.shutdown()
    try:
        nt.init(ncpus=1, ncuda=0, host_memory_limit="64MiB")
        import gc
        gc.collect()
        before = nt.memory_nodes()[0]
        assert before["name"] == "NUMA 0" and before["total_bytes"] == 64 * 2**20
        a = nt.TileTensor.from_dense(torch.randn(1000, 300), (256, 300))  # 4 tiles, the last one partial
        b = nt.TileTensor.from_dense(torch.randn(77, 5), (77, 5))
        nbytes = (1000 * 300 + 77 * 5) * 4
        assert a.materialize().shape == (1000, 300)  # reading it back moves nothing: one copy stays
        nt.synchronize()
        host = nt.memory_nodes()[0]
        for k in ("allocated_bytes", "valid_bytes", "sole_bytes"):
            assert host[k] - before[k] == nbytes, (k, host, before)
        assert host["stale_bytes"] == before["stale_bytes"]
        assert host["requested_bytes"] == 0  # nothing is moving after synchronize()
        assert host["used_bytes"] >= host["allocated_bytes"]
        text = nt.memory_nodes_report()
        assert text.startswith("NUMA 0: ") and "of 0.1 GiB used, tile buffers" in text and "the only valid copy" in text \
            and "transfers in 0.0" in text
        del a, b
        gc.collect()
        nt.synchronize()
        after = nt.memory_nodes()[0]
        assert after["valid_bytes"] == before["valid_bytes"] and after["allocated_bytes"] == before["allocated_bytes"]
    finally:
        nt.shutdown()


def test_a_task_stalling_past_the_watchdog_is_reported_with_memory_nodes():
    """When no task finishes for STARPU_WATCHDOG_TIMEOUT (default 2 minutes; here 0.2 s and one task of
    seconds), the runtime says so on stderr with what each memory node holds, and the work still completes."""
    import subprocess
    import sys
    code = (
        "import torch, nntile_torch as nt\n"
        "nt.init(ncpus=1, ncuda=0, host_memory_limit='2GiB')\n"
        "lin = nt.nn.Linear(3072, 3072, bias=False, tile_size=3072, batch_tile_size=6144)\n"
        "x = torch.randn(6144, 3072)\n"
        "y = lin(x)\n"
        "print('ok', abs(float(y.materialize().double().sum()) - float((x.double() @ lin.weight.materialize().double().T).sum())) < 1)\n")
    env = dict(os.environ, STARPU_WATCHDOG_TIMEOUT="200000")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok True"
    msg = [ln for ln in out.stderr.splitlines() if ln.startswith("nntile_torch: no StarPU task finished for 0.2 s")]
    assert msg, out.stderr[-2000:]
    assert "tasks pending" in msg[0] and "GiB used" in msg[0] and "of 2.0 GiB" in msg[0], msg[0]
    assert "NUMA 0: " in msg[0] and "tile buffers" in msg[0] and "the only valid copy" in msg[0], msg[0]


def test_host_memory_node_is_the_machines_ram():
    """Without a host limit StarPU's host node has the machine's physical RAM (StarPU 1.4 keeps 10% of it back:
    topology.c, "Don't eat all memory for ourself"). Unpatched StarPU takes hwloc's NUMA-node total, which on
    virtual machines can be far less (14 of 24 GiB on the CI machine at one time), and then stalls once its tiles in
    host RAM reach it (scripts/patch_starpu.py)."""
    import subprocess
    import sys
    code = ("import nntile_torch as nt\nnt.init(ncpus=1, ncuda=0)\n"
            "print(nt.info()['starpu_version'], nt.info()['memory_nodes'][0]['total_bytes'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    version, total = out.stdout.split()[-2:]
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    expected = physical if version.startswith("1.3.") else int(physical * 0.9)  # 1.4: global_mem *= 0.9
    assert int(total) >= expected, (out.stdout, physical)


def test_host_tasks_nest_and_restore():
    from nntile_torch import _C
    with nt.runtime.host_tasks():
        with nt.runtime.host_tasks():
            assert _C.set_host_tasks(True) is True  # set inside: still on
        assert _C.set_host_tasks(True) is True  # the inner block restored "on"
    assert _C.set_host_tasks(False) is False  # the outer block restored "off"
    t = nt.TileTensor.from_dense(torch.arange(6.0), (4,))
    with nt.runtime.host_tasks():
        u = t + t  # a task submitted under the hint runs (on a CPU worker) and gives the same values
    assert torch.equal(u.materialize(), 2 * torch.arange(6.0))


def test_a_native_crash_prints_its_backtrace():
    """SIGSEGV in native code (StarPU, a kernel) prints the thread's native backtrace, then dies as it would have:
    the H200 runs that crashed beyond GPU memory left nothing in their logs."""
    import signal
    import subprocess
    import sys
    code = ("import os, signal, nntile_torch as nt\n"
            "nt.init(ncpus=1, ncuda=0)\n"
            "nt.shutdown(); nt.init(ncpus=1, ncuda=0)\n"  # a restarted runtime: StarPU re-installs its handler
            "os.kill(os.getpid(), signal.SIGSEGV)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr[-2000:])
    head = "nntile_torch: fatal signal 11 (SIGSEGV)"
    assert r.stderr.count(head) == 1, r.stderr[-2000:]
    frames = r.stderr.split("native backtrace:\n", 1)[1].splitlines()
    assert len(frames) >= 3 and any("_C" in f or "nntile" in f or "python" in f or "libc" in f for f in frames), frames


def test_refusal_on_another_thread_and_tile_byte_counters():
    """Autograd's device threads create tiles too: a refusal raised there carries its message (numbers
    included: a second C++ runtime in the extension once crashed right there); stats() counts the bytes of live
    tiles and their peak, which reset_peak_stats() starts again."""
    nt.shutdown()
    try:
        nt.init(ncpus=1, ncuda=0, host_memory_limit="16MiB")
        nt.reset_peak_stats()
        base = nt.stats()["tile_bytes"]
        assert nt.stats()["peak_tile_bytes"] == base
        keep = [nt.TileTensor.from_dense(torch.full((512, 1024), float(i)), (256, 1024)) for i in range(3)]  # 6 MiB
        assert nt.stats()["tile_bytes"] - base == 6 * 2**20
        errors = []

        def make():
            try:
                nt.TileTensor.from_dense(torch.zeros(4096, 1024), (512, 1024))  # 16 MiB more
            except RuntimeError as e:
                errors.append(str(e))

        worker = threading.Thread(target=make)
        worker.start()
        worker.join()
        assert len(errors) == 1 and re.search(r"out of memory: live tiles would take \d+ MiB .*: 16 MiB\)", errors[0])
        s = nt.stats()
        assert s["tile_bytes"] == s["peak_tile_bytes"] == base + 6 * 2**20  # the refused tensor counts nowhere
        del keep
        import gc
        gc.collect()
        assert nt.stats()["tile_bytes"] == base
        nt.reset_peak_stats()
        assert nt.stats()["peak_tile_bytes"] == base
    finally:
        nt.shutdown()


def test_memory_summary_groups_live_tiles_by_name():
    """memory_summary() adds up the live tiles per name and dtype, largest first."""
    import gc
    gc.collect()
    a = [nt.TileTensor.empty((512, 1024), (256, 1024), name="probe.big") for _ in range(3)]  # 2 MiB each
    b = nt.TileTensor.empty((256, 1024), (256, 1024), dtype=torch.bfloat16, name="probe.small")  # 0.5 MiB
    text = nt.memory_summary(top=200)
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines()[2:]}
    assert rows["probe.big"][1:] == ["float32", "3", f"{6 / 1024:.3f}"], text
    assert rows["probe.small"][1:] == ["bfloat16", "1", f"{0.5 / 1024:.3f}"], text
    names = [ln.split()[0] for ln in text.splitlines()[2:]]
    assert names.index("probe.big") < names.index("probe.small")
    assert text.startswith("tiles: ")
    del a, b
    gc.collect()
    assert "probe.big" not in nt.memory_summary(top=200)


def _gib_node(name, total, used, allocated=0.0, sole=0.0):
    g = 2**30
    return {"name": name, "total_bytes": int(total * g), "used_bytes": int(used * g),
            "allocated_bytes": int(allocated * g), "valid_bytes": int(allocated * g), "sole_bytes": int(sole * g)}


def test_stall_advice_reads_what_fills_the_nodes():
    """The stall report's advice, on the breakdowns of two H200 stalls of 2026-12-01 (large_models_v6) and made-up
    ones: memory outside live tiles -> a smaller window; only copies of live tiles everywhere -> a disk node."""
    from nntile_torch import _C
    # 13B batch 32, window 2000: the GPU full of buffers that are no live tile's.
    b32 = [_gib_node("NUMA 0", 109.8, 109.8, 77.6, 77.6), _gib_node("CUDA 0", 125.8, 125.1, 18.2, 18.2)]
    text = _C.stall_advice(b32, False, 2000)
    assert text.startswith("At their limit: NUMA 0, CUDA 0."), text
    assert "NUMA 0 32.2 of 109.8 GiB, CUDA 0 106.9 of 125.8 GiB" in text, text
    assert "init(max_submitted_tasks=1000), now 2000" in text and "disk node" not in text, text
    # 20B batch 8: host and GPU full of the only copies of live tiles, no disk node.
    b8 = [_gib_node("NUMA 0", 108.0, 108.0, 88.0, 88.0), _gib_node("CUDA 0", 125.8, 125.6, 107.5, 107.5)]
    text = _C.stall_advice(b8, False, 2000)
    assert "Memory held outside" not in text and "only valid copies" in text, text
    assert "Add a disk node (init(disk_path=..., disk_limit=...))" in text, text
    disk = b8 + [_gib_node("Disk 0", 40.0, 39.9, 39.0, 39.0)]
    text = _C.stall_advice(disk, True, -1)
    assert "only valid copies" in text and "Add a disk node" not in text and "Make it smaller" in text, text
    # 45B batch 8 on an H100 with a 45 GiB disk (h100/large_models_v2), step 1: every node full, host and disk holding
    # 14 GiB of copies also valid elsewhere each: named, with StarPU's failure to evict, not "does not fit" (a copy
    # valid on two full nodes is room on one of them; h100/large_models_v3 said otherwise of such a state).
    b45 = [_gib_node("NUMA 0", 109.8, 109.8, 109.8, 95.7), _gib_node("CUDA 0", 71.3, 70.7, 69.4, 69.4),
           _gib_node("Disk 0", 45.0, 45.0, 45.0, 30.8)]
    b45[2]["requested_bytes"] = 2**30
    text = _C.stall_advice(b45, True, -1)
    assert "only valid copies" not in text and "fails to evict" in text, text
    assert ("Copies also valid on another node, which StarPU may drop to make room: NUMA 0 14.1 GiB (transfers in "
            "0.0), Disk 0 14.2 GiB (transfers in 1.0).") in text, text
    assert "Copies also valid" not in _C.stall_advice(b8, False, 2000)
    # A node at its limit with neither pattern: the general advice; none at its limit: not an eviction stall.
    mixed = [_gib_node("NUMA 0", 100.0, 99.0, 90.0, 30.0), _gib_node("CUDA 0", 80.0, 40.0, 40.0, 40.0)]
    text = _C.stall_advice(mixed, False, -1)
    assert text.startswith("At their limit: NUMA 0.") and "fails to evict" in text, text
    assert _C.stall_advice(mixed[1:], False, -1).startswith("No memory node is at its limit"), mixed
    # Without a window the advice names one, and the running runtime gives its own nodes.
    assert "init(max_submitted_tasks=1000), now none" in _C.stall_advice(b32, False, -1)
    nt.shutdown()
    nt.init(ncpus=1, ncuda=0)
    try:
        assert nt.memory_advice().startswith("No memory node is at its limit")  # no host limit: none is full
    finally:
        nt.shutdown()


def test_streams_per_gpu_default_environment_and_errors():
    """init's CUDA workers per GPU: 2 by default, the user's STARPU_NWORKER_PER_CUDA when set, the argument above
    both; more than one needs a thread per worker (the cuBLASLt workspace is per thread), which init asks StarPU
    for, and refuses a one-thread-per-GPU setting."""
    setting = nt.runtime.streams_per_gpu_setting
    assert setting(None, {}) == (2, {"STARPU_NWORKER_PER_CUDA": "2", "STARPU_CUDA_THREAD_PER_WORKER": "1"})
    assert setting(None, {"STARPU_NWORKER_PER_CUDA": "1"}) == (1, {"STARPU_NWORKER_PER_CUDA": "1",
                                                                   "STARPU_CUDA_THREAD_PER_WORKER": "0"})
    assert setting(3, {"STARPU_NWORKER_PER_CUDA": "1"})[0] == 3
    assert setting(1, {"STARPU_CUDA_THREAD_PER_DEV": "1"})[0] == 1
    with pytest.raises(ValueError, match="STARPU_NWORKER_PER_CUDA must be a positive integer"):
        setting(None, {"STARPU_NWORKER_PER_CUDA": "two"})
    with pytest.raises(ValueError, match="thread per CUDA worker"):
        setting(2, {"STARPU_CUDA_THREAD_PER_DEV": "1"})
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="streams_per_gpu must be a positive int"):
            nt.init(streams_per_gpu=bad)


_PATCH_SETTINGS_SCRIPT = """
import ctypes, os, torch, nntile_torch as nt
nt.init(ncpus=1, ncuda=0)
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
seen = {k: (libc.getenv(k.encode()) or b"").decode() for k in nt.runtime.PATCH_SETTINGS}  # what StarPU read
w = nt.nn.Linear(8, 8, tile_size=8)
opt = nt.optim.AdamW(w.parameters())
print("evict", seen["NNTILE_EVICT_WONT_USE_FIRST"], int(opt._evict_first),
      int(nt.info()["starpu_patch_settings"]["NNTILE_EVICT_WONT_USE_FIRST"]))
nt.shutdown()
print("after", os.environ.get("NNTILE_EVICT_WONT_USE_FIRST"))
"""


@pytest.mark.parametrize("user", [None, "0", "1"], ids=["env=unset", "env=0", "env=1"])
def test_adamw_eviction_marking_follows_what_starpu_was_told(user):
    """StarPU (patched) reads NNTILE_EVICT_WONT_USE_FIRST from the C environment; AdamW marks its updated tiles by the
    same setting (the runtime's choice, default on). AdamW read os.environ, which does not see a default set with C's
    setenv: it had the marking off while StarPU had it on."""
    from conftest import run_python
    env = {k: v for k, v in os.environ.items() if k != "NNTILE_EVICT_WONT_USE_FIRST"}
    if user is not None:
        env["NNTILE_EVICT_WONT_USE_FIRST"] = user
    code = "import os; os.environ.pop('NNTILE_EVICT_WONT_USE_FIRST', None)\n" if user is None else ""
    rc, out, err = run_python(code + _PATCH_SETTINGS_SCRIPT, 120, env=env, what="the settings script")
    assert rc == 0, err[-2000:]
    want = "0" if user == "0" else "1"
    assert f"evict {want} {want} {want}" in out, out
    assert f"after {user}" in out, out  # the user's environment back after shutdown


def test_bad_patch_setting_raises():
    from conftest import run_python
    rc, out, err = run_python("import nntile_torch as nt\nnt.init(ncpus=1, ncuda=0)\n", 60,
                              env={"NNTILE_CUDA_POOL": "yes"})
    assert rc != 0 and "NNTILE_CUDA_POOL must be 0 (off) or a positive integer (on) (got 'yes')" in err, err[-2000:]


def test_the_loaded_starpu_carries_the_projects_patch(monkeypatch):
    """nntile relies on the patched StarPU (scripts/patch_starpu.py: dropping host copies, evicting won't-use tiles
    first, the CUDA buffer pool, no device reset); a StarPU built without it lost them in silence. The patched build
    exports its level, which nt.info() reports; one without it (level 0) warns at the first init, or raises with
    NNTILE_REQUIRE_PATCHED_STARPU=1. The StarPU this project installs (scripts/install_starpu.sh) has it."""
    from nntile_torch import runtime
    level = runtime.starpu_patch_level()
    if level is None:
        pytest.skip("needs /proc/self/maps to find the loaded libstarpu")
    assert level >= runtime.REQUIRED_STARPU_PATCH_LEVEL, (
        f"the loaded StarPU ({runtime._loaded_starpu_path()}) has patch level {level}: rebuild it with "
        "scripts/install_starpu.sh")
    assert nt.info()["starpu_patch_level"] == level
    with pytest.warns(RuntimeWarning, match=r"built without the patch; nntile_torch needs level \d+ .*install_starpu"):
        runtime._check_starpu_patch(level=0)
    monkeypatch.setenv("NNTILE_REQUIRE_PATCHED_STARPU", "1")
    with pytest.raises(RuntimeError, match=r"built with patch level 0|without the patch.*an error, not a warning"):
        runtime._check_starpu_patch(level=0)
    runtime._check_starpu_patch(level=runtime.REQUIRED_STARPU_PATCH_LEVEL)  # nothing to say


def test_the_eviction_comparison_reruns_only_a_difference_from_before_any_eviction(monkeypatch, tmp_path):
    """assert_same_training_runs forgives once, by running both settings again, losses that differ from the first
    step on while both disk nodes were empty; a later first difference, one after tiles were evicted, or one that
    comes back in the second pair fails."""
    import conftest
    from conftest import EvictionRun

    w, other = torch.zeros(3), torch.ones(3)

    def fake(script):
        calls = []

        def run(tmp, tag, **env):
            calls.append(tag)
            return script[len(calls) - 1]
        return run, calls

    good = EvictionRun(w, 5, 0, [1.0, 2.0], 0)
    cases = [  # (the runs in call order, passes, calls)
        ([good, EvictionRun(other, 5, 0, [1.5, 2.0], 0), good, good], True, 4),  # first loss, empty disks: again
        ([good, EvictionRun(other, 5, 0, [1.5, 2.0], 0), good, EvictionRun(other, 5, 0, [1.5, 2.0], 0)], False, 4),
        ([good, EvictionRun(other, 5, 0, [1.5, 2.0], 3)], False, 2),  # evicted before the first loss: no second pair
        ([good, EvictionRun(other, 5, 0, [1.0, 2.5], 0)], False, 2),  # differs from the second step on
        ([good, good], True, 2),
    ]
    for script, passes, ncalls in cases:
        run, calls = fake(script)
        monkeypatch.setattr(conftest, "train_under_eviction", run)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            if passes:
                conftest.assert_same_training_runs(tmp_path, "fake", ("a", {}), ("b", {}))
            else:
                with pytest.raises(AssertionError):
                    conftest.assert_same_training_runs(tmp_path, "fake", ("a", {}), ("b", {}))
        assert len(calls) == ncalls, (script, calls)
