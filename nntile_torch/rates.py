"""The rates the memory plan predicts step times with (nntile_torch/plan.py): measured on this machine once and
cached, or constants fitted on one H200 (the plan's printout says which). A plan on a GPU model other than the H200
with nothing cached measures it first (a few seconds, once).

    python -m nntile_torch.rates          # measures on GPU 0 again and caches; prints the rates

The cache is $STARPU_HOME/.nntile_torch/rates.json when STARPU_HOME is set (beside StarPU's own calibration), else
$XDG_CACHE_HOME/nntile_torch/rates.json (~/.cache by default), one entry per GPU model. NNTILE_PLAN_RATES=defaults
makes the plan ignore it (the tests pin the H200's predictions so).
"""
import dataclasses
import datetime
import json
import os
import sys
import time
import warnings

H200_DEFAULTS = "H200 defaults"


@dataclasses.dataclass
class Rates:
    """What the step-time prediction assumes of the machine (defaults: one H200, measured in
    benchmarks/results/h200; docs/memory_plan.md says how they were fitted)."""
    # Fitted to whole steps on one H200 (docs/measurements.md, "The plan's default rates").
    gemm_flops: float = 680e12  # bf16 GEMM rate on large tiles; tf32 and fp32 below
    gemm_flops_tf32: float = 340e12
    gemm_flops_fp32: float = 50e12
    per_layer_token_width_s: float = 2.3e-10  # everything else on the GPU per (layer x token x width)
    pcie_bytes_s: float = 48e9  # each direction, pinned, 4 MiB+ transfers
    host_update_bytes_s: float = 40e9  # CPU AdamW + bf16 copy of the host blocks, 14 CPU workers
    hbm_bytes_s: float = 3e12  # GPU memory, for the GPU's AdamW updates
    # What the GPU updates of host blocks cost beyond their overlapped transfers, per host parameter
    gpu_update_exposed_s: float = 0.5e-10
    disk_bytes_s: float = 2e9
    source: str = H200_DEFAULTS  # where they come from, as print(plan) says it

    def gemm(self, precision):
        return {"bf16": self.gemm_flops, "tf32": self.gemm_flops_tf32}.get(precision, self.gemm_flops_fp32)


# What a measurement replaces; the others (fitted on whole steps: the per-layer term, the GPU updates' exposed time,
# the disk) stay the H200's.
MEASURED = ("gemm_flops", "gemm_flops_tf32", "gemm_flops_fp32", "pcie_bytes_s", "host_update_bytes_s", "hbm_bytes_s")


def cpu_rates():
    """Rough rates for a plan without a GPU tier (everything in host RAM): per core."""
    cores = os.cpu_count() or 1
    return Rates(gemm_flops=cores * 30e9, gemm_flops_tf32=cores * 30e9, gemm_flops_fp32=cores * 30e9,
                 per_layer_token_width_s=2e-8 / cores, pcie_bytes_s=1e12, host_update_bytes_s=cores * 2e9,
                 hbm_bytes_s=cores * 2e9, gpu_update_exposed_s=0.0, source=f"CPU estimates ({cores} cores)")


def cache_path():
    home = os.environ.get("STARPU_HOME")
    if home:
        return os.path.join(home, ".nntile_torch", "rates.json")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nntile_torch", "rates.json")


def _read():
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save(device, measured, date=None):
    """Caches `measured` ({field of MEASURED: value}) for the GPU model `device` (torch.cuda.get_device_name)."""
    unknown = set(measured) - set(MEASURED)
    if unknown:
        raise ValueError(f"not a measured rate: {sorted(unknown)} (measured: {MEASURED})")
    data = _read()
    data[device] = {"date": date or datetime.date.today().isoformat(), "rates": dict(measured)}
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # another process reading it sees the old file or the new one


