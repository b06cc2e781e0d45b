"""nt.plan()'s decisions and predictions pinned for GPT-2 shapes from small to 30B under a few capacities, on fixed
rates and CPU workers, so a refactor of the plan provably changes none of its output. The pins are in
tests/data/plan_pins.json; after a deliberate change to the plan, regenerate them with
`python tests/test_plan_pins.py` and say why in the commit."""
import hashlib
import json
import math
import os
import sys

import pytest
import torch

import nntile_torch as nt
from nntile_torch.plan import Capacity, GiB, InsufficientMemoryError, Rates

transformers = pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")

PINS = os.path.join(os.path.dirname(__file__), "data", "plan_pins.json")

SHAPES = {"small": (12, 768, 12), "xl": (48, 1600, 25), "13b": (40, 5120, 40), "20b": (44, 6144, 48),
          "30b": (48, 7168, 56), "45b": (56, 8192, 64)}
# (gpu GiB, host GiB, disk GiB, gpus, cpu workers)
CAPACITIES = {"h200": (125.8, 109.8, 0, 1, 14), "small_host": (70.0, 60.0, 0, 1, 6),
              "disk": (125.8, 109.8, 400, 1, 14), "cpu_only": (0, 200.0, 0, 0, 8)}
CASES = [  # (shape, capacity, batch, precision, pins)
    ("small", "h200", 8, "bf16", {}),
    ("small", "cpu_only", 4, "fp32", {}),
    ("xl", "h200", 8, "bf16", {}),
    ("xl", "small_host", 32, "bf16", {}),
    ("xl", "h200", 8, "tf32", {}),
    ("13b", "h200", 32, "bf16", {}),
    ("13b", "small_host", 16, "bf16", {}),
    ("13b", "h200", 32, "bf16", {"host_checkpoints": True}),
    ("20b", "h200", 8, "bf16", {}),
    ("20b", "h200", 16, "bf16", {"host_update": "cpu"}),
    ("30b", "h200", 16, "bf16", {}),
    ("30b", "disk", 16, "bf16", {}),
    ("30b", "small_host", 16, "bf16", {}),
    ("45b", "h200", 8, "bf16", {}),
    ("45b", "disk", 32, "bf16", {}),
]


def meta_gpt2(layers, hidden, heads, vocab=50257, positions=1024):
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=positions,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(cfg)


def case_id(case):
    shape, cap, batch, precision, pins = case
    return "-".join([shape, cap, f"b{batch}", precision] + [f"{k}={v}" for k, v in sorted(pins.items())])


def _names(names):
    """A list of parameter names, pinned exactly but compactly: its count, ends and hash."""
    return {"count": len(names), "first": names[:1], "last": names[-1:],
            "sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}


def outcome(case):
    """Everything the plan decided and predicted for one case, as JSON-able values."""
    shape, cap_name, batch, precision, pins = case
    gpu, host, disk, gpus, workers = CAPACITIES[cap_name]
    cap = Capacity(int(gpu * GiB), int(host * GiB), int(disk * GiB), gpus, workers)
    try:
        p = nt.plan(meta_gpt2(*SHAPES[shape]), batch=batch, seq=1024, precision=precision, rates=Rates(), _cap=cap,
                    **pins)
    except InsufficientMemoryError as e:
        return {"error": str(e), "missing": {k: int(v) for k, v in (e.missing or {}).items()},
                "fixes": repr(e.fixes)}
    return {"summary": p.summary(), "text": str(p), "repr": repr(p),
            "init_kwargs": p.init_kwargs(),
            "alternatives": [[repr(o), s] for o, s in p.alternatives],
            "host_parameter_names": _names(p.host_parameter_names()),
            "cpu_update_parameter_names": _names(p.cpu_update_parameter_names()),
            "bf16_master_parameter_names": _names(p.bf16_master_parameter_names()),
            "bf16_per_use_parameter_names": _names(p.bf16_per_use_parameter_names()),
            "in_host_ram": [m for m in ("transformer.h.0", f"transformer.h.{SHAPES[shape][0] - 1}", "lm_head")
                            if p.in_host_ram(m)],
            "persistent_bytes": p.persistent_bytes()}


def _normalize(x):  # JSON's view: tuples as lists, keys as strings
    return json.loads(json.dumps(x))


def _close(a, b, path="$"):
    """Equal, floats to 1e-12 relative (the same arithmetic may be summed in another order after a refactor)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12), \
            f"{path}: {a!r} != pinned {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != pinned {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {len(a)} items != pinned {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != pinned {b!r}"


@pytest.fixture(scope="module")
def pins():
    with open(PINS) as f:
        return json.load(f)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_plan_output_is_pinned(case, pins):
    assert case_id(case) in pins, f"no pin for {case_id(case)}: regenerate with python tests/test_plan_pins.py"
    _close(_normalize(outcome(case)), pins[case_id(case)])


def test_pins_cover_the_interesting_outcomes(pins):
    """The cases pin every kind of decision: all on the GPU, host blocks, checkpoints in host RAM, each rung of the
    state's ladder (fp32, bf16 moments, bf16 masters, bf16 masters with 8-bit moments, the disk tier), no GPU at all,
    and a refusal (a pin set with none of these could not catch their change)."""
    plans = [v["summary"] for v in pins.values() if "summary" in v]
    assert any(s["host_blocks"] == 0 and s["capacity_bytes"]["gpu"] for s in plans)
    assert any(s["host_blocks"] > 0 for s in plans)
    assert any(s["host_checkpoints"] for s in plans)
    states = {(s["master_dtype"], s["state_dtype"], bool(s["tiers_bytes"].get("disk"))) for s in plans}
    assert {("float32", "float32", False), ("float32", "bfloat16", False), ("bfloat16", "bfloat16", False),
            ("bfloat16", "uint8", False), ("bfloat16", "uint8", True)} <= states, states
    assert any(not s["capacity_bytes"]["gpu"] for s in plans)
    assert any("error" in v for v in pins.values())
    assert len(pins) == len(CASES)


if __name__ == "__main__":
    out = {case_id(c): _normalize(outcome(c)) for c in CASES}
    os.makedirs(os.path.dirname(PINS), exist_ok=True)
    with open(PINS, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(out)} pins to {PINS}", file=sys.stderr)
