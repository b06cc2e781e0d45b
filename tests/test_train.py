"""The training CLI: runs, logs, plots, checkpoints atomically and resumes onto the same trajectory."""
import json
import math
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


def test_compare_fp64_logs_the_reference_and_nntile_strays_from_it_no_more_than_torch(tmp_path):
    log = train.main(COMMON + ["--compare-fp64", "--out", str(tmp_path / "run")])
    assert len(log) == 6 and all({"loss", "torch_loss", "fp64_loss"} <= r.keys() for r in log)
    nntile_dev = max(abs(r["loss"] - r["fp64_loss"]) for r in log)
    torch_dev = max(abs(r["torch_loss"] - r["fp64_loss"]) for r in log)
    # The float64 copy really is float64: fp32 rounding shows against it, and it trains the same model.
    assert 0 < torch_dev < 1e-4, torch_dev
    # nntile's fp32 rounding error is of the order of PyTorch's own (a wrong gradient or update is far larger).
    assert nntile_dev <= 4 * torch_dev + 1e-6, (nntile_dev, torch_dev)
    data = json.loads((tmp_path / "run" / "log.json").read_text())
    assert data["args"]["compare_torch"] and data["steps"][-1]["fp64_loss"] == log[-1]["fp64_loss"]
    devs = data["deviations"]
    assert devs["nntile_vs_fp64"]["max"] == pytest.approx(nntile_dev)
    assert devs["torch_vs_fp64"]["windows"] == [{"first": 0, "last": 5, "max": pytest.approx(torch_dev)}]
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


def test_deviations_per_window():
    log = [{"step": s, "loss": 1.0 + s * 1e-3, "torch_loss": 1.0, "fp64_loss": 1.0 - 1e-4} for s in range(250)]
    devs = train.deviations(log)
    assert [(w["first"], w["last"]) for w in devs["nntile_vs_torch"]["windows"]] == [(0, 99), (100, 199),
                                                                                      (200, 249)]
    assert [w["max"] for w in devs["nntile_vs_torch"]["windows"]] == pytest.approx([0.099, 0.199, 0.249])
    assert devs["torch_vs_fp64"]["max"] == pytest.approx(1e-4)
    assert devs["nntile_vs_fp64"]["max"] == pytest.approx(0.249 + 1e-4)
    assert train.deviations([{"step": 0, "loss": 1.0}]) == {}


def test_step_in_backward_trains_the_same_losses(tmp_path):
    plain = train.main(COMMON + ["--out", str(tmp_path / "a")])
    fused = train.main(COMMON + ["--step-in-backward", "--out", str(tmp_path / "b")])
    assert [r["loss"] for r in fused] == [r["loss"] for r in plain]


