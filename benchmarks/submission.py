"""How long the submitting thread takes per training step of a converted GPT-2, apart from the kernels.

A deep, narrow GPT-2 (by default 48 layers as GPT-2 XL, so the same 580 parameters and the same number of tasks per
step, but width 64) makes every kernel trivial; with the submission window off (nothing waits for execution) the
time until forward + backward return, and until the optimizer's step returns, is the cost of turning a step into
tasks: Python, autograd, the Function wrappers and StarPU's submission. On a GPU that cost has to stay below the
kernels' time, or the GPU waits (the optimizer's step, hundreds of small updates, is where it shows first).
Beside it, the same segments of torch eager (torch.optim.AdamW's default implementation) on the same model and
batches: on a GPU, where its kernels run asynchronously, that is the time its Python and launches take; on a CPU it
includes torch's kernels, so it is only an upper bound there.

The model is Hugging Face's GPT2LMHeadModel (--model hf, the default) or the nanoGPT-shaped model of
examples/nanogpt/model.py (--model nanogpt: the same tasks per step, with its attention's split, views and transposes
run as torch code on TileTensors). Beside the wall time, the submitting thread's own CPU time (the figure an A/B
of two trees on a 2-core machine can compare: the CPU worker executing the tasks competes for the cores).

    python -m benchmarks.submission --layers 48 --steps 12 --out submission.json
    python -m benchmarks.submission --model nanogpt --steps 22
"""
import argparse
import json
import platform
import statistics
import time

import torch

import nntile_torch as nt

from . import models


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hf", choices=["hf", "nanogpt"],
                    help="hf: transformers' GPT2LMHeadModel; nanogpt: examples/nanogpt/model.py (default hf)")
    ap.add_argument("--layers", type=int, default=48, help="GPT-2 blocks (default 48, as GPT-2 XL)")
    ap.add_argument("--width", type=int, default=64, help="hidden size (default 64: trivial kernels)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12, help="steps; the first 2 are warm-up (default 12)")
    ap.add_argument("--step-in-backward", action="store_true",
                    help="AdamW(step_in_backward=True): the updates are submitted inside backward and counted there")
    ap.add_argument("--out", help="JSON file for the figures")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.width < 2 or args.width % 2 or args.steps < 3:
        ap.error("--layers >= 1, an even --width >= 2 and --steps >= 3 are needed")
    return args


def timed_steps(model, opt, ids, steps, sync, family="hf"):
    """Medians over the steps after 2 of warm-up: seconds until forward + backward return, the submitting thread's
    CPU seconds for them, seconds until the optimizer's step returns (each started with nothing pending); and the
    tasks submitted per step (0 for torch)."""
    fwd_bwd, cpu, step, tasks = [], [], [], []
    for _ in range(steps):
        sync()
        n0 = nt.stats()["tasks_submitted"]
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = models.loss(family, model, ids)
        loss.backward()
        t1, c1 = time.perf_counter(), time.thread_time()
        sync()  # the optimizer's step is timed alone
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        del loss
        sync()
        fwd_bwd.append(t1 - t0)
        cpu.append(c1 - c0)
        step.append(t3 - t2)
        tasks.append(nt.stats()["tasks_submitted"] - n0)
    return statistics.median(fwd_bwd[2:]), statistics.median(cpu[2:]), statistics.median(step[2:]), tasks[-1]


def build(family, layers, width, seq):
    """The model, fp32 on the CPU, seeded: 2 heads, vocabulary 256, no dropout."""
    torch.manual_seed(0)
    if family == "nanogpt":
        m = models.nanogpt_module()
        return m.GPT(m.GPTConfig(block_size=seq, vocab_size=256, n_layer=layers, n_head=2, n_embd=width, dropout=0.0))
    import transformers
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=256, n_positions=seq,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def main(argv=None):
    args = parse_args(argv)
    ids = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = build(args.model, args.layers, args.width, args.seq).to(device)
    torch_fb, _, torch_step, _ = timed_steps(ref, torch.optim.AdamW(ref.parameters(), lr=1e-3), ids.to(device),
                                             args.steps, torch.cuda.synchronize if device == "cuda" else lambda: None,
                                             args.model)
    nt.init(ncpus=1, ncuda=0, max_submitted_tasks=0)  # one CPU worker; submission never waits
    model = nt.convert(build(args.model, args.layers, args.width, args.seq), batch_tile_size=args.batch * args.seq)
    opt = nt.optim.AdamW(model.parameters(), lr=1e-3, step_in_backward=args.step_in_backward)
    fb, fb_cpu, st, tasks = timed_steps(model, opt, ids, args.steps, nt.synchronize, args.model)
    nparams = sum(len(g["params"]) for g in opt.param_groups)
    res = {"model": args.model, "layers": args.layers, "width": args.width, "params": nparams,
           "tasks_per_step": tasks, "step_in_backward": args.step_in_backward, "forward_backward_s": fb,
           "forward_backward_cpu_s": fb_cpu, "optimizer_step_s": st,
           "torch_forward_backward_s": torch_fb, "torch_optimizer_step_s": torch_step, "torch_device": device,
           "cpu": platform.processor() or platform.machine(), "torch": torch.__version__}
    res["us_per_task"] = (res["forward_backward_s"] + res["optimizer_step_s"]) / max(res["tasks_per_step"], 1) * 1e6
    res["optimizer_us_per_param"] = res["optimizer_step_s"] / nparams * 1e6
    print(f"{args.model}, {args.layers} layers, {nparams} parameters, {res['tasks_per_step']} tasks per step: "
          f"forward+backward {res['forward_backward_s'] * 1e3:.1f} ms ({fb_cpu * 1e3:.1f} ms of the submitting "
          f"thread's CPU), optimizer step {res['optimizer_step_s'] * 1e3:.1f} ms "
          f"({res['optimizer_us_per_param']:.1f} us per parameter; {res['us_per_task']:.1f} us per task overall); "
          f"torch eager on {device}{' (kernels included)' if device == 'cpu' else ''}: forward+backward "
          f"{torch_fb * 1e3:.1f} ms, optimizer step "
          f"{torch_step * 1e3:.1f} ms; medians of {args.steps - 2} steps")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    nt.shutdown()
    return res


if __name__ == "__main__":
    main()
