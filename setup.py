"""Builds nntile_torch._C with torch's cpp_extension against the torch already installed: CUDA sources when torch
has CUDA and nvcc exists, a CPU-only build otherwise (NNTILE_FORCE_CPU=1 forces it). StarPU 1.3 (or 1.4 for a 1.4
prefix) comes from pkg-config (starpu-1.3.pc, starpu-1.4.pc) or STARPU_PREFIX (default
/opt/nntile_torch/starpu-1.3.10); `bash scripts/install_starpu.sh` installs it. The package metadata is in
pyproject.toml; `pip install .` works with pip's build isolation (buildtools/nntile_build.py says how)."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup

# torch guesses CUDA_HOME from the nvcc on PATH; a toolkit under /usr/local/cuda with nvcc linked elsewhere
# would then be missed (and -lcudart with it).
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
from torch.utils import cpp_extension  # noqa: E402

DEFAULT_STARPU_PREFIX = "/opt/nntile_torch/starpu-1.3.10"


def starpu_series(pc_dir):
    """The prefix's StarPU series: "1.4" where starpu-1.4.pc is there (a 1.4 install also writes the older series'
    .pc files), "1.3" where only starpu-1.3.pc is, None for no prefix (pkg-config then looks for 1.3, then 1.4)."""
    for series in ("1.4", "1.3"):
        if os.path.exists(os.path.join(pc_dir, f"starpu-{series}.pc")):
            return series
    return None


def pkg_config(*args):
    env = dict(os.environ)
    prefix = os.environ.get("STARPU_PREFIX", DEFAULT_STARPU_PREFIX)
    default_pc = os.path.join(prefix, "lib", "pkgconfig")
    series = starpu_series(default_pc)
    if shutil.which("pkg-config") is None and series:
        # No pkg-config on this machine (the GPU box has none): the prefix's layout is known.
        return {"--cflags-only-I": ["-I" + os.path.join(prefix, "include", "starpu", series)],
                "--libs-only-L": ["-L" + os.path.join(prefix, "lib")],
                "--libs-only-l": [f"-lstarpu-{series}"]}[args[0]]
    env["PKG_CONFIG_PATH"] = ":".join(p for p in (env.get("PKG_CONFIG_PATH", ""), default_pc) if p)
    for name in [f"starpu-{series}"] if series else ["starpu-1.3", "starpu-1.4"]:
        try:
            return subprocess.check_output(["pkg-config", *args, name], env=env, text=True,
                                           stderr=subprocess.DEVNULL).split()
        except (OSError, subprocess.CalledProcessError):
            pass
    raise SystemExit(
        "nntile_torch: StarPU 1.3 (or 1.4) not found (pkg-config starpu-1.3 / starpu-1.4, PKG_CONFIG_PATH=%s).\n"
        "Install it with:\n    bash scripts/install_starpu.sh\n"
        "(Debian/Ubuntu; builds StarPU 1.3.10 with this project's patches into %s, with sudo unless root; "
        "STARPU_PREFIX=DIR installs elsewhere and then points this build there), or set STARPU_PREFIX to an "
        "existing installation." % (env["PKG_CONFIG_PATH"], prefix))


def want_cuda():
    import torch
    if os.environ.get("NNTILE_FORCE_CPU") == "1":
        return False
    return torch.version.cuda is not None and (shutil.which("nvcc") or os.path.exists(
        os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")))


def nvidia_wheel_dirs():
    """cuBLAS headers/libraries from torch's nvidia-* wheels, for CUDA toolkits that ship nvcc alone."""
    try:
        import nvidia
    except ImportError:
        return [], []
    inc, lib = [], []
    for root in nvidia.__path__:
        for sub in ("cu13", "cublas"):
            if os.path.exists(os.path.join(root, sub, "include", "cublas_v2.h")):
                inc.append(os.path.join(root, sub, "include"))
                lib.append(os.path.join(root, sub, "lib"))
    return inc, lib


