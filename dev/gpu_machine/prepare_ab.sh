#!/usr/bin/env bash
# Puts an older commit beside this tree for an A/B in one GPU call (dev/gpu_machine/h200.sh ab): its sources in
# .carry/old (git archive, records left out), and when its scripts/install_starpu.sh builds another StarPU than the
# one this tree carries (another build id: an older patch level), that StarPU too, built here by the commit's own
# script into /opt/nntile_torch/ab-<commit>/ and carried as .carry/old_starpu (library without debug info), so that
# each side runs on the StarPU its commit was measured with. Run dev/gpu_machine/prepare_carry.sh first (it makes
# .carry/starpu); this adds to it. STARPU_COMMIT: the old side's StarPU is the one that commit's scripts build instead
# (this tree on the StarPU of 5cadbed: `prepare_ab.sh HEAD 5cadbed`, which splits a change of speed between the code
# and the StarPU build).
#   bash dev/gpu_machine/prepare_ab.sh COMMIT [STARPU_COMMIT]
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 COMMIT [STARPU_COMMIT]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
rev=$(git rev-parse --short "$1^{commit}")
srev=$(git rev-parse --short "${2:-$1}^{commit}")
rm -rf .carry/old .carry/old_starpu
mkdir -p .carry/old
git archive "$rev" -- . ':!benchmarks/results' | tar -x -C .carry/old
scripts=$(mktemp -d)
git archive "$srev" -- scripts | tar -x -C "$scripts"
echo "$rev (StarPU of $srev)" >.carry/old/.ab_commit
build_id() { sed -n 's/^build_id="\(.*\)".*/\1/p' "$1"; }
ours=$(build_id scripts/install_starpu.sh)
theirs=$(build_id "$scripts/scripts/install_starpu.sh")
if [ "$ours" != "$theirs" ]; then
  prefix=/opt/nntile_torch/ab-$srev/starpu-1.3.10
  echo "$srev builds StarPU '$theirs' (this tree: '$ours'): building it in $prefix"
  STARPU_PREFIX=$prefix bash "$scripts/scripts/install_starpu.sh" | tail -2
  mkdir -p .carry/old_starpu/lib
  cp -a "$prefix/include" "$prefix/.nntile_build" .carry/old_starpu/
  cp -a "$prefix"/lib/libstarpu-1.3.so* "$prefix/lib/pkgconfig" .carry/old_starpu/lib/
  for f in .carry/old_starpu/lib/libstarpu-1.3.so*; do [ -L "$f" ] || strip --strip-debug "$f"; done
  cp -a .carry/starpu/lib/libhwloc.so* .carry/old_starpu/lib/
  # pkg-config's prefix is where the GPU machine installs it (h200.sh ab)
  sed -i "s#^prefix=.*#prefix=/opt/nntile_torch/ab-old/starpu-1.3.10#" .carry/old_starpu/lib/pkgconfig/*.pc
else
  echo "$srev builds the same StarPU as this tree ('$ours')"
fi
rm -rf "$scripts"
du -sh .carry
