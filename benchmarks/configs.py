"""Named GPT-2 shapes for the benchmark harness, their exact parameter counts and model FLOPs per token.

Every config is a Hugging Face GPT2Config with tied embeddings (LM head = token embedding) and no dropout;
n_positions is max(1024, seq) (the tiny one: max(32, seq)), so the parameter count depends on seq only past that.
The nanoGPT-shaped family (benchmarks/models.py) has the same shapes with the vocab padded to a multiple of 64.
"""
from dataclasses import dataclass

# nntile variant flags that set things by hand (no memory plan); none: nt.plan() chooses. noplan: nntile's defaults.
MANUAL_NNTILE_FLAGS = {"ckpt", "stepbwd", "bf16state", "offload", "noplan"}

GPT2_VOCAB = 50257

# Environment variables that are not an attempt's settings: where StarPU's perf models live, its output, and the
# StarPU build the extension came from (scripts/h200.sh exports it).
NOT_SETTINGS = ("STARPU_HOME", "STARPU_SILENT", "STARPU_PREFIX")


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    vocab: int = GPT2_VOCAB
    positions: int = 1024  # at least; grown to seq when longer
    note: str = ""


CONFIGS = {
    "tiny": Shape(2, 64, 4, vocab=256, positions=32, note="CPU smoke test"),
    "gpt2": Shape(12, 768, 12, note="GPT-2 small"),
    "medium": Shape(24, 1024, 16, note="GPT-2 medium"),
    "large": Shape(36, 1280, 20, note="GPT-2 large"),
    "xl": Shape(48, 1600, 25, note="GPT-2 XL"),
    "2.7b": Shape(32, 2560, 32, note="GPT-3 2.7B shape"),
    "6.7b": Shape(32, 4096, 32, note="GPT-3 6.7B shape"),
    "13b": Shape(40, 5120, 40, note="GPT-3 13B shape"),
    "20b": Shape(44, 6144, 48, note="GPT-NeoX-20B shape"),
    "30b": Shape(48, 7168, 56, note="30B, standard depth"),
    # The NNTile paper's point: few, very wide layers (it trained GPT-2 shapes up to ~50B on one node, where
    # FSDP stopped near 8B). Width 16384 (head dim 128) gives 13.7B at 4 layers and 26.6B at 8; 4 x 32768 is the
    # paper's ~50B scale.
    "wide-4": Shape(4, 16384, 128, note="NNTile-paper-style wide, shallow"),
    "wide-8": Shape(8, 16384, 128, note="NNTile-paper-style wide, shallow"),
    "wide-4-32k": Shape(4, 32768, 256, note="NNTile-paper-style, ~50B scale"),
}

# The ladder a capacity search climbs when no --config is given (standard depth, increasing size).
CAPACITY_LADDER = ["gpt2", "medium", "large", "xl", "2.7b", "6.7b", "13b", "20b", "30b"]


def positions(name, seq):
    return max(CONFIGS[name].positions, seq)


def model_vocab(name, model="hf"):
    """The vocab of a config in a model family: nanoGPT pads GPT-2's 50257 up to a multiple of 64 (50304)."""
    v = CONFIGS[name].vocab
    return -(-v // 64) * 64 if model == "nanogpt" else v


def param_count(name, seq, model="hf"):
    """Exact parameter count of the model for this config (tied LM head): token and position embeddings,
    per block 12h^2 + 13h (qkv, attention out, MLP in/out with biases, two LayerNorms), final LayerNorm. The same
    for every family (benchmarks/models.py) but the vocab (model_vocab)."""
    s = CONFIGS[name]
    h = s.hidden
    return model_vocab(name, model) * h + positions(name, seq) * h + s.layers * (12 * h * h + 13 * h) + 2 * h


def flops_per_token(params, layers, hidden, seq):
    """Model FLOPs per trained token: 6N for the matmuls with parameters (forward + backward), plus
    12*L*h*seq for attention scores and their weighted sums (forward + backward, no recomputation counted)."""
    return 6 * params + 12 * layers * hidden * seq


def hf_config(name, seq, model="hf"):
    """The transformers.GPT2Config for a named shape (imports transformers); model "hf-tanh": with
    activation_function="gelu_pytorch_tanh" instead of GPT-2's default gelu_new (the same function)."""
    import transformers
    s = CONFIGS[name]
    extra = {"activation_function": "gelu_pytorch_tanh"} if model == "hf-tanh" else {}
    return transformers.GPT2Config(n_layer=s.layers, n_embd=s.hidden, n_head=s.heads, vocab_size=s.vocab,
                                   n_positions=positions(name, seq), resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0, tie_word_embeddings=True, use_cache=False,
                                   bos_token_id=0, eos_token_id=0, **extra)


def by_size(names, seq):
    return sorted(names, key=lambda n: param_count(n, seq))


def fmt_params(n):
    """118.5K, 124.4M, 1.56B."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
