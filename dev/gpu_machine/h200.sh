#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool): installs the StarPU prefix carried in .carry/starpu, builds
# the extension against the machine's torch, then runs what is asked: tests, gputests, cpuadamw (the CPU AdamW
# kernel), nodes (memory as StarPU sees it), gemm, submission, decode, linear, ab (benchmarks), train (main job), mlp,
# profile, multigpu, rates (the plan's rates measured here), bench (the harness, plans in BENCH_ARGS), generate (HF generate() tokens/s beside torch), curves
# (loss curves of every optimizer-state precision beside torch, CURVES_ARGS).
# Logs go to $OUT.
#   bash dev/gpu_machine/h200.sh tests gemm
# STARPU_VERSION=1.4 runs the same steps on StarPU 1.4.10 (carried in .carry/starpu14) instead of 1.3.10: logs
# under $OUT/starpu14, its own STARPU_HOME (kernel models seeded from the carried 1.3.10 home, the same file format,
# 45; no bus figures, so 1.4 calibrates the bus) and prebuilt extension key. An A/B in one call:
#   bash dev/gpu_machine/h200.sh bench; STARPU_VERSION=1.4 bash dev/gpu_machine/h200.sh bench
# The harness's model families and variants pass through BENCH_ARGS (plans joined by ';'), e.g.
#   BENCH_ARGS="--model hf,hf-tanh --backend nntile,torch:compile,fsdp2:compile --config xl --steps 3" \
#     bash dev/gpu_machine/h200.sh bench
# DEVICE_DEADLINE=$(( $(date +%s) + LIMIT - 20 )) set at a call's start keeps the bench step's attempts inside the call.
# Prepare the carry here first: bash dev/gpu_machine/prepare_carry.sh
set -uo pipefail
OUT=${OUT:-/tmp/nntile_out}
case ${STARPU_VERSION:-1.3.10} in
  1.3.10) prefix=/opt/nntile_torch/starpu-1.3.10 carried=.carry/starpu tag="" ;;
  1.4|1.4.10) prefix=/opt/nntile_torch/starpu-1.4.10 carried=.carry/starpu14 tag=starpu14 ;;
  *) echo "STARPU_VERSION must be 1.3.10 or 1.4 (got $STARPU_VERSION)"; exit 2 ;;
esac
prebuilt_out=$OUT/prebuilt  # one folder for the extensions built against either StarPU (their keys differ)
[ -n "$tag" ] && OUT=$OUT/$tag
mkdir -p "$OUT"
if [ -d "$carried" ] && [ ! -f "$prefix/.nntile_build" ]; then
  mkdir -p "$(dirname "$prefix")" && cp -a "$carried" "$prefix"
fi
[ -f "$prefix/.nntile_build" ] || { echo "no StarPU in $prefix (carry $carried: dev/gpu_machine/prepare_carry.sh)"; exit 1; }
echo "StarPU: $prefix ($(cat "$prefix/.nntile_build"))"
export STARPU_PREFIX=$prefix  # setup.py builds against it
export LD_LIBRARY_PATH=$prefix/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export STARPU_HOME=$PWD/.starpu_home${tag:+_$tag} PYTHONUNBUFFERED=1
# the commit the records name (this copy of the tree may carry a .git of an older commit): benchmarks/run.py
[ -f .carry/code_commit ] && export BENCH_CODE_COMMIT=$(cat .carry/code_commit)
mkdir -p "$STARPU_HOME"
# torch.compile's kernels (the harness's compile variants; GPT-2 XL compiles for ~100 s the first time): a folder that
# a warm machine keeps between calls, seeded from .carry/inductor (dev/gpu_machine/prepare_carry.sh, from the
# inductor_cache.tgz a bench call returns)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/nntile_inductor}
if [ -d .carry/inductor ] && [ ! -f "$TORCHINDUCTOR_CACHE_DIR/.seeded" ]; then
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && cp -a .carry/inductor/. "$TORCHINDUCTOR_CACHE_DIR/" \
    && touch "$TORCHINDUCTOR_CACHE_DIR/.seeded"
