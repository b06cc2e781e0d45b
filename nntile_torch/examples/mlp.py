"""Trains a small MLP built from nntile_torch.nn.Linear beside the same torch.nn.Linear model, on the same
batches, and reports both loss curves (until the GPT-2 training CLI exists, this is the main job).

    python -m nntile_torch.examples.mlp [--steps 200] [--device cuda] [--out mlp_run]

The task: regress a fixed random two-layer teacher network. Writes <out>/log.json and <out>/loss.png.
"""
import argparse
import json
import os
import time

import torch
from tqdm import tqdm

import nntile_torch as nt


def build(cls, sizes, device, **kw):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [cls(a, b, device=device, **kw), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tile-size", type=int, default=256)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() and nt._C.built_with_cuda else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="mlp_run")
    args = ap.parse_args()

    sizes = [64, args.width, args.width, 1]
    torch.manual_seed(args.seed)
    teacher = build(torch.nn.Linear, [64, 32, 1], args.device)
    torch.manual_seed(args.seed + 1)
    ours = build(nt.nn.Linear, sizes, args.device, tile_size=args.tile_size, batch_tile_size=args.tile_size,
                 precision=args.precision)
    ref = build(torch.nn.Linear, sizes, args.device)
    ref.load_state_dict(ours.state_dict())
    # Plain torch.optim works on tile parameters (through materialization); nntile_torch.optim comes later.
    opt_ours = torch.optim.SGD(ours.parameters(), lr=args.lr * 10, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=args.lr * 10, momentum=0.9)
    log = {"args": vars(args), "info": {k: v for k, v in nt.info().items() if k != "settings"}, "steps": []}
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 2)
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="mlp", unit="step")
    for step in bar:
        x = torch.randn(args.batch, 64, generator=gen).to(args.device)
        with torch.no_grad():
            target = teacher(x)
        losses = []
        for model, opt in ((ours, opt_ours), (ref, opt_ref)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        log["steps"].append({"step": step, "loss": losses[0], "torch_loss": losses[1]})
        bar.set_postfix(loss=f"{losses[0]:.4f}", torch=f"{losses[1]:.4f}")
    log["seconds"] = time.perf_counter() - t0
    log["stats"] = nt.stats()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([s["loss"] for s in log["steps"]], label="nntile_torch.nn.Linear")
        ax.plot([s["torch_loss"] for s in log["steps"]], "--", label="torch.nn.Linear")
        ax.set_xlabel("step"), ax.set_ylabel("MSE loss"), ax.set_yscale("log"), ax.legend()
        ax.set_title(f"MLP {sizes} on {args.device}, {args.precision}")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"), dpi=100)
    except ImportError:
        pass
    last = log["steps"][-1]
    print(f"final loss {last['loss']:.6f} (torch {last['torch_loss']:.6f}), {log['seconds']:.1f} s; "
          f"wrote {args.out}/log.json and loss.png")


if __name__ == "__main__":
    main()
