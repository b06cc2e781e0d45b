"""Tables and plots from the harness's results.jsonl: <dir>/results.md, throughput.png (tokens/s and TFLOP/s
against model size, one line per backend), capacity.png (largest config completed, per backend) and loss.png
(nntile and torch losses on the same batches), all written headless. results.md's first table sets nntile beside
each peer's fastest variant on the same model family, config, batch and GPUs, with every row's numerics (master
weights' and AdamW moments' dtypes: where nntile's plan picks bf16 ones, the row says so).

    python -m benchmarks.report benchmarks/results/h200

Where an attempt was repeated, the latest record counts; the runs of one `benchmarks.run --repeat N` count as one:
the median run, with the range of the others.
"""
import argparse
import json
import os
import sys

from benchmarks.configs import NOT_SETTINGS, fmt_params, peer_numerics

GiB = 2**30


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def model(r):
    """The record's model family (records from before --model: Hugging Face's GPT-2, the only one then)."""
    return r.get("model") or "hf"


def latest(records, mode):
    """The last record per (backend, variant and settings, model, config, precision, batch, seq, gpus) of that mode; the
    runs of one `benchmarks.run --repeat N` count as one record: the median run's, with `runs` (every ok run's
    tokens/s, sorted) and `runs_failed` added."""
    out, series = {}, {}
    for r in records:
        if r.get("mode") != mode:
            continue
        key = (r["backend"], variant(r), model(r), r["config"], r["precision"], r["batch"], r["seq"], r["gpus"])
        if r.get("series") is not None:
            series.setdefault((key, r["series"]), []).append(r)
            out[key] = (key, r["series"])
        else:
            out[key] = r
    return [median_run(series[v]) if isinstance(v, tuple) else v for v in out.values()]