# The data-centre and consumer GPUs of the last generations (A100, A10/RTX 30, L4/L40/RTX 40, H100/H200, B200,
# RTX 50), those the installed nvcc can build; PTX of the newest for later ones. scripts/setup.sh builds one arch
# (the GPU's, or 9.0) unless TORCH_CUDA_ARCH_LIST is set: the CI machine compiles but has no GPU.
DEFAULT_CUDA_ARCHS = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]


def default_cuda_arch_list():
    nvcc = shutil.which("nvcc") or os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
    try:
        listed = subprocess.check_output([nvcc, "--list-gpu-arch"], text=True, stderr=subprocess.DEVNULL).split()
        known = {a.split("_")[1] for a in listed if a.startswith("compute_")}
        archs = [a for a in DEFAULT_CUDA_ARCHS if a.replace(".", "") in known] or DEFAULT_CUDA_ARCHS[:4]
    except (OSError, subprocess.CalledProcessError, IndexError):
        archs = DEFAULT_CUDA_ARCHS[:4]
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


def torch_requirement():
    """The torch this build compiles against (its C++ ABI): the wheel installs only beside the same release."""
    import torch
    return "torch==" + torch.__version__.split("+")[0]


here = os.path.dirname(os.path.abspath(__file__))
cuda = want_cuda()
sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
if cuda:
    sources += sorted(glob.glob("csrc/**/*.cu", recursive=True))

starpu_inc = [f[2:] for f in pkg_config("--cflags-only-I")]
starpu_libdirs = [f[2:] for f in pkg_config("--libs-only-L")]
starpu_libs = [f[2:] for f in pkg_config("--libs-only-l")]

include_dirs = starpu_inc
library_dirs = list(starpu_libdirs)
libraries = list(starpu_libs)
cxx_flags = ["-O3", "-std=c++20", "-ffp-contract=off", "-fopenmp", "-fno-math-errno", f"-fmacro-prefix-map={here}/="]  # error messages name csrc/...
link_args = ["-fopenmp"] + ["-Wl,-rpath," + d for d in starpu_libdirs]
if sys.platform.startswith("linux"):
    # The C++ runtime torch itself uses, shared. The H200 machine's g++ linked a private static copy into the
    # extension (no libstdc++.so.6 among its needed libraries), and the process then held two C++ runtimes whose
    # locale facet ids disagree: formatting a number into an error message crashed (SIGSEGV in
    # ostream::_M_insert<long>) instead of raising. tests/test_build.py checks the result.
    link_args.append("-l:libstdc++.so.6")
define_macros = []
extra = {"cxx": cxx_flags}
if cuda:
    define_macros.append(("NNTILE_USE_CUDA", None))
    inc, lib = nvidia_wheel_dirs()
    have_toolkit_cublas = glob.glob(os.path.join(cpp_extension.CUDA_HOME or "", "lib64", "libcublas.so*"))
    if not have_toolkit_cublas and lib:
        include_dirs += inc
        # Link against the wheel's versioned libraries; at run time torch has already loaded them.
        shim = os.path.join(here, "build", "cublas_shim")
        os.makedirs(shim, exist_ok=True)
        for name in ("libcublas", "libcublasLt"):
            target = sorted(glob.glob(os.path.join(lib[0], name + ".so.*")))[0]
            link = os.path.join(shim, name + ".so")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
        library_dirs.append(shim)
    libraries += ["cublas", "cublasLt"]
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", default_cuda_arch_list())
    extra["nvcc"] = ["-O3", "-std=c++20", f"-Xcompiler=-fmacro-prefix-map={here}/="] + ["-I" + d for d in inc]
    Ext = cpp_extension.CUDAExtension
else:
    Ext = cpp_extension.CppExtension

setup(
    install_requires=[torch_requirement(), "tqdm"],
    ext_modules=[Ext("nntile_torch._C", sources, include_dirs=include_dirs, library_dirs=library_dirs,
                     libraries=libraries, define_macros=define_macros, extra_compile_args=extra,
                     extra_link_args=link_args)],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
