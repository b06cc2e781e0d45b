"""Benchmark harness: training steps of GPT-2 and Llama-family models on nntile_torch beside PyTorch eager, FSDP,
FSDP2 and DeepSpeed, with the same model, data, batch, sequence length and precision, each attempt in its own process.

    python -m benchmarks.run --backend torch,nntile --config xl --precision bf16 --batch 8 --seq 1024
    python -m benchmarks.run --model hf,hf-tanh,nanogpt --backend nntile,torch:compile,fsdp2:compile --config xl
    python -m benchmarks.run --backend fsdp:offload,fsdp2:offload,deepspeed --config xl,6.7b
    python -m benchmarks.run --mode capacity --backend torch:ckpt,nntile --config 6.7b,13b,20b --steps 2
    python -m benchmarks.run --mode capacity --backend fsdp2:offload+ckpt,deepspeed:offload+ckpt,torch:ao8bit+ckpt
        --config 6.7b,9.4b,13b --steps 1 --warmup 1    # (one line) the peers with their own memory savers
    python -m benchmarks.run --backend nntile,fsdp --config xl --repeat 3   # before/after ratios: medians of 3
    python -m benchmarks.run --backend torch:compile,fsdp2,nntile --config llama3-8b --batch 8 --seq 1024
    python -m benchmarks.run --list-configs

Configs (--config, benchmarks/configs.py) name their family: gpt2 (tiny ... 58b, wide-*), llama (llama-tiny,
llama3-8b, llama-70b), qwen2 (qwen2-tiny, qwen2.5-14b, qwen2.5-32b). Models (--model, benchmarks/models.py), the
same shapes, data, loss and FLOP count within a family; without --model each config builds its family's first:
  hf         (gpt2) Hugging Face GPT2LMHeadModel as a user has it (its default activation gelu_new)
  hf-tanh    (gpt2) the same with activation_function="gelu_pytorch_tanh" (the same function in one kernel)
  nanogpt    (gpt2) examples/nanogpt/model.py, nanoGPT's model.py in structure (its LayerNorm calling F.layer_norm,
             split q/k/v + SDPA, nn.GELU, tied head), vocab padded to a multiple of 64 as nanoGPT does (50304)
  llama      (llama) Hugging Face LlamaForCausalLM from the config (GQA, gated SiLU MLP, RMSNorm, untied head)
  qwen2      (qwen2) Hugging Face Qwen2ForCausalLM from the config (Llama's shape with q, k, v biases)
An explicit --model runs each config of its family; a model that fits none of the configs, or a config that none of
the models fits, is an error.

Backends (a variant after ':' or from --variant; flags joined by '+', e.g. fsdp:offload+ckpt):
  torch      eager; variants plain, ckpt (activation checkpointing), compile (torch.compile(model)), useropt (a
             training script's own optimizer and clipping, as nanoGPT's train.py: torch.optim.AdamW over its
             weight-decay groups, fused on CUDA, betas (0.9, 0.95), and clip_grad_norm_(params, 1.0) every step);
             torchao's optimizers (pip install --no-deps torchao; without it the attempt is unavailable), one of:
             ao8bit (AdamW8bit, moments uint8 block-wise), ao4bit (AdamW4bit), aofp8 (AdamWFp8), aooffload
             (CPUOffloadOptimizer(torch.optim.AdamW, fused=True): fp32 state and step on the CPU, GPU only); and
             aobf16sr (bf16 weights, no fp32 master, stochastic rounding; alone or with ao8bit/ao4bit/aofp8)
  nntile     nntile_torch.convert + nntile_torch.optim.AdamW; plain: the memory plan (nt.plan) picks every setting;
             by hand instead: ckpt, stepbwd (AdamW in backward), bf16state (bf16 moments), offload
             (--offload-fraction of the weights updated on CPU workers), noplan (nntile's defaults, no plan);
             cpuupdate, gpuupdate: the plan with its host blocks updated on CPU workers / on the GPU;
             bf16master: the plan with bf16 master weights; statefetch: the plan with the early state fetch;
             keptcopies: the plan with the GPU blocks' bf16 weight copies kept between steps (not made per use);
             hostckpt: the plan with checkpointing's block inputs homed in host RAM (nt.plan(host_checkpoints=True));
             fp32state: the plan held to the peers' numerics, fp32 moments and master weights (a like-for-like row
             beside a plan that picks bf16 ones);
             useropt: the converted model trained by torch.optim.AdamW and clip_grad_norm_ as torch's useropt (the
             plan, if any, limited to fp32 master weights and moments on the GPU, updates in step())
  fsdp       FSDP1 FULL_SHARD per block; variants plain, offload (CPUOffload(offload_params=True)), ckpt, compile
             (torch.compile of the FSDP1 model, use_orig_params=True), useropt (FSDP1's clip_grad_norm_)
  fsdp2      fully_shard per block + root; variants plain, offload (CPUOffloadPolicy), ckpt, compile (torch.compile
             of each block, then fully_shard: torchtitan's order), useropt; torchao's ao8bit, ao4bit, aofp8,
             aobf16sr as torch's (e.g. fsdp2:offload+ckpt+ao8bit)
  deepspeed  ZeRO-3; variants offload (params + optimizer to CPU, the default), nvme (to --nvme-path),
             gpu (no offload), ckpt (e.g. deepspeed:offload+ckpt, deepspeed:nvme+ckpt)
fsdp, fsdp2 and deepspeed run under torchrun on every visible GPU (one process with gloo on a CPU-only machine);
torch and nntile in one process (nntile on all GPUs). Precision bf16: autocast / MixedPrecision / DeepSpeed bf16 /
nntile bf16 matmuls, fp32 master weights everywhere (nntile's plan may pick bf16 moments or bf16 master weights
beyond GPU memory); tf32: fp32 weights, TF32 matmuls. Each record's `numerics` says its matmul precision and its
master weights' and moments' dtypes (a peer's: and where its optimizer state lives, state_on gpu / cpu / nvme).
torch.compile keeps its kernels in TORCHINDUCTOR_CACHE_DIR (inductor's default: /tmp/torchinductor_<user>): a
folder that outlives the attempt makes later compiles of the same model faster. The warm-up steps' time beyond a
timed step is recorded as `compile_s` (and the first step's as `first_step_s`), apart from the step time.

Throughput: the median (and mean) of the timed steps, after a warm-up that goes on while a step still raises the
peak host or GPU memory by more than 1% (a model beyond GPU memory allocates for its first steps; --max-warmup caps
it, `warmup_used` records it), with each step's time in full garbage collections (`gc_ms`).
Each attempt appends one JSON line to <out>/results.jsonl (status ok, oom, error or unavailable, with a reason;
a timed-out or crashed attempt keeps its step times and losses so far; `settings`: the nntile options given and
the NNTILE_* / STARPU_* variables set) and prints one progress line; its log is <out>/logs/<attempt>.log.
Capacity mode climbs the configs in size order per backend and stops at the first that does not complete; its
default GPT-2 ladder goes from GPT-2 small to 58b, from 6.7b up in steps of at most 1.5x (6.7b, 9.4b, 13b, 15.5b,
20b, 30b, 37b, 45b, 58b).
`python -m benchmarks.report <out>` makes the table and plots.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.configs import (
    MANUAL_NNTILE_FLAGS,
    CAPACITY_LADDER,
    CONFIGS,
    DEFAULT_CONFIG,
    FAMILY_MODELS,
    LADDERS,
    MODEL_FAMILY,
    NOT_SETTINGS,
    TORCHAO_FLAGS,
    TORCHAO_INSTALL,
    by_size,
    default_model,
    family,
    fmt_params,
    model_flops_per_token,
    model_vocab,
    param_count,
    shape_text,
)
from benchmarks.models import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    # compile: torch.compile (torch: the whole model; fsdp: the FSDP1 model, use_orig_params=True; fsdp2: each block,
    # then fully_shard); useropt: a training script's own optimizer and clipping, as nanoGPT's train.py
    # (torch.optim.AdamW over its weight-decay groups, fused on CUDA, and clip_grad_norm_(1.0) every step)
    # ao8bit, ao4bit, aofp8, aobf16sr, aooffload: torchao's optimizers (configs.TORCHAO_FLAGS) instead of torch's AdamW
    "torch": ({"ckpt", "compile", "useropt"} | TORCHAO_FLAGS, ""),
    # stepbwd: AdamW(step_in_backward=True), gradients never all held; bf16state: AdamW(state_dtype=bfloat16)
    # offload: AdamW(offload=--offload-fraction), those updates on CPU workers with their state in host RAM
    # no flag: the memory plan (nt.plan) chooses; noplan: nntile's defaults without a plan; cpuupdate / gpuupdate:
    # the plan, with its host blocks' updates pinned to CPU workers / the GPU; bf16master: the plan with the blocks'
    # matmul weights kept in bf16 alone; statefetch: the plan with the early fetch of the GPU updates' state;
    # keptcopies: the plan with nt.plan(bf16_per_use=False); hostckpt: with nt.plan(host_checkpoints=True)
    # fp32state: the plan with nt.plan(state_dtype=torch.float32, master_dtype=torch.float32), the peers' numerics
    # useropt: torch.optim.AdamW and clip_grad_norm_ on the converted model instead of nt.optim.AdamW (with the
    # plan: one limited to what that optimizer runs, fp32 state on the GPU)
    "nntile": ({"ckpt", "stepbwd", "bf16state", "offload", "noplan", "cpuupdate", "gpuupdate", "bf16master",
                "statefetch", "keptcopies", "hostckpt", "useropt", "fp32state"}, ""),
    "fsdp": ({"offload", "ckpt", "compile", "useropt"}, ""),
    "fsdp2": ({"offload", "ckpt", "compile", "useropt"} | (TORCHAO_FLAGS - {"aooffload"}), ""),
    "deepspeed": ({"offload", "nvme", "gpu", "ckpt"}, "offload"),
}
DISTRIBUTED = {"fsdp", "fsdp2", "deepspeed"}
GiB = 2**30


def machine_name(gpu):
    """'h200' from 'NVIDIA H200', 'h100' from 'NVIDIA H100 80GB HBM3'; 'cpu' without a GPU."""
    if not gpu:
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", gpu.lower()) if w not in ("nvidia", "tesla", "geforce", "rtx")]
    return re.sub(r"[^a-z0-9.]", "", words[0]) if words else "gpu"


def canonical_variant(backend, text):
    allowed, default = VARIANTS[backend]
    flags = {f for f in (text or default).split("+") if f and f != "plain"}
    if backend == "fsdp2" and "aooffload" in flags:
        raise ValueError("fsdp2 has no variant aooffload: torchao's CPUOffloadOptimizer is for one GPU without "
                         "sharding (fsdp2:offload is FSDP2's own CPU offload, CPUOffloadPolicy)")
    bad = flags - allowed
    if bad:
        raise ValueError(f"{backend} has no variant flag {sorted(bad)} (flags: {sorted(allowed)}, or plain)")
    pins = flags & {"cpuupdate", "gpuupdate"} if backend == "nntile" else set()
    if pins and len(pins) > 1:
        raise ValueError("nntile variants cpuupdate and gpuupdate pin the plan's host updates: one of them")
    planned = flags & {"cpuupdate", "gpuupdate", "bf16master", "statefetch", "keptcopies", "hostckpt", "fp32state"} \
        if backend == "nntile" else set()
    if planned and flags & MANUAL_NNTILE_FLAGS:
        raise ValueError(f"nntile variants {sorted(planned)} change the memory plan: not with the flags that turn the "
                         f"plan off ({sorted(MANUAL_NNTILE_FLAGS)})")
    if backend == "nntile" and {"fp32state", "bf16master"} <= flags:
        raise ValueError("nntile variants fp32state and bf16master pin the master weights' dtype: one of them")
    if backend == "nntile" and "useropt" in flags:
        ours = flags & {"stepbwd", "bf16state", "offload", "cpuupdate", "gpuupdate", "bf16master", "statefetch"}
        if ours:
            raise ValueError(f"nntile variant useropt trains with torch.optim.AdamW: not with {sorted(ours)} "
                             "(settings of nt.optim.AdamW)")
    ao = flags & TORCHAO_FLAGS
    if ao:
        if len(ao - {"aobf16sr"}) > 1:
            raise ValueError(f"{backend} variants {sorted(ao - {'aobf16sr'})} each pick torchao's optimizer: "
                             "one of them")
        if {"aobf16sr", "aooffload"} <= flags:
            raise ValueError("aooffload steps torch.optim.AdamW on the CPU (fp32 master weights): not with aobf16sr")
        if "useropt" in flags:
            raise ValueError(f"{backend} variant useropt trains with the script's torch.optim.AdamW: not with "
                             f"torchao's optimizer ({sorted(ao)})")
    if backend == "deepspeed":  # offloads to CPU unless told gpu (no offload) or nvme
        if "gpu" in flags and flags & {"offload", "nvme"}:
            raise ValueError("deepspeed variant 'gpu' (no offload) excludes offload and nvme")
        if "nvme" in flags:
            flags.discard("offload")
        elif "gpu" not in flags:
            flags.add("offload")
    return "+".join(sorted(flags)) or "plain"


def parse_backends(backends, variants):
    """[(backend, variant)] from 'torch,fsdp:offload' and a --variant list for entries without one."""
    out = []
    for item in backends.split(","):
        name, _, var = item.strip().partition(":")
        if name not in VARIANTS:
            raise ValueError(f"unknown backend {name!r} (known: {', '.join(VARIANTS)})")
        for v in ([var] if var else variants or [None]):
            try:
                pair = (name, canonical_variant(name, v))
            except ValueError as e:
                if var or not variants or len(variants) == 1:
                    raise
                print(f"skipping {name}:{v}: {e}", flush=True)
                continue
            if pair not in out:
                out.append(pair)
    return out


def gib(x):
    return f"{x / GiB:.1f} GiB" if x else "-"


def probe(workdir, cpu_only):
    """GPUs, versions and matmul peaks, from a child process (the harness itself never touches the GPU)."""
    if cpu_only or not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi")):
        return {"gpus": 0, "gpu": None, "peak_tflops": {}, "torch": None}
    path = os.path.join(workdir, "probe.json")
    env = child_env(cpu_only)
    r = subprocess.run([sys.executable, "-m", "benchmarks.worker", "--probe", path], env=env, capture_output=True,
                       text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise SystemExit(f"probe failed:\n{r.stdout}\n{r.stderr}")
    with open(path) as f:
        return json.load(f)


def child_env(cpu_only):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def address_space_cap(limit):
    """A preexec_fn capping the attempt's address space (RLIMIT_AS) at `limit` bytes, or None. Emulates a smaller
    host on CPU-only runs; CUDA reserves far more address space than memory, so not for GPU runs."""
    if not limit:
        return None

    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def descendants(root):
    """Pids of every process below root (from /proc), found before anything is killed: torchrun starts its ranks
    in sessions of their own, so killing torchrun's process group does not reach them."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def wait_child(proc, timeout):
    """Waits for proc with os.wait4, which gives this child's own resource usage (ru_maxrss covers its process
    tree: torchrun's ranks too); stops the whole tree past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            timed_out = False
            break
        if time.monotonic() > deadline:
            timed_out = True
            tree = descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGTERM)  # torchrun passes it on to its ranks
            end = time.monotonic() + 10
            while time.monotonic() < end:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.2)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(proc.pid, 0)
            for p in tree:  # ranks in sessions of their own, if any outlived torchrun
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_maxrss * 1024, timed_out


def last_error_line(log_text):
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    stalls = [ln for ln in lines if ln.startswith("nntile_torch: no StarPU task finished")]
    if stalls:  # the runtime's stall report says more than the abort that follows it
        return "stalled: " + stalls[-1][:490]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Aborted)", ln) and not ln.startswith("File "):
            return re.sub(r"^\[rank\d+\]:\s*", "", ln)[:500]
    return lines[-1][:500] if lines else "no output"


def log_progress(log_text):
    """What an attempt got done before it ended, from the worker's progress lines: setup seconds, and the time and
    loss of each step (warm-up included), so that a timeout or a crash still says how far it came and how fast."""
    setup = re.findall(r"^setup: ([0-9.]+) s", log_text, re.M)
    steps = re.findall(r"^step \d+: ([0-9.]+) s, loss ([0-9.eE+-]+|nan|inf)", log_text, re.M)
    gpu = re.findall(r"^step \d+: .*peak GPU ([0-9.]+) GiB", log_text, re.M)
    tiles = re.findall(r"^step \d+: .*peak tiles ([0-9.]+) GiB", log_text, re.M)  # nntile's live tiles
    # nntile's memory nodes, from a slow step's report or the stall report: what filled them
    nodes = re.findall(r"(?:^step \d+ still running after \d+ s; memory nodes|no StarPU task finished.*Memory nodes): "
                       r"(.*?)(?:\. [A-Z].*)?$", log_text, re.M)  # then the advice, after ". "
    phase = re.findall(r"^(DeepSpeedCPUAdam: .*)$", log_text, re.M)  # slow phases the worker announces
    return {"setup_s": float(setup[-1]) if setup else None, "step_times": [float(t) for t, _ in steps],
            "losses": [float(v) for _, v in steps],
            "peak_gpu_bytes": int(float(gpu[-1]) * GiB) if gpu else None,
            "peak_tile_bytes": int(float(tiles[-1]) * GiB) if tiles else None,
            "memory_nodes": nodes[-1] if nodes else None, "last_phase": phase[-1][:200] if phase else None}


def progress_words(prog):
    """'setup 52 s, 3 steps (last 48.1 s)' from log_progress(), or '' when nothing started."""
    words = []
    if prog["setup_s"] is not None:
        words.append(f"setup {prog['setup_s']:.0f} s")
    n = len(prog["step_times"])
    if n:
        words.append(f"{n} step{'s' if n > 1 else ''} (last {prog['step_times'][-1]:.1f} s)")
    elif prog["setup_s"] is not None:
        words.append("no step finished")
    elif prog.get("last_phase"):
        words.append(f"during '{prog['last_phase']}'")
    return ", ".join(words)


def signal_reason(rc):
    """'killed by signal 11 (SIGSEGV)' for a child that a signal ended, else None."""
    if rc is None or rc >= 0:
        return None
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = "unknown signal"
    hint = {"SIGKILL": ", out of host memory?", "SIGSEGV": ", a crash in native code",
            "SIGABRT": ", an abort in native code"}.get(name, "")
    return f"killed by signal {-rc} ({name}{hint})"


def code_commit(root=ROOT):
    """The commit of the code under test, for the records: $BENCH_CODE_COMMIT when set (dev/gpu_machine/h200.sh sets it
    from .carry/code_commit, which dev/gpu_machine/prepare_carry.sh writes: the GPU machine's copy of the tree may hold a
    .git of an older commit, whose HEAD "+changes" is what it read there on 12-01), else git's HEAD in a checkout
    (with "+changes" when tracked files differ from it), else the text of .carry/code_commit, else None."""
    if os.environ.get("BENCH_CODE_COMMIT"):
        return os.environ["BENCH_CODE_COMMIT"].strip()
    try:
        git = ["git", "-C", root]
        head = subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, timeout=20,
                              check=False)
        if head.returncode == 0 and head.stdout.strip():
            changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                     text=True, timeout=20, check=False).stdout.strip()
            return head.stdout.strip() + ("+changes" if changed else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open(os.path.join(root, ".carry", "code_commit")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def attempt_settings(nntile_options, flags, environ):
    """What sets an attempt apart beyond backend, variant, config and batch: nntile options given on the command
    line, and NNTILE_* / STARPU_* environment variables (A/B runs of one variant differ only there), but not where
    StarPU's perf models live (STARPU_HOME) or which build the extension came from (STARPU_PREFIX)."""
    out = {}
    if nntile_options is not None:
        for k, v in nntile_options.items():
            if v is not None and (k != "offload_fraction" or "offload" in flags):
                out[k] = v
    for k, v in sorted(environ.items()):
        if k.startswith(("NNTILE_", "STARPU_")) and k not in NOT_SETTINGS:
            out[k] = v
    return out


