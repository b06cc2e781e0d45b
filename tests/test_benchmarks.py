"""Smoke tests: the benchmarks and the main-job example run end to end at a tiny size and write their results."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=env, check=True, capture_output=True,
                          text=True, timeout=300)


def test_gemm_benchmark(tmp_path):
    run("benchmarks.gemm", "--size", "300", "--tiles", "128", "--reps", "2", "--warmup", "1", "--overhead-tasks",
        "500", "--out", "g.json", tmp_path=tmp_path)
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["gemm"][0]["rel_error"] < 1e-5 and d["gemm"][0]["nntile_tflops"] > 0
    assert d["task_overhead"][0]["tasks_per_s"] > 0


def test_linear_benchmark(tmp_path):
    run("benchmarks.linear", "--layers", "2", "--width", "96", "--rows", "70", "--tile", "32", "--precision", "fp32",
        "--reps", "2", "--warmup", "1", "--out", "l.json", tmp_path=tmp_path)
    d = json.loads((tmp_path / "l.json").read_text())
    assert d["nntile_s"] > 0 and d["torch_s"] > 0


def test_submission_benchmark(tmp_path):
    run("benchmarks.submission", "--layers", "2", "--width", "16", "--steps", "3", "--out", "s.json",
        tmp_path=tmp_path)
    d = json.loads((tmp_path / "s.json").read_text())
    assert d["params"] == 2 * 12 + 4 and d["tasks_per_step"] > 0  # 12 per block, embeddings, final norm
    assert d["forward_backward_s"] > 0 and d["optimizer_step_s"] > 0 and d["us_per_task"] > 0
    assert d["torch_forward_backward_s"] > 0 and d["torch_optimizer_step_s"] > 0


def test_mlp_example(tmp_path):
    out = run("nntile_torch.examples.mlp", "--steps", "5", "--width", "64", "--device", "cpu", "--out", "run",
              tmp_path=tmp_path)
    log = json.loads((tmp_path / "run" / "log.json").read_text())
    assert len(log["steps"]) == 5
    assert all(abs(s["loss"] - s["torch_loss"]) <= 1e-5 * s["torch_loss"] + 1e-7 for s in log["steps"])
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    assert "final loss" in out.stdout


def test_compare_runs(tmp_path):
    """Two training logs on one plot: the last window's mean loss and the gap to the first run, a PNG and a JSON;
    a label count that does not match the logs is refused."""
    from benchmarks.compare_runs import main, moving_average
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    paths = []
    for name, scale in (("a", 1.0), ("b", 1.1)):
        log = {"args": {"name": name}, "steps": [{"step": i, "loss": scale * (5.0 - i / 10)} for i in range(20)]}
        paths.append(str(tmp_path / f"{name}.json"))
        with open(paths[-1], "w") as f:
            json.dump(log, f)
    main(paths + ["--labels", "first", "second", "--window", "5", "--out", str(tmp_path / "c.png"),
                  "--json", str(tmp_path / "c.json")])
    summary = json.load(open(tmp_path / "c.json"))
    first, second = summary["runs"]
    assert first["final_mean_loss"] == pytest.approx(5.0 - 1.7) and first["minus_first"] == 0
    assert second["relative_to_first"] == pytest.approx(0.1) and os.path.getsize(tmp_path / "c.png") > 0
    with pytest.raises(SystemExit):
        main(paths + ["--labels", "only one"])
