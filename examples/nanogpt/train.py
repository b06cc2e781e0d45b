"""Trains the GPT of model.py on bytes of text, in the shape of nanoGPT's train.py (one process): a config of
globals that `--key=value` arguments override, get_batch, the model and configure_optimizers, cosine learning
rate with warm-up, an eval every eval_interval steps, gradient clipping. nntile_torch adds one line:
`model = nt.convert(model)`.

    python train.py --max_iters=200 --device=cuda

The corpus is a text file read as bytes (vocab 256; default: Python's own os.py), split 90/10 into train/val.
"""
import ast
import math
import os
import sys
import time

import numpy as np
import torch

import nntile_torch as nt
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# config (the defaults, overridden by --key=value)
out_dir = "out"
eval_interval = 50
log_interval = 10
eval_iters = 10
eval_only = False
always_save_checkpoint = False
data_path = os.__file__
batch_size = 8
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = True
learning_rate = 1e-3
max_iters = 200
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0.0: no clipping
decay_lr = True
warmup_iters = 20
lr_decay_iters = 200
min_lr = 1e-4
device = "cuda" if torch.cuda.is_available() else "cpu"
seed = 1337
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
for arg in sys.argv[1:]:  # --key=value, as nanoGPT's configurator
    key, _, value = arg.lstrip("-").partition("=")
    if key not in config_keys:
        raise SystemExit(f"unknown config key {key!r}")
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass  # a string
    print(f"overriding {key} = {value!r}")
    globals()[key] = value
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

torch.manual_seed(seed)
device_type = "cuda" if "cuda" in device else "cpu"
with open(data_path, "rb") as f:
    data = np.frombuffer(f.read(), dtype=np.uint8)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=256, dropout=dropout)
model = GPT(GPTConfig(**model_args))
model.to(device)
model = nt.convert(model)  # the one line nntile_torch adds
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:  # linear warm-up
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # from 1 to 0
    return min_lr + coeff * (learning_rate - min_lr)


X, Y = get_batch("train")
t0 = time.time()
iter_num = 0
best_val_loss = 1e9
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                os.makedirs(out_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                            "config": config}, os.path.join(out_dir, "ckpt.pt"))
    if iter_num == 0 and eval_only:
        break
    logits, loss = model(X, Y)
    X, Y = get_batch("train")  # the next batch while this step runs
    loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms")
    iter_num += 1
    if iter_num > max_iters:
        break
