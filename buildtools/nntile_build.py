"""PEP 517 build backend for nntile_torch: setuptools' own, with the installed torch made importable.

The extension must be compiled against the torch it will run with (its headers and C++ ABI). pip builds in an
isolated environment by default, which holds only the build requirements; declaring torch there would download a
fresh one, maybe another version or a CPU-only wheel. So torch is no build requirement: this module asks the same
interpreter, started without the isolation's paths (python -I), where its torch lives, and appends that
site-packages to sys.path, after the isolated environment's own (its setuptools wins). With --no-build-isolation
torch is importable already and nothing changes.
"""
import os
import subprocess
import sys

_FIND_TORCH = "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"


def _make_torch_importable():
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE")}
    r = subprocess.run([sys.executable, "-I", "-c", _FIND_TORCH], env=env, capture_output=True, text=True)
    site = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    if not site or not os.path.isdir(site):
        raise SystemExit(
            "nntile_torch compiles against the torch already installed, and the interpreter running pip "
            f"({sys.executable}) has none: install torch first (pip install torch; on a GPU machine its CUDA "
            "wheel), then pip install this package again")
    if site not in sys.path:
        sys.path.append(site)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), site) if p)


_make_torch_importable()

from setuptools.build_meta import (  # noqa: E402,F401  (the PEP 517 and PEP 660 hooks)
    build_editable, build_sdist, build_wheel, get_requires_for_build_editable, get_requires_for_build_sdist,
    get_requires_for_build_wheel, prepare_metadata_for_build_editable, prepare_metadata_for_build_wheel)
