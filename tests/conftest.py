"""Shared fixtures: devices (CUDA ones marked and skipped without a GPU) and the error-ratio check."""
import os
from typing import NamedTuple

import pytest
import torch

import nntile_torch

# The plan's predictions pinned by tests/test_plan.py are the H200 defaults': rates measured on this machine and
# cached (python -m nntile_torch.rates) would change them.
os.environ.setdefault("NNTILE_PLAN_RATES", "defaults")

HAS_CUDA = torch.cuda.is_available() and nntile_torch._C.built_with_cuda

DEVICES = [
    pytest.param("cpu", id="device=cpu"),
    pytest.param("cuda", id="device=cuda", marks=[
        pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="requires CUDA (a GPU and a CUDA build)")]),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def max_err(a, ref):
    return (a.detach().to(torch.float64).cpu() - ref.detach().to(torch.float64).cpu()).abs().max().item()


def assert_close_as_torch(ours, torch_same_precision, ref64, factor=2.0, what=""):
    """ours must be no further from the float64 reference than `factor` times torch in the same precision
    (plus a few float32 ulps of the reference's scale, for results torch happens to get exact)."""
    scale = ref64.detach().abs().max().item() or 1.0
    e_ours = max_err(ours, ref64)
    e_torch = max_err(torch_same_precision, ref64)
    bound = factor * e_torch + 4 * torch.finfo(torch.float32).eps * scale
    assert e_ours <= bound, f"{what}: error {e_ours:.3e} exceeds {bound:.3e} (torch's own error {e_torch:.3e})"


# Four AdamW steps of six 640 x 640 layers (alternately fp32 and bf16) with host RAM limited to 24 MiB and a disk
# node (ON_GPU=1: a GPU limited to 24 MiB), so StarPU really evicts tiles; prints how many files the disk node held
# at most, nntile's homed bytes, and each step's loss (exact, in hex: the loss is a dense tensor, no wait).
_EVICTION_TRAINING = (
    "import os, torch, nntile_torch as nt\n"
    "d = os.environ['DISK']\n"
    "dev = 'cuda' if os.environ.get('ON_GPU') == '1' else 'cpu'\n"
    "if dev == 'cuda':  # the GPU limited to 24 MiB: StarPU evicts to host RAM\n"
    "    nt.init(ncpus=1, ncuda=1, cuda_memory_limit='24MiB', host_memory_limit='512MiB')\n"
    "else:\n"
    "    nt.init(ncpus=2, ncuda=0, host_memory_limit='24MiB', disk_path=d, disk_limit='512MiB', scheduler='eager')\n"
    "torch.manual_seed(0)\n"
    # 9.4 MiB of weights, 19 of moments; bf16 layers keep bf16 weight copies
    "layers = [nt.nn.Linear(640, 640, tile_size=256, precision=('bf16' if i % 2 else 'fp32'), device=dev)\n"
    "          for i in range(6)]\n"
    "opt = nt.optim.AdamW([p for m in layers for p in m.parameters()], lr=1e-2)\n"
    "x = torch.randn(48, 640).to(dev)\n"
    "spilled, losses = 0, []\n"
    "for _ in range(4):\n"
    "    y = x\n"
    "    for m in layers:\n"
    "        y = torch.tanh(m(y))\n"
    "    loss = (y * y).mean()\n"
    "    losses.append(loss.item())\n"
    "    if len(losses) == 1:  # what the disk held when the first loss was computed\n"
    "        first = sum(len(f) for _, _, f in os.walk(d))\n"
    "    loss.backward(); opt.step(); opt.zero_grad()\n"
    "    spilled = max(spilled, sum(len(f) for _, _, f in os.walk(d)))\n"
    "w = torch.cat([v.flatten().cpu() for m in layers for v in m.state_dict().values()])\n"
    "torch.save(w, os.environ['OUTFILE'])\n"
    "print('homed', nt._C.host_homed_bytes(), 'spilled', spilled, 'first', first)\n"
    "print('losses', *[v.hex() for v in losses])\n")
# The order of the parameters in the weights the script saves: per layer, weight (640 x 640) then bias (640).
_EVICTION_PARAMS = [(f"layers[{i}].{name}", n) for i in range(6) for name, n in (("weight", 640 * 640),
                                                                                     ("bias", 640))]


