#!/usr/bin/env bash
# Builds StarPU from Debian's source package into a fixed prefix outside the repo (with CUDA when nvcc exists).
# Idempotent: a second run only checks the prefix and returns in seconds.
#   STARPU_VERSION  1.3.10 (default: the release this project is built and tested on, Debian 12's) or 1.4
#                   (= 1.4.10, Debian sid's; trixie lists 1.4.7 but the archive no longer serves its files), for an
#                   A/B of the two series (docs/starpu_versions.md)
#   STARPU_PREFIX   where to install (default /opt/nntile_torch/starpu-<version>, e.g. starpu-1.3.10)
#   STARPU_SRC      an already unpacked source tree to build instead of fetching one (e.g. on the GPU box)
#   STARPU_JOBS     make -j (default: all cores)
set -euo pipefail

case ${STARPU_VERSION:-1.3.10} in
  1.3.10) release=1.3.10 version=1.3.10+dfsg-2 suite=bookworm sources=nntile-starpu-src ;;
  1.4|1.4.10) release=1.4.10 version=1.4.10+dfsg-2 suite=sid sources=nntile-starpu14-src ;;
  *) echo "error: STARPU_VERSION must be 1.3.10 or 1.4 (got ${STARPU_VERSION})" >&2; exit 1 ;;
esac
series=${release%.*}  # 1.3 or 1.4: the name of the library and of its pkg-config file
prefix=${STARPU_PREFIX:-/opt/nntile_torch/starpu-$release}
here=$(cd "$(dirname "$0")" && pwd)

nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
want_cuda=no; [ -n "$nvcc_bin" ] && want_cuda=yes

# What the build was made with; a prefix built otherwise (or by an older version of this script) is rebuilt.
build_id="cuda=$want_cuda maxcpus=128 maxcudadev=8 v10"  # v3: host memory size; v4: eviction settings; v5: GPU buffer pool; v6: no device reset; v7: patch level marker; v8: no abort on a negative task time, patch level 2; v9: no idle writes to disk nodes on won't-use, patch level 3; v10: full disk nodes free what is not a sole copy, patch level 4 (scripts/patch_starpu.py)
[ "$release" != 1.3.10 ] && build_id="starpu=$release $build_id"
stamp="$prefix/.nntile_build"
if [ -f "$stamp" ] && grep -qx "$build_id" "$stamp" && [ -f "$prefix/lib/pkgconfig/starpu-$series.pc" ]; then
  echo "StarPU already installed in $prefix ($build_id)"
  exit 0
fi

# Root's steps (apt, the prefix when its parent is not writable): directly as root, else through sudo.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "error: '$*' needs root: run as root, install sudo, or set STARPU_PREFIX to a directory you can write" >&2; exit 1; fi
}
parent=$prefix; while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
install_as=as_root; [ -w "$parent" ] && install_as=""
if [ -z "${STARPU_SRC:-}" ]; then
  if command -v apt-get >/dev/null; then
    # Source lines for the suite that carries the release: bookworm's 1.3.10 is the release this project is built
    # and tested on (Debian 12 and 13); sid's 1.4.10 the alternative. Source lines only: no binary comes from sid.
    if ! apt-cache showsrc starpu 2>/dev/null | grep -qx "Version: $version"; then
      as_root tee "/etc/apt/sources.list.d/$sources.sources" >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
      as_root apt-get update -qq
    fi
    as_root apt-get install -y -qq --no-install-recommends dpkg-dev build-essential pkg-config libhwloc-dev >/dev/null
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get source -qq "starpu=$version" >/dev/null 2>&1) || {
    echo "error: could not fetch Debian's source package starpu=$version (deb-src for $suite needed)" >&2; exit 1; }
  src=$(ls -d "$work"/starpu-"$release"*/ | head -1)
else
  src=$STARPU_SRC
fi

python3 "$here/patch_starpu.py" "$src"
if [ "$want_cuda" = yes ]; then
  cuda_dir=$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")
  cuda_flags=(--enable-cuda --enable-maxcudadev=8 --with-cuda-dir="$cuda_dir")
  # A CUDA toolkit without cuBLAS (nvcc alone): take cuBLAS from the nvidia-cublas wheel that torch brings.
  # libstarpu records the soname libcublas.so.13, which torch's own wheel provides at run time.
  if ! ls "$cuda_dir"/lib64/libcublas.so* >/dev/null 2>&1; then
    nv=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null || true)
    [ -f "$nv/include/cublas_v2.h" ] || { echo "error: cuBLAS not found in $cuda_dir nor in a pip nvidia-cublas wheel (pip install torch first)" >&2; exit 1; }
    shim=$(mktemp -d); ln -s "$nv"/lib/libcublas.so.* "$shim/"; ln -s "$nv"/lib/libcublasLt.so.* "$shim/"
    ln -s "$(ls "$nv"/lib/libcublas.so.* | head -1)" "$shim/libcublas.so"
    export CPPFLAGS="${CPPFLAGS:-} -I$nv/include" LDFLAGS="${LDFLAGS:-} -L$shim -Wl,-rpath-link,$shim"
    export NVCCFLAGS="${NVCCFLAGS:-} -I$nv/include"
  fi
else
  cuda_flags=(--disable-cuda)
fi
# configure would size the worker table to this machine's cores; the GPU boxes have 16 to 128.
cuda_flags+=(--enable-maxcpus=128)
# 1.4's new parts, off like the others: the Python interface (built when Python's headers are found) and the
# HIP driver (probed when CUDA is off)
[ "$series" = 1.4 ] && cuda_flags+=(--disable-starpupy --disable-hip)

cd "$src"
./configure --prefix="$prefix" "${cuda_flags[@]}" \
  --disable-opencl --disable-fortran --disable-build-examples --disable-build-tests --disable-build-doc \
  --disable-socl --disable-starpufft --disable-mpi --disable-glpk --disable-starpurm --disable-static \
  --disable-hdf5 --disable-leveldb ${STARPU_CONFIGURE_EXTRA:-} >configure.log 2>&1 || { tail -40 configure.log; exit 1; }
make -j"${STARPU_JOBS:-$(nproc)}" >make.log 2>&1 || { grep -B2 -A8 -m5 -e 'error:' -e 'Error [0-9]' make.log; exit 1; }
# Installed beside the prefix, then renamed into place: processes building against the prefix or starting meanwhile
# see the old StarPU or the new one, never a prefix half removed (running ones keep the library they mapped).
stage="$(dirname "$prefix")/.stage-$(basename "$prefix")-$$"
$install_as rm -rf "$stage" && $install_as mkdir -p "$stage"
$install_as make install DESTDIR="$stage" >install.log 2>&1 || { tail -20 install.log; $install_as rm -rf "$stage"; exit 1; }
echo "$build_id" | $install_as tee "$stage$prefix/.nntile_build" >/dev/null
$install_as rm -rf "$prefix.old"
[ -e "$prefix" ] && $install_as mv "$prefix" "$prefix.old"
$install_as mv "$stage$prefix" "$prefix"
$install_as rm -rf "$prefix.old" "$stage"
echo "StarPU installed in $prefix ($build_id)"
