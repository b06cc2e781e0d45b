#!/usr/bin/env bash
# Installs everything nntile_torch needs on a fresh Debian 12/13 machine and builds the extension in place:
# apt packages, pip packages, StarPU (cached under /opt/nntile_torch, see install_starpu.sh), then _C.
# Idempotent: a second run takes seconds. Runs as root, or as a user with sudo for the apt and /opt steps.
# Stops at the first step that fails, saying which and why.
#   PYTHON                 the interpreter (default python3)
#   NNTILE_TORCH_SPEC      the torch to install (default torch==2.14.1, a CUDA build)
#   TORCH_CUDA_ARCH_LIST   GPU archs to build for (default here: the GPU's, or 9.0 without one: one arch keeps
#                          the build short; setup.py alone builds the common archs, docs/tuning.md)
#   MAX_JOBS               compile jobs (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build

fail() { echo "setup.sh: $*" >&2; exit 1; }

as_root() {  # apt and /opt need root: directly as root, else through sudo
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else fail "'$*' needs root: run setup.sh as root, or install sudo"; fi
}

if command -v apt-get >/dev/null; then
  need=()
  for p in build-essential pkg-config libhwloc-dev dpkg-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  if [ ${#need[@]} -gt 0 ]; then
    { as_root apt-get update -qq && as_root apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
      >build/apt.log 2>&1 || { tail -20 build/apt.log >&2; fail "installing ${need[*]} with apt-get failed (above)"; }
  fi
else
  for t in c++ pkg-config; do command -v $t >/dev/null || fail "no apt-get, and $t is missing: install a C++ compiler, pkg-config and hwloc"; done
fi

py=${PYTHON:-python3}
command -v "$py" >/dev/null || fail "no $py (set PYTHON to a Python >= 3.10)"
# torch 2.14.1 is a CUDA build, so the CUDA sources compile even on a machine without a GPU.
PIP_ROOT_USER_ACTION=ignore $py -m pip install --disable-pip-version-check "${NNTILE_TORCH_SPEC:-torch==2.14.1}" \
  numpy pytest tqdm matplotlib transformers==5.17.0 ninja setuptools wheel >build/pip.log 2>&1 \
  || { tail -30 build/pip.log >&2
       grep -q externally-managed-environment build/pip.log && fail "$py is the system's (PEP 668): make a venv" \
         "first (python3 -m venv ~/venv && . ~/venv/bin/activate) and run again, or set PYTHON to another Python"
       grep -q "No module named pip" build/pip.log && fail "$py has no pip: apt-get install python3-pip python3-venv"
       fail "pip install failed (above; the whole log: build/pip.log)"; }

bash scripts/install_starpu.sh || fail "building StarPU failed (above)"

if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  # One arch: the GPU's when there is one, else 9.0 (the CI machine compiles the CUDA code but has no GPU).
  TORCH_CUDA_ARCH_LIST=$($py -c "import torch; print('%d.%d' % torch.cuda.get_device_capability() if torch.cuda.is_available() else '9.0')" 2>/dev/null || echo 9.0)
  export TORCH_CUDA_ARCH_LIST
fi
MAX_JOBS=${MAX_JOBS:-$(nproc)} $py setup.py -q build_ext --inplace >build/setup.log 2>&1 || {
  grep -m20 -B2 -A6 -i error build/setup.log >&2 || tail -40 build/setup.log >&2
  fail "building the extension failed (above; the whole log: build/setup.log)"; }
$py -c "import nntile_torch as nt; print('nntile_torch ready: StarPU', nt.info()['starpu_version'], 'workers', nt.info()['workers'])" \
  || fail "the built extension does not import (above)"
