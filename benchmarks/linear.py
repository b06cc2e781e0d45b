"""A stack of nntile_torch.nn.Linear layers beside the same torch.nn.Linear stack: forward + backward time,
TFLOP/s (6 * rows * width^2 per layer and step) and their ratio, in one run.

    python -m benchmarks.linear --layers 8 --width 8192 --rows 8192 --precision bf16 --tile 4096

torch runs under autocast (bf16) or with tf32 allowed, to match --precision. Median of --reps steps.
"""
import argparse
import json

import torch

import nntile_torch as nt
from benchmarks.common import median_time



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=4096)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--ncpus", type=int, default=0, help="StarPU CPU workers beside the GPUs (default 0)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and nt._C.built_with_cuda
    dev = "cuda" if cuda else "cpu"
    nt.init(ncpus=args.ncpus if cuda else None)
    L, W, R = args.layers, args.width, args.rows
    ours = torch.nn.Sequential(*[nt.nn.Linear(W, W, bias=args.bias, device=dev, tile_size=args.tile, batch_tile_size=args.tile,
                                              precision=args.precision) for _ in range(L)])
    ref = torch.nn.Sequential(*[torch.nn.Linear(W, W, bias=args.bias, device=dev) for _ in range(L)])
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(R, W, device=dev)
    gy = torch.randn(R, W, device=dev)
    sync_t = torch.cuda.synchronize if cuda else (lambda: None)

    def step_ours():
        ours(x).backward(gy)

    def step_ref():
        if args.precision == "bf16":
            with torch.autocast(dev, dtype=torch.bfloat16):
                y = ref(x)
        else:
            y = ref(x)
        y.backward(gy)

    flops = 6.0 * R * W * W * L
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    t_ref = median_time(step_ref, args.warmup, args.reps, sync_t)
    t_ours = median_time(step_ours, args.warmup, args.reps, nt.synchronize)
    res = {"layers": L, "width": W, "rows": R, "tile": args.tile, "bias": args.bias, "precision": args.precision,
           "nntile_s": t_ours, "torch_s": t_ref, "nntile_tflops": flops / t_ours / 1e12,
           "torch_tflops": flops / t_ref / 1e12, "ratio": t_ref / t_ours, "info_workers": nt.info()["workers"],
           "gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__}
    print(f"linear stack {L}x{W}, rows {R}, {args.precision}, tile {args.tile}, bias {args.bias}: nntile {t_ours * 1e3:.1f} ms "
          f"({res['nntile_tflops']:.0f} TFLOP/s), torch {t_ref * 1e3:.1f} ms ({res['torch_tflops']:.0f} TFLOP/s), "
          f"speed ratio {res['ratio']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
