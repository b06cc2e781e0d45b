"""The README's example runs as printed (on the CPU here; on the GPU where there is one), all in tiles."""
import pathlib
import re

from conftest import run_python

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_example_trains():
    text = README.read_text()
    example = text.split("## Example", 1)[1]
    code = re.search(r"```python\n(.*?)```", example, re.S).group(1)
    rc, out, err = run_python(code, 300, what="the README's example")
    assert rc == 0, err[-3000:]
    # HF's GPT2Config defaults (attn_pdrop = 0.1 among them) train in tiles: no dense fallback named on stderr
    assert "run as dense torch code" not in err and "ran as dense torch code" not in err, err[-3000:]
    losses = [float(line.split()[1]) for line in out.splitlines() if line.strip()]
    assert len(losses) == 20 and losses[-1] < losses[0], out
