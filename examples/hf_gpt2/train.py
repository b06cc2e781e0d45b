"""Trains a Hugging Face GPT-2 (transformers' GPT2LMHeadModel, from a config: no download) on padded batches of
text lines, as a plain PyTorch loop would: input_ids, an attention_mask for the padding, labels -100 on the pads,
torch.optim.AdamW. nntile_torch adds one line: `model = nt.convert(model)`.

    python train.py --steps=100 --attn=sdpa      # or eager

Lines of a text file (default: Python's os.py) as bytes (vocab 256 + a pad id), right-padded per batch.
"""
import argparse
import os

import torch
import transformers

import nntile_torch as nt

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=100)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--max-len", type=int, default=48)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--width", type=int, default=128)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--dropout", type=float, default=0.1, help="GPT-2's attn_pdrop, resid_pdrop and embd_pdrop")
p.add_argument("--data", default=os.__file__)
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = p.parse_args()

torch.manual_seed(0)
PAD = 256
lines = [ln.encode()[:args.max_len] for ln in open(args.data, encoding="utf-8", errors="replace")]
lines = [ln for ln in lines if len(ln) >= 4]


def batch(step):
    picked = [lines[(step * args.batch + i) * 7919 % len(lines)] for i in range(args.batch)]
    t = max(len(ln) for ln in picked)
    ids = torch.full((args.batch, t), PAD, dtype=torch.long)
    mask = torch.zeros(args.batch, t, dtype=torch.long)
    for i, ln in enumerate(picked):
        ids[i, :len(ln)] = torch.tensor(list(ln))
        mask[i, :len(ln)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids.to(args.device), mask.to(args.device), labels.to(args.device)


# attn_pdrop, resid_pdrop and embd_pdrop are GPT-2's 0.1 by default (tile dropout, inside the attention tasks too).
config = transformers.GPT2Config(vocab_size=PAD + 1, n_positions=args.max_len, n_embd=args.width,
                                 n_layer=args.layers, n_head=args.heads, bos_token_id=0, eos_token_id=0,
                                 pad_token_id=PAD, attn_pdrop=args.dropout, resid_pdrop=args.dropout,
                                 embd_pdrop=args.dropout)
config._attn_implementation = args.attn
model = transformers.GPT2LMHeadModel(config).to(args.device)
model = nt.convert(model)  # the one line nntile_torch adds
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
for step in range(args.steps):
    ids, mask, labels = batch(step)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 10 == 0 or step == args.steps - 1:
        print(f"step {step}: loss {loss.item():.4f}")