fi
if [ -z "$tag" ]; then
  [ -d .carry/starpu_home ] && cp -a .carry/starpu_home/. "$STARPU_HOME/"
elif [ -d ".carry/starpu_home_$tag" ]; then
  cp -a ".carry/starpu_home_$tag/." "$STARPU_HOME/"
elif [ -d .carry/starpu_home/.starpu/sampling/codelets ]; then
  mkdir -p "$STARPU_HOME/.starpu/sampling"
  cp -a .carry/starpu_home/.starpu/sampling/codelets "$STARPU_HOME/.starpu/sampling/"
fi
t0=$(date +%s)
# The extension built by an earlier call comes back under $OUT/prebuilt/<key> (debug info stripped: ~1 MB);
# dev/gpu_machine/prepare_carry.sh puts it in .carry/prebuilt, and a call whose sources and torch match skips the build.
key=$( (find csrc -type f -print0 | sort -z | xargs -0 cat; cat setup.py;
        python3 -c "import sys, torch; print(torch.__version__, sys.version)"
        [ -n "$tag" ] && cat "$prefix/.nntile_build") | sha256sum | cut -c1-16)  # 1.3.10's keys as before
so=$(python3 -c "import sysconfig; print('_C' + sysconfig.get_config_var('EXT_SUFFIX'))")
# /tmp/nntile_prebuilt: what an earlier call on this (still warm) machine built; its $OUT is gone, its /tmp is not
found=""
for d in .carry/prebuilt "$prebuilt_out" /tmp/nntile_prebuilt; do [ -f "$d/$key/$so" ] && { found=$d; break; }; done
if [ -n "$found" ]; then  # carried, built earlier in this call, or by an earlier call on this machine
  cp "$found/$key/$so" "nntile_torch/$so"
  echo "build: prebuilt extension $key from $found (0 s)"
else
  if ! MAX_JOBS=16 python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1; then
    grep -m20 -B2 -A6 error "$OUT/build.log"; exit 1
  fi
  mkdir -p "$prebuilt_out/$key" /tmp/nntile_prebuilt/$key && strip --strip-debug -o "$prebuilt_out/$key/$so" "nntile_torch/$so"
  cp "$prebuilt_out/$key/$so" /tmp/nntile_prebuilt/$key/
  echo "build: $(( $(date +%s) - t0 )) s (kept as prebuilt $key)"
