"""A GPU timeline of one training step: when the GPU computes, when it copies to and from the host, and when it
waits, from torch.profiler's CUDA activity (every stream of the process, StarPU's included).

    from benchmarks.timeline import Timeline
    with Timeline() as tl:
        step()
        synchronize()
    summary = tl.save("run.timeline")   # run.timeline.json (numbers) and run.timeline.png (three lanes)

The harness records one with `python -m benchmarks.run ... --timeline` (the last timed step of each attempt, beside
its log). The summary says, per bucket of the step (50 ms by default) and in total: the time some kernel ran (the
union over streams), bytes copied host to GPU and back, and the GPU's idle time split by what the copy engines did
meanwhile (an idle GPU while copies run: waiting for data; idle with no copy: waiting for work or dependencies).
A third lane, from /proc (Linux), shows the CPU time of the process's threads per bucket: StarPU's CPU workers
(threads named "CPU <n>": the host blocks' AdamW updates beyond GPU memory) apart from the other threads (Python's
submission and autograd), StarPU's CUDA drivers left out (they poll without pause). StarPU 1.3.10's CPU workers poll
for tasks too: on the H200 they show a core each whether they compute or wait (20B: 14.0 of 14 throughout), so the
lane tells the submitting threads' load, and CPU time a worker spends beyond its core. Its zero is the sampler's
start, within a few ms of the first GPU activity; samples every 20 ms.
`python -m benchmarks.timeline trace.json` summarises a chrome trace exported earlier.
"""
import argparse
import json
import os
import re
import tempfile
import threading
import time