def median_run(runs):
    """The record of the median run by tokens/s (the lower one of an even count) among the ok ones."""
    ok = sorted((r for r in runs if r["status"] == "ok" and r.get("tokens_per_s")), key=lambda r: r["tokens_per_s"])
    if not ok:
        return runs[-1]
    return dict(ok[(len(ok) - 1) // 2], runs=[r["tokens_per_s"] for r in ok], runs_failed=len(runs) - len(ok))


def _tokens(r):
    runs = r.get("runs") or []
    if len(runs) < 2:
        return _f(r, "tokens_per_s", ",.0f")
    failed = f", {r['runs_failed']} failed" if r.get("runs_failed") else ""
    return f"{r['tokens_per_s']:,.0f} (median of {len(runs)}: {runs[0]:,.0f}-{runs[-1]:,.0f}{failed})"


def variant(r):
    """The variant with the attempt's own settings (nntile options, NNTILE_/STARPU_ variables), if any."""
    settings = r.get("settings") or {}
    return r["variant"] + "".join(f" {k}={v}" for k, v in settings.items() if k not in NOT_SETTINGS)


def label(r):
    gpus = r.get("gpus") or 0
    return (("" if model(r) == "hf" else f"{model(r)} ") + f"{r['backend']}"
            + ("" if variant(r) == "plain" else f":{variant(r)}") + f" {r['precision']}"
            + (f", {gpus} GPUs" if gpus > 1 else ""))


def _short(dtype):
    return {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)


def numerics(r):
    """{"master", "moments", "by"} of a record: its own `numerics`, or for records from before it was kept, what
    its variant and plan say (nntile's bf16state, the plan's summary); the peers kept fp32 master weights and
    moments throughout."""
    n = r.get("numerics")
    if n:
        return n
    flags = r["variant"].split("+")
    if r["backend"] != "nntile":  # an attempt that failed before its worker said (or an older record): its variant's
        return peer_numerics(r["backend"], flags)
    plan = (r.get("env") or {}).get("plan")
    if plan:
        master = _short(plan.get("master_dtype", "float32"))
        return {"master": "fp32" if master == "fp32" else "bf16 (blocks' matmul weights)",
                "moments": _short(plan.get("state_dtype", "float32")), "by": "the memory plan"}
    return {"master": "fp32", "moments": "bf16" if "bf16state" in flags else "fp32"}


def numerics_text(r):
    """'master fp32, moments **bf16** (plan)': dtypes other than fp32 in bold, '(plan)' where the memory plan chose."""
    n = numerics(r)

    def show(k):
        v = str(n.get(k, "?"))
        return v if v.startswith("fp32") or v == "?" else f"**{v}**"
    where = n.get("state_on")
    return (f"master {show('master')}, moments {show('moments')}" + (" (plan)" if n.get("by") else "")
            + (f", state on {where.upper()}" if where in ("cpu", "nvme") else ""))


def numerics_class(r):
    """(master, moments) by their dtypes alone, the first word of each (fp32, bf16, uint8, 4-bit, fp8): what a
    capacity comparison holds equal. Where the state lives (GPU, CPU, NVMe) is a memory saver, not numerics."""
    n = numerics(r)
    return tuple(str(n.get(k) or "?").split()[0] for k in ("master", "moments"))


def class_text(c):
    return f"master {c[0]}, moments {c[1]}"


def _f(r, k, fmt):
    v = r.get(k)
    return format(v, fmt) if v is not None else "-"


def _gib(v):
    return f"{v / GiB:.1f}" if v else "-"


def peers(rows):
    """Per (model, config, precision, batch, seq, GPUs) with an nntile row: every nntile variant and each peer's
    fastest variant (ok rows), fastest first."""
    groups = {}
    for r in rows:
        if r["status"] == "ok" and r.get("tokens_per_s"):
            groups.setdefault((model(r), r["config"], r["precision"], r["batch"], r["seq"], r["gpus"]), []).append(r)
    out = []
    for key, rs in groups.items():
        if not any(r["backend"] == "nntile" for r in rs):
            continue
        best = {}
        for r in rs:
            if r["backend"] != "nntile" and r["tokens_per_s"] > best.get(r["backend"], {}).get("tokens_per_s", 0):
                best[r["backend"]] = r
        tried = {b: sum(1 for r in rs if r["backend"] == b) for b in best}
        picked = [r for r in rs if r["backend"] == "nntile"] + list(best.values())
        out.append((key, sorted(picked, key=lambda r: -r["tokens_per_s"]), tried))
    return sorted(out, key=lambda g: (g[0][0], g[1][0]["params"], g[0][1:]))


def peers_table(groups):
    head = ("| model | config | GPUs | batch x seq | backend | variant | numerics | tokens/s | step s | compile s "
            "| host waits / step | vs best peer |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (m, config, precision, batch, seq, gpus), rs, tried in groups:
        others = [r for r in rs if r["backend"] != "nntile"]
        top = max((r["tokens_per_s"] for r in others), default=None)
        for r in rs:
            more = tried.get(r["backend"], 1)
            name = variant(r) + (f" (fastest of {more})" if more > 1 else "")
            waits = r.get("host_waits")
            timed = waits[r.get("warmup_used", r.get("warmup", 0)):] if waits else None
            ratio = f"{r['tokens_per_s'] / top:.2f}x" if top else "-"
            lines.append(f"| {m} | {config} {precision} | {gpus} | {batch} x {seq} | {r['backend']} | {name} | "
                         f"{numerics_text(r)} | {_tokens(r)} | {_f(r, 'step_s', '.3f')} | "
                         f"{_f(r, 'compile_s', '.0f')} | "
                         f"{max(timed) if timed else '-'} | {ratio} |")
    return "\n".join(lines)


def throughput_table(rows):
    head = ("| model | config | params | backend | variant | precision | numerics | GPUs | batch x seq | status "
            "| tokens/s | TFLOP/s | MFU | step s | peak GPU GiB | peak host GiB | loss |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(rows, key=lambda r: (model(r), r["params"], r["precision"], r["backend"], variant(r))):
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {(r.get('reason') or '')[:120]}"
        lines.append(f"| {model(r)} | {r['config']} | {fmt_params(r['params'])} | {r['backend']} | {variant(r)} | "
                     f"{r['precision']} | {numerics_text(r)} | {r['gpus']} | {r['batch']} x {r['seq']} | "
                     f"{status.replace('|', '/')} | "
                     f"{_tokens(r)} | {_f(r, 'tflops', '.1f')} | {_f(r, 'mfu', '.2f')} | "
                     f"{_f(r, 'step_s', '.3f')}{_uneven_steps(r)}{_longer_warmup(r)} | {_gib(r.get('peak_gpu_bytes'))} | "
                     f"{_gib(r.get('peak_host_bytes'))} | {_f(r, 'loss', '.4f')} |")
    return "\n".join(lines)


def _uneven_steps(r):
    """' (mean M)' when the timed steps' mean is over 5% above their median (a few slow steps the median hides)."""
    median, mean = r.get("step_s"), r.get("step_mean_s")
    return f" (mean {mean:.3f})" if median and mean and mean > 1.05 * median else ""


def _longer_warmup(r):
    """' (N warm-up)' when the worker warmed up longer than asked (memory still grew: benchmarks.worker.WarmUp)."""
    used = r.get("warmup_used")
    return f" ({used} warm-up)" if used is not None and used > r.get("warmup", used) else ""


PREDICTION_TOLERANCE = 0.15  # the plan's promise (docs/memory_plan.md): its step within 15% of the measured one


def predictions(rows):
    """(row, the plan's predicted step s, its rates' source) for every ok nntile row that ran under the memory plan
    (the harness records the plan's summary with each attempt)."""
    out = []
    for r in rows:
        plan = (r.get("env") or {}).get("plan") or {}
        predicted = (plan.get("predicted") or {}).get("step_s")
        if r["backend"] == "nntile" and r["status"] == "ok" and r.get("step_s") and predicted:
            out.append((r, predicted, plan.get("rates")))
    return sorted(out, key=lambda x: (model(x[0]), x[0]["params"], x[0]["batch"], variant(x[0])))


def predictions_table(preds):
    head = ("| model | config | batch x seq | variant | the plan's choice | predicted step s | measured step s "
            "| measured / predicted | within 15% | rates |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r, predicted, rates in preds:
        plan = r["env"]["plan"]
        choice = (f"{plan.get('host_blocks', 0)}/{plan.get('blocks', '?')} host blocks, moments "
                  f"{plan.get('state_dtype')}, master {plan.get('master_dtype')}"
                  + (", checkpointing" if plan.get("checkpointing") else "")
                  + (", updates in backward" if plan.get("step_in_backward") else ""))
        ratio = r["step_s"] / predicted
        ok = "yes" if abs(ratio - 1) <= PREDICTION_TOLERANCE else "**no**"
        lines.append(f"| {model(r)} | {r['config']} {r['precision']} | {r['batch']} x {r['seq']} | {variant(r)} | "
                     f"{choice} | {predicted:.3f} | {r['step_s']:.3f} | {ratio:.2f} | {ok} | "
                     f"{rates or 'not recorded'} |")
    return "\n".join(lines)


def capacity(records):
    """Per (model, backend, variant, precision, batch, seq): the largest ok config and the first failure above it."""
    groups = {}
    for r in latest(records, "capacity"):
        groups.setdefault((model(r), r["backend"], variant(r), r["precision"], r["batch"], r["seq"]), []).append(r)
    out = []
    for key, rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        best = max(ok, key=lambda r: r["params"]) if ok else None
        above = [r for r in rs if r["status"] != "ok" and (best is None or r["params"] > best["params"])]
        fail = min(above, key=lambda r: r["params"]) if above else None
        out.append((key, best, fail))
    return sorted(out, key=lambda t: -(t[1]["params"] if t[1] else 0))


def capacity_table(caps):
    head = ("| model | backend | variant | precision | batch x seq | largest completed | params | step s "
            "| first failure | numerics |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (m, b, v, p, batch, seq), best, fail in caps:
        failure = (f"{fail['config']} ({fmt_params(fail['params'])}): {fail['status']}"
                   f"{': ' + (fail.get('reason') or '')[:80] if fail.get('reason') else ''}" if fail else "-")
        lines.append(f"| {m} | {b} | {v} | {p} | {batch} x {seq} | {best['config'] if best else 'none'} | "
                     f"{fmt_params(best['params']) if best else '-'} | {_f(best or {}, 'step_s', '.2f')} | "
                     f"{failure.replace('|', '/')} | {numerics_text(best or fail)} |")
    return "\n".join(lines)


def capacity_compare(caps):
    """Per (model, precision, batch, seq): each backend's largest completed model per numerics class (over its
    variants: a peer at its best with its own memory savers), as {(backend, class): (best, first failure above it)};
    nntile's among them. Sorted as capacity()."""
    groups = {}
    for (m, b, v, p, batch, seq), best, fail in caps:
        if best is not None:
            top = groups.setdefault((m, p, batch, seq), {})
            k = (b, numerics_class(best))
            if k not in top or best["params"] > top[k][0]["params"]:
                top[k] = (best, fail)
    return sorted(groups.items(), key=lambda g: g[0])


def _largest(best, fail):
    """'13b (12.85B)', with ', none failed' when no larger attempt failed (the ladder ended first: a lower bound)."""
    return f"{best['config']} ({fmt_params(best['params'])})" + ("" if fail else ", none failed")


def capacity_compare_table(groups):
    """Each peer's largest model per numerics beside nntile's largest at the same numerics, and their ratio; then
    nntile's largest at fp32 state and at compact state."""
    head = ("| model | precision | batch x seq | backend | variant | numerics | largest completed "
            "| nntile's largest at these numerics | nntile / peer |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    notes = []
    for (m, p, batch, seq), top in groups:
        ours = {c: bf for (b, c), bf in top.items() if b == "nntile"}
        for (b, c), (best, fail) in sorted(top.items(), key=lambda t: (t[0][0] != "nntile", -t[1][0]["params"])):
            if b == "nntile":
                match, ratio = "-", "-"
            elif c in ours:
                nb, nf = ours[c]
                match = f"{variant(nb)}: {_largest(nb, nf)}"
                bound = ">= " if not nf and fail else "<= " if nf and not fail else "" if nf else "? "
                ratio = f"{bound}{nb['params'] / best['params']:.2f}x"
            else:
                match, ratio = "no nntile run at these numerics", "-"
            lines.append(f"| {m} | {p} | {batch} x {seq} | {b} | {variant(best)} | {numerics_text(best)} | "
                         f"{_largest(best, fail)} | {match} | {ratio} |")
        fp32 = ours.get(("fp32", "fp32"))
        compact = max((bf for c, bf in ours.items() if c != ("fp32", "fp32")), key=lambda bf: bf[0]["params"],
                      default=None)
        if fp32 or compact:
            notes.append(f"- {m} {p}, batch {batch} x {seq}: nntile's largest at fp32 state "
                         + (f"{_largest(*fp32)} ({variant(fp32[0])})" if fp32 else "not run")
                         + "; at compact state " + (f"{_largest(*compact)} ({variant(compact[0])}, "
                                                    f"{class_text(numerics_class(compact[0]))})"
                                                    if compact else "not run"))
    return "\n".join(lines + ([""] + notes if notes else []))


def environment(records):
    lines = []
    seen = set()
    for r in records:
        env = r.get("env") or {}
        key = (r["machine"], env.get("gpu"), env.get("torch"), env.get("cuda"))
        if env and key not in seen:
            seen.add(key)
            counts = sorted({x.get("gpus") or 0 for x in records if (x.get("env") or {}).get("gpu") == env.get("gpu")})
            where = (f"{env['gpu']}, " + " or ".join(map(str, counts)) + " per attempt (GPUs column)"
                     if env.get("gpu") else "CPU only")
            lines.append(f"- {r['machine']}: {where}, torch {env.get('torch')}, "
                         f"CUDA {env.get('cuda')}, transformers {env.get('transformers')}, Python {env.get('python')}, "
                         f"{env.get('cpus')} CPU cores")
    peaks = {r["precision"]: r["peak_tflops"] for r in records if r.get("peak_tflops")}
    if peaks:
        lines.append("- matmul peak (torch.matmul 8192^3, same run): " +
                     ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in sorted(peaks.items())))
    for r in records:
        env = r.get("env") or {}
        if r["backend"] == "nntile" and env.get("starpu"):
            lines.append(f"- nntile: StarPU {env['starpu']}, scheduler {env.get('scheduler')}, workers "
                         f"{env.get('workers')}, tile {env.get('tile_size')}, batch tile {env.get('batch_tile_size')}, "
                         f"submission window {env.get('submission_window', 'not recorded')}, "
                         f"settings {env.get('nntile_settings')}")
            break
    for r in records:
        env = r.get("env") or {}
        if r["backend"] == "deepspeed" and env.get("deepspeed"):
            lines.append(f"- deepspeed {env['deepspeed']}, optimizer {env.get('optimizer')}"
                         + (f" ({env['optimizer_note']})" if env.get("optimizer_note") else ""))
            break
    return "\n".join(lines)


def plot_throughput(rows, path):
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r["status"] == "ok" and r.get("tokens_per_s")]
    if not ok:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {}
    for r in ok:  # a gathered summary may name its series (one backend whose variant changes with the size)
        series.setdefault(r.get("series") or label(r), []).append(r)
    if len({r["params"] for r in ok}) == 1:  # one model size: bars per backend (a line through one x is a dot)
        names = sorted(series, key=lambda n: -series[n][0]["tokens_per_s"])
        for ax, key, what in zip(axes, ("tokens_per_s", "tflops"),
                                 ("tokens/s", "model TFLOP/s (6N + 12 L h seq per token)")):
            vals = [series[n][0][key] for n in names]
            ax.barh(range(len(names)), vals, color=[f"C{i}" for i in range(len(names))])
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=8)
            ax.invert_yaxis()
            for i, v in enumerate(vals):
                ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
            ax.set_xlabel(what)
            ax.grid(alpha=0.3, axis="x")
        b = ok[0]
        per_gpu = {r["batch"] // max(1, r.get("gpus") or 1) for r in ok}
        name = ("GPT-2 " if b.get("family", "gpt2") == "gpt2" else "") + b["config"]  # older records: GPT-2's
        fig.suptitle(f"{name} ({b['params'] / 1e9:.2f}B) training throughput, {b['machine']}, "
                     + (f"{per_gpu.pop()} x {b['seq']} tokens per GPU" if len(per_gpu) == 1 else "batches differ"))
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return True
    batches = {r["batch"] for r in ok}
    for name, rs in sorted(series.items()):
        rs.sort(key=lambda r: r["params"])
        x = [r["params"] / 1e9 for r in rs]
        for ax, key in zip(axes, ("tokens_per_s", "tflops")):
            ax.plot(x, [r[key] for r in rs], "o-", label=name)
            if len(batches) > 1:  # batches differ between points: each says its own
                for xi, r in zip(x, rs):
                    ax.annotate(f"b{r['batch']}", (xi, r[key]), textcoords="offset points", xytext=(4, 4),
                                fontsize=7)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    sizes = sorted({r["params"] / 1e9 for r in ok})
    for ax, what in zip(axes, ("tokens/s", "model TFLOP/s (6N + 12 L h seq per token)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes)  # the model sizes measured, as plain numbers
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("parameters (billions)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, which="both")
    b = ok[0]
    batch = f"batch {b['batch']} x {b['seq']}" if len(batches) == 1 else f"bN = N sequences of {b['seq']} per step"
    fig.suptitle(f"GPT-2 training throughput, {batch}, {b['machine']}")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_capacity(caps, path):
    import matplotlib.pyplot as plt
    if not caps:
        return False
    import textwrap
    # variants with settings get long ("bf16state+ckpt+stepbwd host_memory_limit=108GiB ..."): wrapped under the bar
    names = ["\n".join(w.replace("+ ", "+") for w in textwrap.wrap(
        (("" if m == "hf" else f"{m} ") + f"{b}" + ("" if v == "plain" else f":{v}")).replace("+", "+ "), 20,
        break_long_words=False)) + f"\n{p}, b{batch}" for (m, b, v, p, batch, seq), _, _ in caps]
    vals = [best["params"] / 1e9 if best else 0 for _, best, _ in caps]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(caps)), 4.5 + 0.12 * max(n.count("\n") for n in names)))
    bars = ax.bar(range(len(caps)), vals, color="tab:blue")
    for bar, (_, best, fail) in zip(bars, caps):
        text = (best["config"] if best else "none") + (f"\n(fails {fail['config']})" if fail else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(caps)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("largest model trained (billions of parameters)")
    ax.set_title("Capacity: largest config that completes its steps")
    ax.margins(y=0.2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def loss_pairs(records):
    """(torch record, nntile record) pairs on the same config, precision, batch, seq and steps; the longest last."""
    best = {}
    for r in records:
        if r["status"] == "ok" and r["backend"] in ("torch", "nntile") and r.get("losses"):
            best[(r["backend"], model(r), r["config"], r["precision"], r["batch"], r["seq"], len(r["losses"]))] = r
    pairs = []
    for (b, *rest), r in best.items():
        if b == "torch" and ("nntile", *rest) in best:
            pairs.append((r, best[("nntile", *rest)]))
    return sorted(pairs, key=lambda p: (len(p[0]["losses"]), p[0]["params"]))


def plot_losses(pairs, path):
    import matplotlib.pyplot as plt
    if not pairs:
        return False
    pairs = pairs[-4:]
    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4), squeeze=False)
    for ax, (t, n) in zip(axes[0], pairs):
        ax.plot(range(len(t["losses"])), t["losses"], label=f"torch:{t['variant']}")
        ax.plot(range(len(n["losses"])), n["losses"], "--", label=f"nntile:{n['variant']}")
        gap = max(abs(a - b) for a, b in zip(t["losses"], n["losses"]))
        ax.set_title(f"{model(t)} {t['config']} {t['precision']}, batch {t['batch']} x {t['seq']}: max gap {gap:.2e}",
                     fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(folder):
    import matplotlib
    matplotlib.use("Agg")
    path = os.path.join(folder, "results.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"no {path}: run python -m benchmarks.run --out {folder} first")
    records = load(path)
    rows = latest(records, "throughput")
    caps = capacity(records)
    pairs = loss_pairs(records)
    md = [f"# Benchmark results ({len(records)} attempts in results.jsonl)", "", environment(records), ""]
    best = peers(rows)
    if best:
        md += ["## nntile beside each peer's fastest variant", "",
               ("Per model family, config, batch and GPU count: every nntile variant and, for each peer, its fastest "
                "variant among those run (compile: torch.compile; useropt: the script's own torch.optim.AdamW and "
                "clip_grad_norm_). Numerics: master weights' and AdamW moments' dtypes, those other than fp32 in bold; "
                "(plan): chosen by nntile's memory plan. compile s: the warm-up steps' time beyond a timed step. "
                "Host waits: nntile's per step, the loss read included (the most of the timed steps)."), "",
               peers_table(best), ""]
    if rows:
        md += ["## Throughput", "", ("TFLOP/s count 6N + 12 L h seq FLOPs per token; MFU against the matmul peak "
                                     "measured in the same run; step time is the median of the timed steps; peak GPU "
                                     "memory is the device's memory in use (all allocators), peak host memory the sum "
                                     "of the ranks' peak RSS."), "",
               throughput_table(rows), ""]
        if plot_throughput(rows, os.path.join(folder, "throughput.png")):
            md += ["![throughput](throughput.png)", ""]
    preds = predictions(rows)
    if preds:
        md += ["## The memory plan's predicted step against the measured one", "",
               ("Every nntile row that ran under `nt.plan` (the harness's default): the step time the plan predicted "
                "for the placement it chose, beside the measured median step. The plan's promise is within 15% "
                "(docs/memory_plan.md); rates: what it assumed of the machine (the H200's defaults, or measured on "
                "this GPU model: nntile_torch/rates.py; older records did not say)."), "", predictions_table(preds), ""]
    if caps:
        md += ["## Capacity", "", capacity_table(caps), ""]
        compare = capacity_compare(caps)
        if any(b == "nntile" for _, top in compare for b, _ in top) and any(
                b != "nntile" for _, top in compare for b, _ in top):
            md += ["### Capacity at equal numerics", "",
                   ("Each backend's largest model per numerics (master weights' and AdamW moments' dtypes; where the "
                    "optimizer state lives is a memory saver, not numerics), over its variants, beside nntile's "
                    "largest at the same numerics. 'none failed': the ladder ended before a failure, a lower bound "
                    "(>= / <= on the ratio; ? where neither failed)."), "",
                   capacity_compare_table(compare), ""]
        if plot_capacity(caps, os.path.join(folder, "capacity.png")):
            md += ["![capacity](capacity.png)", ""]
    if pairs:
        md += ["## Loss: nntile vs torch on the same batches", ""]
        for t, n in pairs:
            gap = max(abs(a - b) for a, b in zip(t["losses"], n["losses"]))
            md.append(f"- {model(t)} {t['config']} {t['precision']}, batch {t['batch']} x {t['seq']}, "
                      f"{len(t['losses'])} steps: "
                      f"step 0 {t['losses'][0]:.4f} vs {n['losses'][0]:.4f}, last {t['losses'][-1]:.4f} vs "
                      f"{n['losses'][-1]:.4f}, largest gap {gap:.2e}")
        if plot_losses(pairs, os.path.join(folder, "loss.png")):
            md += ["", "![loss](loss.png)"]
        md.append("")
    with open(os.path.join(folder, "results.md"), "w") as f:
        f.write("\n".join(md))
    return records


def default_folder():
    import torch

    from benchmarks.run import ROOT, machine_name
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return os.path.join(ROOT, "benchmarks", "results", machine_name(gpu))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", help="folder holding results.jsonl (default benchmarks/results/<machine>)")
    args = ap.parse_args(argv)
    folder = args.folder or default_folder()
    records = report(folder)
    made = [f for f in ("results.md", "throughput.png", "capacity.png", "loss.png")
            if os.path.exists(os.path.join(folder, f))]
    print(f"{len(records)} records; wrote {', '.join(made)} in {folder}")


if __name__ == "__main__":
    sys.exit(main())
