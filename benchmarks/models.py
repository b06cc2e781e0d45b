"""The model families the harness trains (`benchmarks.run --model`), built from one named shape (configs.py):
how each is built, called for its loss, checkpointed and initialized module by module, and the weight-decay groups
of a training script's own optimizer.

  hf       Hugging Face GPT2LMHeadModel as a user has it: its default activation gelu_new (the tanh formula written
           out, about eight elementwise kernels in eager torch)
  hf-tanh  the same with activation_function="gelu_pytorch_tanh" (the same function as one kernel)
  nanogpt  examples/nanogpt/model.py, nanoGPT's model.py in structure: its own LayerNorm calling F.layer_norm, c_attn
           split into q, k, v and F.scaled_dot_product_attention, nn.GELU, a head tied to the token embedding;
           vocab padded to a multiple of 64 as nanoGPT pads GPT-2's (50257 -> 50304), biases as its GPTConfig's
           default (True, as GPT-2)
  llama    Hugging Face LlamaForCausalLM from the config's LlamaConfig (the llama family's configs: RMSNorm, rotary
           embeddings, grouped-query attention, gated SiLU MLP, untied head), its default attention (sdpa)
  qwen2    Hugging Face Qwen2ForCausalLM from the config's Qwen2Config (the qwen2 family's: Llama's with q, k, v biases)
The first three build the gpt2 family's configs, llama and qwen2 their own (configs.MODEL_FAMILY).
Every family trains on the same token ids and the same loss: next-token cross-entropy over the sequence's first
seq - 1 positions (Hugging Face's labels=ids; nanoGPT's targets are the ids shifted left, the last one -1, which
its F.cross_entropy(..., ignore_index=-1) skips).
"""
import importlib.util
import math
import os
import sys

import torch

from benchmarks.configs import CONFIGS, MODEL_FAMILY, check_model, hf_config, model_vocab, positions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = tuple(MODEL_FAMILY)  # hf, hf-tanh, nanogpt, llama, qwen2
LLAMA_LIKE = ("llama", "qwen2")


def hf_class(model):
    """The transformers class of a Hugging Face model name."""
    import transformers
    return {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}.get(
        model, transformers.GPT2LMHeadModel)


def nanogpt_module():
    """examples/nanogpt/model.py as a module (the examples folder is no package)."""
    name = "nanogpt_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", "nanogpt", "model.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # before exec: its dataclass looks its module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


def nanogpt_config(config, seq, dropout=0.0):
    s = CONFIGS[config]
    return nanogpt_module().GPTConfig(block_size=positions(config, seq), vocab_size=model_vocab(config, "nanogpt"),
                                      n_layer=s.layers, n_head=s.heads, n_embd=s.hidden, dropout=dropout, bias=True)


DROPOUT_ON = ("all", "attention")


def build(model, config, seq, dropout=0.0, dropout_on="all"):
    """The model of family `model` at shape `config`, on the current default device (torch.device(...) as a context
    manager: meta builds it without memory), in train mode, weights from the current torch seed. ValueError when
    the model does not build that config's family. dropout: the probability of every dropout of the model
    (nanoGPT's one knob, GPT-2's attention, residual and embedding dropouts, the Llama family's attention dropout),
    or with dropout_on="attention" of the attention's alone (on its probabilities; the others 0)."""
    if dropout_on not in DROPOUT_ON:
        raise ValueError(f"dropout_on must be one of {', '.join(DROPOUT_ON)} (got {dropout_on!r})")
    check_model(config, model)
    attention_only = dropout_on == "attention"
    if model == "nanogpt":
        net = nanogpt_module().GPT(nanogpt_config(config, seq, dropout))
        if attention_only:  # its one knob: keep the attention's (SDPA's dropout_p, attn_dropout), zero the rest
            net.transformer.drop.p = 0.0
            for block in net.transformer.h:
                block.attn.resid_dropout.p = block.mlp.dropout.p = 0.0
    else:
        cfg = hf_config(config, seq, model, dropout)
        if attention_only and model not in LLAMA_LIKE:  # the Llama family has the attention's alone
            cfg.resid_pdrop = cfg.embd_pdrop = 0.0
        net = hf_class(model)(cfg)
    net.train()
    return net


def real_buffers(model, net, device):
    """A model built on meta gets its buffers that are no parameters (which convert() does not materialize) on
    `device`: the Llama family's rotary module (inv_freq), made anew from the config. GPT-2's models have none."""
    if model in LLAMA_LIKE and net.model.rotary_emb.inv_freq.is_meta:
        net.model.rotary_emb = type(net.model.rotary_emb)(net.config, device=device)


