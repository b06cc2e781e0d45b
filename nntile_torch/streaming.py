"""The memory plan's execution (docs/memory_plan.md): hooks on a converted model's blocks that move the weights of
the blocks kept in host RAM explicitly, ahead of use, and keep submission a few blocks ahead of execution.

At block i of the forward (and at block i of the backward, walking down):
1. throttle: wait until the block `lookahead + 1` behind has been computed (its output, or in the backward the
   gradient it produced, is written), so the tasks in flight, and the buffers StarPU allocates for them, stay
   within a few blocks; a marker of GPU progress, so CPU updates that lag do not hold submission back;
2. the host blocks that block was using are marked won't-use: StarPU evicts their GPU copies first (clean
   copies: the host holds the value, so nothing is written back);
3. the next `lookahead` host blocks' weights (the bf16 copies in bf16 mode) are fetched to the GPU, each once the
   update that writes it has run, into the buffers just released.
On-demand eviction stays the safety net for everything else."""
import functools
import weakref

import torch

from . import _C
from .tensor import TileTensor


def _module(model, path):
    m = model
    for part in path.split(".") if path else []:
        m = getattr(m, part)
    return m


def _first_tile_tensor(value):
    """The first TileTensor in a block's output (a tensor, or a tuple such as Hugging Face's)."""
    if isinstance(value, TileTensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, TileTensor):
                return v
    return None


def _in_backward():
    return torch._C._current_graph_task_id() != -1


class Streamer:
    """The per-block hooks of one plan on one model (install() makes it)."""

    def __init__(self, model, plan):
        self.blocks = list(_module(model, plan.facts.blocks_path)) if plan.facts.blocks_path else []
        self.host = set(plan.host_block_indices)
        self.lookahead = plan.lookahead
        self.bf16 = plan.precision == "bf16"
        self.forward_marks = {}  # block -> weakref to its output's C++ tiles
        self.backward_marks = {}  # block -> weakref to the gradient of its input
        self.nodes = None  # memory nodes the host blocks' weights go to (None: every GPU's)
        self.handles = []
        for i, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_pre_hook(functools.partial(self._pre_forward, i)))
            self.handles.append(block.register_forward_hook(functools.partial(self._post_forward, i)))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # -- what moves --------------------------------------------------------------------------------------------
    def weights(self, i):
        """The tiles the matmuls of block i read: bf16 copies (bf16 mode, made when the update ran) or the weights."""
        out = []
        for p in self.blocks[i].parameters():
            if type(p) is not TileTensor or p.dim() != 2:
                continue
            if self.bf16:
                cache = getattr(p, "_bf16_cache", None)
                if cache is not None and cache[0] == p._tiles.version:
                    out.append(cache[1])
            else:
                out.append(p._tiles)
        return out

    def _stream(self, done, upcoming):
        """Marks block `done`'s streamed weights won't-use and fetches the upcoming host blocks' to every GPU."""
        if done in self.host:
            for t in self.weights(done):
                t.wont_use()
        nodes = _C.cuda_memory_nodes() if self.nodes is None else self.nodes
        for j in upcoming:
            if j in self.host:
                for t in self.weights(j):
                    for node in nodes:
                        t.prefetch(node)

    @staticmethod
    def _wait(marks, i):
        ref = marks.pop(i, None)
        tiles = ref() if ref is not None else None
        if tiles is not None:
            tiles.wait_written()

    # -- the hooks ---------------------------------------------------------------------------------------------
    def _pre_forward(self, i, module, args):
        if _in_backward():  # activation checkpointing recomputes the block inside the backward
            return
        behind = i - self.lookahead - 1
        self._wait(self.forward_marks, behind)
        self._stream(behind, range(i + 1, min(len(self.blocks), i + 1 + self.lookahead)))

    def _post_forward(self, i, module, args, output):
        out = _first_tile_tensor(output)
        if out is None or _in_backward():
            return
        self.forward_marks[i] = weakref.ref(out._tiles)
        if out.requires_grad:
            out.register_hook(functools.partial(self._pre_backward, i))

    def _pre_backward(self, i, grad):
        """Runs when the backward reaches block i (grad: the gradient of its output, made by block i + 1)."""
        if isinstance(grad, TileTensor):
            self.backward_marks[i + 1] = weakref.ref(grad._tiles)  # block i + 1's backward is done once written
        ahead = i + self.lookahead + 2
        self._wait(self.backward_marks, ahead)
        self._stream(ahead, range(i - 1, max(-1, i - 1 - self.lookahead), -1))
        return None


def install(model, plan):
    """Hooks the plan's streaming onto model's blocks (replacing an earlier plan's); returns the Streamer."""
    old = getattr(model, "_nntile_streamer", None)
    if old is not None:
        old.remove()
    streamer = Streamer(model, plan)
    model._nntile_streamer = streamer
    return streamer


def checkpoint_blocks(model, path):
    """Activation checkpointing of each block of a model that has no gradient_checkpointing_enable (non-reentrant
    torch.utils.checkpoint around every block's forward)."""
    from torch.utils.checkpoint import checkpoint
    for block in _module(model, path):
        if getattr(block, "_nntile_checkpointed", False):
            continue
        forward = block.forward

        def run(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
        block.forward = run
        block._nntile_checkpointed = True
