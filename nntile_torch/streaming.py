"""The memory plan's execution (docs/memory_plan.md): hooks on a converted model's blocks that move the weights of
the blocks kept in host RAM explicitly, ahead of use, and keep submission a few blocks ahead of execution.

At block i of the forward (and at block i of the backward, walking down):
1. throttle: wait until the block `lookahead + 1` behind has been computed (its output, or in the backward the
   gradient it produced, is written), so the tasks in flight, and the buffers StarPU allocates for them, stay
   within a few blocks; a marker of GPU progress, so CPU updates that lag do not hold submission back;
2. the host blocks that block was using are marked won't-use: StarPU evicts their GPU copies first (clean
   copies: the host holds the value, so nothing is written back);
3. the next `lookahead` host blocks' weights (the bf16 copies in bf16 mode) are fetched to the GPU, each once the
   update that writes it has run, into the buffers just released;
4. optionally (state_ahead, off by default: measured slower where the GPU is full), in the backward, the master
   weights and moments of a host block updated on the GPU are fetched as the GPU starts that block's backward, so the
   update at its end finds them there instead of fetching them only once it is ready (3.6 GB per 20B block, ~75 ms
   at 48 GB/s, against ~100 ms of that block's backward at batch 16).
5. with the plan's host_checkpoints, in the forward, the input of the block `lookahead + 1` behind (what
   checkpointing keeps of it) is copied to host RAM, and the one before it marked won't-use (its GPU copy is clean
   by then: evicted first, nothing written back); in the backward each block's input is fetched back to the GPU
   `lookahead` blocks ahead of its recompute.
On-demand eviction stays the safety net for everything else."""
import functools
import weakref

import torch

from . import _C
from .owners import module_record
from .param import param_state
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


def _live(ref):
    """What a weakref (or None) points to, if it is still alive."""
    return ref() if ref is not None else None


def _in_backward():
    return torch._C._current_graph_task_id() != -1