# attention before matmul: ATen's memory-efficient attention kernels are named fmha_cutlass...
KINDS = (("optimizer", ("adamw",)), ("attention", ("flash", "fmha", "attention", "sdpa")),
         ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas")))


def kernel_kind(name):
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def _merge(intervals):
    """Sorted, disjoint union of (start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _length(merged):
    return sum(e - s for s, e in merged)


def _intersect(a, b):
    """Union a intersected with union b (both merged)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _per_bucket(merged, t0, width, n):
    out = [0.0] * n
    for s, e in merged:
        k = max(0, int((s - t0) // width))
        while k < n and s < e:
            edge = t0 + (k + 1) * width
            part = min(e, edge) - s
            if part > 0:
                out[k] += part
            s = edge
            k += 1
    return out


def _bytes_per_bucket(copies, t0, width, n):
    """Bytes of each copy spread evenly over its duration."""
    out = [0.0] * n
    for s, e, b in copies:
        d = max(e - s, 1e-9)
        for k, part in enumerate(_per_bucket([[s, e]], t0, width, n)):
            if part:
                out[k] += b * part / d
    return out


def _thread_kind(name):
    """'workers' (StarPU's CPU workers), None (StarPU's CUDA drivers and watchdog: left out) or 'other'."""
    if re.fullmatch(r"CPU \d+", name):
        return "workers"
    if re.fullmatch(r"CUDA \d+", name) or name == "watchdog":
        return None
    return "other"


def thread_lanes(samples, bucket_s, n):
    """Per bucket, the cores' worth of CPU time StarPU's CPU workers and the other threads ran, from samples
    [(seconds since the sampler's start, {thread id: (name, CPU ns so far)})]: each thread's time between two samples
    spread evenly over that interval."""
    lanes = {"workers": [0.0] * n, "other": [0.0] * n}
    workers = set()
    for (t_a, a), (t_b, b) in zip(samples, samples[1:]):
        for tid, (name, ns) in b.items():
            kind = _thread_kind(name)
            if kind is None or tid not in a:
                continue
            if kind == "workers":
                workers.add(tid)
            d = (ns - a[tid][1]) * 1e-9
            if d <= 0 or t_b <= t_a:
                continue
            for k, part in enumerate(_per_bucket([[t_a, t_b]], 0.0, bucket_s, n)):
                if part:
                    lanes[kind][k] += d * part / (t_b - t_a)
    return {"cpu_workers": len(workers), "cpu_workers_busy_core_s": round(sum(lanes["workers"]), 4),
            "other_threads_busy_core_s": round(sum(lanes["other"]), 4),
            "cpu_workers_busy": [round(x / bucket_s, 3) for x in lanes["workers"]],
            "other_threads_busy": [round(x / bucket_s, 3) for x in lanes["other"]]}


class ThreadSampler:
    """Samples every `period` s the CPU time of each thread of this process (/proc/self/task/*/schedstat, in ns) and
    its name, on a daemon thread, between start() and stop(); .samples as thread_lanes() takes them. Does nothing
    where /proc has no schedstat."""

    def __init__(self, period=0.02):
        self.period, self.samples, self._names = period, [], {}
        self._stop = threading.Event()
        self._thread = None

    def _read(self):
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                if tid not in self._names:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        self._names[tid] = f.read().strip()
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[tid] = (self._names[tid], int(f.read().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def _run(self):
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, self._read()))
            self._stop.wait(self.period)
        self.samples.append((time.perf_counter() - t0, self._read()))

    def start(self):
        if os.path.exists("/proc/self/task") and os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"):
            self._thread = threading.Thread(target=self._run, name="timeline-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def summarize(trace_events, bucket_s=0.05, thread_samples=None):
    """The numbers of a chrome trace's events (torch.profiler's export): times in seconds, bytes in GB; with
    ThreadSampler's samples, the CPU lanes of thread_lanes() too."""
    kernels, optimizer, h2d, d2h = [], [], [], []
    by_name, by_kind, calls = {}, {}, {}
    for ev in trace_events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat, name = ev.get("cat", ""), ev.get("name", "")
        s = float(ev["ts"]) * 1e-6
        e = s + float(ev["dur"]) * 1e-6
        if cat == "kernel":
            kernels.append((s, e))
            n, t = by_name.get(name, (0, 0.0))
            by_name[name] = (n + 1, t + e - s)
            kind = kernel_kind(name)
            by_kind[kind] = by_kind.get(kind, 0.0) + e - s
            if kind == "optimizer":
                optimizer.append((s, e))
        elif cat in ("cuda_runtime", "cuda_driver"):  # API calls of every thread (StarPU's workers too)
            n, t = calls.get(name, (0, 0.0))
            calls[name] = (n + 1, t + e - s)
            continue
        elif cat == "gpu_memcpy":
            b = float((ev.get("args") or {}).get("bytes", 0))
            if "HtoD" in name:
                h2d.append((s, e, b))
            elif "DtoH" in name:
                d2h.append((s, e, b))
    spans = [x[:2] for x in kernels] + [x[:2] for x in h2d] + [x[:2] for x in d2h]
    if not spans:
        return {"error": "no GPU activity in the trace (is CUPTI available?)"}
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    wall = t1 - t0
    busy = _merge(kernels)
    up = _merge([x[:2] for x in h2d])
    down = _merge([x[:2] for x in d2h])
    copying = _merge(up + down)
    idle = _merge([[s, e] for s, e in zip([t0] + [e for _, e in busy], [s for s, _ in busy] + [t1]) if e > s])
    idle_copying = _length(_intersect(idle, copying))
    n = max(1, int(wall // bucket_s) + 1)
    gb = 1e9
    out = {
        "wall_s": wall, "kernel_busy_s": _length(busy), "gpu_idle_s": _length(idle),
        "gpu_idle_while_copying_s": idle_copying, "gpu_idle_no_copy_s": _length(idle) - idle_copying,
        "h2d_gb": sum(b for *_, b in h2d) / gb, "d2h_gb": sum(b for *_, b in d2h) / gb,
        "h2d_active_s": _length(up), "d2h_active_s": _length(down), "both_directions_s": _length(_intersect(up, down)),
        "h2d_copies": len(h2d), "d2h_copies": len(d2h), "kernels": len(kernels),
        "kernel_s_by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": k[:100], "count": c, "s": round(t, 4)}
                        for k, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]],
        "runtime_calls": [{"name": k[:60], "count": c, "s": round(t, 4)}
                          for k, (c, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:12]],
        "bucket_s": bucket_s,
        "busy": [round(x / bucket_s, 3) for x in _per_bucket(busy, t0, bucket_s, n)],
        "optimizer": [round(x / bucket_s, 3) for x in _per_bucket(_merge(optimizer), t0, bucket_s, n)],
        "h2d_gbps": [round(x / gb / bucket_s, 2) for x in _bytes_per_bucket(h2d, t0, bucket_s, n)],
        "d2h_gbps": [round(x / gb / bucket_s, 2) for x in _bytes_per_bucket(d2h, t0, bucket_s, n)],
    }
    for d in ("h2d", "d2h"):
        active = out[f"{d}_active_s"]
        out[f"{d}_gbps_when_active"] = round(out[f"{d}_gb"] / active, 2) if active else None
    if thread_samples and len(thread_samples) > 1:
        out.update(thread_lanes(thread_samples, bucket_s, n))
    return out


def report(s):
    """A few readable lines of a summary."""
    if "error" in s:
        return s["error"]
    w = s["wall_s"]
    lines = [f"GPU timeline of one step: {w:.3f} s; kernels busy {s['kernel_busy_s']:.3f} s "
             f"({100 * s['kernel_busy_s'] / w:.0f}%), idle {s['gpu_idle_s']:.3f} s "
             f"(while copies ran {s['gpu_idle_while_copying_s']:.3f} s, with no copy {s['gpu_idle_no_copy_s']:.3f} s)",
             f"  to the GPU {s['h2d_gb']:.1f} GB in {s['h2d_active_s']:.3f} s of copying "
             f"({s['h2d_gbps_when_active'] or 0:.1f} GB/s then), back {s['d2h_gb']:.1f} GB in {s['d2h_active_s']:.3f} s "
             f"({s['d2h_gbps_when_active'] or 0:.1f} GB/s), both directions at once {s['both_directions_s']:.3f} s; "
             f"{s['h2d_copies']} + {s['d2h_copies']} copies, {s['kernels']} kernels",
             "  kernel time by kind: " + ", ".join(f"{k} {v:.3f} s" for k, v in s["kernel_s_by_kind"].items())]
    if s.get("cpu_workers"):
        lines.append(f"  CPU: {s['cpu_workers']} StarPU CPU workers ran {s['cpu_workers_busy_core_s']:.2f} core-s "
                     f"({s['cpu_workers_busy_core_s'] / w:.1f} cores on average), other threads "
                     f"{s['other_threads_busy_core_s']:.2f} core-s")
    if s.get("runtime_calls"):
        lines.append("  CUDA calls (every thread): " + ", ".join(f"{c['name']} {c['count']}x {c['s']:.3f} s"
                                                               for c in s["runtime_calls"][:6]))
    return "\n".join(lines)


def plot(s, path, title=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [i * s["bucket_s"] for i in range(len(s["busy"]))]
    cpu = "cpu_workers_busy" in s
    fig, axes = plt.subplots(3 if cpu else 2, 1, figsize=(12, 8 if cpu else 5.5), sharex=True)
    a, b = axes[0], axes[1]
    a.fill_between(t, [100 * x for x in s["busy"]], step="post", alpha=0.6, label="some kernel running")
    a.fill_between(t, [100 * x for x in s["optimizer"]], step="post", alpha=0.8, label="optimizer kernels")
    a.set_ylabel("GPU busy, %")
    a.set_ylim(0, 105)
    a.legend(loc="lower right")
    a.set_title(title or "one training step on the GPU")
    b.step(t, s["h2d_gbps"], where="post", label="host to GPU")
    b.step(t, s["d2h_gbps"], where="post", label="GPU to host")
    b.set_ylabel("copies, GB/s")
    b.legend(loc="upper right")
    if cpu:
        c = axes[2]
        c.step(t, s["cpu_workers_busy"], where="post",
               label=f"StarPU's {s['cpu_workers']} CPU workers (they poll: busy or waiting)")
        c.step(t, s["other_threads_busy"], where="post", label="other threads (submission, autograd)")
        c.set_ylabel("CPU, cores busy")
        c.legend(loc="upper right")
    axes[-1].set_xlabel(f"seconds into the step ({s['bucket_s'] * 1000:.0f} ms buckets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Timeline:
    """torch.profiler over the with-block (CUDA activity only); save() summarises, writes JSON and a plot."""

    def __init__(self, bucket_s=0.05):
        self.bucket_s = bucket_s
        self.prof = None
        self.sampler = ThreadSampler()

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self.prof = profile(activities=[ProfilerActivity.CUDA])
        self.prof.__enter__()
        self.sampler.start()
        return self

    def __exit__(self, *exc):
        self.sampler.stop()
        self.prof.__exit__(*exc)
        return False

    def save(self, prefix, title=""):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self.prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        s = summarize(events, self.bucket_s, self.sampler.samples)
        with open(prefix + ".json", "w") as f:
            json.dump(s, f)
        if "error" not in s:
            plot(s, prefix + ".png", title)
        return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a chrome trace (torch.profiler's export_chrome_trace)")
    ap.add_argument("--bucket", type=float, default=0.05, help="seconds per bucket (default 0.05)")
    ap.add_argument("--out", help="prefix for <out>.json and <out>.png")
    args = ap.parse_args()
    with open(args.trace) as f:
        s = summarize(json.load(f).get("traceEvents", []), args.bucket)
    print(report(s))
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(s, f)
        if "error" not in s:
            plot(s, args.out + ".png", os.path.basename(args.trace))


if __name__ == "__main__":
    main()
