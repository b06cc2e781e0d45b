#!/usr/bin/env bash
# Gathers what the GPU machine lacks into .carry/ (git-ignored): the StarPU prefix (shared library, headers,
# pkg-config file, libhwloc) and, when given, a StarPU home with calibrated models (a tarball from $OUT) and the
# extension an earlier GPU call built ($OUT/prebuilt: used when the sources still match, which skips the build).
# Also libaio's header and library (.carry/aio), which DeepSpeed's NVMe offload (async_io op) compiles against and
# the GPU machine may lack: Debian's libaio-dev and its library package, unpacked. And .carry/code_commit, the
# commit the harness records (the GPU machine's copy has no .git).
# StarPU 1.4 too, when built here (STARPU_VERSION=1.4 bash scripts/install_starpu.sh): .carry/starpu14, the library
# without its debug info (1.8 of 14 MB), for `STARPU_VERSION=1.4 bash dev/gpu_machine/h200.sh ...`; STARPU14_HOME_TGZ: the
# starpu14/starpu_home.tgz such a run returned (its models; without it, 1.4 starts from 1.3.10's kernel models).
# INDUCTOR_TGZ: the inductor_cache.tgz a bench call with compile variants returned, unpacked into .carry/inductor
# (dev/gpu_machine/h200.sh seeds TORCHINDUCTOR_CACHE_DIR from it: torch.compile then reuses its kernels).
#   bash dev/gpu_machine/prepare_carry.sh [starpu_home.tgz [prebuilt_dir]]
set -euo pipefail
prefix=${STARPU_PREFIX:-/opt/nntile_torch/starpu-1.3.10}
prefix14=${STARPU14_PREFIX:-/opt/nntile_torch/starpu-1.4.10}
cd "$(dirname "$0")/../.."
hw=$(ldconfig -p | awk '/libhwloc.so.15 /{print $NF; exit}')
rm -rf .carry/starpu && mkdir -p .carry/starpu/lib
cp -a "$prefix/include" "$prefix/.nntile_build" .carry/starpu/
cp -a "$prefix"/lib/libstarpu-1.3.so* "$prefix/lib/pkgconfig" .carry/starpu/lib/
cp -L "$hw" .carry/starpu/lib/libhwloc.so.15 && ln -sf libhwloc.so.15 .carry/starpu/lib/libhwloc.so
rm -rf .carry/starpu14 .carry/starpu_home_starpu14
if [ -f "$prefix14/lib/pkgconfig/starpu-1.4.pc" ]; then
  mkdir -p .carry/starpu14/lib
  cp -a "$prefix14/include" "$prefix14/.nntile_build" .carry/starpu14/
  cp -a "$prefix14"/lib/libstarpu-1.4.so* "$prefix14/lib/pkgconfig" .carry/starpu14/lib/
  for f in .carry/starpu14/lib/libstarpu-1.4.so*; do [ -L "$f" ] || strip --strip-debug "$f"; done
  cp -L "$hw" .carry/starpu14/lib/libhwloc.so.15 && ln -sf libhwloc.so.15 .carry/starpu14/lib/libhwloc.so
  if [ -n "${STARPU14_HOME_TGZ:-}" ]; then
    mkdir -p .carry/starpu_home_starpu14 && tar xzf "$STARPU14_HOME_TGZ" -C .carry/starpu_home_starpu14
  fi
fi
if [ $# -ge 1 ]; then rm -rf .carry/starpu_home && mkdir -p .carry/starpu_home && tar xzf "$1" -C .carry/starpu_home; fi
if [ $# -ge 2 ] && [ -d "$2" ]; then mkdir -p .carry/prebuilt && cp -r "$2"/. .carry/prebuilt/; fi
if [ -n "${INDUCTOR_TGZ:-}" ]; then
  rm -rf .carry/inductor && mkdir -p .carry/inductor && tar xzf "$INDUCTOR_TGZ" -C .carry/inductor
fi
# The commit the GPU machine's copy comes from (it has no .git), for the harness's records: benchmarks/run.py's
# own reading of it, written where that function looks when git is not there.
rm -f .carry/code_commit
commit=$(python3 -c "from benchmarks.run import code_commit; print(code_commit() or '')")
[ -n "$commit" ] && echo "$commit" >.carry/code_commit
rm -rf .carry/aio && mkdir -p .carry/aio/include .carry/aio/lib
tmp=$(mktemp -d)
if (cd "$tmp" && apt-get download libaio-dev >/dev/null 2>&1 \
      && { apt-get download libaio1t64 >/dev/null 2>&1 || apt-get download libaio1 >/dev/null 2>&1; }); then
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
  cp "$tmp"/root/usr/include/libaio.h .carry/aio/include/
  cp -a "$tmp"/root/usr/lib/x86_64-linux-gnu/libaio.so* .carry/aio/lib/
else
  echo "warning: libaio packages not downloadable; DeepSpeed's nvme variant will depend on the GPU machine's" >&2
  rm -rf .carry/aio
fi
rm -rf "$tmp"
du -sh .carry