def padded_causal_bias(b, t):
    """(b, t, t) additive float mask of the kept-statistics tests: causal, and the first three keys of sequence 1
    padded away (every query still keeps a key)."""
    m = torch.zeros(b, t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    m[1, :, :3] = float("-inf")
    m[1, :3, 0] = 0.0
    return m


def softmax_logsumexp(q, k, scale, bias=None):
    """The log-sum-exp per head and query that an attention forward keeps, in float64, from q and k (B, H, T, D)
    (float64 already): of the scaled scores plus `bias` ((B, T, T), padded_causal_bias), causal without one."""
    t = q.shape[2]
    if bias is None:
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        bias = torch.zeros(t, t, dtype=torch.double, device=q.device).masked_fill(causal, float("-inf"))
    else:
        bias = bias.to(q.device).double().unsqueeze(1)
    return torch.logsumexp(q @ k.transpose(2, 3) * scale + bias, -1)

def run_python(code, timeout, env=None, what="the script"):
    """Runs `code` in a fresh interpreter (its own StarPU) in a session of its own, with a hard `timeout`: past it
    the whole process group is killed (SIGKILL) and the test fails with the output so far, after at most 10 more
    seconds even if the process does not die (a process stuck in a driver). subprocess.run's timeout waited for
    the killed child without a bound. Returns (returncode, stdout, stderr)."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=err, text=True,
                             env=dict(os.environ, **(env or {})), start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            out.seek(0)
            err.seek(0)
            pytest.fail(f"{what} did not finish in {timeout} s; its output: {out.read()[-1500:]!r} "
                        f"{err.read()[-1500:]!r}")
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read()


class EvictionRun(NamedTuple):
    weights: torch.Tensor  # every parameter after the last step, flattened in _EVICTION_PARAMS' order
    spilled: int  # the most files the disk node held
    homed: int  # nntile's homed bytes
    losses: list  # each step's loss
    spilled_first: int  # files on the disk node when the first loss was computed (0: nothing evicted before it)


def train_under_eviction(tmp_path, tag, timeout=300, **env):
    """Runs _EVICTION_TRAINING in its own process (StarPU reads NNTILE_* settings once) with `env` added; returns
    an EvictionRun. A run past `timeout` seconds fails the test (a hang reported as such, not as the whole session's
    timeout; run_python)."""
    disk = tmp_path / f"disk_{tag}"
    disk.mkdir()
    out = tmp_path / f"w_{tag}.pt"
    rc, stdout, stderr = run_python(_EVICTION_TRAINING, timeout, dict(DISK=str(disk), OUTFILE=str(out), **env),
                                    what=f"the eviction training ({env})")
    assert rc == 0, stderr[-3000:]
    words = stdout.split()
    losses = [float.fromhex(v) for v in stdout.split("losses", 1)[1].splitlines()[0].split()]
    return EvictionRun(torch.load(out), int(words[words.index("spilled") + 1]), int(words[words.index("homed") + 1]),
                       losses, int(words[words.index("first") + 1]))


def assert_same_training_runs(tmp_path, what, a, b, check=None):
    """Runs the eviction training (train_under_eviction, on CPUs with a disk node) once per setting, a and b each
    (tag, env), calls check(tag, run) on each run, and asserts the same training (assert_same_training).

    One difference is forgiven once, with a warning, by running both settings again: losses that differ from the
    first step on while the disk node was still empty in both runs, so before anything was evicted, which is not what
    these tests compare. About one fresh process in 60 to 300 on the 2-core CI machine takes another trajectory from
    its first forward on, the same one every time (first loss 0x1.9f188ep-10 instead of 0x1.9f14fep-10, with homes
    and without, in a process whose disk node was still empty then); its cause is not found (docs/measurements.md,
    'Bit-identical training under eviction'). A difference that appears after the first step, or again in the second
    pair, fails."""
    import warnings

    def pair(suffix):
        runs = []
        for tag, env in (a, b):
            run = train_under_eviction(tmp_path, tag + suffix, **env)
            if check is not None:
                check(tag, run)
            runs.append(run)
        return runs

    x, y = pair("")
    if not torch.equal(x.weights, y.weights) and x.losses[0] != y.losses[0] \
            and x.spilled_first == 0 and y.spilled_first == 0:
        warnings.warn(f"{what}: the first losses differ ({x.losses[0].hex()} against {y.losses[0].hex()}) before "
                      "anything was evicted (docs/measurements.md, 'Bit-identical training under eviction'); both "
                      "settings run again")
        x, y = pair("_again")
    assert_same_training(x, y, what)


def assert_same_training(a, b, what=""):
    """Two EvictionRuns gave finite weights, the same bit for bit. If not, the message says from which step on the
    losses differ (a step's loss comes before its update) and which parameters differ, by how much: the evidence
    the rare inequality under eviction (issue 35) has to leave behind."""
    assert torch.isfinite(a.weights).all(), f"{what}: non-finite weights"
    if torch.equal(a.weights, b.weights):
        return
    steps = [s for s, (x, y) in enumerate(zip(a.losses, b.losses)) if x != y]
    lines = [f"{what}: the weights differ; losses {a.losses} against {b.losses}: "
             + (f"first different at step {steps[0]} (its forward, or an update before it)" if steps
                else "equal at every step (the difference arose in the last update)")]
    start = 0
    for name, n in _EVICTION_PARAMS:
        x, y = a.weights[start:start + n], b.weights[start:start + n]
        start += n
        if not torch.equal(x, y):
            lines.append(f"  {name}: {int((x != y).sum())} of {n} values differ, by at most "
                         f"{(x - y).abs().max().item():.3e} (the first at flat index {int((x != y).nonzero()[0])})")
    raise AssertionError("\n".join(lines))
