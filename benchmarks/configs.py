"""Named model shapes for the benchmark harness, their exact parameter counts and model FLOPs per token.

Each config names its family:
  gpt2   a Hugging Face GPT2Config with tied embeddings (LM head = token embedding), dropout off unless asked;
         n_positions is max(1024, seq) (the tiny one: max(32, seq)), so the parameter count depends on seq only past
         that. The nanoGPT-shaped model (benchmarks/models.py) has the same shapes with the vocab padded to a multiple
         of 64.
  llama  a Hugging Face LlamaConfig: RMSNorm, rotary position embeddings, grouped-query attention (kv_heads key/value
         heads), the gated MLP (gate, up, down: three matrices of hidden x mlp), no biases, an untied LM head.
  qwen2  a Hugging Face Qwen2Config: Llama's shape with biases on the q, k and v projections.
The models of each family (the harness's --model) are MODEL_FAMILY's keys.
"""
from dataclasses import dataclass

# nntile variant flags that set things by hand (no memory plan); none: nt.plan() chooses. noplan: nntile's defaults.
MANUAL_NNTILE_FLAGS = {"ckpt", "stepbwd", "bf16state", "offload", "noplan"}

GPT2_VOCAB = 50257

# torchao's optimizers (pytorch/ao, torchao.optim) as variants of the torch and fsdp2 peers: their own memory savers for
# the optimizer state. ao8bit / ao4bit / aofp8: AdamW8bit / AdamW4bit / AdamWFp8, moments quantized block-wise (block
# 256 / 128 / 256, one fp32 scale per block; a tensor under 4096 elements or not a multiple of the block keeps its
# moments in the parameter's dtype); aobf16sr: bf16 parameters, no fp32 master copy, updated with stochastic
# rounding (_AdamW(bf16_stochastic_round=True), or with one of the above: its bf16_stochastic_round=True);
# aooffload: CPUOffloadOptimizer(torch.optim.AdamW, fused=True), fp32 moments and the step on the CPU (one GPU only).
TORCHAO_FLAGS = {"ao8bit", "ao4bit", "aofp8", "aobf16sr", "aooffload"}
TORCHAO_LOW_BIT = {"ao8bit": "uint8 block-wise (256)", "ao4bit": "4-bit block-wise (128)",
                   "aofp8": "fp8 e4m3 block-wise (256)"}
TORCHAO_INSTALL = ("pip install --no-deps torchao (a wheel for any torch >= 2.x that needs no other package; then "
                   "check python -c 'import torchao.optim' with this torch)")


def peer_numerics(backend, flags):
    """A peer's (torch, fsdp, fsdp2, deepspeed) numerics from its variant flags: the master weights' and the AdamW
    moments' dtypes, and where the optimizer state lives (state_on: gpu, cpu or nvme). The matmul precision is the
    attempt's."""
    flags = set(flags)
    sr = "aobf16sr" in flags
    low = [text for f, text in TORCHAO_LOW_BIT.items() if f in flags]
    if backend == "deepspeed":
        state_on = "nvme" if "nvme" in flags else "gpu" if "gpu" in flags else "cpu"
    else:
        state_on = "cpu" if flags & {"offload", "aooffload"} else "gpu"
    return {"master": "bf16 (stochastic rounding)" if sr else "fp32",
            "moments": low[0] if low else "bf16" if sr else "fp32", "state_on": state_on}

# Environment variables that are not an attempt's settings: where StarPU's perf models live, its output, and the
# StarPU build the extension came from (dev/gpu_machine/h200.sh exports it).
NOT_SETTINGS = ("STARPU_HOME", "STARPU_SILENT", "STARPU_PREFIX")


# The models (--model) of each family, the first its default: what a config of that family builds without --model.
FAMILY_MODELS = {"gpt2": ("hf", "hf-tanh", "nanogpt"), "llama": ("llama",), "qwen2": ("qwen2",)}
MODEL_FAMILY = {m: f for f, ms in FAMILY_MODELS.items() for m in ms}


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    vocab: int = GPT2_VOCAB
    positions: int = 1024  # at least; grown to seq when longer (llama, qwen2: max_position_embeddings, no parameters)
    note: str = ""
    family: str = "gpt2"
    mlp: int = 0  # the MLP's inner width (gpt2: 4 x hidden)
    kv_heads: int = 0  # key/value heads (gpt2: heads)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.hidden // self.heads


def llama_shape(layers, hidden, mlp, heads, kv_heads, vocab, rope_theta, family="llama", positions=8192,
                norm_eps=1e-5, note=""):
    return Shape(layers, hidden, heads, vocab=vocab, positions=positions, note=note, family=family, mlp=mlp,
                 kv_heads=kv_heads, rope_theta=rope_theta, norm_eps=norm_eps)


