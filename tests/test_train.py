"""The training CLI: runs, logs, plots, checkpoints atomically and resumes onto the same trajectory."""
import json
import os

import pytest

pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")
from nntile_torch import train  # noqa: E402

COMMON = ["--steps", "6", "--batch", "2", "--seq", "24", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
          "--corpus-bytes", "200000", "--device", "cpu", "--no-progress", "--tile-size", "24"]


def test_compare_torch_log_and_plot(tmp_path):
    log = train.main(COMMON + ["--compare-torch", "--out", str(tmp_path / "run")])
    assert len(log) == 6
    assert all(abs(r["loss"] - r["torch_loss"]) < 1e-4 for r in log)
    data = json.loads((tmp_path / "run" / "log.json").read_text())
    assert data["steps"][-1]["step"] == 5 and data["parameters"] > 0
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


def test_resume_continues_the_same_trajectory(tmp_path):
    full = train.main(COMMON + ["--out", str(tmp_path / "full")])
    ck = str(tmp_path / "ck" / "ckpt.pt")
    first = train.main(COMMON[:1] + ["3"] + COMMON[2:] + ["--checkpoint", ck, "--out", str(tmp_path / "a")])
    assert os.path.exists(ck) and not [f for f in os.listdir(tmp_path / "ck") if ".tmp." in f]
    resumed = train.main(COMMON + ["--resume", ck, "--out", str(tmp_path / "b")])
    assert [r["step"] for r in resumed] == list(range(6))
    assert resumed[:3] == first
    for a, b in zip(resumed[3:], full[3:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * b["loss"]


def test_bad_arguments():
    with pytest.raises(SystemExit):
        train.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        train.main(COMMON + ["--n-embd", "30", "--n-head", "4"])
