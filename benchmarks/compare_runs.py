"""Loss curves of several training-CLI runs (nntile_torch.train's log.json) on one plot, with the gap between them:
what a setting costs in loss (e.g. bf16 master weights against fp32 ones on the same batches).

    python -m benchmarks.compare_runs runA/log.json runB/log.json --labels "fp32 master" "bf16 master" \
        --out compare.png --json compare.json

Prints, per run, the mean loss over the last --window steps and its difference from the first run's; the plot shows
the raw losses faintly and their moving averages over --window steps.
"""
import argparse
import json


def moving_average(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def summarize(runs, labels, window):
    """Per run: steps, final mean loss over the last `window` steps, its difference from the first run's."""
    rows = []
    base = None
    for log, label in zip(runs, labels):
        losses = [s["loss"] for s in log["steps"]]
        tail = losses[-window:]
        mean = sum(tail) / len(tail)
        base = mean if base is None else base
        rows.append({"label": label, "steps": len(losses), "final_mean_loss": mean, "minus_first": mean - base,
                     "relative_to_first": mean / base - 1})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="log.json files of nntile_torch.train runs")
    ap.add_argument("--labels", nargs="+", help="one label per log (default: the file names)")
    ap.add_argument("--window", type=int, default=50, help="steps averaged (default 50)")
    ap.add_argument("--title", default="loss on the same batches")
    ap.add_argument("--out", help="PNG of the curves")
    ap.add_argument("--json", help="the summary as JSON")
    args = ap.parse_args(argv)
    labels = args.labels or args.logs
    if len(labels) != len(args.logs):
        ap.error(f"{len(args.logs)} logs but {len(labels)} labels")
    runs = []
    for path in args.logs:
        with open(path) as f:
            runs.append(json.load(f))
    rows = summarize(runs, labels, args.window)
    width = max(len(r["label"]) for r in rows)
    print(f"{'run':<{width}}  steps  mean loss (last {args.window})  vs first")
    for r in rows:
        print(f"{r['label']:<{width}}  {r['steps']:>5}  {r['final_mean_loss']:>22.4f}  {r['minus_first']:+.4f} "
              f"({100 * r['relative_to_first']:+.2f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"window": args.window, "runs": rows, "args": [r.get("args") for r in runs]}, f, indent=1)
    if args.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax, dx) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(2, 1))
        first = None
        for log, label in zip(runs, labels):
            steps = [s["step"] for s in log["steps"]]
            smooth = moving_average([s["loss"] for s in log["steps"]], args.window)
            line, = ax.plot(steps, smooth, label=label)
            ax.plot(steps, [s["loss"] for s in log["steps"]], color=line.get_color(), alpha=0.15, linewidth=0.8)
            if first is None:
                first = smooth
            else:  # the gap, where the curves would hide it by overlapping
                n = min(len(first), len(smooth))
                dx.plot(steps[:n], [100 * (smooth[i] / first[i] - 1) for i in range(n)], color=line.get_color(),
                        label=f"{label} vs {labels[0]}")
        ax.set_ylabel(f"loss (moving average, {args.window} steps)")
        ax.set_title(args.title)
        ax.grid(alpha=0.3)
        ax.legend()
        dx.axhline(0, color="gray", linewidth=0.8)
        dx.set_xlabel("step")
        dx.set_ylabel("difference, %")
        dx.grid(alpha=0.3)
        if len(runs) > 1:
            dx.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