CONFIGS = {
    "tiny": Shape(2, 64, 4, vocab=256, positions=32, note="CPU smoke test"),
    "gpt2": Shape(12, 768, 12, note="GPT-2 small"),
    "medium": Shape(24, 1024, 16, note="GPT-2 medium"),
    "large": Shape(36, 1280, 20, note="GPT-2 large"),
    "xl": Shape(48, 1600, 25, note="GPT-2 XL"),
    "2.7b": Shape(32, 2560, 32, note="GPT-3 2.7B shape"),
    "6.7b": Shape(32, 4096, 32, note="GPT-3 6.7B shape"),
    # The capacity ladder's rungs between the published shapes, so that consecutive sizes differ by at most 1.5x
    # (6.7b -> 13b was 1.93x, 13b -> 20b 1.58x, 30b -> 45b 1.52x): standard depth, head dim 128 throughout.
    "9.4b": Shape(36, 4608, 36, note="ladder rung, 9.4B (1.41x 6.7b)"),
    "13b": Shape(40, 5120, 40, note="GPT-3 13B shape"),
    "15.5b": Shape(40, 5632, 44, note="ladder rung, 15.5B (13b's depth, 1.21x 13b)"),
    "20b": Shape(44, 6144, 48, note="GPT-NeoX-20B shape"),
    "30b": Shape(48, 7168, 56, note="30B, standard depth"),
    "37b": Shape(52, 7680, 60, note="ladder rung, 37B (1.24x 30b)"),
    "45b": Shape(56, 8192, 64, note="45B GPT-2 shape (issue 39)"),
    "58b": Shape(72, 8192, 64, note="ladder top, 58B (45b's width, 72 layers)"),
    # The NNTile paper's point: few, very wide layers (it trained GPT-2 shapes up to ~50B on one node, where
    # FSDP stopped near 8B). Width 16384 (head dim 128) gives 13.7B at 4 layers and 26.6B at 8; 4 x 32768 is the
    # paper's ~50B scale.
    "wide-4": Shape(4, 16384, 128, note="NNTile-paper-style wide, shallow"),
    "wide-8": Shape(8, 16384, 128, note="NNTile-paper-style wide, shallow"),
    "wide-4-32k": Shape(4, 32768, 256, note="NNTile-paper-style, ~50B scale"),
    # The Llama family: the published models' shapes (Llama 3's without its 3.1 rope scaling), built from config.
    "llama-tiny": llama_shape(2, 64, 160, 4, 2, 1000, 10000.0, positions=32, note="CPU smoke test"),
    "qwen2-tiny": llama_shape(2, 64, 160, 4, 2, 1000, 1e6, family="qwen2", positions=32, norm_eps=1e-6,
                              note="CPU smoke test (q, k, v biases)"),
    "llama3-8b": llama_shape(32, 4096, 14336, 32, 8, 128256, 500000.0, note="Llama 3 8B"),
    "qwen2.5-14b": llama_shape(48, 5120, 13824, 40, 8, 152064, 1e6, family="qwen2", positions=32768, norm_eps=1e-6,
                               note="Qwen2.5 14B (q, k, v biases)"),
    "qwen2.5-32b": llama_shape(64, 5120, 27648, 40, 8, 152064, 1e6, family="qwen2", positions=32768, norm_eps=1e-6,
                               note="Qwen2.5 32B (q, k, v biases)"),
    "llama-70b": llama_shape(80, 8192, 28672, 64, 8, 128256, 500000.0, note="Llama 3 70B"),
}

# The ladder a capacity search climbs when no --config is given (standard depth, increasing size), per family.
# From 6.7b up, consecutive sizes differ by at most 1.5x (tests/test_bench_run.py checks it).
CAPACITY_LADDER = ["gpt2", "medium", "large", "xl", "2.7b", "6.7b", "9.4b", "13b", "15.5b", "20b", "30b", "37b", "45b",
                   "58b"]
LADDERS = {"gpt2": CAPACITY_LADDER, "llama": ["llama3-8b", "llama-70b"], "qwen2": ["qwen2.5-14b", "qwen2.5-32b"]}
# The throughput config when no --config is given, per family.
DEFAULT_CONFIG = {"gpt2": "xl", "llama": "llama3-8b", "qwen2": "qwen2.5-14b"}


def family(name):
    return CONFIGS[name].family


def default_model(name):
    """The model a config builds when --model does not say: its family's first (gpt2: hf)."""
    return FAMILY_MODELS[family(name)][0]


def check_model(name, model):
    """ValueError unless `model` builds configs of `name`'s family."""
    if model not in MODEL_FAMILY:
        raise ValueError(f"unknown model {model!r} (known: {', '.join(MODEL_FAMILY)})")
    if MODEL_FAMILY[model] != family(name):
        raise ValueError(f"--model {model} builds the {MODEL_FAMILY[model]} family, config {name} is of the "
                         f"{family(name)} family (its models: {', '.join(FAMILY_MODELS[family(name)])})")


def positions(name, seq):
    return max(CONFIGS[name].positions, seq)