def precheck(a, cpu_only, args, world):
    """Why the attempt cannot run here, found without starting it (the worker checks again), or None."""
    flags = a["variant"].split("+")
    if a["backend"] == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install deepspeed; see dev/gpu_machine/h200.sh for carried wheels)"
    if a["backend"] == "nntile" and importlib.util.find_spec("nntile_torch") is None:
        return "nntile_torch is not importable"
    if cpu_only and a["backend"] in ("fsdp", "fsdp2") and "offload" in flags:
        return "CPU offload needs a GPU to offload from (none here)"
    ao = set(flags) & TORCHAO_FLAGS
    if ao and importlib.util.find_spec("torchao") is None:
        return f"torchao is not installed (variants {'+'.join(sorted(ao))}): {TORCHAO_INSTALL}"
    if "aooffload" in flags and cpu_only:
        return "torchao's CPUOffloadOptimizer needs a GPU to offload from (none here)"
    if "aobf16sr" in flags and a["precision"] != "bf16":
        return f"aobf16sr trains bf16 weights: --precision bf16 only (got {a['precision']})"
    if "nvme" in flags and not args.nvme_path:
        return "the nvme variant needs --nvme-path"
    if args.batch % world:
        return f"batch {args.batch} does not split over {world} GPUs"
    return None


