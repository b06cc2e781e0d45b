"""Trains a GPT-2 (Hugging Face GPT2LMHeadModel) converted to tile tasks on an offline byte-level corpus.

    python -m nntile_torch.train                      # small model, a few minutes on 2 CPU cores
    python -m nntile_torch.train --compare-torch      # also trains the unconverted model on the same batches
    python -m nntile_torch.train --checkpoint run/ckpt.pt --checkpoint-every 50
    python -m nntile_torch.train --resume run/ckpt.pt --steps 400

Writes <out>/log.json (settings, per-step losses, tokens/s) and <out>/loss.png. On a machine with a GPU it
trains there (--device cpu to stay on the CPU).
"""
import argparse
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
    ap.add_argument("--warmup", type=int, default=20, help="linear learning-rate warm-up steps")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--tile-size", type=int,
                    help="tile edge for weights (default: max(1024, 3 * width), so that attention tiles hold whole "
                         "rows and run as tile tasks)")
    ap.add_argument("--batch-tile-size", type=int, help="rows per activation tile (default: one sequence)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--cuda-memory-limit", help="StarPU's share of GPU memory, e.g. 100GiB")
    ap.add_argument("--host-memory-limit", help="StarPU's share of host RAM, e.g. 64GiB")
    ap.add_argument("--corpus-bytes", type=int, default=8 << 20, help="bytes of corpus to read (default 8 MiB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-torch", action="store_true", help="train the unconverted model beside it")
    ap.add_argument("--checkpoint", help="path to save checkpoints to (atomically)")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end)")
    ap.add_argument("--resume", help="checkpoint to resume model, optimizer and step from")
    ap.add_argument("--out", default="train_run", help="output folder (default train_run)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    for name in ("seq", "batch", "steps"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive (got {getattr(args, name)})")
    return args


def build_model(args, device):
    import transformers
    layers, width, heads = SIZES[args.model]
    layers, width, heads = args.n_layer or layers, args.n_embd or width, args.n_head or heads
    if width % heads:
        raise SystemExit(f"--n-embd ({width}) must be a multiple of --n-head ({heads})")
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=256,
                                  n_positions=max(args.seq, 64), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(args.seed)
    return transformers.GPT2LMHeadModel(cfg).to(device)


def lr_at(step, args):
    return args.lr * min(1.0, (step + 1) / max(1, args.warmup))


def save_checkpoint(path, model, opt, step, log):
    """Writes to a temporary file, then renames: a crash leaves the previous checkpoint whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "log": log}, tmp)
    os.replace(tmp, path)


def plot(log, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in log]
    ax.plot(steps, [r["loss"] for r in log], label="nntile_torch (converted)")
    if any("torch_loss" in r for r in log):
        ax.plot(steps, [r.get("torch_loss", math.nan) for r in log], "--", label="PyTorch (unconverted)")
    ax.set_xlabel("step"), ax.set_ylabel("cross-entropy (nats/byte)"), ax.set_title(title), ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() and nt._C.built_with_cuda else "cpu")
    nt.init(cuda_memory_limit=args.cuda_memory_limit, host_memory_limit=args.host_memory_limit)
    ref = build_model(args, device)
    torch_model = copy.deepcopy(ref) if args.compare_torch else None
    width = ref.config.n_embd
    model = nt.convert(ref, precision=args.precision, tile_size=args.tile_size or max(1024, 3 * width),
                       batch_tile_size=args.batch_tile_size or args.seq)
    opt = nt.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    topt = (torch.optim.AdamW(torch_model.parameters(), lr=args.lr, weight_decay=args.weight_decay, foreach=False)
            if torch_model is not None else None)
    start, log = 0, []
    if args.resume:
        ck = torch.load(args.resume, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start, log = ck["step"], ck["log"]
        if torch_model is not None:  # the comparison restarts from the same weights
            torch_model.load_state_dict(ck["model"])
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
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        value = loss.item()
        dt = time.perf_counter() - t0
        rec = {"step": step, "loss": value, "tokens_per_s": tokens / dt}
        if torch_model is not None:
            for group in topt.param_groups:
                group["lr"] = lr_at(step, args)
            topt.zero_grad()
            tl = torch_model(ids, labels=ids).loss
            tl.backward()
            topt.step()
            rec["torch_loss"] = tl.item()
        log.append(rec)
        if not math.isfinite(value):
            raise SystemExit(f"loss became {value} at step {step}; stopping (no checkpoint written)")
        post = {"loss": f"{value:.4f}", "tok/s": f"{rec['tokens_per_s']:.0f}"}
        if "torch_loss" in rec:
            post["torch"] = f"{rec['torch_loss']:.4f}"
        bar.set_postfix(post)
        if args.checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, model, opt, step + 1, log)
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, args.steps, log)
    os.makedirs(args.out, exist_ok=True)
    summary = {"args": vars(args), "device": device, "parameters": params,
               "nntile": {k: v for k, v in nt.info().items() if k != "settings"}, "stats": nt.stats(), "steps": log}
    with open(os.path.join(args.out, "log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(log, os.path.join(args.out, "loss.png"),
         f"GPT-2 {args.model}, {params / 1e6:.1f}M params, {args.precision}, {device}")
    if log:
        last = log[-1]
        extra = f" (PyTorch {last['torch_loss']:.4f})" if "torch_loss" in last else ""
        print(f"final loss {last['loss']:.4f}{extra}; wrote {args.out}/log.json and {args.out}/loss.png")
    return log


if __name__ == "__main__":
    main()
