"""Repeats the eviction training of tests/conftest.py (train_under_eviction) and compares every run with the first:
final weights bit for bit and, with task_hashes.c preloaded, each task's input and output hashes, naming the first
task where a run parts way (issue 35). Each run is a fresh process with its own disk node directory.

    python dev/task_hashes/repeat.py -n 200                      # the default window
    python dev/task_hashes/repeat.py -n 200 STARPU_LIMIT_MAX_SUBMITTED_TASKS=6 STARPU_LIMIT_MIN_SUBMITTED_TASKS=3
    python dev/task_hashes/repeat.py -n 200 NNTILE_HOST_HOMES=12MiB
    python dev/task_hashes/repeat.py -n 50 --compare A B          # two settings alternately, every run against A's first

Prints one line per differing run and a summary (runs, differing runs, seconds per run). --keep DIR keeps the traces
and weights. --no-hashes runs without the preloaded library (its hashing slows each CPU task a little)."""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def starpu_cflags():
    """-I flags of the StarPU that nntile_torch builds with: setup.py's prefix (STARPU_PREFIX or its default) through
    pkg-config, or the prefix's include directory where there is no pkg-config."""
    text = (ROOT / "setup.py").read_text()
    default = next(line.split("=", 1)[1].strip().strip('"') for line in text.splitlines()
                   if line.startswith("DEFAULT_STARPU_PREFIX"))
    prefix = pathlib.Path(os.environ.get("STARPU_PREFIX", default))
    pc = prefix / "lib" / "pkgconfig"
    for series in ("1.4", "1.3"):
        if (pc / f"starpu-{series}.pc").exists():
            if shutil.which("pkg-config"):
                env = dict(os.environ, PKG_CONFIG_PATH=str(pc))
                return subprocess.check_output(["pkg-config", "--cflags-only-I", f"starpu-{series}"], env=env,
                                               text=True).split()
            return [f"-I{prefix / 'include' / 'starpu' / series}"]
    raise SystemExit(f"task_hashes: no StarPU under {prefix} (set STARPU_PREFIX)")


def build(workdir):
    """task_hashes.so from task_hashes.c, against the StarPU nntile_torch builds with."""
    out = workdir / "task_hashes.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-o", str(out), str(HERE / "task_hashes.c"),
                    *starpu_cflags(), "-ldl", "-lpthread"], check=True)
    return out


def trace(path):
    """{task index: (name, worker, [(in, out, producer) per buffer])}"""
    tasks = {}
    for line in open(path):
        p = line.split()
        tasks[int(p[0])] = (p[2], int(p[1]), [tuple(b.split("/")) for b in p[4:]])
    return tasks


def first_difference(a, b):
    """The first task (by submission index) whose input or output hashes differ between traces a and b."""
    for i in sorted(set(a) | set(b)):
        if i not in a or i not in b:
            return f"task {i} ran in only one of the runs"
        (name, wa, ba), (_, wb, bb) = a[i], b[i]
        ins = [k for k in range(len(ba)) if ba[k][0] != bb[k][0]]
        outs = [k for k in range(len(ba)) if ba[k][1] != bb[k][1]]
        if ins or outs:
            producers = [ba[k][2] for k in ins]
            what = (f"inputs {ins} differ (written by tasks {producers}, -1: by the host)" if ins
                    else f"same inputs, outputs {outs} differ")
            return f"task {i} ({name}, workers {wa} and {wb}): {what}"
    return "no task differs (the difference is outside the CPU tasks: host copies, torch ops)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="runs (default 50)")
    ap.add_argument("--keep", help="directory to keep traces and weights in")
    ap.add_argument("--no-hashes", action="store_true", help="do not preload task_hashes.so")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="two settings ('KEY=V,KEY=V' or '-' for none) run alternately")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("env", nargs="*", help="KEY=VALUE settings for every run")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from conftest import _EVICTION_TRAINING  # noqa: E402

    workdir = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="task_hashes_"))
    workdir.mkdir(parents=True, exist_ok=True)
    lib = None if args.no_hashes else build(workdir)
    base = dict(os.environ, PYTHONPATH=str(ROOT), NNTILE_PLAN_RATES="defaults")
    base.update(kv.split("=", 1) for kv in args.env)
    settings = [{}]
    if args.compare:
        settings = [dict(kv.split("=", 1) for kv in s.split(",")) if s != "-" else {} for s in args.compare]
    ref_w = ref_t = None
    differing = 0
    t0 = time.time()
    for i in range(args.n):
        setting = settings[i % len(settings)]
        disk = workdir / "disk"
        shutil.rmtree(disk, ignore_errors=True)
        disk.mkdir()
        w_path, t_path = workdir / f"w_{i:04d}.pt", workdir / f"t_{i:04d}.txt"
        env = dict(base, DISK=str(disk), OUTFILE=str(w_path), **setting)
        if lib:
            env.update(LD_PRELOAD=str(lib), TASK_HASHES_OUT=str(t_path))
        p = subprocess.run([sys.executable, "-c", _EVICTION_TRAINING], env=env, capture_output=True, text=True,
                           timeout=args.timeout)
        if p.returncode != 0:
            print(f"run {i} failed:\n{p.stderr[-2000:]}")
            differing += 1
            continue
        w = torch.load(w_path)
        if ref_w is None:
            ref_w, ref_t = w, (trace(t_path) if lib else None)
            continue
        if not torch.equal(w, ref_w):
            differing += 1
            d = (w - ref_w).abs()
            where = first_difference(ref_t, trace(t_path)) if lib else "(no hashes)"
            print(f"run {i} {setting or ''}: {int((d > 0).sum())} weights differ (max {d.max().item():.3e}); "
                  f"first differing task: {where}", flush=True)
        elif lib:
            where = first_difference(ref_t, trace(t_path))
            if not where.startswith("no task"):
                print(f"run {i}: same weights, but {where}", flush=True)
        if not args.keep:
            w_path.unlink()
            if lib and i > 0:
                t_path.unlink()
    n = args.n
    print(f"{differing} of {n - 1} runs differ from the first ({(time.time() - t0) / n:.1f} s per run; "
          f"settings {args.env} {args.compare or ''})")


if __name__ == "__main__":
    main()