def dropout_suffix(args):
    """The attempt name's part for its dropout: "_drop0.1" (every dropout), "_attndrop0.1" (attention's alone)."""
    if not args.dropout:
        return ""
    return f"_{'attn' if args.dropout_on == 'attention' else ''}drop{args.dropout:g}"


def run_attempt(a, args, machine, peaks, ngpus, logdir):
    """Runs one attempt in its own process (torchrun for the distributed backends) and returns its record."""
    model = a.get("model") or default_model(a["config"])
    name = (f"{a['backend']}_{a['variant']}_{'' if model == 'hf' else model + '_'}{a['config']}_{a['precision']}"
            f"_b{args.batch}_s{args.seq}{dropout_suffix(args)}")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_path = os.path.join(logdir, f"{stamp}_{name}.log")
    params = param_count(a["config"], args.seq, model)
    shape = CONFIGS[a["config"]]
    cpu_only = args.cpu or ngpus == 0
    world = 1 if (cpu_only or a["backend"] not in DISTRIBUTED) else ngpus
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp:
        spec = {"backend": a["backend"], "flags": [f for f in a["variant"].split("+") if f != "plain"],
                "model": model, "config": a["config"], "precision": a["precision"], "batch": args.batch,
                "seq": args.seq, "dropout": args.dropout, "dropout_on": args.dropout_on,
                "steps": args.steps, "warmup": args.warmup, "seed": args.seed, "data_pool": args.data_pool,
                "max_warmup": args.max_warmup if a["mode"] == "throughput" else args.warmup,
                "lr": args.lr, "weight_decay": 0.01, "params": params, "cpu": cpu_only,
                "init_device": args.init_device, "zero_init": args.zero_init or a["mode"] == "capacity",
                "ds_optimizer": args.ds_optimizer, "nvme_path": args.nvme_path,
                "nntile": {"tile_size": args.tile_size, "batch_tile_size": args.batch_tile_size, "ncpus": args.ncpus,
                           "ncuda": args.ncuda, "cuda_memory_limit": args.cuda_memory_limit,
                           "host_memory_limit": args.host_memory_limit, "disk_path": args.disk_path,
                           "disk_limit": args.disk_limit, "scheduler": args.scheduler,
                           "offload_fraction": args.offload_fraction,
                           "max_submitted_tasks": args.max_submitted_tasks},
                "result": os.path.join(tmp, "result"),
                "timeline": log_path[:-len(".log")] + ".timeline" if args.timeline else None,
                "trace_steps": log_path[:-len(".log")] + ".steps.tasks" if args.trace_steps else None}
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        worker = ["-m", "benchmarks.worker", "--spec", spec_path]
        if a["backend"] in DISTRIBUTED:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", *worker]
        else:
            cmd = [sys.executable, *worker]
        rec = {"machine": machine, "backend": a["backend"], "variant": a["variant"], "model": model,
               "family": shape.family, "config": a["config"], "params": params, "layers": shape.layers,
               "hidden": shape.hidden, "heads": shape.heads, "kv_heads": shape.kv_heads or shape.heads,
               "mlp": shape.mlp or 4 * shape.hidden, "vocab": model_vocab(a["config"], model),
               "flops_per_token": model_flops_per_token(a["config"], args.seq, model), "precision": a["precision"],
               "numerics": None, "gpus": 0 if cpu_only else world,
               "batch": args.batch, "seq": args.seq, "dropout": args.dropout, "dropout_on": args.dropout_on,
               "steps": args.steps, "warmup": args.warmup,
               "mode": a["mode"],
               "status": None, "reason": None, "tokens_per_s": None, "tflops": None, "mfu": None,
               "peak_tflops": peaks.get(a["precision"]), "step_s": None, "peak_gpu_bytes": None,
               "peak_host_bytes": None, "loss": None, "losses": None,
               "time": datetime.datetime.now().isoformat(timespec="seconds"),
               "log": os.path.relpath(log_path, args.out),
               "settings": attempt_settings(spec["nntile"] if a["backend"] == "nntile" else None, spec["flags"],
                                            os.environ),
               "code_commit": args.code_commit}
        reason = precheck(a, cpu_only, args, world)
        if reason:
            rec.update(status="unavailable", reason=reason, wall_s=0.0, log=None)
            return rec
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            log.write(" ".join(cmd) + "\n" + json.dumps(spec) + "\n")
            log.flush()
            # Its own process group, so that a timeout kills torchrun's ranks too.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(cpu_only), cwd=ROOT,
                                    start_new_session=True,
                                    preexec_fn=address_space_cap(args.host_memory_cap))  # noqa: PLW1509
            rc, tree_rss, timed_out = wait_child(proc, a["timeout"])
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        ranks = []
        for r in range(world):
            p = f"{spec['result']}.rank{r}.json"
            if os.path.exists(p):
                with open(p) as f:
                    ranks.append(json.load(f))
    with open(log_path, errors="replace") as f:
        log_text = f.read()
    rec["returncode"] = rc
    prog = log_progress(log_text)
    done = progress_words(prog)
    if timed_out:
        rec.update(status="error", reason=f"timeout after {a['timeout']:.0f} s" + (f": {done}" if done else ""))
        rec.update(prog, peak_host_bytes=tree_rss)
    elif ranks:
        first = ranks[0]
        bad = [r for r in ranks if r["status"] != "ok"]
        worst = bad[0] if bad else first
        rec.update(status=worst["status"], reason=worst["reason"])
        for k in ("step_s", "step_mean_s", "step_times", "gc_ms", "warmup_used", "losses", "loss", "setup_s", "env",
                  "timeline", "dispatch", "phase_ms", "step_traces", "first_step_s", "compile_s", "host_waits",
                  "tasks"):
            if k in first:
                rec[k] = first[k]
        rec["numerics"] = (first.get("env") or {}).get("numerics")
        if first.get("gpus") is not None and not cpu_only:
            rec["gpus"] = first["gpus"]
        gpu_peaks = [r["peak_gpu_bytes"] for r in ranks if r.get("peak_gpu_bytes")]
        rec["peak_gpu_bytes"] = max(gpu_peaks) if gpu_peaks else None
        torch_peaks = [r["peak_torch_bytes"] for r in ranks if r.get("peak_torch_bytes")]
        rec["peak_torch_bytes"] = max(torch_peaks) if torch_peaks else None
        rec["peak_host_bytes"] = sum(r.get("peak_host_bytes") or 0 for r in ranks) or tree_rss
        if rc != 0 and not bad and len(ranks) < world:
            rec.update(status="error", reason=last_error_line(log_text))
    else:  # the child died before writing a result: killed (OOM killer: signal 9) or crashed
        killed = rc == -9 or re.search(r"(exitcode\s*:\s*-9|Signal 9 \(SIGKILL\)|SIGKILL)", log_text)
        reason = signal_reason(-9 if killed else rc) or last_error_line(log_text)
        rec.update(status="oom" if killed else "error", reason=reason + (f" after {done}" if done else ""))
        rec.update(prog, peak_host_bytes=tree_rss)
    if rec["status"] == "ok" and rec.get("step_s"):
        tokens = args.batch * args.seq
        rec["tokens_per_s"] = tokens / rec["step_s"]
        rec["tflops"] = rec["flops_per_token"] * rec["tokens_per_s"] / 1e12
        peak = peaks.get(a["precision"])
        if peak and rec["gpus"]:
            rec["mfu"] = rec["tflops"] / (peak * rec["gpus"])
    return rec


