"""The benchmark harness on the Llama family: its configs' parameter counts from the models Hugging Face builds on the
meta device (no memory), model FLOPs per token against a hand count, the family check of --model, --list-configs,
and llama-tiny / qwen2-tiny trained through python -m benchmarks.run on torch and nntile (CPU, fp32)."""
import json
import math

import pytest
import torch

from benchmarks import models
from benchmarks.configs import (
    CONFIGS,
    default_model,
    flops_per_token,
    fmt_params,
    model_flops_per_token,
    param_count,
)
from benchmarks.run import main, model_runs, parse_args
from test_bench_run import harness

LLAMA_TINY = ["--precision", "fp32", "--batch", "2", "--seq", "32", "--steps", "2", "--warmup", "1",
              "--max-warmup", "1", "--cpu", "--timeout", "150"]


@pytest.mark.parametrize("config,count,text", [
    ("llama3-8b", 8_030_261_248, "8.03B"), ("qwen2.5-32b", 32_763_876_352, "32.76B"),
    ("qwen2.5-14b", 14_770_033_664, "14.77B"), ("llama-70b", 70_553_706_496, "70.55B"),
    ("llama-tiny", 214_336, "214.3K")], ids=["llama3-8b", "qwen2.5-32b", "qwen2.5-14b", "llama-70b", "llama-tiny"])
def test_llama_param_counts_are_the_built_models(config, count, text):
    """The count the harness records (configs.param_count) is the model's own, built on meta from the config; the
    published sizes: Llama 3 8B 8.03B, Qwen2.5 32B 32.76B."""
    model = default_model(config)
    with torch.device("meta"):
        net = models.build(model, config, 1024)
    assert sum(p.numel() for p in net.parameters()) == param_count(config, 1024) == count
    assert fmt_params(count) == text
    s = CONFIGS[config]
    attn = net.model.layers[0].self_attn
    assert net.lm_head.weight is not net.model.embed_tokens.weight  # untied
    assert attn.k_proj.weight.shape == (s.kv_heads * s.head_dim, s.hidden)  # GQA
    assert (attn.q_proj.bias is not None) == (s.family == "qwen2")
    assert net.model.layers[0].mlp.gate_proj.weight.shape == (s.mlp, s.hidden)
    assert type(net).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[s.family]
    from benchmarks.worker import nvme_param_swap  # DeepSpeed's swap buffers hold the largest parameter
    assert nvme_param_swap(config, 1024)["offload_param"]["buffer_size"] >= max(p.numel() for p in net.parameters())


def test_flops_per_token_is_the_hand_count():
    """6 x (every matmul weight: q, k, v, o, gate, up, down per block, the untied head; plus the RMSNorm weights and
    Qwen2's biases, as GPT-2's count keeps its LayerNorms) + 12 L h seq for attention (all query heads). The token
    embedding is a lookup: not counted. GPT-2's count is unchanged."""
    seq = 1024
    h, kv, mlp, layers, vocab = 4096, 8 * 128, 14336, 32, 128256  # Llama 3 8B
    block = h * h + h * kv + h * kv + h * h + 3 * h * mlp + 2 * h
    want = 6 * (layers * block + vocab * h + h) + 12 * layers * h * seq
    assert model_flops_per_token("llama3-8b", seq) == want
    assert want == 6 * (8_030_261_248 - vocab * h) + 12 * 32 * 4096 * 1024
    h, kv, mlp, layers, vocab = 5120, 8 * 128, 27648, 64, 152064  # Qwen2.5 32B, q/k/v biases
    block = 2 * h * h + 2 * h * kv + 3 * h * mlp + 2 * h + (h + 2 * kv)
    assert model_flops_per_token("qwen2.5-32b", 2048) == 6 * (layers * block + vocab * h + h) + 12 * layers * h * 2048
    assert model_flops_per_token("xl", seq) == flops_per_token(param_count("xl", seq), 48, 1600, seq)
    assert model_flops_per_token("xl", seq, "nanogpt") == flops_per_token(param_count("xl", seq, "nanogpt"), 48,
                                                                          1600, seq)


