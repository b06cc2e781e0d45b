"""Trains a GPT-2 (Hugging Face GPT2LMHeadModel) converted to tile tasks on an offline byte-level corpus.

    python -m nntile_torch.train                      # small model, a few minutes on 2 CPU cores
    python -m nntile_torch.train --compare-torch      # also trains the unconverted model on the same batches
    python -m nntile_torch.train --compare-fp64       # and a float64 copy: the reference both fp32 runs drift from
    python -m nntile_torch.train --checkpoint run/ckpt.pt --checkpoint-every 50
    python -m nntile_torch.train --resume run/ckpt.pt --steps 400

Writes <out>/log.json (settings, per-step losses, tokens/s) and <out>/loss.png. On a machine with a GPU it
trains there (--device cpu to stay on the CPU).

Training is chaotic: two fp32 runs that round differently (converted and unconverted) agree closely at first and
drift apart later, both equally valid. --compare-fp64 says whether the converted model rounds worse than PyTorch:
it measures how far each fp32 curve strays from the float64 one.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import time

import torch

import nntile_torch as nt
from nntile_torch.data import Batches, stdlib_corpus

SIZES = {  # name -> (layers, embedding width, heads)
    "tiny": (2, 128, 4),
    "small": (4, 256, 8),
    "gpt2": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=list(SIZES), help="size preset (default: tiny)")
    ap.add_argument("--n-layer", type=int, help="override the preset's layer count")
    ap.add_argument("--n-embd", type=int, help="override the preset's width")
    ap.add_argument("--n-head", type=int, help="override the preset's head count")
    ap.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    ap.add_argument("--steps", type=int, default=400, help="total steps (default 400)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--step-in-backward", action="store_true",
                    help="update each parameter as soon as its gradient is complete and drop the gradient "
                         "(AdamW(step_in_backward=True): less memory, same updates)")
    ap.add_argument("--bf16-adam-state", action="store_true",
                    help="keep AdamW's moments in bf16 with stochastic rounding (AdamW(state_dtype=torch.bfloat16): "
                         "4 bytes per parameter less, not bitwise torch's AdamW)")
    ap.add_argument("--offload", type=float, default=0.0,
                    help="share of the weights (0-1) whose AdamW runs on CPU workers with master weights and states "
                         "in host RAM (AdamW(offload=...)); with a GPU, the other cores become CPU workers")
    ap.add_argument("--no-plan", action="store_true",
                    help="no memory plan: without --step-in-backward, --bf16-adam-state or --offload the plan "
                         "(nt.plan, docs/memory_plan.md) picks those, activation checkpointing and the blocks kept "
                         "in host RAM from the model, the batch and the memory; it stops before step 1 when the "
                         "model fits nowhere")
    ap.add_argument("--bf16-master", action="store_true",
                    help="the memory plan keeps the blocks' matmul weights as bf16 master weights (master_dtype="
                         "torch.bfloat16: stochastic rounding in AdamW; bf16 or 8-bit moments, as the plan picks; "
                         "with --precision bf16): what the "
                         "plan does by itself only when fp32 master weights fit nowhere")
    ap.add_argument("--warmup", type=int, default=20, help="linear learning-rate warm-up steps")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--tile-size", type=int,
                    help="tile edge for weights (default: 3 x width, so that attention tiles hold whole rows and run "
                         "as tile tasks; 4 x width on GPUs when the model fits there: convert()'s default)")
    ap.add_argument("--batch-tile-size", type=int,
                   help="rows per activation tile (default: whole sequences; one per tile on CPUs, on GPUs the "
                        "batch split once per GPU)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--cuda-memory-limit", help="StarPU's share of GPU memory, e.g. 100GiB")
    ap.add_argument("--host-memory-limit", help="StarPU's share of host RAM, e.g. 64GiB (default: with GPUs, the "
                    "RAM less max(16 GiB, 1/8); on CPUs alone, no limit)")
    ap.add_argument("--max-submitted-tasks", type=int, help="StarPU's submission window: tasks pending before "
                    "the training loop waits (default 1000; 0: none)")
    ap.add_argument("--corpus-bytes", type=int, default=8 << 20, help="bytes of corpus to read (default 8 MiB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0, help="GPT-2's attn_pdrop, resid_pdrop and embd_pdrop "
                    "(Hugging Face's default is 0.1; default here 0, so --compare-torch compares the same numbers)")
    ap.add_argument("--compare-torch", action="store_true", help="train the unconverted model beside it")
    ap.add_argument("--compare-fp64", action="store_true",
                    help="also train a float64 copy of the unconverted model as the reference (implies "
                         "--compare-torch)")
    ap.add_argument("--checkpoint", help="path to save checkpoints to (atomically)")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end)")
    ap.add_argument("--resume", help="checkpoint to resume model, optimizer and step from")
    ap.add_argument("--out", default="train_run", help="output folder (default train_run)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    for name in ("seq", "batch", "steps"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive (got {getattr(args, name)})")
    args.compare_torch = args.compare_torch or args.compare_fp64
    return args


def build_model(args, device):
    import transformers
    layers, width, heads = SIZES[args.model]
    layers, width, heads = args.n_layer or layers, args.n_embd or width, args.n_head or heads
    if width % heads:
        raise SystemExit(f"--n-embd ({width}) must be a multiple of --n-head ({heads})")
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=256,
                                  n_positions=max(args.seq, 64), resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                                  attn_pdrop=args.dropout,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(args.seed)
    return transformers.GPT2LMHeadModel(cfg).to(device)


def lr_at(step, args):
    return args.lr * min(1.0, (step + 1) / max(1, args.warmup))


def hf_loss(model, ids):
    return model(ids, labels=ids).loss


def float64_loss(model, ids):
    """Next-byte cross-entropy in float64 throughout: Hugging Face's own loss casts the logits to float32, which
    would round the reference's loss and its gradient to fp32."""
    logits = model(ids).logits  # (batch, seq, vocab)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def atomic_save(obj, path):
    """torch.save(obj, path), atomically (atomic_write)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write(path, write):
    """write(f) into a binary file f that becomes `path`, such that `path` is always a whole file: the previous one,
    or the new one once complete. Written to a temporary file in the same directory, flushed to the disk (fsync),
    renamed over `path` (os.replace:
    atomic on POSIX), and the rename itself flushed (fsync of the directory). A process killed while saving (SIGKILL,
    the OOM killer, a power cut after the rename is on disk) leaves the previous checkpoint loadable; the temporary
    files such a process leaves are removed by the next save."""
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):  # leftovers of saves killed midway (their process is gone)
        pid = old[len(name) + 5:] if old.startswith(name + ".tmp.") else ""
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, old))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _stop_at_nonfinite(value, step, args):
    where = (f"; the checkpoint {args.checkpoint} is as it was: resume from it (--resume), with a lower --lr"
             if args.checkpoint else "")
    raise SystemExit(f"nntile_torch.train: the loss is {value} at step {step}; stopping before its update (no weight "
                     f"or optimizer state changed){where}")


def save_checkpoint(path, model, opt, step, log):
    """The model's and optimizer's state, the step and the log, saved atomically (atomic_save)."""
    atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "log": log}, path)


PAIRS = {  # name in the log's "deviations" -> the two per-step losses it compares
    "nntile_vs_torch": ("loss", "torch_loss"),
    "nntile_vs_fp64": ("loss", "fp64_loss"),
    "torch_vs_fp64": ("torch_loss", "fp64_loss"),
}


def deviations(log, window=100):
    """Largest |difference| between each pair of loss curves, over the run and per window of `window` steps.

    Returns {pair: {"max": float, "windows": [{"first": step, "last": step, "max": float}, ...]}} for the pairs
    the log holds; windows are steps [k * window, (k + 1) * window) cut at the log's last step, the same for
    every pair."""
    out, end = {}, max((r["step"] for r in log), default=0)
    for name, (a, b) in PAIRS.items():
        worst = {}
        for r in log:
            if a in r and b in r:
                k = r["step"] // window
                worst[k] = max(worst.get(k, 0.0), abs(r[a] - r[b]))
        if worst:
            out[name] = {"max": max(worst.values()),
                         "windows": [{"first": k * window, "last": min((k + 1) * window - 1, end), "max": worst[k]}
                                     for k in sorted(worst)]}
    return out


def plot(log, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fp64 = any("fp64_loss" in r for r in log)
    if fp64:
        fig, (ax, dax) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, height_ratios=(4, 3))
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in log]
    ax.plot(steps, [r["loss"] for r in log], label="nntile_torch (converted)")
    if any("torch_loss" in r for r in log):
        ax.plot(steps, [r.get("torch_loss", math.nan) for r in log], "--", label="PyTorch (unconverted)")
    if fp64:
        ax.plot(steps, [r.get("fp64_loss", math.nan) for r in log], ":", color="k", label="PyTorch float64")
    ax.set_ylabel("cross-entropy (nats/byte)"), ax.set_title(title), ax.legend()
    ax.grid(alpha=0.3)
    if fp64:
        styles = {"nntile_vs_torch": ("|nntile - torch|", "C2"), "nntile_vs_fp64": ("|nntile - float64|", "C0"),
                  "torch_vs_fp64": ("|torch - float64|", "C1")}
        span = max(1, len(log) // 20)
        for name, (a, b) in PAIRS.items():
            # A zero difference has no place on a log axis: left as a gap.
            diff = [abs(r[a] - r[b]) if a in r and b in r and r[a] != r[b] else math.nan for r in log]
            label, color = styles[name]
            dax.plot(steps, diff, lw=0.6, alpha=0.35, color=color)
            # Per-step differences jump by decades; the running maximum shows the trend of each pair.
            peak = [max((d for d in diff[max(0, i - span + 1):i + 1] if d == d), default=math.nan)
                    for i in range(len(diff))]
            dax.plot(steps, peak, lw=1.6, color=color, label=f"{label} (max of last {span} steps)")
        dax.set_yscale("log"), dax.set_ylabel("|loss difference| (thin: per step)"), dax.legend(fontsize=8)
        dax.grid(alpha=0.3, which="both")
        dax.set_xlabel("step")
    else:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_deviations(devs):
    """A table: one row per pair of curves, the largest |difference| over the run, then per window of steps."""
    names = {"nntile_vs_torch": "nntile - torch", "nntile_vs_fp64": "nntile - fp64", "torch_vs_fp64": "torch - fp64"}
    spans = sorted({(w["first"], w["last"]) for d in devs.values() for w in d["windows"]})
    if not spans:
        return
    print(f"{'max |loss difference|':<21} {'run':>9}  " + " ".join(f"{f'{a}-{b}':>9}" for a, b in spans))
    for name, d in devs.items():
        by_span = {(w["first"], w["last"]): w["max"] for w in d["windows"]}
        cells = " ".join(f"{by_span[s]:9.2e}" if s in by_span else f"{'-':>9}" for s in spans)
        print(f"  {names[name]:<19} {d['max']:9.2e}  {cells}")


def main(argv=None):
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() and nt._C.built_with_cuda else "cpu")
    ncpus = None
    if args.offload and device == "cuda":  # the offloaded updates run on CPU workers: all cores but the GPUs'
        ncpus = nt.config.cpu_workers_beside_gpus()
    ref = build_model(args, device)
    plan = None
    if args.bf16_master and (args.no_plan or args.step_in_backward or args.bf16_adam_state or args.offload):
        raise SystemExit("nntile_torch.train: --bf16-master is a memory plan's choice: not with --no-plan, "
                         "--step-in-backward, --bf16-adam-state or --offload")
    if not (args.no_plan or args.step_in_backward or args.bf16_adam_state or args.offload):
        try:
            plan = nt.plan(ref, args.batch, args.seq, args.precision,
                           gpu_memory=args.cuda_memory_limit if device == "cuda" else None,
                           host_memory=args.host_memory_limit,
                           master_dtype=torch.bfloat16 if args.bf16_master else None)
        except ValueError as e:
            raise SystemExit(f"nntile_torch.train: {e}")
        except nt.InsufficientMemoryError as e:
            raise SystemExit(f"nntile_torch.train: {e}")
        if plan.beyond_gpu or plan.checkpointing:
            print(plan, flush=True)
        # the plan's limits, workers and window; the command line's where it gives them
        plan.init(cuda_memory_limit=args.cuda_memory_limit, host_memory_limit=args.host_memory_limit,
                  max_submitted_tasks=args.max_submitted_tasks)
    else:
        nt.init(ncpus=ncpus, cuda_memory_limit=args.cuda_memory_limit, host_memory_limit=args.host_memory_limit,
                max_submitted_tasks=args.max_submitted_tasks)
    torch_model = copy.deepcopy(ref) if args.compare_torch else None
    fp64_model = copy.deepcopy(ref).double() if args.compare_fp64 else None
    tiles = dict(tile_size=args.tile_size, batch_tile_size=args.batch_tile_size or nt.config.rows_per_tile(
        args.batch, args.seq, device == "cuda", nt.runtime.num_places()))
    if plan is not None:
        model = plan.apply(ref, **tiles)
        opt = plan.optimizer(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        model = nt.convert(ref, precision=args.precision, **tiles)
        opt = nt.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                             step_in_backward=args.step_in_backward,
                             state_dtype=torch.bfloat16 if args.bf16_adam_state else torch.float32,
                             offload=args.offload or None)
    references = []  # (log key, model, loss function, optimizer): unconverted models trained on the same batches
    for key, ref_model, loss_fn in (("torch_loss", torch_model, hf_loss), ("fp64_loss", fp64_model, float64_loss)):
        if ref_model is not None:
            references.append((key, ref_model, loss_fn, torch.optim.AdamW(
                ref_model.parameters(), lr=args.lr, weight_decay=args.weight_decay, foreach=False)))
    start, log = 0, []
    if args.resume:
        ck = torch.load(args.resume, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start, log = ck["step"], ck["log"]
        for _, ref_model, _, ref_opt in references:  # the comparisons restart from the same weights and moments
            ref_model.load_state_dict(ck["model"])  # (cast to float64 for the float64 copy)
            # A copy: load_state_dict keeps tensors that already match, which the other optimizers would then share.
            ref_opt.load_state_dict(copy.deepcopy(ck["optimizer"]))
            for group in ref_opt.param_groups:  # the saved groups say foreach=None; keep the single-tensor loop
                group["foreach"] = False
    batches = Batches(stdlib_corpus(args.corpus_bytes), args.batch, args.seq, args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"nntile_torch: GPT-2 {args.model} ({params / 1e6:.2f}M parameters) on {device}, precision "
          f"{args.precision}, batch {args.batch}x{args.seq}, steps {start}..{args.steps}", flush=True)
    from tqdm import tqdm
    bar = tqdm(range(start, args.steps), initial=start, total=args.steps, unit="step", disable=args.no_progress)
    tokens = args.batch * args.seq
    for step in bar:
        ids = batches(step).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = hf_loss(model, ids)
        # A NaN or inf loss must change nothing: its value is read before any update (before the backward when the
        # updates run inside it), and the run stops with the model, the optimizer and the checkpoint as they were.
        value = loss.item() if opt.step_in_backward else None
        if value is not None and not math.isfinite(value):
            _stop_at_nonfinite(value, step, args)
        loss.backward()
        if value is None:
            value = loss.item()
            if not math.isfinite(value):
                opt.zero_grad()
                _stop_at_nonfinite(value, step, args)
        opt.step()
        dt = time.perf_counter() - t0
        rec = {"step": step, "loss": value, "tokens_per_s": tokens / dt}
        for key, ref_model, loss_fn, ref_opt in references:  # after dt: tokens/s measures the converted model alone
            for group in ref_opt.param_groups:
                group["lr"] = lr_at(step, args)
            ref_opt.zero_grad()
            ref_loss = loss_fn(ref_model, ids)
            ref_loss.backward()
            ref_opt.step()
            rec[key] = ref_loss.item()
        log.append(rec)
        post = {"loss": f"{value:.4f}", "tok/s": f"{rec['tokens_per_s']:.0f}"}
        if "torch_loss" in rec:
            post["torch"] = f"{rec['torch_loss']:.4f}"
        if "fp64_loss" in rec:
            post["fp64"] = f"{rec['fp64_loss']:.4f}"
        bar.set_postfix(post)
        if args.checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, model, opt, step + 1, log)
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, args.steps, log)
    os.makedirs(args.out, exist_ok=True)
    devs = deviations(log)
    summary = {"args": vars(args), "device": device, "parameters": params,
               "nntile": {k: v for k, v in nt.info().items() if k != "settings"}, "stats": nt.stats(),
               "deviations": devs, "steps": log}
    atomic_write(os.path.join(args.out, "log.json"), lambda f: f.write(json.dumps(summary, indent=1).encode()))
    plot(log, os.path.join(args.out, "loss.png"),
         f"GPT-2 {args.model}, {params / 1e6:.1f}M params, {args.precision}, {device}")
    if log:
        last = log[-1]
        refs = [f"{name} {last[key]:.4f}" for name, key in (("PyTorch", "torch_loss"), ("float64", "fp64_loss"))
                if key in last]
        extra = f" ({', '.join(refs)})" if refs else ""
        print_deviations(devs)
        print(f"final loss {last['loss']:.4f}{extra}; wrote {args.out}/log.json and {args.out}/loss.png")
    return log


if __name__ == "__main__":
    main()