def progress(rec):
    if rec["status"] != "ok":
        return f"{rec['status']}: {rec['reason']} [{rec['wall_s']:.0f} s]"
    mfu = f", MFU {rec['mfu']:.2f}" if rec["mfu"] is not None else ""
    return (f"ok: {rec['tokens_per_s']:,.0f} tok/s, {rec['tflops']:.1f} TFLOP/s{mfu}, step {rec['step_s']:.3f} s, "
            f"GPU {gib(rec['peak_gpu_bytes'])}, host {gib(rec['peak_host_bytes'])}, loss {rec['loss']:.4f} "
            f"[{rec['wall_s']:.0f} s]")


def table(records):
    head = ("| backend | variant | model | config | params | prec | status | tok/s | TFLOP/s | MFU | step s | GPU GiB "
            "| host GiB |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        def f(k, fmt, r=r):
            return format(r[k], fmt) if r.get(k) is not None else "-"
        rows.append(f"| {r['backend']} | {r['variant']} | {r.get('model', 'hf')} | {r['config']} | "
                    f"{fmt_params(r['params'])} | "
                    f"{r['precision']} | "
                    f"{r['status']} | {f('tokens_per_s', ',.0f')} | {f('tflops', '.1f')} | {f('mfu', '.2f')} | "
                    f"{f('step_s', '.3f')} | {(r['peak_gpu_bytes'] or 0) / GiB:.1f} | "
                    f"{(r['peak_host_bytes'] or 0) / GiB:.1f} |")
    return "\n".join(rows)


def model_runs(configs, models=None):
    """[(model, config)] to run: without models each config with its family's default model; with them every model
    with every config of its family. ValueError for a model that fits none of the configs or a config that none of
    the models fits (a Llama config under --model hf, say), naming the families."""
    if not models:
        return [(default_model(c), c) for c in configs]
    runs = [(m, c) for m in models for c in configs if MODEL_FAMILY[m] == family(c)]
    for m in models:
        if not any(mm == m for mm, _ in runs):
            raise ValueError(f"--model {m} builds the {MODEL_FAMILY[m]} family, and none of the configs is of it ("
                             + "; ".join(f"{c}: {family(c)} family, --model {'/'.join(FAMILY_MODELS[family(c)])}"
                                         for c in configs) + ")")
    for c in configs:
        if not any(cc == c for _, cc in runs):
            raise ValueError(f"config {c} is of the {family(c)} family (its models: "
                             f"{', '.join(FAMILY_MODELS[family(c)])}), none of --model {','.join(models)}")
    return runs


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="torch,nntile", help="comma list of backend[:variant] (default torch,nntile)")
    ap.add_argument("--variant", help="comma list of variants for backends given without one")
    ap.add_argument("--config", help="comma list of configs (--list-configs; default: the models' family's, gpt2: xl; "
                    f"capacity: {','.join(CAPACITY_LADDER)})")
    ap.add_argument("--model",
                    help="comma list of models (benchmarks/models.py): hf (Hugging Face GPT2LMHeadModel, its "
                         "default gelu_new), hf-tanh (the same with gelu_pytorch_tanh), nanogpt (examples/nanogpt's "
                         "nanoGPT-shaped model, vocab padded to 50304) for the gpt2 configs; llama "
                         "(LlamaForCausalLM) for the llama configs, qwen2 (Qwen2ForCausalLM) for the qwen2 ones; "
                         "default: each config's family's first (hf, llama, qwen2)")
    ap.add_argument("--precision", default="bf16", help="comma list of bf16, tf32, fp32 (default bf16)")
    ap.add_argument("--mode", default="throughput", choices=["throughput", "capacity"])
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences (default 8)")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="every dropout of the model (GPT-2's attention, residual and embedding ones, Hugging Face's "
                         "default 0.1; nanoGPT's dropout; the Llama family's attention dropout), default 0")
    ap.add_argument("--dropout-on", default="all", choices=["all", "attention"],
                    help="which dropouts --dropout sets: every one (default) or the attention's alone (on its "
                         "probabilities; GPT-2's residual and embedding dropouts and nanoGPT's others stay 0)")
    ap.add_argument("--steps", type=int, default=5,
                    help="timed steps after warm-up; the median is reported (default 5)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps first, at least (default 2); in throughput mode warm-up goes on while a step "
                         "still raises the peak host or GPU memory by more than 1%%, up to --max-warmup steps")
    ap.add_argument("--max-warmup", type=int,
                    help="most warm-up steps while memory still grows (default --warmup + 4; = --warmup: fixed)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="throughput: run every attempt N times, in rounds (each attempt once per round); one process "
                         "differs from the next by up to 5%% on the H200, so the report gives the median and the "
                         "range (default 1)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per attempt, then killed (default 1800)")
    ap.add_argument("--budget", type=float, help="seconds for this whole invocation: attempts are cut to what is "
                    "left and none starts with under 30 s left")
    ap.add_argument("--out", help="results folder (default benchmarks/results/<machine>)")
    ap.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    ap.add_argument("--data-pool", type=int, default=64, help="distinct random sequences the batches draw from")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when there is a GPU")
    ap.add_argument("--host-memory-cap", help="cap each attempt's address space (RLIMIT_AS), e.g. 8GiB: emulates a "
                    "smaller host in CPU-only runs (CUDA needs far more address space than memory)")
    ap.add_argument("--timeline", action="store_true",
                    help="after the timed steps, one more under torch.profiler: the GPU's compute, copies and idle "
                         "time (benchmarks/timeline.py), as <log>.timeline.json and .png beside the attempt's log; "
                         "for nntile one more under a task trace: where the idle time between tasks goes "
                         "(benchmarks/dispatch.py), as <log>.timeline.tasks.json")
    ap.add_argument("--trace-steps", action="store_true",
                    help="nntile: every step under a task trace; each step's brief (span, submission, GPU busy time, "
                         "gaps by stage, the longest gaps and tasks) in the log and the record, every task as "
                         "<log>.steps.tasks.json.gz (slower steps: for finding what one slow step did differently)")
    ap.add_argument("--init-device", default="auto", choices=["auto", "cuda", "cpu", "meta"],
                    help="where the dense model is built before sharding/conversion (auto: GPU if it fits; for "
                    "nntile, meta when its fp32 weights pass 20%% of the GPU: module by module into tiles)")
    g = ap.add_argument_group("nntile")
    g.add_argument("--tile-size", type=int,
                   help="weight tile edge in elements (default: nntile_torch.config.weight_tile, 3 or 4 x width)")
    g.add_argument("--batch-tile-size", type=int,
                   help="rows per activation tile (default: whole sequences; one per tile on CPUs, on GPUs the "
                        "batch split once per GPU)")
    g.add_argument("--ncpus", type=int, help="StarPU CPU workers (default StarPU's)")
    g.add_argument("--ncuda", type=int, help="StarPU CUDA workers (default: every GPU)")
    g.add_argument("--cuda-memory-limit", help="StarPU's share of each GPU, e.g. 120GiB")
    g.add_argument("--host-memory-limit", help="StarPU's share of host RAM, e.g. 100GiB (default: with GPUs, "
                   "the RAM less max(16 GiB, 1/8); on CPUs alone, no limit)")
    g.add_argument("--disk-path", help="folder for a StarPU disk node (made when missing; --disk-limit must fit "
                   "in its free space)")
    g.add_argument("--disk-limit", help="size of the disk node, e.g. 500GiB")
    g.add_argument("--scheduler", help="StarPU scheduler (default dmdas with GPUs, lws on CPUs)")
    g.add_argument("--max-submitted-tasks", type=int,
                   help="submission window: tasks pending before submission waits (default 1000; 0: none)")
    g.add_argument("--offload-fraction", type=float, default=1.0,
                   help="variant offload: share of the weights whose AdamW runs on CPU workers with master weights "
                        "and states in host RAM (default 1.0)")
    g = ap.add_argument_group("deepspeed")
    g.add_argument("--nvme-path", help="folder for the nvme variant's offload")
    g.add_argument("--ds-optimizer", default="auto", choices=["auto", "cpuadam", "torch"],
                   help="DeepSpeedCPUAdam (compiled on first use) or torch.optim.AdamW (auto: cpuadam when "
                        "offloading on a GPU machine, falling back to torch if it cannot be built)")
    g.add_argument("--zero-init", action="store_true",
                   help="build the model under deepspeed.zero.Init (always in capacity mode)")
    ap.add_argument("--list-configs", action="store_true", help="print the configs with their sizes and exit")
    ap.add_argument("--dry-run", action="store_true", help="print the attempts and exit")
    args = ap.parse_args(argv)
    for k in ("batch", "seq", "steps"):
        if getattr(args, k) <= 0:
            ap.error(f"--{k} must be positive (got {getattr(args, k)})")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0 (got {args.warmup})")
    if not 0.0 <= args.dropout < 1.0:
        ap.error(f"--dropout must be in [0, 1) (got {args.dropout})")
    if args.max_warmup is None:
        args.max_warmup = args.warmup + 4
    elif args.max_warmup < args.warmup:
        ap.error(f"--max-warmup must be >= --warmup ({args.warmup}) (got {args.max_warmup})")
    if args.repeat < 1:
        ap.error(f"--repeat must be positive (got {args.repeat})")
    if args.repeat > 1 and args.mode != "throughput":
        ap.error("--repeat is for --mode throughput (a capacity search stops at its first failure)")
    if args.mode == "capacity" and args.warmup + args.steps < 2:
        # the first step allocates the optimizer's state after the backward has freed the activations: only the
        # second holds state, gradients and activations together (plain torch "fitted" 6.7B on the H200 in 1 step)
        ap.error("--mode capacity needs at least 2 steps, warm-up included: only the second holds the optimizer's "
                 "state, the gradients and the activations together")
    try:
        args.pairs = parse_backends(args.backend, args.variant.split(",") if args.variant else None)
    except ValueError as e:
        ap.error(str(e))
    models = [m.strip() for m in args.model.split(",")] if args.model else None
    if models and any(m not in MODELS for m in models):
        ap.error(f"--model takes {', '.join(MODELS)} (got {args.model})")
    if args.config:
        args.configs = [c.strip() for c in args.config.split(",")]
    else:  # the models' families' defaults (gpt2 without --model)
        fams = list(dict.fromkeys(MODEL_FAMILY[m] for m in models)) if models else ["gpt2"]
        args.configs = [c for f in fams for c in ([DEFAULT_CONFIG[f]] if args.mode == "throughput" else LADDERS[f])]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown config(s) {unknown} (known: {', '.join(CONFIGS)})")
    try:
        args.runs = model_runs(args.configs, models)
    except ValueError as e:
        ap.error(str(e))
    args.models = list(dict.fromkeys(m for m, _ in args.runs))
    if args.host_memory_cap:
        from nntile_torch.runtime import parse_bytes
        args.host_memory_cap = parse_bytes(args.host_memory_cap, "--host-memory-cap")
    if args.warmup < 1 and any("compile" in v.split("+") for _, v in args.pairs):
        ap.error("compile variants need --warmup >= 1: the first step compiles (its time is recorded as compile_s)")
    args.precisions = [p.strip() for p in args.precision.split(",")]
    if any(p not in ("bf16", "tf32", "fp32") for p in args.precisions):
        ap.error(f"--precision takes bf16, tf32, fp32 (got {args.precision})")
    args.code_commit = code_commit()
    return args


