"""Tile GEMM TFLOP/s beside torch.matmul (same sizes, same run), and StarPU task overhead on tiny tiles.

    python -m benchmarks.gemm --size 8192 --tiles 2048 4096 8192 --out results/gemm.json

On a GPU the tile GEMM runs on CUDA workers only (ncpus=0) so that CPU workers do not take GEMM tiles; the
torch side uses the same matrices. Each figure is the median of --reps runs after --warmup runs.
"""
import argparse
import json
import platform
import time

import torch

import nntile_torch as nt
from benchmarks.common import median_time
from nntile_torch import _C

MODES = {  # name -> (torch dtype of A and B, precision mode, torch setup)
    "fp32": (torch.float32, "fp32"),
    "tf32": (torch.float32, "tf32"),
    "bf16": (torch.bfloat16, "fp32"),       # bf16 tiles in, fp32 accumulate and output
    "bf16-from-fp32": (torch.float32, "bf16"),  # fp32 tiles rounded to bf16 by cuBLAS
}



def torch_matmul(n, mode, device, warmup, reps):
    dtype = MODES[mode][0]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t = median_time(lambda: torch.matmul(a, b), warmup, reps, sync)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * n**3 / t / 1e12


def tile_gemm(n, tile, mode, warmup, reps):
    dtype, precision = MODES[mode]
    a = nt.TileTensor.from_dense(torch.randn(n, n, dtype=dtype), (tile, tile))
    b = nt.TileTensor.from_dense(torch.randn(n, n, dtype=dtype), (tile, tile))
    c = nt.TileTensor.empty((n, n), (tile, tile))
    t = median_time(lambda: _C.gemm(False, a.tiles, False, b.tiles, c.tiles, 1.0, 0.0, precision), warmup, reps,
                    nt.synchronize)
    # Check the last product against torch (on the host, in float64 for a reference).
    ref = a.materialize().double() @ b.materialize().double()
    rel = ((c.materialize().double() - ref).norm() / ref.norm()).item()
    return 2 * n**3 / t / 1e12, rel


def task_overhead(ntasks, where):
    """Tasks per second for `add` on 1-element tiles: submission plus execution, i.e. the scheduler's cost."""
    x = nt.TileTensor.from_dense(torch.randn(ntasks), (1,))
    y = nt.TileTensor.from_dense(torch.randn(ntasks), (1,))
    _C.add(1.0, x.tiles, 1.0, y.tiles)
    nt.synchronize()
    t0 = time.perf_counter()
    _C.add(1.0, x.tiles, 1.0, y.tiles)
    t_submit = time.perf_counter() - t0
    nt.synchronize()
    t = time.perf_counter() - t0
    return {"where": where, "tasks": ntasks, "tasks_per_s": ntasks / t, "submit_per_s": ntasks / t_submit}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tiles", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--overhead-tasks", type=int, default=20000)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()

    cuda = torch.cuda.is_available() and _C.built_with_cuda
    device = "cuda" if cuda else "cpu"
    rows = []
    nt.init(ncpus=0 if cuda else None, scheduler="dmdas" if cuda else None)
    info = nt.info()
    for mode in args.modes:
        if mode != "fp32" and not cuda:
            continue
        ref = torch_matmul(args.size, mode, device, args.warmup, args.reps)
        for tile in args.tiles:
            tf, rel = tile_gemm(args.size, tile, mode, args.warmup, args.reps)
            rows.append({"mode": mode, "n": args.size, "tile": tile, "nntile_tflops": tf, "torch_tflops": ref,
                         "ratio": tf / ref, "rel_error": rel})
            print(f"gemm {mode:15s} n={args.size} tile={tile:5d}: {tf:7.1f} TFLOP/s  torch {ref:7.1f}  "
                  f"ratio {tf / ref:.2f}  rel.err {rel:.1e}", flush=True)
    nt.shutdown()
    overhead = []
    for label, kw in [("cpu workers", dict(ncuda=0))] + ([("cuda worker", dict(ncpus=0))] if cuda else []):
        nt.init(**kw)
        overhead.append(task_overhead(args.overhead_tasks, label))
        nt.shutdown()
    result = {
        "machine": platform.node(), "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "starpu": info["starpu_version"],
        "scheduler": info["scheduler"], "workers": info["workers"], "gemm": rows, "task_overhead": overhead,
    }
    print("\n| mode | tile | nntile TFLOP/s | torch.matmul TFLOP/s | ratio |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['tile']} | {r['nntile_tflops']:.1f} | {r['torch_tflops']:.1f} | {r['ratio']:.2f} |")
    for o in overhead:
        print(f"task overhead ({o['where']}): {o['tasks_per_s']:.0f} tasks/s end to end, "
              f"{o['submit_per_s']:.0f} tasks/s submitted")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
