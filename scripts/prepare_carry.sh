#!/usr/bin/env bash
# Gathers what the GPU machine lacks into .carry/ (git-ignored): the StarPU prefix (shared library, headers,
# pkg-config file, libhwloc) and, when given, a StarPU home with calibrated models (a tarball from $OUT) and the
# extension an earlier GPU call built ($OUT/prebuilt: used when the sources still match, which skips the build).
#   bash scripts/prepare_carry.sh [starpu_home.tgz [prebuilt_dir]]
set -euo pipefail
prefix=${STARPU_PREFIX:-/opt/nntile_torch/starpu-1.3.10}
cd "$(dirname "$0")/.."
rm -rf .carry/starpu && mkdir -p .carry/starpu/lib
cp -a "$prefix/include" "$prefix/.nntile_build" .carry/starpu/
cp -a "$prefix"/lib/libstarpu-1.3.so* "$prefix/lib/pkgconfig" .carry/starpu/lib/
hw=$(ldconfig -p | awk '/libhwloc.so.15 /{print $NF; exit}')
cp -L "$hw" .carry/starpu/lib/libhwloc.so.15 && ln -sf libhwloc.so.15 .carry/starpu/lib/libhwloc.so
if [ $# -ge 1 ]; then rm -rf .carry/starpu_home && mkdir -p .carry/starpu_home && tar xzf "$1" -C .carry/starpu_home; fi
if [ $# -ge 2 ] && [ -d "$2" ]; then mkdir -p .carry/prebuilt && cp -r "$2"/. .carry/prebuilt/; fi
du -sh .carry
