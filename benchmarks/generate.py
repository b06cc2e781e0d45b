"""Sampling speed: Hugging Face's generate() on a converted model beside the same model as plain torch, greedy, with
and without the key/value cache, in one run: tokens/s (new tokens of the whole batch per second), the host waits
per token, and whether the tokens agree.

    python -m benchmarks.generate --config xl --batch 8 --prompt 128 --new 64 --precision bf16

The weights are random (the harness's configs, benchmarks/configs.py): greedy tokens of an untrained model are a
fair workload, and in fp32 they must equal torch's. bf16: torch under autocast, nntile's matmuls in bf16
(convert(precision="bf16")); tokens may then part where two logits are within bf16 rounding, and the fraction
that agrees is reported. One generate() of --new tokens warms each side up first.
"""
import argparse
import copy
import json
import time

import torch

import nntile_torch as nt
from benchmarks import models


def timed_generate(net, ids, new, cache, autocast, sync):
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=cache, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        net.generate(ids, **kw)  # warm-up: kernels, caches, the runtime's models
        sync()
        t0 = time.perf_counter()
        out = net.generate(ids, **kw)
        sync()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="xl", help="a harness config (python -m benchmarks.run --list-configs)")
    ap.add_argument("--model", default=None, help="model family (default: the config's; hf, hf-tanh, llama, qwen2)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--cache", default="on,off", help="comma list: on (the key/value cache), off")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from benchmarks.configs import default_model
    model = args.model or default_model(args.config)
    cuda = torch.cuda.is_available() and nt._C.built_with_cuda
    dev = "cuda" if cuda else "cpu"
    nt.init()
    torch.manual_seed(0)
    with torch.device(dev):
        ref = models.build(model, args.config, args.prompt + args.new).eval()
    ref.generation_config.pad_token_id = 0
    ours = nt.convert(copy.deepcopy(ref), precision=args.precision).eval()
    ids = torch.randint(1, ref.config.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(dev)
    bf16 = args.precision == "bf16"
    sync_torch = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for cache in args.cache.split(","):
        on = cache == "on"
        ref_out, t_ref = timed_generate(ref, ids, args.new, on, bf16, sync_torch)
        waits0 = nt.stats()["blocking_waits"]
        our_out, t_ours = timed_generate(ours, ids, args.new, on, False, nt.synchronize)
        waits = (nt.stats()["blocking_waits"] - waits0) / 2  # two generate() calls: the warm-up and the timed one
        agree = (our_out[:, args.prompt:].cpu() == ref_out[:, args.prompt:].cpu()).float().mean().item()
        tokens = args.batch * args.new
        rows.append({"config": args.config, "model": model, "precision": args.precision, "batch": args.batch,
                     "prompt": args.prompt, "new": args.new, "cache": on, "torch_tokens_s": tokens / t_ref,
                     "nntile_tokens_s": tokens / t_ours, "ratio": t_ref / t_ours,
                     "host_waits_per_token": waits / args.new, "tokens_agree": agree})
        r = rows[-1]
        print(f"{args.config} {model} {args.precision} batch {args.batch}, prompt {args.prompt}, {args.new} new, cache "
              f"{cache}: torch {r['torch_tokens_s']:,.0f} tok/s, nntile {r['nntile_tokens_s']:,.0f} tok/s "
              f"({r['ratio']:.2f}x), {r['host_waits_per_token']:.1f} waits/token, tokens agree {agree:.1%}",
              flush=True)
    res = {"rows": rows, "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "nntile_info": {k: v for k, v in nt.info().items() if k in ("workers", "scheduler")}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    nt.shutdown()


if __name__ == "__main__":
    main()
