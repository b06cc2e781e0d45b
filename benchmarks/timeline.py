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
`python -m benchmarks.timeline trace.json` summarises a chrome trace exported earlier.
"""
import argparse
import json
import os
import tempfile

KINDS = (("optimizer", ("adamw",)), ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas")),
         ("attention", ("flash", "fmha", "attention", "sdpa")))


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


def summarize(trace_events, bucket_s=0.05):
    """The numbers of a chrome trace's events (torch.profiler's export): times in seconds, bytes in GB."""
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
    if s.get("runtime_calls"):
        lines.append("  CUDA calls (every thread): " + ", ".join(f"{c['name']} {c['count']}x {c['s']:.3f} s"
                                                               for c in s["runtime_calls"][:6]))
    return "\n".join(lines)


def plot(s, path, title=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [i * s["bucket_s"] for i in range(len(s["busy"]))]
    fig, (a, b) = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    a.fill_between(t, [100 * x for x in s["busy"]], step="post", alpha=0.6, label="some kernel running")
    a.fill_between(t, [100 * x for x in s["optimizer"]], step="post", alpha=0.8, label="optimizer kernels")
    a.set_ylabel("GPU busy, %")
    a.set_ylim(0, 105)
    a.legend(loc="lower right")
    a.set_title(title or "one training step on the GPU")
    b.step(t, s["h2d_gbps"], where="post", label="host to GPU")
    b.step(t, s["d2h_gbps"], where="post", label="GPU to host")
    b.set_ylabel("copies, GB/s")
    b.set_xlabel(f"seconds into the step ({s['bucket_s'] * 1000:.0f} ms buckets)")
    b.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Timeline:
    """torch.profiler over the with-block (CUDA activity only); save() summarises, writes JSON and a plot."""

    def __init__(self, bucket_s=0.05):
        self.bucket_s = bucket_s
        self.prof = None

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self.prof = profile(activities=[ProfilerActivity.CUDA])
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        return False

    def save(self, prefix, title=""):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self.prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        s = summarize(events, self.bucket_s)
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