def load(device):
    """The rates measured for the GPU model `device`, the H200's for what was not measured; None without any."""
    entry = _read().get(device)
    if not isinstance(entry, dict) or not isinstance(entry.get("rates"), dict):
        return None
    measured = {k: float(v) for k, v in entry["rates"].items() if k in MEASURED and float(v) > 0}
    if not measured:
        return None
    return Rates(**measured, source=f"measured on {device} {entry.get('date', '?')}")


def _device_name():
    import torch
    from . import _C
    if not (_C.built_with_cuda and torch.cuda.is_available()):
        return None
    return torch.cuda.get_device_name(0)


def machine_rates():
    """The plan's rates with a GPU tier: this GPU model's measured ones when cached; on a GPU model other than the
    H200 (whose defaults these are) with nothing cached, measured now (a few seconds, once: cached for the next
    plans); NNTILE_PLAN_RATES=defaults: the H200's."""
    if os.environ.get("NNTILE_PLAN_RATES", "").lower() == "defaults":
        return Rates()
    device = _device_name()
    if device is None:
        return Rates()
    measured = load(device)
    if measured is None and "H200" not in device:
        print(f"nntile_torch: measuring {device}'s rates for the memory plan (once; cached in {cache_path()})",
              file=sys.stderr)
        try:
            save(device, measure())
        except (RuntimeError, OSError) as e:  # out of GPU memory, a read-only cache: the defaults, said so
            warnings.warn(f"nntile_torch: could not measure {device}'s rates ({e}); the plan uses the H200's")
            return Rates()
        measured = load(device)
    return measured or Rates()


def _median_s(fn, repeats):
    import torch
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def measure(tile=(8192, 4096, 4096), copy_bytes=256 * 2**20, adamw_numel=2**25, repeats=5):
    """Measures on GPU 0: the GEMM rate at a tile's shape (m x k by k x n: rows of activations, a weight tile) in
    bf16, tf32 and fp32; pinned host <-> GPU copies (the slower direction) and GPU memory; the CPU's AdamW (torch's
    fused CPU AdamW, bytes touched as the plan counts them: 34 per fp32-state parameter). Returns {field: value}."""
    import torch
    if _device_name() is None:
        raise RuntimeError("nntile_torch.rates.measure needs a CUDA GPU (the plan's CPU-only rates are estimates)")
    dev = torch.device("cuda", 0)
    m, k, n = tile
    out = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for field, dtype, allow in (("gemm_flops", torch.bfloat16, False), ("gemm_flops_tf32", torch.float32, True),
                                    ("gemm_flops_fp32", torch.float32, False)):
            torch.backends.cuda.matmul.allow_tf32 = allow
            a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
            c = torch.empty(m, n, device=dev, dtype=dtype)
            torch.matmul(a, b, out=c)  # warm-up (cuBLAS's handle and heuristics)
            out[field] = 2 * m * k * n / _median_s(lambda: torch.matmul(a, b, out=c), repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    host = torch.empty(copy_bytes, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
    gpu2 = torch.empty_like(gpu)
    gpu.copy_(host, non_blocking=True)
    to_gpu = _median_s(lambda: gpu.copy_(host, non_blocking=True), repeats)
    to_host = _median_s(lambda: host.copy_(gpu, non_blocking=True), repeats)
    out["pcie_bytes_s"] = copy_bytes / max(to_gpu, to_host)
    out["hbm_bytes_s"] = 2 * copy_bytes / _median_s(lambda: gpu2.copy_(gpu), repeats)  # read and write
    p = torch.zeros(adamw_numel)
    p.grad = torch.randn(adamw_numel)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    opt.step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    out["host_update_bytes_s"] = 34 * adamw_numel / sorted(times)[len(times) // 2]
    return out


def main():
    device = _device_name()
    measured = measure()
    save(device, measured)
    rates = load(device)
    print(f"{rates.source}, cached in {cache_path()}:")
    for field in MEASURED:
        print(f"  {field:<22} {getattr(rates, field):.3e}  (H200 default {getattr(Rates(), field):.3e})")


if __name__ == "__main__":
    main()