def test_resume_continues_the_same_trajectory(tmp_path):
    full = train.main(COMMON + ["--compare-fp64", "--out", str(tmp_path / "full")])
    ck = str(tmp_path / "ck" / "ckpt.pt")
    first = train.main(COMMON[:1] + ["3"] + COMMON[2:] + ["--checkpoint", ck, "--out", str(tmp_path / "a")])
    assert os.path.exists(ck) and not [f for f in os.listdir(tmp_path / "ck") if ".tmp." in f]
    resumed = train.main(COMMON + ["--compare-fp64", "--resume", ck, "--out", str(tmp_path / "b")])
    assert [r["step"] for r in resumed] == list(range(6))
    assert resumed[:3] == first
    for a, b in zip(resumed[3:], full[3:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * b["loss"]
        # The references restart from the checkpoint's weights and Adam moments (fp32, so float64 only nearly).
        assert abs(a["torch_loss"] - b["torch_loss"]) <= 1e-5 and abs(a["fp64_loss"] - b["fp64_loss"]) <= 1e-5


def test_bad_arguments():
    with pytest.raises(SystemExit):
        train.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        train.main(COMMON + ["--n-embd", "30", "--n-head", "4"])


_KILLED_MID_SAVE = """
import io, sys, time, torch
from nntile_torch import train
ck, marker = sys.argv[1], sys.argv[2]
real = torch.save


def half_then_hang(obj, f, *args, **kwargs):  # the save the test kills: half the bytes written, then SIGKILL
    buf = io.BytesIO()
    real(obj, buf, *args, **kwargs)
    data = buf.getvalue()
    f.write(data[:len(data) // 2])
    f.flush()
    open(marker, "w").close()
    time.sleep(600)


torch.save = half_then_hang
train.main(sys.argv[3:])
"""


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(tmp_path):
    """A real SIGKILL in the middle of writing a checkpoint: the checkpoint file is still the previous one, whole and
    loadable; resuming from it gives the losses of a run never interrupted, and the killed save's temporary file is
    removed by the next save."""
    import signal
    import subprocess
    import sys
    import time
    import torch
    steps = lambda n: COMMON[:1] + [str(n)] + COMMON[2:]  # noqa: E731
    full = train.main(steps(4) + ["--out", str(tmp_path / "full")])
    ck = tmp_path / "ck" / "ckpt.pt"
    train.main(steps(2) + ["--checkpoint", str(ck), "--out", str(tmp_path / "a")])
    before = ck.read_bytes()
    marker = tmp_path / "mid_save"
    p = subprocess.Popen([sys.executable, "-c", _KILLED_MID_SAVE, str(ck), str(marker)] + steps(4)
                         + ["--resume", str(ck), "--checkpoint", str(ck), "--checkpoint-every", "1",
                            "--out", str(tmp_path / "b")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         env=dict(os.environ, PYTHONPATH=str(os.path.dirname(os.path.dirname(train.__file__)))))
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert p.poll() is None, p.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the save to kill never started"
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    left = [f for f in os.listdir(ck.parent) if ".tmp." in f]
    assert left == [f"ckpt.pt.tmp.{p.pid}"], left  # the half-written file, beside the checkpoint
    assert ck.read_bytes() == before
    assert torch.load(ck, map_location="cpu", weights_only=False)["step"] == 2
    resumed = train.main(steps(4) + ["--resume", str(ck), "--checkpoint", str(ck), "--out", str(tmp_path / "c")])
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert all(abs(a["loss"] - b["loss"]) <= 1e-6 * b["loss"] for a, b in zip(resumed, full))
    assert not [f for f in os.listdir(ck.parent) if ".tmp." in f]  # the killed save's leftover removed
    assert torch.load(ck, map_location="cpu", weights_only=False)["step"] == 4


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    import torch
    ck = tmp_path / "ckpt.pt"
    train.atomic_save({"step": 1}, ck)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")
    with pytest.raises(RuntimeError, match="cannot pickle"):
        train.atomic_save({"step": 2, "bad": Unpicklable()}, ck)
    assert torch.load(ck)["step"] == 1 and os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.parametrize("mode", [[], ["--step-in-backward"]], ids=["updates=step", "updates=in-backward"])
def test_a_nonfinite_loss_stops_the_run_before_its_update(tmp_path, monkeypatch, mode):
    """A NaN loss (here at step 2) stops the CLI with a clear message before any weight or optimizer state takes
    it (before the backward when the updates run inside it); the checkpoint of step 2 stays, finite, and resuming from
    it continues the run. The CLI stepped first and read the loss after, with the weights already NaN."""
    import torch
    nt = pytest.importorskip("nntile_torch")
    real_loss, real_step = train.hf_loss, nt.optim.AdamW.step
    calls = {"loss": 0, "step": 0}

    def poisoned(model, ids):
        calls["loss"] += 1
        loss = real_loss(model, ids)
        return loss * float("nan") if calls["loss"] == 3 else loss

    def counted(self, *args, **kwargs):
        calls["step"] += 1
        return real_step(self, *args, **kwargs)
    monkeypatch.setattr(train, "hf_loss", poisoned)
    monkeypatch.setattr(nt.optim.AdamW, "step", counted)
    ck = tmp_path / "ckpt.pt"
    args = COMMON[:1] + ["4"] + COMMON[2:] + mode + ["--checkpoint", str(ck), "--checkpoint-every", "1",
                                                     "--out", str(tmp_path / "a")]
    with pytest.raises(SystemExit, match=r"the loss is nan at step 2; stopping before its update .* is as it was"):
        train.main(args)
    if not mode:
        assert calls["step"] == 2  # steps 0 and 1; with updates in backward step() only finishes them
    saved = torch.load(ck, map_location="cpu", weights_only=False)
    assert saved["step"] == 2 and all(torch.isfinite(v).all() for v in saved["model"].values())
    monkeypatch.setattr(train, "hf_loss", real_loss)
    resumed = train.main(args[:-2] + ["--resume", str(ck), "--out", str(tmp_path / "b")])
    assert [r["step"] for r in resumed] == [0, 1, 2, 3] and all(math.isfinite(r["loss"]) for r in resumed)
