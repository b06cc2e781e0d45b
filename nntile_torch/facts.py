"""What the memory plan (nntile_torch/plan.py) reads of a model: every parameter with its block and whether a matmul
reads it, the blocks, the widths, and what the modules say they cost (nntile_torch/costs.py) summed per block, before
the blocks and after them; from those, the activation bytes at the step's peak."""
import dataclasses

import torch
from torch import nn

from .costs import Costs, describe, language_model, residual_block


@dataclasses.dataclass
class ParamInfo:
    name: str
    numel: int
    block: int  # index of the block it belongs to, -1 for the rest (embeddings, final norm)
    matmul: bool  # read by a matmul (gets a bf16 copy in bf16 mode)


@dataclasses.dataclass
class ModelFacts:
    params: list
    n_layer: int
    width: int
    vocab: int
    inner: int
    blocks_path: str  # attribute path of the blocks' ModuleList, e.g. "transformer.h"
    # the modules that may describe themselves (nntile_torch/costs.py), by where they run: ("front" | "head" | block
    # index, module); the blocks themselves among them
    modules: list = dataclasses.field(default_factory=list, repr=False)

    @property
    def n_params(self):
        return sum(p.numel for p in self.params)

    def block_params(self, b):
        return [p for p in self.params if p.block == b]

    def sums(self):
        """(elements, matmul elements) per block, and of the parameters outside blocks: what every placement's
        arithmetic adds up (computed once: the plan weighs thousands of placements)."""
        cached = getattr(self, "_sums", None)
        if cached is None:
            blocks = [[0, 0] for _ in range(self.n_layer)]
            rest = [0, 0]
            for p in self.params:
                acc = blocks[p.block] if 0 <= p.block < self.n_layer else rest
                acc[0] += p.numel
                acc[1] += p.numel if p.matmul else 0
            tails = [(0, 0)]  # tails[k]: the sums over the last k blocks
            for b in reversed(blocks):
                tails.append((tails[-1][0] + b[0], tails[-1][1] + b[1]))
            cached = self._sums = ([tuple(b) for b in blocks], tuple(rest), tails)
        return cached

    def costs(self, precision, seq):
        """The modules' descriptions (costs.describe) summed by where they run, per token: a StepCosts. Computed once
        per (precision, seq): the plan weighs thousands of placements."""
        cache = self.__dict__.setdefault("_costs", {})
        if (precision, seq) not in cache:
            if not self.modules and self.__dict__.get("_settled"):
                raise ValueError(f"these facts were settled for sequences of {self._settled} tokens (got {seq})")
            cache[precision, seq] = step_costs(self, precision, seq)
        return cache[precision, seq]

    def settle(self, seq):
        """Sums the descriptions for every precision at `seq` and lets go of the modules (a plan must not keep the
        model it was made for alive: convert() replaces its modules, whose dense weights would stay)."""
        from .config import PRECISIONS
        for precision in PRECISIONS:
            self.costs(precision, seq)
        self.modules = []
        self._settled = seq


@dataclasses.dataclass
class StepCosts:
    """What the model's modules say they cost, summed, per token (costs.Costs for the fields)."""
    blocks: list  # one Costs per block: its modules' and its own (the residual stream, its checkpoint)
    front: Costs  # before the blocks and alive all step: the ids, the embeddings' output
    head: Costs  # after the blocks: the final norm, the head, the logits (alive from the loss to the head's backward)

    @property
    def matmul_flops(self):
        return sum(b.matmul_flops for b in self.blocks) + self.front.matmul_flops + self.head.matmul_flops

    @property
    def attention_flops(self):
        return sum(b.attention_flops for b in self.blocks) + self.front.attention_flops + self.head.attention_flops


