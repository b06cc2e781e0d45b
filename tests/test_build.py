"""How the extension is built: what it links."""
import subprocess

import nntile_torch


def test_extension_links_the_shared_cpp_runtime():
    """One C++ runtime in the process, torch's: a private static libstdc++ in the extension (the H200 machine's
    g++ linked one) made two sets of locale facet ids, and formatting a number into an error message crashed."""
    out = subprocess.run(["readelf", "-d", nntile_torch._C.__file__], capture_output=True, text=True, check=True)
    needed = [ln.split("[")[1].rstrip("]") for ln in out.stdout.splitlines() if "(NEEDED)" in ln]
    assert "libstdc++.so.6" in needed, needed


def _disassembly(symbol_part):
    """objdump's text of the extension's functions whose symbol contains symbol_part ({symbol: text}); None without
    nm/objdump."""
    import shutil
    if not (shutil.which("nm") and shutil.which("objdump")):
        return None
    so = nntile_torch._C.__file__
    syms = [ln.split()[-1] for ln in subprocess.run(["nm", so], capture_output=True, text=True, check=True)
            .stdout.splitlines() if symbol_part in ln and " t " in ln]
    return {s: subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={s}", so], capture_output=True,
                              text=True, check=True).stdout for s in syms}


def test_cpu_kernel_clones_use_wide_vectors():
    """The CPU AdamW kernels' AVX2 and AVX-512 clones (cpu_clones.h) hold their loops compiled for those levels (ymm,
    zmm registers): target_clones without `flatten` cloned only the outer functions, whose loops, in helpers, were
    compiled once for the baseline (SSE2), so the host blocks' updates ran at half the speed or less."""
    import platform
    if platform.machine() != "x86_64":
        import pytest
        pytest.skip("x86 clones only")
    found = _disassembly("adamw_bf16state_cpu")
    if found is None:
        import pytest
        pytest.skip("no nm/objdump")
    clones = {s.rsplit(".", 1)[-1]: text for s, text in found.items() if ".arch_" in s or s.endswith(".default")}
    assert set(clones) == {"arch_x86_64_v4", "arch_x86_64_v3", "default"}, sorted(found)
    assert "zmm" in clones["arch_x86_64_v4"] or "ymm" in clones["arch_x86_64_v4"]
    assert "ymm" in clones["arch_x86_64_v3"]
    assert "ymm" not in clones["default"] and "xmm" in clones["default"]