def loss(model, net, ids):
    """The training loss of `net` (a family-`model` model, converted, wrapped or compiled) on ids (batch, seq)."""
    if model == "nanogpt":
        targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -1)], dim=1)  # the last position has none
        return net(ids, targets)[1]
    return net(input_ids=ids, labels=ids).loss


def blocks(net):
    """The transformer blocks' ModuleList (GPT-2's transformer.h in its three models, the Llama family's model.layers;
    under FSDP1 or torch.compile the wrapped module's)."""
    inner = getattr(net, "_orig_mod", net)  # torch.compile's OptimizedModule
    inner = getattr(inner, "_fsdp_wrapped_module", inner)
    return inner.transformer.h if hasattr(inner, "transformer") else inner.model.layers


def block_class(model):
    if model == "nanogpt":
        return nanogpt_module().Block
    if model == "llama":
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        return LlamaDecoderLayer
    if model == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
        return Qwen2DecoderLayer
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    return GPT2Block


def enable_checkpointing(net):
    """Activation checkpointing of every block (non-reentrant): Hugging Face's own switch, else torch.utils.checkpoint
    around each block's forward (nntile_torch.streaming.checkpoint_blocks, plain torch code). Returns what it did, for
    the record (a flag that did nothing would read as a memory saver that was there)."""
    if hasattr(net, "gradient_checkpointing_enable"):
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not getattr(net, "is_gradient_checkpointing", True):
            raise RuntimeError(f"{type(net).__name__}.gradient_checkpointing_enable() left checkpointing off")
        return "Hugging Face gradient_checkpointing_enable (non-reentrant), every block"
    from torch.utils.checkpoint import checkpoint
    for block in blocks(net):
        forward = block.forward

        def run(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
        block.forward = run
    return "torch.utils.checkpoint (non-reentrant) around every block's forward"


def module_init(model, net):
    """init(module) for nt.convert of a model built on meta: the family's own init one module at a time, GPT-2's
    depth-scaled init of the residual projections included (both families apply it from the whole model); each
    module drawn where it is (the GPU: fast) and moved to host RAM, so that each tile goes to the GPU that first
    works on it. The Llama family's init is Hugging Face's _init_weights alone (no depth scaling)."""
    if model in LLAMA_LIKE:
        def init(m):
            net._init_weights(m)
            m.to("cpu")
        return init
    if model == "nanogpt":
        layers = net.config.n_layer
        scaled = {id(b.attn.c_proj) for b in net.transformer.h} | {id(b.mlp.c_proj) for b in net.transformer.h}
        std = 0.02 / math.sqrt(2 * layers)

        def init(m):
            net._init_weights(m)  # Linear and Embedding; its LayerNorm starts at 1 and 0 (convert sets them)
            if id(m) in scaled:
                torch.nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):  # swapped; a LayerNorm keeps its home device
                m.to("cpu")
        return init
    scaled = {id(m.c_proj) for m in net.modules() if type(m).__name__ in ("GPT2Attention", "GPT2MLP")}
    std = net.config.initializer_range / math.sqrt(2 * net.config.n_layer)

    def init(m):
        net._init_weights(m)
        if id(m) in scaled:
            m.weight.normal_(0.0, std)
        m.to("cpu")
    return init


def describe(model, net):
    """What the records say of the model as built: its class, attention and activation."""
    if model == "nanogpt":
        attention = "F.scaled_dot_product_attention" if net.transformer.h[0].attn.flash else "written out"
        return {"family": model, "class": "examples/nanogpt/model.py GPT", "attention": attention,
                "activation": "nn.GELU()"}
    cfg = net.config
    return {"family": model, "class": type(net).__name__, "attention": getattr(cfg, "_attn_implementation", None),
            "activation": cfg.hidden_act if model in LLAMA_LIKE else cfg.activation_function}


def user_optimizer(model, net, lr, weight_decay, fused):
    """A training script's own optimizer, as nanoGPT's configure_optimizers builds it: torch.optim.AdamW over two
    groups, matrices (weights, embeddings) decayed and vectors (biases, LayerNorm weights) not, fused on CUDA,
    betas (0.9, 0.95). For the nanoGPT model its own configure_optimizers."""
    betas = (0.9, 0.95)
    if model == "nanogpt" and hasattr(net, "configure_optimizers"):
        return net.configure_optimizers(weight_decay, lr, betas, "cuda" if fused else "cpu")
    params = [p for p in net.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **({"fused": True} if fused else {}))
