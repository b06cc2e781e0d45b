"""Trains a Llama-shaped Hugging Face model (transformers' LlamaForCausalLM, from a config: no download) with
nntile_torch: built on the meta device (the dense model never exists whole), planned (nt.plan: where the weights,
moments and activations go), converted by the plan (plan.apply) and trained with the plan's AdamW on the training
CLI's corpus (Python's standard library source as bytes, nntile_torch.data).

    python examples/llama/train.py --steps 5                 # tiny: 2 layers x 96, 4 heads / 2 kv heads
    python examples/llama/train.py --layers 4 --width 256 --heads 8 --kv-heads 2 --intermediate 688

RMSNorms, the seven linear layers of each block, the rotary embedding, grouped-query attention, the gated MLP's
silu * up, the untied LM head and the loss run as tile tasks; an op that ran as torch code on materialized tiles
would be named at the end of the run.
"""
import argparse
import time
import warnings

import torch
import transformers

import nntile_torch as nt
from nntile_torch.data import Batches, stdlib_corpus

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=5)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--width", type=int, default=96)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--intermediate", type=int, default=160, help="the gated MLP's inner width")
p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.manual_seed(args.seed)
config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.width, intermediate_size=args.intermediate,
                                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                  num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
                                  tie_word_embeddings=False, use_cache=False)
config._attn_implementation = "sdpa"
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config)
# The rotary module's inverse frequencies are a buffer computed from the config, not a parameter convert()
# materializes: build that module on a real device.
model.model.rotary_emb = type(model.model.rotary_emb)(config=config)

plan = nt.plan(model, args.batch, args.seq, args.precision)
print(plan, flush=True)
# An op without a tile version would warn once as it runs; the run ends by naming any instead.
warnings.filterwarnings("ignore", message=r"nntile_torch: .*ran as dense torch code")
model = plan.apply(model, init=model._init_weights)
model.train()
opt = plan.optimizer(model.parameters(), lr=args.lr)
batches = Batches(stdlib_corpus(), args.batch, args.seq, args.seed)
params = sum(p.numel() for p in model.parameters())
print(f"Llama {args.layers} x {args.width} ({params / 1e6:.2f}M parameters), precision {args.precision}")
for step in range(args.steps):
    t0 = time.perf_counter()
    ids = batches(step)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step}: loss {loss.item():.4f} ({time.perf_counter() - t0:.2f} s)", flush=True)
ops = sorted({op for _, op in nt.convert_report(model).dense_ops})
print(f"torch ops run on materialized tiles: {', '.join(ops) or 'none'}")
