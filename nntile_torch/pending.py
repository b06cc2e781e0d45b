"""Pending producers (docs/fusion.md, "one pending producer per tensor"): under bf16 training an op whose output a
bf16 matmul may read (LayerNorm, GELU, GELU's backward) records its submission instead of making it. The matmul that
reads the output submits it writing the bf16 tiles the GEMM reads (fuse_bf16: no fp32 output, no cast); anything
else reading the tiles first flushes it (the plain fp32 op, through TileTensor's accessor of its tiles). In training
a Linear's GEMM is pending too: the residual add that reads its output has it write the sum (fuse_residual).

Rules that keep it correct: a producer is submitted at the latest when its first reader's tasks are, so StarPU sees
the same graph with some pairs merged; after a fused use the fp32 values are still owed, and a later reader gets them
from the plain op submitted then; a producer never reads inputs that changed since it was recorded (checked by
the tiles' versions; everything pending is flushed at the end of a converted model's forward and of a backward, at
materialize() and nt.synchronize(), and before an optimizer step)."""
import weakref

import torch

from . import config
from .owners import PENDING


class Producer:
    """One recorded submission: submit(into, first) submits the op writing `into` (its own output tiles, bf16 tiles
    of their shape, or None: scratch, when they died before a side output was read), and its other outputs (a
    LayerNorm's mean and rstd) when first (otherwise scratch). It holds its output weakly (PENDING's values must
    not keep their keys alive)."""
    __slots__ = ("submit", "inputs", "versions", "first", "out", "bf16", "with_residual", "writes_bf16")

    def __init__(self, submit, out, inputs, with_residual=None):
        self.submit, self.inputs, self.first = submit, inputs, True
        self.versions = [t.version for t in inputs]
        self.out, self.bf16 = weakref.ref(out), None  # bf16: the bf16 tiles a fused use had it write (weak)
        # with_residual(into, residual): submits the op writing its output plus `residual` into `into` (a Linear's
        # GEMM reading the residual as its C input: docs/fusion.md, pair 3), or None where the op cannot or has
        # done so once (a second add reads the output, one plain GEMM, instead of running the GEMM again)
        self.with_residual = with_residual
        self.writes_bf16 = with_residual is None  # a GEMM's bias needs fp32 output tiles (fuse_bf16 is not for it)

    def check(self):
        if [t.version for t in self.inputs] != self.versions:
            raise RuntimeError("nntile_torch: a pending producer's inputs were written before it was submitted "
                               "(docs/fusion.md: it must be flushed first); this is a bug in nntile_torch")

    def run(self, into):
        self.check()
        self.submit(into, self.first)
        self.first = False


def candidate(grad_context, fusion="bf16_outputs"):
    """Whether an op records its submission instead of making it: the fusion `fusion` on (config.fusion_enabled;
    "bf16_outputs" for LayerNorm and GELU, "residual" for a Linear's GEMM) and a forward or backward that autograd
    records (training; `grad_context` False for apply_tiled's forward without grad)."""
    return grad_context and config.fusion_enabled(fusion)


def defer(submit, out, side=(), inputs=(), with_residual=None):
    """Records submit (see Producer) as the pending producer of `out` (C++ tiles) and of its side outputs."""
    p = Producer(submit, out, inputs, with_residual)
    for t in (out, *side):
        PENDING[t] = p


def pending(tiles):
    """Whether C++ `tiles` have a pending producer that can write them in bf16 (fuse_bf16: LayerNorm, GELU; a
    Linear's GEMM, whose bias needs fp32 output tiles, cannot)."""
    p = PENDING.get(tiles) if PENDING.data else None
    return p is not None and p.writes_bf16


def _forget(p):
    for t in [t for t, q in PENDING.items() if q is p]:
        del PENDING[t]


def flush(tiles):
    """Submits the pending producer of C++ `tiles` as the plain op (writing them), if any: the hook of
    TileTensor's tiles accessor, before anything reads them."""
    p = PENDING.pop(tiles, None)
    if p is None:
        return
    if p.first:
        _forget(p)  # its output and side outputs are all written now
    p.run(p.out())


def fuse_bf16(tiles, make):
    """bf16 tiles of C++ `tiles`' shape and tiling (new ones from make()) written by the pending producer of `tiles`
    (the fused task), or those it wrote for an earlier fused use still alive (a second bf16 matmul reading the same
    tensor reads the same bf16 tiles); the fp32 values stay owed (flushed if anything reads `tiles` later). The
    producer's side outputs are written now."""
    p = PENDING[tiles]
    done = p.bf16() if p.bf16 is not None else None
    if done is not None:
        return done
    out = make()
    p.bf16 = weakref.ref(out)
    first = p.first
    p.run(out)
    if first:  # its side outputs are written: only `tiles` stay owed
        _forget(p)
        PENDING[tiles] = p
    return out


def fusable_with_residual(tiles):
    """Whether C++ `tiles` have a pending producer that can add a residual to them (fuse_residual)."""
    p = PENDING.get(tiles) if PENDING.data else None
    return p is not None and p.with_residual is not None


def fuse_residual(tiles, residual, make):
    """`tiles` + `residual` (C++ tiles of the same shape and tiling) in new tiles from make(), written by the pending
    producer of `tiles` in the same tasks (a Linear's GEMM reads the residual as its C input: docs/fusion.md, pair
    3; fusable_with_residual says whether it can). The values of `tiles` stay owed (flushed if anything reads them
    later: the GEMM again, without the residual)."""
    p = PENDING[tiles]
    p.check()
    out = make()
    p.with_residual(out, residual)
    p.with_residual = None
    if p.first:  # its side outputs (the GEMM's cast input) are written: only `tiles` stay owed
        p.first = False
        _forget(p)
        PENDING[tiles] = p
    return out


def flush_all():
    """Submits every pending producer as the plain op (the end of a forward or backward, a host wait)."""
    while PENDING:
        flush(next(iter(PENDING)))


def flush_at_backward_end():
    """Queues flush_all for the end of the running backward (called from a Function's backward that deferred).
    Outside autograd's engine (a backward called directly) there is no end to wait for: what is pending is then
    flushed by its reader, the next host wait or the next forward's end."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(flush_all)
    except RuntimeError:
        pass


def at_forward_end(module, args, output):
    """A converted model's forward hook: flush_all (what its outputs hold is read later by anything)."""
    flush_all()
