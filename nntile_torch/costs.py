"""What one module costs a training step, as the memory plan (nntile_torch/accounting.py) adds it up: each module form
describes itself (docs/memory_plan.md, "What the modules say"), the plan sums the descriptions and searches.

A description is a `Costs`, per token of the batch at one precision. It comes, in this order, from the module's own
`plan_costs(precision, seq)` method (nntile_torch.nn's modules, or any module of the user's: a new form brings its
own), or from a describer registered for the module's class (`register_form`: torch.nn.Linear, LayerNorm,
transformers' Conv1D and GPT-2's attention and MLP, registered beside the nntile module that replaces them, so that a
model is planned the same before and after convert()). A module neither describes costs nothing by itself; an
elementwise module (GELU) has no width of its own and is described by the form around it (GPT-2's MLP).
Descriptions are additive: a module's own costs, without its children's (each child describes itself).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Costs:
    """Per token of the batch, at one precision:

    kept: bytes of activations its forward keeps for its backward (what activation checkpointing drops);
    backward: bytes its backward holds at once beside those (the gradients it is making);
    matmul_flops: forward FLOPs in GEMMs (the backward does twice as many, a checkpointed recompute once more);
    attention_flops: forward FLOPs in attention's products (they grow with the sequence);
    checkpoint: bytes a block keeps under checkpointing (its input), for the module that is a whole block;
    matmul_weights: names of its own parameters a matmul reads (they get a bf16 copy in bf16 mode, and may be kept
    as bf16 master weights);
    elementwise: bytes its forward's elementwise tasks read and write (norms, activations, residual adds): the plan's
    share of GPU time besides GEMMs and attention (plan.py: GPT2_BLOCK_ELEMENTWISE)."""
    kept: int = 0
    backward: int = 0
    matmul_flops: int = 0
    attention_flops: int = 0
    checkpoint: int = 0
    matmul_weights: tuple = ()
    elementwise: int = 0

    def __add__(self, other):
        return Costs(self.kept + other.kept, self.backward + other.backward, self.matmul_flops + other.matmul_flops,
                     self.attention_flops + other.attention_flops, self.checkpoint + other.checkpoint,
                     self.matmul_weights + other.matmul_weights, self.elementwise + other.elementwise)


def matmul_input_bytes(precision):
    """Bytes per element of a matmul's input kept for its backward: its bf16 copy in bf16 mode, else float32."""
    return 2 if precision == "bf16" else 4


_FORMS = []  # (matches(module) -> bool, describe(module, precision, seq) -> Costs or None), first match wins


def register_form(matches, describe):
    """Describes the modules `matches(module)` accepts by `describe(module, precision, seq)` (a Costs, or None for
    nothing): for classes one cannot give a plan_costs method (torch's, transformers'). Later registrations are
    asked first."""
    _FORMS.insert(0, (matches, describe))


def describe(module, precision, seq):
    """The module's own Costs at `precision` for sequences of `seq` tokens, or None (nothing of its own)."""
    own = getattr(module, "plan_costs", None)
    if callable(own):
        return own(precision, seq)
    for matches, fn in _FORMS:
        if matches(module):
            return fn(module, precision, seq)
    return None


def residual_block(width):
    """A transformer block's own costs beside its modules': checkpointing keeps its input, its backward the
    gradient of the residual stream (float32, width elements each). The default for a block that does not describe
    itself. Its two residual adds read two float32 streams and write one each (elementwise)."""
    return Costs(backward=4 * width, checkpoint=4 * width, elementwise=2 * 12 * width)


def language_model(width, vocab, precision):
    """What a language model keeps outside its modules, per token: at the front (alive all step) the int64 ids and
    the embeddings' output, the stream into the first block; at the head (alive from the loss to the head's
    backward) the logits, their gradient and its copy for the head's matmul. Returns (front, head)."""
    return Costs(kept=8 + 4 * width), Costs(kept=4 * vocab, backward=4 * vocab + matmul_input_bytes(precision) * vocab)


# A GPT-2 block's elementwise bytes per token and width: two residual adds (24), two layer norms (16), GELU over the
# 4 x width inner features (32). The plan's elementwise rate was fitted per (layer x token x width) on GPT-2 shapes:
# per byte it is that rate over this.
GPT2_BLOCK_ELEMENTWISE = 72
