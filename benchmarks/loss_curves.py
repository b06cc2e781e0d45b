"""Loss curves of one GPT-2 trained with each optimizer-state precision, beside plain PyTorch: what bf16 moments,
bf16 master weights and 8-bit moments cost in loss, on the same batches from the same initial weights.

    python -m benchmarks.loss_curves --steps 2000 --budget 480            # one GPU, ~8-9 minutes
    python -m benchmarks.loss_curves --variants ref,bf16,bf16master       # bf16 master weights apart from bf16 matmuls
    python -m benchmarks.loss_curves --device cpu --n-layer 1 --n-embd 64 --seq 32 --batch 4 --steps 20

What it shows:
  1. One model config (Hugging Face GPT2LMHeadModel built from a config, no hub weights), initialized once: every
     variant loads the same initial state dict and trains on the same batches (the training CLI's offline corpus,
     nntile_torch.data: the Python standard library's source as bytes, vocabulary 256) with the same schedule.
  2. Each variant in its own process (its own StarPU and CUDA context): a crash or an out-of-memory of one keeps the
     others' curves, and one's memory never lingers into the next.
  3. A time budget shared out as the run goes: each variant gets what is left divided by the variants still to run
     (so time one leaves unused goes to the next), stops at its share and records how far it got.
  4. A variant whose option nntile_torch does not have is skipped with the reason, never run as something else.

Variants (--variants):
  ref         PyTorch eager, fp32 weights and matmuls, torch.optim.AdamW: the reference
  fp32        nt.convert(precision="fp32") + nt.optim.AdamW: fp32 master weights and moments (torch's numerics)
  bf16m       as fp32, AdamW(state_dtype=torch.bfloat16): bf16 moments, stochastic rounding
  bf16master  nt.plan(master_dtype=torch.bfloat16): the blocks' matmul weights kept in bf16 alone, bf16 moments (the
              plan pairs them), bf16 matmuls (bf16 master weights need them)
  q8          as fp32, AdamW(state_dtype=torch.uint8): 8-bit block-wise moments (bitsandbytes' scheme)
  bf16master_q8  as bf16master with 8-bit block-wise moments: the plan's most compact state (what 45B needs)
  bf16        nt.convert(precision="bf16"), fp32 master weights and moments: not run by default; beside bf16master
              it separates the master weights' cost from the bf16 matmuls'

Writes to --out (default benchmarks/results/<machine>/loss_curves, <machine> as benchmarks/run.py names it):
loss_curves.json (config, commit, device, per variant the per-step losses, steps, seconds, final loss = mean of the
last 50 steps, relative difference to ref over the steps both reached), summary.md (the table, also printed last),
loss_curves.png (smoothed curves; below, each one's difference to ref) and README.md (what ran, the command).
"""
import argparse
import collections
import datetime
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> backend, matmul precision, master weights' dtype, moments' dtype, what it is
VARIANTS = {
    "ref": ("torch", "fp32", "float32", "float32", "PyTorch eager fp32, torch.optim.AdamW (the reference)"),
    "fp32": ("nntile", "fp32", "float32", "float32", "nt.convert fp32 + nt.optim.AdamW, fp32 master weights and moments"),
    "bf16m": ("nntile", "fp32", "float32", "bfloat16", "as fp32, bf16 moments (AdamW(state_dtype=torch.bfloat16))"),
    "bf16master": ("nntile", "bf16", "bfloat16", "bfloat16",
                   "bf16 master weights and moments (nt.plan(master_dtype=torch.bfloat16)), bf16 matmuls"),
    "q8": ("nntile", "fp32", "float32", "uint8", "as fp32, 8-bit block-wise moments (AdamW(state_dtype=torch.uint8))"),
    "bf16master_q8": ("nntile", "bf16", "bfloat16", "uint8",
                      "bf16 master weights, 8-bit block-wise moments (nt.plan(master_dtype=torch.bfloat16, "
                      "state_dtype=torch.uint8): the plan's most compact state, the 45B one), bf16 matmuls"),
    "bf16": ("nntile", "bf16", "float32", "float32", "nt.convert bf16 matmuls, fp32 master weights and moments"),
}
DEFAULT_VARIANTS = "ref,fp32,bf16m,bf16master,q8,bf16master_q8"
TAIL = 50  # steps the final loss is the mean of
GRACE_S = 90  # past its share, a variant's process is killed this much later (it stops itself at the share)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma-separated, run in this order (default {DEFAULT_VARIANTS}; known: {', '.join(VARIANTS)})")
    ap.add_argument("--steps", type=int, default=2000, help="steps per variant (default 2000)")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="seconds for all variants together, start-up included (default 480)")
    ap.add_argument("--n-layer", type=int, default=6, help="GPT-2 blocks (default 6)")
    ap.add_argument("--n-embd", type=int, default=768, help="width (default 768)")
    ap.add_argument("--n-head", type=int, default=12, help="attention heads (default 12)")
    ap.add_argument("--seq", type=int, default=256, help="sequence length in bytes (default 256)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    ap.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default 6e-4)")
    ap.add_argument("--min-lr", type=float, default=None, help="learning rate at the last step (default lr / 10)")
    ap.add_argument("--warmup", type=int, default=100, help="linear warm-up steps, then cosine decay (default 100)")
    ap.add_argument("--beta2", type=float, default=0.95, help="AdamW's beta2 (default 0.95; beta1 0.9)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's decoupled weight decay (default 0.1)")
    ap.add_argument("--seed", type=int, default=0, help="initial weights and batch order (default 0)")
    ap.add_argument("--corpus-bytes", type=int, default=8 << 20, help="bytes of corpus (default 8 MiB)")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    ap.add_argument("--out", help="results folder (default benchmarks/results/<machine>/loss_curves)")
    ap.add_argument("--print-every", type=float, default=10.0, help="seconds between progress lines (default 10)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run this one variant (config from --worker-dir)
    ap.add_argument("--worker-dir", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if not args.variants:
        ap.error("--variants names none")
    if len(set(args.variants)) != len(args.variants):
        ap.error(f"--variants names one twice ({','.join(args.variants)})")
    for name in ("steps", "n_layer", "n_embd", "n_head", "seq", "batch", "corpus_bytes"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive (got {getattr(args, name)})")
    if args.budget <= 0:
        ap.error(f"--budget must be positive seconds (got {args.budget})")
    if args.n_embd % args.n_head:
        ap.error(f"--n-embd ({args.n_embd}) must be a multiple of --n-head ({args.n_head})")
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    return args


# -- the run of one variant (its own process) ------------------------------------------------------------------

def gpt2_config(cfg):
    import transformers
    return transformers.GPT2Config(
        n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"], vocab_size=256,
        n_positions=max(cfg["seq"], 64), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0)


def lr_at(step, cfg):
    """Linear warm-up to lr, then cosine decay to min_lr at the last step (nanoGPT's schedule)."""
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    span = max(1, cfg["steps"] - 1 - cfg["warmup"])
    frac = min(1.0, (step - cfg["warmup"]) / span)
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * frac)) * (cfg["lr"] - cfg["min_lr"])


def unavailable(variant):
    """Why nntile_torch cannot run `variant` as it is meant (an option it does not have), or None."""
    import inspect

    import torch

    import nntile_torch as nt
    backend, _, master, state, _ = VARIANTS[variant]
    if backend == "torch":
        return None
    if state != "float32":
        if "state_dtype" not in inspect.signature(nt.optim.AdamW).parameters:
            return "nt.optim.AdamW has no state_dtype argument"
        try:
            nt.optim.state_bytes_per_param(getattr(torch, state))
        except (ValueError, AttributeError) as e:
            return f"nt.optim.AdamW does not take state_dtype=torch.{state}: {e}"
    if master != "float32" and "master_dtype" not in inspect.signature(nt.plan).parameters:
        return f"nt.plan has no master_dtype argument ({master} master weights)"
    return None


def build(variant, cfg, device):
    """(model, optimizer, settings) of `variant`, from the shared initial weights."""
    import torch
    import transformers
    backend, precision, master, state, _ = VARIANTS[variant]
    model = transformers.GPT2LMHeadModel(gpt2_config(cfg))
    model.load_state_dict(torch.load(os.path.join(cfg["dir"], "init.pt"), map_location="cpu"))
    model.to(device)
    adamw = dict(lr=cfg["lr"], betas=(0.9, cfg["beta2"]), eps=1e-8, weight_decay=cfg["weight_decay"])
    if backend == "torch":
        torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 matmuls, as nntile's "fp32"
        return model, torch.optim.AdamW(model.parameters(), **adamw), {"optimizer": "torch.optim.AdamW"}
    import nntile_torch as nt
    if master == "bfloat16":
        # The plan pins: everything on the GPU, updates in step() (as the other variants), no checkpointing.
        plan = nt.plan(model, cfg["batch"], cfg["seq"], precision, master_dtype=torch.bfloat16,
                       state_dtype=getattr(torch, state), step_in_backward=False, checkpointing=False, host_blocks=0)
        plan.init()
        rows = nt.config.rows_per_tile(cfg["batch"], cfg["seq"], device == "cuda", nt.runtime.num_places())
        model = plan.apply(model, batch_tile_size=rows)
        opt = plan.optimizer(model.parameters(), **adamw)
        settings = {"optimizer": "nt.optim.AdamW via nt.plan", "plan": {
            "master_dtype": str(plan.master_dtype), "state_dtype": str(plan.state_dtype),
            "bf16_master_parameters": len(plan.bf16_master_parameter_names())}}
    else:
        nt.init()
        rows = nt.config.rows_per_tile(cfg["batch"], cfg["seq"], device == "cuda", nt.runtime.num_places())
        model = nt.convert(model, precision=precision, batch_tile_size=rows)
        opt = nt.optim.AdamW(model.parameters(), state_dtype=getattr(torch, state), **adamw)
        settings = {"optimizer": "nt.optim.AdamW"}
    settings.update(batch_tile_size=rows, nntile={k: v for k, v in nt.info().items() if k != "settings"})
    return model, opt, settings


def worker(args):
    """Trains one variant until --steps or its --seconds, appending each step's loss to <worker-dir>/<variant>.jsonl
    as it goes (what a crash leaves is still read), then a last line with the outcome."""
    started = time.monotonic()
    variant = args.worker
    with open(os.path.join(args.worker_dir, "config.json")) as f:
        cfg = json.load(f)
    log = open(os.path.join(args.worker_dir, f"{variant}.jsonl"), "w")

    def write(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()

    reason = unavailable(variant)
    if reason:
        write({"status": "skipped", "reason": reason})
        print(f"skipped: {reason}", flush=True)
        return
    import torch
    from nntile_torch.data import Batches, stdlib_corpus
    device = cfg["device"]
    torch.manual_seed(cfg["seed"])
    model, opt, settings = build(variant, cfg, device)
    batches = Batches(stdlib_corpus(cfg["corpus_bytes"]), cfg["batch"], cfg["seq"], cfg["seed"])
    setup_s = time.monotonic() - started
    write({"settings": settings, "setup_s": setup_s})
    deadline = started + args.seconds
    status, reason, step = "ok", None, 0
    t_train = time.monotonic()
    last_print, window = t_train, collections.deque(maxlen=TAIL)
    print(f"set up in {setup_s:.1f} s; {cfg['steps']} steps, {args.seconds:.0f} s in all", flush=True)
    for step in range(cfg["steps"]):
        if time.monotonic() >= deadline:
            status, reason = "stopped", f"its share of the budget ({args.seconds:.0f} s) ran out after {step} steps"
            break
        ids = batches(step).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        value = loss.item()  # after backward: nntile has the whole backward submitted before this waits
        if not math.isfinite(value):
            status, reason = "diverged", f"loss {value} at step {step} (not updated)"
            break
        opt.step()
        write({"step": step, "loss": value, "t": time.monotonic() - t_train})
        window.append(value)
        now = time.monotonic()
        if now - last_print >= args.print_every or step == 0 or step == cfg["steps"] - 1:
            last_print = now
            print(f"step {step + 1}/{cfg['steps']} loss {value:.4f} (mean of last {len(window)}: "
                  f"{sum(window) / len(window):.4f}), {(step + 1) / max(now - t_train, 1e-9):.1f} steps/s, "
                  f"{now - started:.0f}/{args.seconds:.0f} s", flush=True)
    else:
        step = cfg["steps"]
    if device == "cuda":
        torch.cuda.synchronize()
    write({"status": status, "reason": reason, "train_s": time.monotonic() - t_train,
           "seconds": time.monotonic() - started,
           "peak_torch_gpu_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None})
    log.close()


# -- the driver ------------------------------------------------------------------------------------------------

def probe(device):
    """Versions, the device to use and the GPU's name. The name is read in a separate process: the driver itself
    never makes a CUDA context (torch.cuda.is_available() makes none), which would hold GPU memory all run long."""
    import platform

    import torch
    import transformers
    rec = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "cuda_available": torch.cuda.is_available(), "gpu": None, "nntile_cuda": None}
    try:
        import nntile_torch  # loads the extension; starts nothing
        rec["nntile_cuda"] = bool(nntile_torch._C.built_with_cuda)
    except Exception as e:  # the reference runs without it; the nntile variants will say why they fail
        rec["nntile_error"] = f"{type(e).__name__}: {e}"
    device = device or ("cuda" if rec["cuda_available"] else "cpu")
    if device == "cuda":
        if not rec["cuda_available"]:
            raise SystemExit("benchmarks.loss_curves: --device cuda, but torch sees no GPU")
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                             capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            raise SystemExit(f"benchmarks.loss_curves: reading the GPU's name failed:\n{out.stderr[-2000:]}")
        rec["gpu"] = out.stdout.strip().splitlines()[-1]
    return device, rec


def init_weights(cfg):
    """The initial weights every variant starts from, saved to <dir>/init.pt; (parameters, sha256 of them)."""
    import torch
    import transformers
    torch.manual_seed(cfg["seed"])
    model = transformers.GPT2LMHeadModel(gpt2_config(cfg))
    state = model.state_dict()
    torch.save(state, os.path.join(cfg["dir"], "init.pt"))
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return sum(p.numel() for p in model.parameters()), digest.hexdigest()[:16]


def run_variant(variant, workdir, seconds, print_every):
    """Runs one variant's process with a hard limit of seconds + GRACE_S, its output prefixed with its name; returns
    its record from what its log holds (steps so far after a crash or kill)."""
    cmd = [sys.executable, "-m", "benchmarks.loss_curves", "--worker", variant, "--worker-dir", workdir,
           "--seconds", str(seconds), "--print-every", str(print_every)]
    tail = collections.deque(maxlen=40)
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def pump():
        for line in p.stdout:
            tail.append(line.rstrip())
            print(f"[{variant}] {line.rstrip()}", flush=True)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    killed = False
    try:
        p.wait(timeout=seconds + GRACE_S)
    except subprocess.TimeoutExpired:
        killed = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)
    reader.join(timeout=10)
    rec = {"status": None, "reason": None, "losses": [], "step_times_s": [], "settings": None, "setup_s": None,
           "train_s": None, "seconds": None}
    path = os.path.join(workdir, f"{variant}.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if "step" in r:
                    rec["losses"].append(r["loss"])
                    rec["step_times_s"].append(r["t"])
                else:
                    rec.update(r)
    if rec["status"] is None:  # no outcome line: the process died
        how = (f"killed after {seconds + GRACE_S:.0f} s (its share plus {GRACE_S} s)" if killed
               else f"exit status {p.returncode}" if p.returncode >= 0
               else f"killed by signal {-p.returncode} ({signal.Signals(-p.returncode).name})")
        # the last lines of its output, with this checkout's path cut from tracebacks (records carry no local paths)
        last = [ln.replace(ROOT + os.sep, "") for ln in tail if ln.strip()][-6:]
        rec.update(status="error", reason=f"{how} after {len(rec['losses'])} steps: " + " | ".join(last))
    elif p.returncode not in (0, None) and rec["status"] != "error":
        rec["status"], rec["reason"] = "error", f"exit status {p.returncode} after its outcome ({rec['reason']})"
    return rec


def mean(values):
    return sum(values) / len(values) if values else None


def summarize(records, ref="ref"):
    """Adds steps, final_loss (mean of the last TAIL steps) and, against ref, rel_diff_to_ref: (variant - ref) / ref
    of the mean losses over the last TAIL steps that both reached (compared_at: those steps)."""
    base = records.get(ref)
    for name, rec in records.items():
        losses = rec["losses"]
        t = rec.pop("step_times_s")
        rec["steps"] = len(losses)
        rec["final_loss"] = mean(losses[-TAIL:])
        rec["steps_per_s"] = len(losses) / t[-1] if t and t[-1] > 0 else None
        rec["rel_diff_to_ref"] = rec["compared_at"] = None
        if base is not None and name != ref and base["losses"] and losses:
            n = min(len(losses), len(base["losses"]))
            a, b = mean(losses[max(0, n - TAIL):n]), mean(base["losses"][max(0, n - TAIL):n])
            rec["rel_diff_to_ref"] = (a - b) / b
            rec["compared_at"] = [max(0, n - TAIL), n - 1]
    return records


def smooth(values, window):
    from benchmarks.compare_runs import moving_average
    return moving_average(values, max(1, window))


def plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {n: r for n, r in record["variants"].items() if r["losses"]}
    if not runs:
        return False
    longest = max(len(r["losses"]) for r in runs.values())
    window = max(1, min(TAIL, longest // 20))
    fig, (ax, dax) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True, height_ratios=(3, 2))
    ref = runs.get("ref")
    tops = []
    for i, (name, r) in enumerate(runs.items()):
        color = "k" if name == "ref" else f"C{i}"
        steps = range(1, len(r["losses"]) + 1)
        sm = smooth(r["losses"], window)
        ax.plot(steps, r["losses"], color=color, lw=0.4, alpha=0.2)
        label = f"{name}: {r['final_loss']:.4f}" + (f" ({100 * r['rel_diff_to_ref']:+.2f}%)"
                                                    if r["rel_diff_to_ref"] is not None else "")
        ax.plot(steps, sm, color=color, lw=1.6 if name == "ref" else 1.2, label=label)
        tops.extend(sm[len(sm) // 10:])
        if ref is not None and name != "ref":
            n = min(len(r["losses"]), len(ref["losses"]))
            diff = [a - b for a, b in zip(r["losses"][:n], ref["losses"][:n])]
            dax.plot(range(1, n + 1), smooth(diff, window), color=color, lw=1.2, label=name)
    if tops:
        low = min(min(r["losses"]) for r in runs.values())
        ax.set_ylim(low - 0.05 * abs(low), max(tops) * 1.05)
    c = record["config"]
    ax.set_title(f"GPT-2 {c['n_layer']} x {c['n_embd']} ({record['parameters'] / 1e6:.1f}M), batch {c['batch']} x "
                 f"{c['seq']} bytes, {record['device']['name']}", fontsize=10)
    ax.set_ylabel(f"loss (nats/byte; moving average of {window})")
    ax.legend(fontsize=8, title=f"mean of last {TAIL} steps (vs ref)", title_fontsize=8)
    ax.grid(alpha=0.3)
    dax.axhline(0.0, color="k", lw=0.8)
    dax.set_ylabel(f"loss - ref loss (moving average of {window})")
    dax.set_xlabel("step")
    dax.grid(alpha=0.3)
    if dax.lines[1:]:
        dax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def table(record):
    lines = ["| variant | numerics | status | steps | seconds | steps/s | final loss (mean of last 50) | vs ref |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in record["variants"].items():
        _, precision, master, state, _ = VARIANTS[name]
        numerics = f"matmuls {precision}, master {master}, moments {state}"
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        fmt = (lambda v, f: "-" if v is None else format(v, f))
        vs = "-" if r["rel_diff_to_ref"] is None else f"{100 * r['rel_diff_to_ref']:+.2f}%"
        lines.append(f"| {name} | {numerics} | {status} | {r['steps']} | {fmt(r['seconds'], '.0f')} | "
                     f"{fmt(r['steps_per_s'], '.1f')} | {fmt(r['final_loss'], '.4f')} | {vs} |")
    return "\n".join(lines)


def readme(record, command):
    c, d = record["config"], record["device"]
    rows = "\n".join(f"- `{n}`: {VARIANTS[n][4]}" for n in record["variants"])
    return f"""# Loss curves by optimizer-state precision ({record['date']}, code {record['commit']})

GPT-2 (Hugging Face GPT2LMHeadModel from a config: {c['n_layer']} layers x {c['n_embd']}, {c['n_head']} heads,
byte vocabulary 256, {record['parameters'] / 1e6:.1f}M parameters, no dropout) trained on the training CLI's offline
corpus ({c['corpus_bytes']} bytes of the Python standard library's source), batch {c['batch']} x {c['seq']},
AdamW betas (0.9, {c['beta2']}), weight decay {c['weight_decay']}, lr {c['lr']:g} after {c['warmup']} warm-up steps,
cosine to {c['min_lr']:g} at step {c['steps']}, no gradient clipping. Every variant starts from the same weights
(sha256 {record['init_sha256']}) and sees the same batches, each in its own process; the budget of {c['budget']:.0f} s
was shared out as the run went (a variant stops at its share). Device: {d['name']}, torch {d['torch']},
transformers {d['transformers']}.

{rows}

```bash
{command}
```

{table(record)}

`loss_curves.json`: the config and, per variant, every step's loss; final loss is the mean of the last {TAIL} steps
and "vs ref" compares the means over the last {TAIL} steps both reached. `loss_curves.png`: moving averages of the
losses and, below, of each variant's difference to ref. Two fp32 runs that round differently drift apart too
(training is chaotic): a difference of the size fp32 shows against ref is noise, not a cost.
"""


def recorded_command(argv, out):
    """The command line as the records give it: --out as a path in the repository where it is one, else as a
    placeholder (a folder of the machine that ran it, such as a GPU call's output folder, means nothing elsewhere)."""
    words, i = list(argv), 0
    while i < len(words):
        if words[i] == "--out" and i + 1 < len(words):
            words[i + 1] = _shown_out(out)
            i += 1
        elif words[i].startswith("--out="):
            words[i] = "--out=" + _shown_out(out)
        i += 1
    return ("python -m benchmarks.loss_curves " + " ".join(words)).strip()


def _shown_out(out):
    rel = os.path.relpath(os.path.abspath(out), ROOT)
    return rel if not rel.startswith("..") else "<output folder>"


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    started = time.monotonic()
    device, info = probe(args.device)
    from benchmarks.run import code_commit, machine_name
    machine = machine_name(info["gpu"] if device == "cuda" else None)
    out = args.out or os.path.join(ROOT, "benchmarks", "results", machine, "loss_curves")
    os.makedirs(out, exist_ok=True)
    cfg = {k: getattr(args, k) for k in ("steps", "budget", "n_layer", "n_embd", "n_head", "seq", "batch", "lr",
                                          "min_lr", "warmup", "beta2", "weight_decay", "seed", "corpus_bytes")}
    cfg.update(device=device, variants=args.variants)
    record = {"config": cfg, "commit": code_commit(ROOT), "date": datetime.date.today().isoformat(),
              "device": {"name": info["gpu"] if device == "cuda" else "CPU", "machine": machine, "type": device,
                         **{k: v for k, v in info.items() if k != "gpu"}},
              "variants": {}}
    print(f"benchmarks.loss_curves: {', '.join(args.variants)} on {record['device']['name']}, "
          f"{args.steps} steps each, budget {args.budget:.0f} s; out {out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="loss_curves_") as workdir:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({**cfg, "dir": workdir}, f)
        record["parameters"], record["init_sha256"] = init_weights({**cfg, "dir": workdir})
        left = args.budget - (time.monotonic() - started)
        for i, variant in enumerate(args.variants):
            share = max(1.0, left / (len(args.variants) - i))
            print(f"== {variant} ({VARIANTS[variant][4]}): up to {share:.0f} s", flush=True)
            t0 = time.monotonic()
            record["variants"][variant] = run_variant(variant, workdir, share, args.print_every)
            left -= time.monotonic() - t0
    summarize(record["variants"])
    record["wall_s"] = time.monotonic() - started
    record["command"] = recorded_command(argv if argv is not None else sys.argv[1:], out)
    with open(os.path.join(out, "loss_curves.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table(record) + "\n")
    plotted = plot(record, os.path.join(out, "loss_curves.png"))
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(readme(record, record["command"]))
    print(table(record))
    print(f"wrote {out}: loss_curves.json, summary.md, README.md" + (", loss_curves.png" if plotted else "")
          + f" ({record['wall_s']:.0f} s)")
    return record


if __name__ == "__main__":
    main()