class Streamer:
    """The per-block hooks of one plan on one model (install() makes it)."""

    def __init__(self, model, plan):
        self.plan = plan
        self.blocks = list(_module(model, plan.facts.blocks_path)) if plan.facts.blocks_path else []
        self.host = set(plan.host_block_indices)
        self.gpu_updated = set(getattr(plan, "gpu_update_block_indices", ()))
        self.lookahead = plan.lookahead
        # Early fetch of the GPU updates' state (step 4 above): off by default, because where the GPU is full the
        # room for a block's state fetched early is made by evicting live tiles, and the step was slower
        # (docs/measurements.md, "Early state fetch"). 0 turns it on (the harness's variant statefetch).
        self.state_ahead = None
        self._state_fetched = None  # the lowest block whose state this backward has fetched
        self._state_known = set()  # GPU-updated blocks whose state existed when this step's forward began
        self.state_fetches = 0  # tiles fetched ahead of GPU updates (per memory node), for tests and reports
        self.bf16 = plan.precision == "bf16"
        self.forward_marks = {}  # block -> weakref to its output's C++ tiles
        self.backward_marks = {}  # block -> weakref to the gradient of its input
        self.nodes = None  # memory nodes the host blocks' weights go to (None: every GPU's)
        self.host_checkpoints = bool(getattr(plan, "host_checkpoints", False))
        self.host_node = 0  # where the checkpoints go (StarPU's main RAM)
        self.inputs = {}  # block -> weakref to its input's C++ tiles (host_checkpoints)
        self.checkpoint_moves = 0  # block inputs copied to host RAM or fetched back (per memory node), for tests
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
        """The tiles the matmuls of block i read: bf16 copies (bf16 mode, made when the update ran), bf16 master
        weights, or the weights."""
        out = []
        for p in self.blocks[i].parameters():
            if type(p) is not TileTensor or p.dim() != 2:
                continue
            tiles = param_state(p).matmul_tiles(self.bf16)
            if tiles is not None:
                out.append(tiles)
        return out

    def state(self, i):
        """The master weights and moments block i's GPU update reads (AdamW records them at its first update)."""
        out = []
        for p in self.blocks[i].parameters():
            out.extend(param_state(p).update_state())
        return out

    def _fetch_state(self, starting, last=False):
        """Fetches the GPU-updated host blocks' state from the block whose backward the GPU is starting down to
        `state_ahead` blocks below it, each once per backward (at the backward's last hook, `last`, all the rest: no
        later point comes). A fetch, not an ordered prefetch: the update that will write these tiles is submitted
        already, and the value wanted is the one before it."""
        if self.state_ahead is None or not self.gpu_updated:
            return
        starting = min(starting, len(self.blocks) - 1)  # still above the blocks (the head's backward): the last
        top = starting if self._state_fetched is None else min(starting, self._state_fetched - 1)
        low = 0 if last else max(0, starting - self.state_ahead)
        if top < low:
            return
        nodes = _C.cuda_memory_nodes() if self.nodes is None else self.nodes
        for j in range(top, low - 1, -1):
            if j in self._state_known:
                for t in self.state(j):
                    for node in nodes:
                        t.fetch(node)
                        self.state_fetches += 1
        self._state_fetched = low

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

    def _offload_input(self, done):
        """Copies block `done`'s input to host RAM, and marks the one before it won't-use (copied a block ago)."""
        tiles = _live(self.inputs.get(done))
        if tiles is not None:
            tiles.prefetch(self.host_node)
            self.checkpoint_moves += 1
        tiles = _live(self.inputs.get(done - 1))
        if tiles is not None:
            tiles.wont_use()

    def _fetch_inputs(self, blocks):
        """Fetches the inputs of these blocks back to every GPU, ahead of their recompute in the backward."""
        nodes = _C.cuda_memory_nodes() if self.nodes is None else self.nodes
        for j in blocks:
            tiles = _live(self.inputs.pop(j, None))
            if tiles is None:
                continue
            for node in nodes:
                tiles.prefetch(node)
                self.checkpoint_moves += 1

    @staticmethod
    def _wait(marks, i):
        tiles = _live(marks.pop(i, None))
        if tiles is not None:
            tiles.wait_written()

    # -- the hooks ---------------------------------------------------------------------------------------------
    def _pre_forward(self, i, module, args):
        if _in_backward():  # activation checkpointing recomputes the block inside the backward
            return
        if i == 0 and self.state_ahead is not None:  # a new step: its backward fetches the state of every block
            # updated in an earlier step (not the first step's, made by updates submitted in that same backward:
            # StarPU has no value of them to fetch)
            self._state_fetched = None
            self._state_known = {j for j in self.gpu_updated if self.state(j)}
        behind = i - self.lookahead - 1
        self._wait(self.forward_marks, behind)
        self._stream(behind, range(i + 1, min(len(self.blocks), i + 1 + self.lookahead)))
        if self.host_checkpoints:
            if i == 0:
                self.inputs.clear()
            x = _first_tile_tensor(args)
            if x is not None:
                self.inputs[i] = weakref.ref(x.tiles)
            if behind >= 0:
                self._offload_input(behind)

    def _post_forward(self, i, module, args, output):
        out = _first_tile_tensor(output)
        if out is None or _in_backward():
            return
        self.forward_marks[i] = weakref.ref(out.tiles)
        if out.requires_grad:
            out.register_hook(functools.partial(self._pre_backward, i))

    def _pre_backward(self, i, grad):
        """Runs when the backward reaches block i (grad: the gradient of its output, made by block i + 1)."""
        if isinstance(grad, TileTensor):
            self.backward_marks[i + 1] = weakref.ref(grad.tiles)  # block i + 1's backward is done once written
        ahead = i + self.lookahead + 2
        self._wait(self.backward_marks, ahead)
        self._stream(ahead, range(i - 1, max(-1, i - 1 - self.lookahead), -1))
        self._fetch_state(ahead - 1, last=i == 0)  # the GPU has done block `ahead`: it starts the one below
        if self.host_checkpoints:  # this block's input (if not already) and the next `lookahead` ones below
            self._fetch_inputs(range(i, max(-1, i - 1 - self.lookahead), -1))
        return None


def install(model, plan):
    """Hooks the plan's streaming onto model's blocks (replacing an earlier plan's); returns the Streamer."""
    old = streamer(model)
    if old is not None:
        old.remove()
    new = Streamer(model, plan)
    module_record(model).streamer = new  # as long as the model lives, read through streamer() only
    return new


def streamer(model):
    """The Streamer that a memory plan installed on `model` (nt.convert(..., plan=) does), or None: its settings
    (nodes, state_ahead) and counters (state_fetches, checkpoint_moves), and its plan (`.plan`)."""
    record = module_record(model, create=False)
    return record.streamer if record is not None else None


def checkpoint_blocks(model, path):
    """Activation checkpointing of each block of a model that has no gradient_checkpointing_enable (non-reentrant
    torch.utils.checkpoint around every block's forward)."""
    from torch.utils.checkpoint import checkpoint
    for block in _module(model, path):
        record = module_record(block)
        if record.checkpointed:
            continue
        forward = block.forward

        def run(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
        block.forward = run
        record.checkpointed = True
