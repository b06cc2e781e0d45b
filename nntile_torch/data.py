"""An offline text corpus for the training CLI: the Python standard library's own source files (present wherever
Python is), read in sorted order as bytes, so every machine with the same Python gets the same corpus. Tokens are
bytes (vocabulary 256)."""
import os
import sysconfig

import torch


def stdlib_corpus(max_bytes=8 << 20):
    """uint8 tensor of up to max_bytes bytes of Python source."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "__pycache__"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            chunks.append(data)
            total += len(data)
            if total >= max_bytes:
                break
        if total >= max_bytes:
            break
    if total < 1 << 16:
        raise RuntimeError(f"found only {total} bytes of Python source under {root}; the corpus needs 64 KiB")
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


class Batches:
    """Batch number `step` is always the same (seeded by seed and step), so a resumed run sees the same data."""

    def __init__(self, data, batch, seq, seed):
        if data.numel() <= seq + 1:
            raise ValueError(f"corpus of {data.numel()} bytes is too short for sequences of {seq}")
        self.data, self.batch, self.seq, self.seed = data, batch, seq, seed

    def __call__(self, step):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.data.numel() - self.seq, (self.batch,), generator=g)
        return torch.stack([self.data[s:s + self.seq] for s in starts.tolist()]).long()