def main(argv=None):
    started = time.monotonic()
    args = parse_args(argv)
    if args.list_configs:
        for n, s in CONFIGS.items():
            count = param_count(n, args.seq)
            print(f"{n:11s} {s.family:5s} {shape_text(n):62s} {count:>14,d} params ({fmt_params(count)})"
                  f"{' at seq ' + str(args.seq) if s.family == 'gpt2' else ''}  {s.note}")
        return []
    if args.mode == "throughput":
        # rounds: each attempt once per round, so that a slow machine phase does not hit one setting's runs alone
        plan = [{"backend": b, "variant": v, "model": m, "config": c, "precision": p, "mode": "throughput",
                 "round": r}
                for r in range(1, args.repeat + 1) for c in args.configs for p in args.precisions
                for m in args.models if (m, c) in args.runs for b, v in args.pairs]
    else:
        plan = None  # built as the search goes
    if args.dry_run:
        for a in plan or [{"backend": b, "variant": v, "model": m, "config": c, "precision": p} for m in args.models
                          for b, v in args.pairs for p in args.precisions for c in by_size(args.configs, args.seq)
                          if (m, c) in args.runs]:
            print(f"{a['backend']}:{a['variant']} {a['model']} {a['config']} {a['precision']}"
                  + (f" (round {a['round']} of {args.repeat})" if args.repeat > 1 else ""))
        return []
    with tempfile.TemporaryDirectory(prefix="bench_probe_") as tmp:
        info = probe(tmp, args.cpu)
    ngpus = 0 if args.cpu else info["gpus"]
    machine = machine_name(info["gpu"] if ngpus else None)
    args.out = args.out or os.path.join(ROOT, "benchmarks", "results", machine)
    logdir = os.path.join(args.out, "logs")
    os.makedirs(logdir, exist_ok=True)
    peaks = info["peak_tflops"] if ngpus else {}
    where = f"{ngpus} x {info['gpu']}" if ngpus else "CPU only"
    print(f"benchmarks.run: {where}" + (f", torch {info['torch']}" if info["torch"] else "") +
          (", matmul peak " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()) + " TFLOP/s" if peaks else "") +
          f"; batch {args.batch} x seq {args.seq}, {args.warmup} warm-up"
          + (f" (up to {args.max_warmup} while memory grows)" if args.max_warmup > args.warmup
             and args.mode == "throughput" else "") + f" + {args.steps} timed steps; "
          f"results in {args.out}", flush=True)
    if args.steps < 5:
        print(f"note: {args.steps} timed steps (a median over at least 5 is the convention for reported figures)")
    records = []
    series = datetime.datetime.now().isoformat(timespec="seconds")  # the runs of one --repeat, for the report

    def attempt(a, i, n):
        head = f"[{i}/{n}] {a['mode']} {a['backend']}:{a['variant']} {a['model']} {a['config']} " \
               f"({fmt_params(param_count(a['config'], args.seq, a['model']))}) {a['precision']} ..."
        left = args.budget - (time.monotonic() - started) if args.budget is not None else math.inf
        if left < 30:
            print(f"{head} not started: under 30 s of the {args.budget:.0f} s --budget left", flush=True)
            return None
        a["timeout"] = min(args.timeout, left)
        print(head, end=" ", flush=True)
        rec = run_attempt(a, args, machine, peaks, ngpus, logdir)
        if args.repeat > 1:
            rec.update(round=a["round"], rounds=args.repeat, series=series)
        print(progress(rec), flush=True)
        with open(os.path.join(args.out, "results.jsonl"), "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        records.append(rec)
        return rec

    if plan is not None:
        for i, a in enumerate(plan, 1):
            attempt(a, i, len(plan))
    else:
        for m in args.models:
            ladder = by_size([c for c in args.configs if (m, c) in args.runs], args.seq)
            for b, v in args.pairs:
                for p in args.precisions:
                    best = None
                    for i, c in enumerate(ladder, 1):
                        a = {"backend": b, "variant": v, "model": m, "config": c, "precision": p, "mode": "capacity"}
                        rec = attempt(a, i, len(ladder))
                        if rec is None or rec["status"] != "ok":
                            break
                        best = rec
                    print(f"capacity {b}:{v} {'' if m == 'hf' else m + ' '}{p}: "
                          + (f"{best['config']} ({fmt_params(best['params'])})" if best else "none of the configs")
                          + f" completes {args.warmup + args.steps} steps at batch {args.batch} x {args.seq}",
                          flush=True)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