def step_costs(facts, precision, seq):
    """Sums the descriptions of facts.modules: per block, and outside the blocks before them (front) and after
    them (head), with what a language model keeps outside its modules (costs.language_model: ids, logits). A block
    that does not describe itself is a residual block over the model's width (costs.residual_block)."""
    blocks = [Costs() for _ in range(facts.n_layer)]
    described_blocks = set()
    front, head = language_model(facts.width, facts.vocab, precision)
    for where, m, is_block in facts.modules:
        c = describe(m, precision, seq)
        if is_block:
            described_blocks.add(where)
        if c is None:
            continue
        if where == "front":
            front = front + c
        elif where == "head":
            head = head + c
        else:
            blocks[where] = blocks[where] + c
    for b in range(facts.n_layer):
        if b not in described_blocks:
            blocks[b] = blocks[b] + residual_block(facts.width)
    return StepCosts(blocks, front, head)


def _find_blocks(model):
    """The largest nn.ModuleList of at least two modules of one class: the transformer's blocks."""
    best = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            if best is None or len(m) > len(best[1]):
                best = (name, m)
    return best


def model_facts(model):
    """What the plan needs of a model: every parameter (ties counted once) with its block and whether a matmul reads
    it (the modules holding it say: costs.Costs.matmul_weights), the modules by where they run, and the widths."""
    found = _find_blocks(model)
    path, blocks = found if found else ("", [])
    read_by_matmul = set()  # id(param)
    modules, past_blocks = [], False
    for mname, m in model.named_modules():  # each module once, in the order they were registered
        if path and (mname == path or mname.startswith(path + ".")):
            if mname != path:
                rest = mname[len(path) + 1:]
                modules.append((int(rest.split(".", 1)[0]), m, "." not in rest))
            past_blocks = True
        else:
            modules.append(("head" if past_blocks else "front", m, False))
        own = describe(m, "fp32", 1)
        for pname in (own.matmul_weights if own is not None else ()):
            p = getattr(m, pname, None)
            if isinstance(p, torch.Tensor) and p.dim() == 2:
                read_by_matmul.add(id(p))
    params = []
    for name, p in model.named_parameters():
        block = -1
        if path and name.startswith(path + "."):
            block = int(name[len(path) + 1:].split(".", 1)[0])
        params.append(ParamInfo(name, p.numel(), block, id(p) in read_by_matmul))
    cfg = getattr(model, "config", None)
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding) or type(m).__name__ == "Embedding"]
    width = getattr(cfg, "n_embd", None) or getattr(cfg, "hidden_size", None)
    vocab = getattr(cfg, "vocab_size", None)
    if embeddings:
        largest = max(embeddings, key=lambda e: e.weight.numel())
        width = width or largest.weight.shape[1]
        vocab = vocab or largest.weight.shape[0]
    if not width:  # no embedding, no config: the widest matmul input of a block
        mats = [p for p in model.parameters() if p.dim() == 2]
        width = min(min(p.shape) for p in mats) if mats else 1
    # GPT-2 names its MLP width n_inner (None: 4 x width), the Llama family intermediate_size
    inner = getattr(cfg, "n_inner", None) or getattr(cfg, "intermediate_size", None) or 4 * width
    return ModelFacts(params, len(blocks), int(width), int(vocab or 0), int(inner), path, modules)


# ---------------------------------------------------------------------------------------------------------------
# Activation bytes per token at the step's peak, from what the modules say they keep (costs.py; GPT-2's: per block
# LayerNorm's input, each matmul's input (bf16 in bf16 mode), qkv and the attention output, GELU's input). The peak
# comes either at the head's backward (logits, their gradient and its bf16 copy beside every block's kept tensors)
# or inside one block's backward (its gradients, and with checkpointing its recomputed tensors), not both: the
# larger of the two counts. How close it comes: docs/measurements.md, "Activation estimate"; the CPU's tests hold it
# within 35% (test_plan.py).

def activation_bytes(facts, batch, seq, precision, checkpointing):
    c = facts.costs(precision, seq)
    # block inputs only, or everything every block keeps
    stored = sum(b.checkpoint for b in c.blocks) if checkpointing else sum(b.kept for b in c.blocks)
    block = max((b.backward + (b.kept if checkpointing else 0) for b in c.blocks), default=0)
    head = c.head.kept + c.head.backward
    return batch * seq * (stored + max(head, block) + c.front.kept)