def model_vocab(name, model=None):
    """The vocab of a config in a model family: nanoGPT pads GPT-2's 50257 up to a multiple of 64 (50304)."""
    v = CONFIGS[name].vocab
    return -(-v // 64) * 64 if model == "nanogpt" else v


def kv_width(name):
    """Width of the key (and of the value) projection's output: kv_heads x head_dim (grouped-query attention)."""
    s = CONFIGS[name]
    return s.kv_heads * s.head_dim


def block_params(name):
    """Parameters of one transformer block. gpt2: 12h^2 + 13h (qkv, attention out, MLP in/out with biases, two
    LayerNorms). llama: q and o h x h, k and v h x kv (GQA), gate, up and down h x mlp, two RMSNorm weights;
    qwen2: and the q, k, v biases (h + 2 kv)."""
    s = CONFIGS[name]
    h = s.hidden
    if s.family == "gpt2":
        return 12 * h * h + 13 * h
    kv = kv_width(name)
    return 2 * h * h + 2 * h * kv + 3 * h * s.mlp + 2 * h + (h + 2 * kv if s.family == "qwen2" else 0)


def param_count(name, seq, model=None):
    """Exact parameter count of the model for this config. gpt2 (tied LM head): token and position embeddings, the
    blocks, final LayerNorm; the same for every GPT-2 model (benchmarks/models.py) but the vocab (model_vocab).
    llama, qwen2: token embedding and the untied LM head (vocab x h each), the blocks, final RMSNorm (rotary
    embeddings have no parameters)."""
    s = CONFIGS[name]
    h = s.hidden
    if s.family == "gpt2":
        return model_vocab(name, model) * h + positions(name, seq) * h + s.layers * block_params(name) + 2 * h
    return 2 * s.vocab * h + s.layers * block_params(name) + h


def flops_per_token(params, layers, hidden, seq):
    """Model FLOPs per trained token: 6N for the matmuls with parameters (forward + backward), plus
    12*L*h*seq for attention scores and their weighted sums (forward + backward, no recomputation counted)."""
    return 6 * params + 12 * layers * hidden * seq


def model_flops_per_token(name, seq, model=None):
    """The model FLOPs per trained token that the harness's model TFLOP/s and MFU count, for every family:
    6N + 12 L (heads x head_dim) seq (flops_per_token). gpt2: N every parameter (the tied token embedding counted
    once, as the LM head's matmul; position embeddings, LayerNorms and biases, under 0.2% at XL, with it). llama,
    qwen2: N every parameter but the token embedding (a lookup; the untied head is a matmul): per block q, k, v, o
    (k and v h x kv under GQA), gate, up and down (the gated MLP's three matrices), the RMSNorms' weights and
    Qwen2's biases (under 0.01%); attention's scores and weighted sums span all query heads (k and v repeated over
    the group), so GQA leaves that term as for h."""
    s = CONFIGS[name]
    params = param_count(name, seq, model)
    if s.family != "gpt2":
        params -= s.vocab * s.hidden
    return flops_per_token(params, s.layers, s.heads * s.head_dim, seq)


def hf_config(name, seq, model=None, dropout=0.0):
    """The transformers config for a named shape (imports transformers): gpt2's GPT2Config (model "hf-tanh": with
    activation_function="gelu_pytorch_tanh" instead of GPT-2's default gelu_new, the same function); llama's
    LlamaConfig and qwen2's Qwen2Config, untied head, no KV cache. dropout: every dropout probability the config has
    (GPT-2's attention, residual and embedding ones, HF's default 0.1 each; the Llama family's attention one)."""
    import transformers
    s = CONFIGS[name]
    if s.family != "gpt2":
        cls = transformers.LlamaConfig if s.family == "llama" else transformers.Qwen2Config
        return cls(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.mlp, num_hidden_layers=s.layers,
                   num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                   max_position_embeddings=positions(name, seq), rms_norm_eps=s.norm_eps, rope_theta=s.rope_theta,
                   attention_dropout=dropout, tie_word_embeddings=False, use_cache=False)
    extra = {"activation_function": "gelu_pytorch_tanh"} if model == "hf-tanh" else {}
    return transformers.GPT2Config(n_layer=s.layers, n_embd=s.hidden, n_head=s.heads, vocab_size=s.vocab,
                                   n_positions=positions(name, seq), resid_pdrop=dropout,
                                   embd_pdrop=dropout, attn_pdrop=dropout, tie_word_embeddings=True,
                                   use_cache=False,
                                   bos_token_id=0, eos_token_id=0, **extra)


def shape_text(name):
    """'48 layers x 1600, 25 heads, vocab 50257' / '32 layers x 4096, MLP 14336, 32 heads / 8 kv, vocab 128256'."""
    s = CONFIGS[name]
    if s.family == "gpt2":
        return f"{s.layers} layers x {s.hidden}, {s.heads} heads, vocab {s.vocab}"
    return f"{s.layers} layers x {s.hidden}, MLP {s.mlp}, {s.heads} heads / {s.kv_heads} kv, vocab {s.vocab}"


def by_size(names, seq):
    return sorted(names, key=lambda n: param_count(n, seq))


def fmt_params(n):
    """118.5K, 124.4M, 1.56B."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
