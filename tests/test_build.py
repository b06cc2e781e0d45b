"""How the extension is built: what it links."""
import subprocess

import nntile_torch


def test_extension_links_the_shared_cpp_runtime():
    """One C++ runtime in the process, torch's: a private static libstdc++ in the extension (the H200 machine's
    g++ linked one) made two sets of locale facet ids, and formatting a number into an error message crashed."""
    out = subprocess.run(["readelf", "-d", nntile_torch._C.__file__], capture_output=True, text=True, check=True)
    needed = [ln.split("[")[1].rstrip("]") for ln in out.stdout.splitlines() if "(NEEDED)" in ln]
    assert "libstdc++.so.6" in needed, needed
