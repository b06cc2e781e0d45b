"""How long a converted GPT-2 takes per generated token when its kernels cost nothing: what the submitting thread
does per decoding step (Hugging Face's generate() with the key/value cache in tiles, greedy).

A deep, narrow GPT-2 (by default 48 layers as GPT-2 XL, width 64) makes every kernel trivial, so the time per token
is Python, Hugging Face's code, nntile's modules and StarPU's submission: on a GPU a decoding step waits for exactly
that (benchmarks/results/h100/generate_v1). Timed as the difference between a long and a short generation (prompt
and cache set-up cancel out), each the fastest of three, medians over rounds. Beside it the unconverted model in
torch eager on the same prompt: on a CPU that includes its kernels (an upper bound on its overhead), on a GPU its
kernels run asynchronously.

    python -m benchmarks.decode_submission --layers 48 --batch 8 --new 32 --out decode.json
"""
import argparse
import copy
import json
import platform
import statistics
import time

import torch

import nntile_torch as nt


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48, help="GPT-2 blocks (default 48, as GPT-2 XL)")
    ap.add_argument("--width", type=int, default=64, help="hidden size (default 64: trivial kernels)")
    ap.add_argument("--batch", type=int, default=8, help="sequences generated together (default 8)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument("--new", type=int, default=32, help="tokens timed per round (default 32)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported (default 3)")
    ap.add_argument("--out", help="JSON file for the figures")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.width < 4 or args.width % 4 or args.new < 1 or args.rounds < 1 or args.prompt < 1:
        ap.error("--layers >= 1, a --width that is a multiple of 4, --prompt, --new and --rounds >= 1 are needed")
    return args


def per_token(model, ids, new, tries=3):
    """(Seconds, tasks submitted) per generated token: a generation of new + 2 tokens against one of 2, each the
    fastest of `tries` (noise only adds time: a single pair of a few tokens once came out negative on a loaded CPU)."""
    def timed(n):
        runs = []
        for _ in range(tries):
            t, tasks = time.perf_counter(), nt.stats()["tasks_submitted"]
            model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids))
            runs.append((time.perf_counter() - t, nt.stats()["tasks_submitted"] - tasks))
        return min(s for s, _ in runs), runs[-1][1]
    (long_s, long_tasks), (short_s, short_tasks) = timed(new + 2), timed(2)
    return (long_s - short_s) / new, (long_tasks - short_tasks) / new


def main(argv=None):
    args = parse_args(argv)
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=4, vocab_size=97,
                                  n_positions=args.prompt + args.new + 8, bos_token_id=0, eos_token_id=None,
                                  pad_token_id=0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    ours = nt.convert(copy.deepcopy(ref)).eval()
    ids = torch.randint(1, cfg.vocab_size, (args.batch, args.prompt))
    with torch.no_grad():
        per_token(ours, ids, 2, tries=1)  # warm-up: first-call caches
        per_token(ref, ids, 2, tries=1)
        ours_s, tasks = zip(*(per_token(ours, ids, args.new) for _ in range(args.rounds)))
        ref_s = [per_token(ref, ids, args.new)[0] for _ in range(args.rounds)]
    tasks = round(statistics.median(tasks))
    res = dict(layers=args.layers, width=args.width, batch=args.batch, prompt=args.prompt, new=args.new,
               ms_per_token=1e3 * statistics.median(ours_s), torch_ms_per_token=1e3 * statistics.median(ref_s),
               tasks_per_token=tasks, machine=platform.processor() or platform.machine(),
               device=str(next(ours.parameters()).device), workers=nt.info()["workers"])
    print(f"{args.layers} layers x width {args.width}, batch {args.batch}: {res['ms_per_token']:.1f} ms per token "
          f"({tasks} tasks), torch eager {res['torch_ms_per_token']:.1f} ms (medians of {args.rounds})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