def test_a_model_of_another_family_is_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--model", "hf", "--config", "llama3-8b"])
    assert "--model hf builds the gpt2 family" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model", "llama", "--config", "qwen2.5-32b"])
    assert ("--model llama builds the llama family, and none of the configs is of it (qwen2.5-32b: qwen2 family, "
            "--model qwen2)") in capsys.readouterr().err
    with pytest.raises(ValueError, match="config llama-tiny is of the llama family"):
        model_runs(["xl", "llama-tiny"], ["hf", "nanogpt"])
    with pytest.raises(ValueError, match="builds the gpt2 family"):
        models.build("hf", "llama-tiny", 32)
    # without --model each config builds its family's model; with several, each model its family's configs
    assert parse_args(["--config", "llama-tiny"]).runs == [("llama", "llama-tiny")]
    assert model_runs(["xl", "qwen2.5-14b"]) == [("hf", "xl"), ("qwen2", "qwen2.5-14b")]
    assert model_runs(["xl", "llama3-8b"], ["hf", "llama", "nanogpt"]) == [
        ("hf", "xl"), ("llama", "llama3-8b"), ("nanogpt", "xl")]
    args = parse_args(["--model", "llama"])  # no --config: the family's default
    assert args.configs == ["llama3-8b"] and args.models == ["llama"]
    assert parse_args(["--model", "qwen2", "--mode", "capacity"]).configs == ["qwen2.5-14b", "qwen2.5-32b"]


def test_list_configs_names_every_family_shape_and_size(capsys):
    main(["--list-configs"])
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert set(lines) == set(CONFIGS)
    for name, s in CONFIGS.items():
        assert f" {s.family} " in lines[name] and f"{param_count(name, 1024):,d} params" in lines[name]
    assert "32 layers x 4096, MLP 14336, 32 heads / 8 kv, vocab 128256" in lines["llama3-8b"]
    assert "(8.03B)" in lines["llama3-8b"] and "(32.76B)" in lines["qwen2.5-32b"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """llama-tiny and qwen2-tiny on torch and nntile, then nntile built on meta and converted module by module (the
    path of a model whose weights pass 20% of the GPU)."""
    out = tmp_path_factory.mktemp("llama")
    harness("benchmarks.run", "--config", "llama-tiny,qwen2-tiny", "--backend", "torch,nntile", *LLAMA_TINY,
            "--out", str(out), cwd=out)
    harness("benchmarks.run", "--config", "llama-tiny", "--backend", "nntile", "--init-device", "meta", *LLAMA_TINY,
            "--out", str(out / "meta"), cwd=out)
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    meta = json.loads((out / "meta" / "results.jsonl").read_text())
    return {(r["config"], r["backend"]): r for r in recs}, meta


@pytest.mark.parametrize("config,family", [("llama-tiny", "llama"), ("qwen2-tiny", "qwen2")])
def test_llama_family_trains_the_same_on_torch_and_nntile(tiny_runs, config, family):
    runs, _ = tiny_runs
    t, n = runs[config, "torch"], runs[config, "nntile"]
    for r in (t, n):
        assert r["status"] == "ok", f"{r['backend']}: {r['reason']}"
        assert (r["family"], r["model"], r["config"]) == (family, family, config)
        assert r["env"]["model"]["class"] == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]
        assert r["params"] == param_count(config, 32) == r["env"]["params_counted"]
        assert (r["layers"], r["hidden"], r["heads"], r["kv_heads"], r["mlp"], r["vocab"]) == (2, 64, 4, 2, 160, 1000)
        assert len(r["losses"]) == 3 and abs(r["losses"][0] - math.log(1000)) < 0.3
        assert r["flops_per_token"] == model_flops_per_token(config, 32)
        assert r["tflops"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / 1e12)
    # the same weights, ids and optimizer at fp32 on the CPU: the same losses
    assert max(abs(a - b) for a, b in zip(t["losses"], n["losses"])) <= 1e-4, (t["losses"], n["losses"])
    assert n["env"]["convert"]["dense"] == [] and n["host_waits"] == [1, 1, 1]


def test_llama_built_on_meta_converts_module_by_module(tiny_runs):
    runs, meta = tiny_runs
    assert meta["status"] == "ok", meta["reason"]
    assert meta["env"]["init_device"] == "meta" and meta["env"]["params_counted"] == meta["params"]
    assert abs(meta["losses"][0] - math.log(1000)) < 0.3 and all(math.isfinite(v) for v in meta["losses"])
    assert meta["env"]["convert"]["dense"] == []
