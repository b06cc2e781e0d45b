"""Where the GPU's idle time between tasks goes, from a task trace (nntile_torch.task_trace()).

A GPU worker runs its tasks in order on one stream. When a task A finishes and the next task B was not launched
yet, the GPU idles until B's kernels are launched: that stretch is on the worker's thread, from StarPU seeing A
finished (A's "end") to the end of B's codelet function. Each such gap is cut at B's own steps, clipped so that
every stage starts where the previous one ended:

  release   A's completion handled until B enters the scheduler (A's data released, B's dependencies met)
  push      the scheduler placing B (push_start -> push_end)
  queue     B waiting in the worker's queue until the worker pops it (push_end -> pop_end)
  acquire   B's data made ready on the GPU (pop_end -> acquire_end)
  driver    the driver's loop until it calls B's function (acquire_end -> func_enter)
  function  B's codelet function on the worker's thread: our kernels' launches (func_enter -> func_exit)

Not seen here: how long after A's last kernel the driver noticed (it polls CUDA events) and how long B's first
kernel takes from its launch to its start on the GPU (a few microseconds).

    python -m benchmarks.dispatch trace.json    # a saved trace (a list of records; .json.gz too): its summary
"""
import gzip
import json
import statistics
import sys
from collections import defaultdict

STAGES = ("release", "push", "queue", "acquire", "driver", "function")
_MARKS = ("push_start", "push_end", "pop_end", "acquire_end", "func_enter", "func_exit")


def gaps(records):
    """Per worker, the gaps where the worker had nothing launched when a task finished: a list of
    (A's name, B's name, {stage: microseconds}) in order."""
    by_worker = defaultdict(list)
    for r in records:
        if r.get("func_exit") is not None and r.get("end") is not None:
            by_worker[r["worker"]].append(r)
    out = defaultdict(list)
    for worker, rs in by_worker.items():
        rs.sort(key=lambda r: r["func_exit"])  # launch order (one stream per worker)
        for a, b in zip(rs, rs[1:]):
            if b["func_exit"] <= a["end"]:
                continue  # B was launched behind A: no idle when A finished
            t = a["end"]
            stages = {}
            for stage, mark in zip(STAGES, _MARKS):
                v = b.get(mark)
                v = t if v is None else max(t, v)
                stages[stage] = v - t
                t = v
            out[worker].append((a["name"], b["name"], stages))
    return out


def summarize(records, kind="cuda"):
    """The gaps of each worker of that kind ("cuda", "cpu"; None: every worker): count, milliseconds per stage in
    all, median microseconds per gap and per stage, and the codelet function's median by task name (the top 12 by
    time)."""
    result = {"tasks": len(records), "workers": {}}
    kinds = {r["worker"]: r.get("kind") for r in records}
    for worker, gs in sorted(gaps(records).items()):
        if kind is not None and kinds.get(worker) != kind:
            continue
        total = {s: sum(g[2][s] for g in gs) / 1e3 for s in STAGES}
        funcs = defaultdict(list)
        for _, b, st in gs:
            funcs[b].append(st["function"])
        top = sorted(funcs.items(), key=lambda kv: -sum(kv[1]))[:12]
        result["workers"][str(worker)] = {
            "tasks": sum(1 for r in records if r.get("worker") == worker),
            "gaps": len(gs),
            "gap_ms": round(sum(total.values()), 2),
            "ms_by_stage": {s: round(v, 2) for s, v in total.items()},
            "median_us_by_stage": {s: round(statistics.median(g[2][s] for g in gs), 1) if gs else 0.0
                                   for s in STAGES},
            "median_gap_us": round(statistics.median(sum(g[2].values()) for g in gs), 1) if gs else 0.0,
            "function_by_task": [{"name": n, "gaps": len(v), "median_us": round(statistics.median(v), 1),
                                  "ms": round(sum(v) / 1e3, 2)} for n, v in top],
        }
    return result


def _union_ms(intervals):
    total, until = 0.0, None
    for a, b in sorted(intervals):
        if until is None or a > until:
            total, until = total + (b - a), b
        elif b > until:
            total, until = total + (b - until), b
    return total / 1e3


def step_summary(records, top=5):
    """One step's trace in brief, to find what a slow step did differently: its tasks, the span from the first
    submission to the last task's end and how long submitting took (ms), how long the GPU workers had tasks
    running (the union of their tasks' start-end, ms), their gaps (as summarize()), and the longest gaps and tasks."""
    subs = [r["submit"] for r in records if r.get("submit") is not None]
    ends = [r["end"] for r in records if r.get("end") is not None]
    cuda = [r for r in records if r.get("kind") == "cuda" and r.get("start") is not None and r.get("end") is not None]
    out = {"tasks": len(records),
           "span_ms": round((max(ends) - min(subs)) / 1e3, 3) if subs and ends else None,
           "submit_ms": round((max(subs) - min(subs)) / 1e3, 3) if subs else None,
           "gpu_busy_ms": round(_union_ms([(r["start"], r["end"]) for r in cuda]), 3)}
    kinds = {r["worker"]: r.get("kind") for r in records}
    on = "cuda" if cuda else "cpu"  # the GPU workers' gaps, or the CPU workers' in a CPU-only run
    mine = [g for w, gs in gaps(records).items() if kinds.get(w) == on for g in gs]
    by_stage = {st: sum(g[2][st] for g in mine) / 1e3 for st in STAGES}
    out["gap_ms"] = round(sum(by_stage.values()), 3)
    out["gap_ms_by_stage"] = {st: round(v, 3) for st, v in by_stage.items()}
    longest = sorted(mine, key=lambda g: -sum(g[2].values()))[:top]
    out["longest_gaps"] = [{"after": a, "before": b, "us": round(sum(st.values()), 1),
                            "stage": max(st, key=st.get)} for a, b, st in longest]
    out["longest_tasks"] = [{"name": r["name"], "us": round(r["end"] - r["start"], 1)}
                            for r in sorted(cuda, key=lambda r: r["start"] - r["end"])[:top]]
    return out


def report(summary):
    """The summary as lines of text."""
    lines = []
    for worker, w in summary["workers"].items():
        lines.append(f"dispatch, worker {worker}: {w['tasks']} tasks, {w['gaps']} gaps with nothing launched, "
                     f"{w['gap_ms']:.1f} ms of worker time in them (median {w['median_gap_us']:.1f} us per gap)")
        lines.append("  " + ", ".join(f"{s} {w['ms_by_stage'][s]:.1f} ms (median {w['median_us_by_stage'][s]:.1f} us)"
                                      for s in STAGES))
        lines.append("  codelet functions in gaps: " + ", ".join(
            f"{f['name']} {f['gaps']}x {f['median_us']:.1f} us" for f in w["function_by_task"]))
    return "\n".join(lines) if lines else "dispatch: no GPU worker in the trace"


def main(argv=None):
    path = (argv or sys.argv[1:])[0]
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        records = json.load(f)
    print(report(summarize(records, kind=None)))


if __name__ == "__main__":
    main()
