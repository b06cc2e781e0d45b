"""benchmarks/loss_curves.py on the CPU at a tiny config: the record's structure, falling losses, fp32 on nntile
tracking PyTorch step for step, the time budget stopping a variant, and a clear error for an unknown variant."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers is installed by scripts/setup.sh")
pytest.importorskip("matplotlib", reason="matplotlib is installed by scripts/setup.sh")
from benchmarks import loss_curves  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--device", "cpu", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--seq", "32", "--batch", "4",
        "--corpus-bytes", "200000", "--lr", "3e-3", "--warmup", "2"]


def run_cli(*args, timeout=240):
    # One torch thread: a tiny model's ops spin-waited for a second core that another process held (0.5 s a step).
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "benchmarks.loss_curves", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def curves(tmp_path_factory):
    out = tmp_path_factory.mktemp("curves")
    stdout = run_cli(*TINY, "--variants", "ref,fp32", "--steps", "12", "--budget", "200", "--out", str(out))
    return {"out": out, "stdout": stdout, "record": json.loads((out / "loss_curves.json").read_text())}


def test_record_has_its_fields_and_files(curves):
    rec, out = curves["record"], curves["out"]
    assert {"config", "commit", "device", "variants", "parameters", "init_sha256", "command", "wall_s"} <= rec.keys()
    assert rec["config"]["steps"] == 12 and rec["config"]["variants"] == ["ref", "fp32"]
    assert rec["device"]["machine"] == "cpu" and rec["device"]["type"] == "cpu" and rec["device"]["torch"]
    assert list(rec["variants"]) == ["ref", "fp32"]
    for name, v in rec["variants"].items():
        assert v["status"] == "ok", f"{name}: {v['status']}: {v['reason']}"
        assert v["steps"] == len(v["losses"]) == 12 and v["seconds"] > 0 and v["settings"]
        assert v["final_loss"] == pytest.approx(sum(v["losses"]) / 12)  # fewer than 50 steps: all of them
    assert rec["variants"]["ref"]["rel_diff_to_ref"] is None
    assert rec["variants"]["fp32"]["compared_at"] == [0, 11]
    assert rec["variants"]["fp32"]["settings"]["nntile"]["workers"]
    summary = (out / "summary.md").read_text()
    assert "| ref |" in summary and "| fp32 |" in summary
    assert "python -m benchmarks.loss_curves" in (out / "README.md").read_text()
    assert "--out <output folder>" in rec["command"] and str(out) not in (out / "README.md").read_text()
    assert (out / "loss_curves.png").stat().st_size > 1000
    assert summary.strip() in curves["stdout"]  # the table is printed last
    assert "[fp32] step 12/12" in curves["stdout"]  # progress lines, prefixed with the variant


def test_losses_fall(curves):
    for name, v in curves["record"]["variants"].items():
        losses = v["losses"]
        assert losses[0] > 5.0  # ln(256) = 5.55 at the start: a byte vocabulary, untrained
        assert sum(losses[-3:]) / 3 < losses[0] - 0.5, f"{name}: {losses}"


def test_fp32_tracks_ref_step_for_step(curves):
    v = curves["record"]["variants"]
    ref, fp32 = v["ref"]["losses"], v["fp32"]["losses"]
    # The same initial weights and batches: step 1 is the same forward; fp32 rounding apart for the next few.
    for step in range(5):
        assert abs(fp32[step] - ref[step]) < 1e-4, (step, fp32[:5], ref[:5])
    assert abs(v["fp32"]["rel_diff_to_ref"]) < 1e-3


def test_budget_stops_a_variant_and_says_how_far_it_got(tmp_path):
    run_cli(*TINY, "--variants", "ref", "--steps", "1000000", "--budget", "15", "--out", str(tmp_path))
    v = json.loads((tmp_path / "loss_curves.json").read_text())["variants"]["ref"]
    assert v["status"] == "stopped" and f"ran out after {v['steps']} steps" in v["reason"], v["reason"]
    assert v["steps"] < 1000000 and v["seconds"] < 15 + 5


def test_unknown_variant_is_an_error_naming_the_known_ones(capsys):
    with pytest.raises(SystemExit) as e:
        loss_curves.parse_args(["--variants", "ref,adam8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown variant(s) adam8" in err and "bf16master" in err and "q8" in err


def test_relative_difference_is_over_the_steps_both_reached():
    recs = {"ref": {"losses": [4.0] * 100 + [2.0] * 100, "step_times_s": [1.0]},
            "q8": {"losses": [4.4] * 100, "step_times_s": [1.0]}}  # stopped halfway
    loss_curves.summarize(recs)
    assert recs["ref"]["final_loss"] == 2.0 and recs["q8"]["final_loss"] == pytest.approx(4.4)
    assert recs["q8"]["rel_diff_to_ref"] == pytest.approx(0.1) and recs["q8"]["compared_at"] == [50, 99]


def test_the_recorded_command_names_an_output_folder_outside_the_repository_by_a_placeholder():
    """A record carries no path of the machine that made it (a GPU call's output folder): --out shows as a path in
    the repository where it is one, else as a placeholder; the other arguments as given."""
    inside = os.path.join(ROOT, "benchmarks", "results", "x")
    assert loss_curves.recorded_command(["--steps", "5", "--out", inside], inside) == \
        "python -m benchmarks.loss_curves --steps 5 --out benchmarks/results/x"
    assert loss_curves.recorded_command(["--out=/elsewhere/curves", "--budget", "9"], "/elsewhere/curves") == \
        "python -m benchmarks.loss_curves --out=<output folder> --budget 9"
    assert loss_curves.recorded_command([], "/elsewhere") == "python -m benchmarks.loss_curves"
