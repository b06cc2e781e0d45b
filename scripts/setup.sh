#!/usr/bin/env bash
# Installs everything nntile_torch needs on a fresh Debian 12/13 machine and builds the extension in place:
# apt packages, StarPU (cached under /opt/nntile_torch, see install_starpu.sh), pip packages, then _C.
# Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""; [ "$(id -u)" != 0 ] && sudo=sudo
if command -v apt-get >/dev/null; then
  need=()
  for p in build-essential pkg-config libhwloc-dev dpkg-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
  if [ ${#need[@]} -gt 0 ]; then
    $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
py=${PYTHON:-python3}
# torch 2.14.1 is a CUDA build, so the CUDA sources compile even on a machine without a GPU.
$py -m pip install -q --disable-pip-version-check "${NNTILE_TORCH_SPEC:-torch==2.14.1}" numpy pytest tqdm matplotlib transformers==5.17.0 \
  ninja setuptools wheel 2>&1 | grep -v -e "^WARNING: Location" -e "Running pip as the 'root'" || true
bash scripts/install_starpu.sh
mkdir -p build
MAX_JOBS=${MAX_JOBS:-$(nproc)} $py setup.py -q build_ext --inplace >build/setup.log 2>&1 || {
  mkdir -p build; grep -m20 -B2 -A6 -i error build/setup.log || tail -40 build/setup.log; exit 1; }
$py -c "import nntile_torch as nt; print('nntile_torch ready: StarPU', nt.info()['starpu_version'], 'workers', nt.info()['workers'])"
