"""Where a converted GPT-2 step spends its time: setup phases, per step the time to submit the tasks (the Python
thread) against the time until they have all run, and for one step under torch.profiler the GPU kernels (busy
time, count, top kernels by total time), so the gap between wall time and kernel time is visible.

    python -m benchmarks.profile_step --config xl --batch 8 --seq 1024 [--batch-tile-size 8192] [--ncpus 1]
    python -m benchmarks.profile_step --model nanogpt --config xl      # a model family of benchmarks/models.py
    python -m benchmarks.profile_step --config llama3-8b --batch 16     # beyond GPU memory: the memory plan's path

The memory plan (nt.plan: the model built on meta, every tile placed before step 1) is used by default where the
user needs it: on GPUs when AdamW's float32 state (16 bytes per parameter) exceeds the GPU's memory, as
nt.convert's warning says (--plan on / off to choose).

Prints a summary and writes it as JSON (--out). StarPU's own worker and bus statistics are printed at exit when
STARPU_WORKER_STATS=1 / STARPU_BUS_STATS=1 are set (StarPU reads them at init).
"""
import argparse
import json
import statistics
import time

import torch

from benchmarks import models
from benchmarks.configs import CONFIGS, default_model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="xl", choices=sorted(CONFIGS))
    ap.add_argument("--model", choices=models.MODELS, help="model (default: the config's family's first: hf, llama, "
                    "qwen2)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--tile-size", type=int)
    ap.add_argument("--batch-tile-size", type=int)
    ap.add_argument("--ncpus", type=int)
    ap.add_argument("--scheduler")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0, help="every dropout of the model (default 0)")
    ap.add_argument("--dropout-on", default="all", choices=["all", "attention"],
                    help="which dropouts --dropout sets: every one (default) or the attention's alone")
    ap.add_argument("--plan", default="auto", choices=["auto", "on", "off"],
                    help="the memory plan (nt.plan): auto (default) where AdamW's float32 state exceeds the GPU's "
                    "memory, on, or off (nt.convert and nt.optim.AdamW with their defaults)")
    ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler step")
    ap.add_argument("--out", help="JSON summary")
    args = ap.parse_args()
    args.model = args.model or default_model(args.config)

    import nntile_torch as nt
    from nntile_torch.accounting import adamw_state_bytes, machine_capacity
    cuda = torch.cuda.is_available()
    out = {"args": vars(args)}
    shape = CONFIGS[args.config]
    build = (args.model, args.config, args.seq, args.dropout, args.dropout_on)
    plan = None
    if args.plan != "off":
        with torch.device("meta"):
            shape_only = models.build(*build)
        params = sum(p.numel() for p in {id(p): p for p in shape_only.parameters()}.values())
        cap = machine_capacity()  # what convert()'s warning compares against
        if args.plan == "on" or (cuda and adamw_state_bytes(params, args.precision) > cap.gpu_bytes * cap.gpus):
            plan = nt.plan(shape_only, args.batch, args.seq, args.precision)
            print(plan, flush=True)
    out["planned"] = plan is not None
    t = time.perf_counter()
    if plan is not None:
        plan.init(ncpus=args.ncpus, scheduler=args.scheduler)
    else:
        nt.init(ncpus=args.ncpus, scheduler=args.scheduler)
    out["init_s"] = time.perf_counter() - t
    torch.manual_seed(0)
    dev = "cuda" if cuda else "cpu"
    t = time.perf_counter()
    if plan is not None:
        model = shape_only  # on meta: convert builds it module by module into tiles
    else:
        with torch.device(dev):
            model = models.build(*build)
    shape_only = None
    if cuda:
        torch.cuda.synchronize()
    out["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = args.batch_tile_size or nt.config.rows_per_tile(args.batch, args.seq, cuda, nt.runtime.num_places())
    if plan is not None:
        from nntile_torch.convert import default_tile_size
        models.real_buffers(args.model, model, dev)
        model = nt.convert(model, precision=args.precision, tile_size=args.tile_size or default_tile_size(model, plan),
                           batch_tile_size=rows, plan=plan, init=models.module_init(args.model, model),
                           init_device=dev)
    else:
        tile = args.tile_size or max(1024, 3 * shape.hidden)
        model = nt.convert(model, precision=args.precision, tile_size=tile, batch_tile_size=rows)
    nt.synchronize()
    out["convert_s"] = time.perf_counter() - t
    if cuda:
        torch.cuda.empty_cache()
    t = time.perf_counter()
    opt = plan.optimizer(model.parameters(), lr=1e-4) if plan is not None else nt.optim.AdamW(model.parameters(),
                                                                                               lr=1e-4)
    out["optimizer_s"] = time.perf_counter() - t
    ids = torch.randint(0, shape.vocab, (args.batch, args.seq)).to(dev)

    def step():
        opt.zero_grad()
        loss = models.loss(args.model, model, ids)
        loss.backward()
        opt.step()
        return loss

    steps = []
    for s in range(args.steps):
        n0 = nt.stats()["tasks_submitted"]
        t = time.perf_counter()
        loss = step()
        t_sub = time.perf_counter() - t
        value = float(loss.detach())
        nt.synchronize()
        t_all = time.perf_counter() - t
        steps.append({"submit_s": t_sub, "step_s": t_all, "tasks": nt.stats()["tasks_submitted"] - n0, "loss": value})
        print(f"step {s}: submit {t_sub:.3f} s, all done {t_all:.3f} s, {steps[-1]['tasks']} tasks, loss {value:.4f}",
              flush=True)
    out["steps"] = steps
    out["step_s_median"] = statistics.median(x["step_s"] for x in steps[1:] or steps)
    if cuda and not args.no_profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            float(step().detach())
            nt.synchronize()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e6
        by_name = {}
        for e in kernels:
            n, tt = by_name.get(e.name, (0, 0.0))
            by_name[e.name] = (n + 1, tt + e.device_time / 1e6)
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]  # the tail of small kernels adds up too
        cpu_top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        out["profiled"] = {"wall_s": wall, "kernel_busy_s": busy, "kernels": len(kernels),
                           "top_kernels": [{"name": k[:90], "count": n, "s": s} for k, (n, s) in top]}
        print(f"profiled step: wall {wall:.3f} s, GPU kernels busy {busy:.3f} s ({len(kernels)} kernels)")
        for k, (n, s) in top[:15]:
            print(f"  {s:8.4f} s  {n:6d}x  {k[:90]}")
        print(cpu_top)
    out["stats"] = nt.stats()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k.endswith("_s") or k == "step_s_median"}), flush=True)
    nt.runtime._exit()  # StarPU prints its worker / bus statistics here when asked to


if __name__ == "__main__":
    main()