fi
# "A=1 B=2 --x y" -> envs=(A=1 B=2), words=(--x y): a run's own environment settings, then its arguments.
split_env() {
  read -ra words <<< "$1"; envs=()
  while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} == *=* && ${words[0]} != --* ]]; do
    envs+=("${words[0]}"); words=("${words[@]:1}")
  done
}
# Carried wheels (pytest-timeout for the test steps; DeepSpeed and its missing dependencies for the harness)
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
status=0
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    tests)  # the suite (TESTS: test paths, default tests)
      # shellcheck disable=SC2086  # a list of paths
      python3 -m pytest -q -rs --timeout 240 --timeout-method thread ${TESTS:-tests} 2>&1 | tee "$OUT/tests.log" \
        | tail -25; rc=${PIPESTATUS[0]} ;;
    cpuadamw)  # the CPU AdamW kernel, with and without the x86 clones, beside torch's (benchmarks/cpu_adamw.py)
      python3 -m benchmarks.cpu_adamw --json "$OUT/cpu_adamw.json" 2>&1 | tee "$OUT/cpu_adamw.log"; rc=${PIPESTATUS[0]} ;;
    gputests)  # the CUDA variants of every op and model test (marked cuda); GPUTESTS: test paths (default tests);
               # GPUTEST_ARGS: more pytest arguments (-s: no capture, so a crash's native backtrace reaches the log)
      # shellcheck disable=SC2086  # a list of paths
      python3 -m pytest -v -rfEs --timeout 150 --timeout-method thread -m cuda ${GPUTEST_ARGS:-} ${GPUTESTS:-tests} 2>&1 | tee "$OUT/gputests.log" \
        | grep -vE " PASSED|^$" | tail -40; rc=${PIPESTATUS[0]} ;;
    multigpu)  # several GPUs (kinds nvidia-h200-x2/x4/x8): the place tests, then GPT-2 XL bf16 at 8 sequences per
               # GPU: nntile and torch on 1 GPU, then nntile (one process), FSDP2 and DeepSpeed ZeRO-3 (torchrun) on all
      python3 -m pytest -q --timeout 200 tests/test_places.py 2>&1 | tee "$OUT/multigpu.log" | tail -3
      ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
      for n in 1 "$ngpu"; do
        backends=nntile,torch; [ "$n" -gt 1 ] && backends=${MG_BACKENDS:-nntile,fsdp2,deepspeed:gpu}
        CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) python3 -m benchmarks.run --backend $backends --config xl \
          --precision bf16 --batch $((8 * n)) --seq 1024 --warmup 2 --steps 5 --timeout ${MG_TIMEOUT:-150} \
          --out /tmp/bench_mg 2>&1 | tee -a "$OUT/multigpu.log" | grep -E "^\[|^benchmarks"
      done
      python3 -m benchmarks.report /tmp/bench_mg 2>&1 | tail -12
      tar czf "$OUT/bench_multigpu.tgz" -C /tmp/bench_mg . ; rc=0 ;;
    profile)  # where a converted step's time goes; PROFILE_ARGS: benchmarks.profile_step arguments, runs joined by ';',
              # each optionally led by VAR=value settings for that run (A/B in one call: "--config xl;NNTILE_ATTENTION=efficient --config xl")
      IFS=';' read -ra runs <<< "${PROFILE_ARGS:---config xl}"; i=0
      for r in "${runs[@]}"; do
        i=$((i + 1)); echo "== profile $i: $r" | tee -a "$OUT/profile.log"
        split_env "$r"
        env STARPU_WORKER_STATS=1 STARPU_BUS_STATS=1 "${envs[@]}" timeout "${PROFILE_TIMEOUT:-200}" \
          python3 -m benchmarks.profile_step "${words[@]}" --out "$OUT/profile_$i.json" >>"$OUT/profile.log" 2>&1
        echo "rc=$?" >>"$OUT/profile.log"
        grep -E "^step|^profiled|^\{" "$OUT/profile.log" | tail -8
      done; rc=0 ;;
    generate)  # Hugging Face generate() tokens/s beside torch (benchmarks/generate.py); GENERATE_ARGS: its arguments
      # shellcheck disable=SC2086  # a list of arguments
      python3 -m benchmarks.generate ${GENERATE_ARGS:---config xl --batch 8 --prompt 128 --new 64 --precision bf16} \
        --json "$OUT/generate.json" 2>&1 | grep -v "^\[starpu\]" | tee "$OUT/generate.log" | tail -4
      rc=${PIPESTATUS[0]} ;;
    nodes)  # memory as the OS, the NUMA nodes (what hwloc reads) and StarPU's memory nodes see it
      { free -b | head -2; grep -h MemTotal /sys/devices/system/node/node*/meminfo
        python3 -c "import nntile_torch as nt; nt.init(); [print(n) for n in nt.info()['memory_nodes']]"
      } 2>&1 | tee "$OUT/nodes.log"; rc=${PIPESTATUS[0]} ;;
    gemm) python3 -m benchmarks.gemm --out "$OUT/gemm.json" 2>&1 | tee "$OUT/gemm.log" | tail -30; rc=${PIPESTATUS[0]} ;;
    submission)  # the submitting thread's time per step of a 48-layer GPT-2 (kernels trivial): this machine's CPU
      python3 -m benchmarks.submission --out "$OUT/submission.json" 2>&1 | tail -1; rc=${PIPESTATUS[0]} ;;
    decode)  # the submitting thread's time per generated token of a 48-layer GPT-2 (kernels trivial) beside torch
      python3 -m benchmarks.decode_submission --out "$OUT/decode_submission.json" 2>&1 | tail -3; rc=${PIPESTATUS[0]} ;;
    linear) for prec in bf16 tf32; do
              python3 -m benchmarks.linear --precision $prec --out "$OUT/linear_$prec.json" 2>&1 | tee -a "$OUT/linear.log" | tail -3
            done; rc=${PIPESTATUS[0]} ;;
    linear-variants)  # where the time goes: tile size, bias kernels
      for a in "--tile 8192" "--no-bias" "--tile 2048" "--precision fp32 --reps 3"; do
        python3 -m benchmarks.linear $a 2>&1 | tee -a "$OUT/linear_variants.log" | tail -1
      done; rc=0 ;;
    ab)  # before/after in one call: the tree in .carry/old (dev/gpu_machine/prepare_ab.sh REV) beside this one, the
         # old side on its own StarPU when .carry/old_starpu holds one. AB_PROFILE: benchmarks.profile_step runs (joined
         # by ';', each optionally led by VAR=value settings, as profile's), each on both trees in turn, AB_ROUNDS
         # rounds (default 2), both sides from a fresh copy of the carried STARPU_HOME; without it benchmarks.linear.
         # AB_NEW_BENCHMARKS=1: both sides run this tree's benchmarks/ (the same measuring script, e.g. profile_step's
         # --plan that the old tree lacks; it must run on the old tree's nntile_torch)
      old_env=(STARPU_HOME=$PWD/.starpu_home_ab_old) new_env=(STARPU_HOME=$PWD/.starpu_home_ab_new)
      for h in .starpu_home_ab_old .starpu_home_ab_new; do
        rm -rf "$h" && mkdir -p "$h" && { [ ! -d .carry/starpu_home ] || cp -a .carry/starpu_home/. "$h/"; }
      done
      if [ -d .carry/old_starpu ]; then
        op=/opt/nntile_torch/ab-old/starpu-1.3.10
        rm -rf "$op" && mkdir -p "$(dirname "$op")" && cp -a .carry/old_starpu "$op"
        old_env+=(STARPU_PREFIX=$op LD_LIBRARY_PATH=$op/lib:$LD_LIBRARY_PATH)
      fi
      echo "old: $(cat .carry/old/.ab_commit 2>/dev/null || echo '?') on StarPU $(env "${old_env[@]}" sh -c \
        'cat "${STARPU_PREFIX}/.nntile_build"'); new: $(cat .carry/code_commit 2>/dev/null || echo '?')" | tee "$OUT/ab.log"
      if [ -n "${AB_NEW_BENCHMARKS:-}" ]; then rm -rf .carry/old/benchmarks && mkdir .carry/old/benchmarks \
        && cp -a benchmarks/*.py .carry/old/benchmarks/; fi
      # the same extension sources on the same StarPU: this tree's build serves the old one (no second build)
      if [ ! -d .carry/old_starpu ] && diff -rq csrc .carry/old/csrc >/dev/null && cmp -s setup.py .carry/old/setup.py; then
        cp "nntile_torch/$so" ".carry/old/nntile_torch/$so" && echo "old side: this tree's extension (same csrc)" | tee -a "$OUT/ab.log"
      else
        (cd .carry/old && env "${old_env[@]}" MAX_JOBS=16 python3 setup.py build_ext --inplace >"$OUT/build_old.log" 2>&1) \
          || { echo "old build failed"; grep -m20 -B2 -A6 error "$OUT/build_old.log"; }
      fi
      if [ -n "${AB_PROFILE:-}" ]; then
        IFS=';' read -ra runs <<< "$AB_PROFILE"
        for round in $(seq "${AB_ROUNDS:-2}"); do
          i=0
          for r in "${runs[@]}"; do
            i=$((i + 1)); split_env "$r"
            for side in old new; do
              if [ $side = old ]; then dir=.carry/old side_env=("${old_env[@]}"); else dir=. side_env=("${new_env[@]}"); fi
              echo "== round $round, run $i, $side: $r" >>"$OUT/ab.log"
              (cd $dir && env "${side_env[@]}" "${envs[@]}" timeout "${PROFILE_TIMEOUT:-200}" \
                python3 -m benchmarks.profile_step "${words[@]}" --out "$OUT/ab_${round}_${i}_$side.json" >>"$OUT/ab.log" 2>&1)
              echo "rc=$?" >>"$OUT/ab.log"
              echo "round $round, run $i, $side: $(grep -E '^step|^rc=' "$OUT/ab.log" | tail -2 | tr '\n' ' ')"
            done
          done
        done
      else
        for prec in bf16 tf32; do
          for side in old new; do
            if [ $side = old ]; then dir=.carry/old side_env=("${old_env[@]}"); else dir=. side_env=("${new_env[@]}"); fi
            (cd $dir && env "${side_env[@]}" python3 -m benchmarks.linear --precision $prec 2>&1) | sed "s/^/$side: /" \
              | tee -a "$OUT/ab.log" | tail -1
          done
        done
      fi; rc=0 ;;
    train) python3 -m nntile_torch.train --model small --steps 500 --compare-torch --no-progress --out "$OUT/train" \
             2>&1 | tail -3; rc=${PIPESTATUS[0]} ;;
    bench)  # the benchmark harness; BENCH_ARGS: benchmarks.run arguments, several plans joined by ';', or @file
            # (a file with one plan per line); BENCH_BUDGET: seconds for all (default 420; attempts are cut)
      # DeepSpeed's JIT builder parses each TORCH_CUDA_ARCH_LIST entry as numbers and fails on an arch-specific one
      # such as 9.0a ("invalid literal for int() with base 10: '0a'", seen on the H200): give it the plain arch
      [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] && echo "TORCH_CUDA_ARCH_LIST was '$TORCH_CUDA_ARCH_LIST'" \
        && export TORCH_CUDA_ARCH_LIST=$(sed -E 's/([0-9])a/\1/g' <<< "$TORCH_CUDA_ARCH_LIST")
      if [ -d .carry/aio ] && [ ! -f /usr/include/libaio.h ]; then  # libaio for DeepSpeed's async_io (nvme variant)
        aio=$PWD/.carry/aio
        export CFLAGS="-I$aio/include ${CFLAGS:-}" LDFLAGS="-L$aio/lib ${LDFLAGS:-}" CPATH=$aio/include${CPATH:+:$CPATH}
        export LIBRARY_PATH=$aio/lib${LIBRARY_PATH:+:$LIBRARY_PATH} LD_LIBRARY_PATH=$aio/lib:$LD_LIBRARY_PATH
      fi
      plan_text=${BENCH_ARGS:-}; [[ $plan_text == @* ]] && plan_text=$(cat "${plan_text#@}")
      if [[ $plan_text == *nvme* ]] && python3 -c "import deepspeed" 2>/dev/null; then
        # the async_io op compiles on first use, like DeepSpeedCPUAdam below: once here, outside the budget
        t1=$(date +%s)
        timeout 300 python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder as B; b = B()
print('async_io compatible:', b.is_compatible(verbose=True)); b.load()" >"$OUT/ds_async_io.log" 2>&1
        echo "DeepSpeed async_io build: rc=$?, $(( $(date +%s) - t1 )) s" | tee -a "$OUT/bench.log"
        tail -3 "$OUT/ds_async_io.log"
      fi
      if [[ $plan_text == *deepspeed* ]] && python3 -c "import deepspeed" 2>/dev/null; then
        # DeepSpeedCPUAdam compiles on first use (minutes; an XL attempt was cut at 62 s while compiling): build it
        # once here, outside the attempts' budget; torch's extension cache keeps it for every attempt after.
        t1=$(date +%s)
        timeout 300 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
          >"$OUT/ds_cpu_adam.log" 2>&1; echo "DeepSpeedCPUAdam build: rc=$?, $(( $(date +%s) - t1 )) s" | tee -a "$OUT/bench.log"
      fi
      # a fresh folder per call (a warm machine keeps /tmp: an earlier call's records would come back again)
      bdir=/tmp/bench${tag:+_$tag}; rm -rf "$bdir"; rc=0; end=$(( $(date +%s) + ${BENCH_BUDGET:-420} ))  # seconds for all plans together
      # DEVICE_DEADLINE (epoch seconds, e.g. the call's start + its limit - 20): no attempt runs past it, whatever the
      # build before took (a cold machine's build once ate the margin and the call was killed with nothing returned)
      [ -n "${DEVICE_DEADLINE:-}" ] && [ "$DEVICE_DEADLINE" -lt "$end" ] && end=$DEVICE_DEADLINE
      # killed anyway (the device's limit): what was measured and the attempts' logs still come back
      trap 'tar czf "$OUT/bench.tgz" -C "$bdir" . 2>/dev/null; exit 124' TERM INT
      args=${BENCH_ARGS:---backend torch,nntile --config xl --precision bf16 --batch 8 --seq 1024}
      if [[ $args == @* ]]; then  # @file: one plan per line, '#' comments
        args=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "${args#@}" | paste -sd';')
      fi
      IFS=';' read -ra plans <<< "$args"
      for plan in "${plans[@]}"; do  # a plan may start with VAR=value settings for its attempts
        split_env "$plan"
        [ ${#envs[@]} -gt 0 ] && echo "env: ${envs[*]}" | tee -a "$OUT/bench.log"
        env "${envs[@]}" python3 -m benchmarks.run "${words[@]}" --out $bdir --budget $(( end - $(date +%s) )) 2>&1 \
          | tee -a "$OUT/bench.log"
        [ "${PIPESTATUS[0]}" = 0 ] || rc=1
        # after every plan, so that a call cut by the device's time limit still brings back what was measured
        tar czf "$OUT/bench.tgz" -C $bdir . 2>/dev/null
      done
      python3 -m benchmarks.report $bdir 2>&1 | tee -a "$OUT/bench.log"
      # results.jsonl, results.md, plots, one log per attempt (one file: the device returns 8 at most)
      tar czf "$OUT/bench.tgz" -C $bdir .
      if [[ $args == *compile* ]] && [ -d "$TORCHINDUCTOR_CACHE_DIR" ]; then  # the compiled kernels, to carry next time
        tar czf /tmp/inductor_cache.tgz --exclude=.seeded -C "$TORCHINDUCTOR_CACHE_DIR" . 2>/dev/null
        size=$(stat -c %s /tmp/inductor_cache.tgz 2>/dev/null || echo 0)
        if [ "$size" -le $(( ${INDUCTOR_TGZ_MAX_MB:-40} << 20 )) ]; then mv /tmp/inductor_cache.tgz "$OUT/"
        else echo "inductor cache $(( size >> 20 )) MB: not returned (over INDUCTOR_TGZ_MAX_MB=${INDUCTOR_TGZ_MAX_MB:-40})"; fi
      fi ;;
    curves)  # loss curves of every optimizer-state precision beside torch (benchmarks/loss_curves.py);
             # CURVES_ARGS: its arguments (default 2,000 steps in 540 s: the fp32 variants run ~27 steps/s on an
             # H100); records, summary and plot in $OUT/loss_curves
      # shellcheck disable=SC2086  # a list of arguments
      python3 -m benchmarks.loss_curves ${CURVES_ARGS:---steps 2000 --budget 540} --out "$OUT/loss_curves" 2>&1 \
        | grep -v "^\[starpu\]" | tee "$OUT/loss_curves.log" | tail -14; rc=${PIPESTATUS[0]} ;;
    rates)  # the plan's rates measured on this GPU (microbenchmark peaks: nntile_torch/rates.py), beside its defaults
      # cached under $OUT/rates, not in STARPU_HOME: the plans of later steps and calls keep the H200's fitted defaults
      env -u STARPU_HOME XDG_CACHE_HOME="$OUT/rates" python3 -m nntile_torch.rates 2>&1 | grep -v "^\[starpu\]" | tee "$OUT/rates.log" | tail -14; rc=${PIPESTATUS[0]} ;;
    mlp) python3 -m nntile_torch.examples.mlp --steps 100 --out "$OUT/mlp" 2>&1 | tr '\r' '\n' | tail -3; rc=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
  echo "step $step: rc=$rc, $(( $(date +%s) - t0 )) s"
  [ "$rc" = 0 ] || status=1
done
# Calibrated perf models and bus figures come back, to be carried next time.
tar czf "$OUT/starpu_home.tgz" -C "$STARPU_HOME" . 2>/dev/null
exit $status
