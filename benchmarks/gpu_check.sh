#!/usr/bin/env bash
# The CUDA kernels on a real GPU, in one call: started once in the repository root of a machine
# with a CUDA build of PyTorch, nvcc and a GPU (no network needed), it
#   1. builds the CUDA extension in place for the GPU it finds (TORCH_CUDA_ARCH_LIST from the
#      device, MAX_JOBS = cores), checks that every op registers its CUDA kernels, and reads the
#      attention kernels' registers, spills and tensor-core instructions (benchmarks/gpu_sass.py);
#   2. runs tests/test_cuda.py and tests/test_fused_cuda.py on the GPU, and the native CUDA tests
#      (tests/native/cuda) built by nvcc for the GPU (their build overlaps steps 1 and 2);
#   3. benchmarks every op against what a GPU user would call instead (benchmarks/gpu_bench.py);
#   4. trains the `shakespeare` preset with our kernels and with plain PyTorch from the same
#      seed and compares the losses and tokens/s (benchmarks/gpu_train.py);
#   5. times GPT-2 small training in bfloat16: pygpt on both kernel sets, a plain PyTorch GPT-2
#      (eager and compiled) and transformers' (benchmarks/gpu_gpt2.py);
# and writes OUTDIR/report.md (benchmarks/gpu_report.py) beside the raw logs: build.log,
# tests.log, native.log, bench.log, train.log, gpt2.log. A failed step is recorded and the script
# goes on to the next one that does not need it; each step has a time limit, and all of them together
# stay under GPU_CHECK_BUDGET_S seconds (default 450, so the call ends within 8 minutes).
#
# Usage: benchmarks/gpu_check.sh OUTDIR [--dry-run] [--skip STEP,...]
#   --dry-run   every step on the CPU, at tiny sizes (the build only checks the extension in
#               place; the native step builds and runs one test on the host CUDA emulator), to
#               prove the script where there is no GPU
#   --skip      leave out any of: tests, native, bench, train, gpt2 (e.g. on a rerun after a fix)
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S. Exit status 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: benchmarks/gpu_check.sh OUTDIR [--dry-run] [--skip STEP,...]" >&2; exit 2; }
out="" dry="" skip=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=--dry-run ;;
    --skip) [ $# -ge 2 ] || usage; skip=",$2,"; shift ;;
    -*) usage ;;
    *) [ -z "$out" ] || usage; out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || usage
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/steps.tsv"

PY=${PYTHON:-python3}
export PYTHONPATH="$PWD:$PWD/export${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-450}))
failures=0

# note STEP RESULT [SECONDS]: one row of the report's step table.
note() {
  printf '%s\t%s\t%s\n' "$1" "$2" "${3:-0}" >> "$work/steps.tsv"
  echo "-- $1: $2 (${3:-0} s)"
  [ "$2" = ok ] || [ "${2#skipped}" != "$2" ] || failures=$((failures + 1))
}

# run_step STEP CAP RESERVE LOG COMMAND...: runs COMMAND, its output appended to LOG, for at most
# CAP seconds and never into the RESERVE seconds kept for the steps after it.
run_step() {
  local name=$1 cap=$2 reserve=$3 log=$4
  shift 4
  local left=$((deadline - SECONDS - reserve))
  local limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 5 ]; then
    note "$name" "not run: out of time"
    return 1
  fi
  echo "== $name (at most ${limit} s): $*" >> "$log"
  local start=$SECONDS rc
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) note "$name" ok $((SECONDS - start)) ;;
    124|137) note "$name" "timed out after ${limit} s" $((SECONDS - start)) ;;
    *) note "$name" "failed (exit $rc)" $((SECONDS - start)) ;;
  esac
  return $rc
}

wanted() { [ "${skip#*,$1,}" = "$skip" ] || { note "$1" "skipped: --skip"; return 1; }; }

finish() {
  "$PY" benchmarks/gpu_report.py --out "$out" --work "$work" $dry
  cat "$out/report.md"
  exit $((failures > 0))
}

# 0. The machine.
run_step env 60 0 "$out/build.log" "$PY" benchmarks/gpu_env.py --json "$work/env.json"
if [ -z "$dry" ]; then
  arch=$("$PY" benchmarks/gpu_env.py --arch 2>> "$out/build.log") &&
    cuda_home=$("$PY" benchmarks/gpu_env.py --cuda-home 2>> "$out/build.log") || {
      note machine "failed: no CUDA device or toolkit (see build.log)"
      finish
    }
  export CUDA_HOME=$cuda_home NVCC=$cuda_home/bin/nvcc CUDA_ARCH=${arch/./}
fi

# 2a. The native CUDA tests' build, in the background (at a lower priority than the extension's).
native=build/gpu-check-native
if wanted native; then
  (start=$SECONDS
   nice -n 10 timeout -k 10 300 bash benchmarks/gpu_native.sh build "$native" $dry \
     > "$out/native.log" 2>&1
   echo "$? $((SECONDS - start))" > "$work/native-build.rc") &
  native_build=$!
fi

# 1. The extension, for this GPU.
if [ -n "$dry" ]; then
  run_step build 60 300 "$out/build.log" "$PY" benchmarks/gpu_env.py --check-ops cpu
else
  run_step build 300 175 "$out/build.log" env TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" \
      PYGPT_CUDA=1 "$PY" setup.py build_ext --inplace &&
    run_step ops-registered 60 175 "$out/build.log" "$PY" benchmarks/gpu_env.py --check-ops cuda
fi
built=$?
[ $built -eq 0 ] || grep -m 20 -iE '\berror\b|FAILED:' "$out/build.log"

# 1b. The attention kernels' machine code: registers and spills a thread, tensor-core (HMMA),
# ldmatrix and cp.async instructions (benchmarks/gpu_sass.py, cuobjdump).
if [ $built -eq 0 ]; then
  if [ -n "$dry" ]; then
    note sass "skipped: dry run (the CPU build holds no device code)"
  else
    run_step sass 40 175 "$out/build.log" "$PY" benchmarks/gpu_sass.py --table "$work/sass.md"
  fi
fi

# 2. The tests: Python on the GPU, then the native ones. With pytest-xdist they run in four
# worker processes, so a test that crashes its process is reported as failed and the rest still run.
workers=()
"$PY" -c "import xdist" 2> /dev/null && workers=(-n 4)
if wanted tests; then
  if [ $built -ne 0 ]; then
    note tests "skipped: no extension"
  elif run_step tests 150 145 "$out/tests.log" "$PY" -m pytest -q -rs -p no:cacheprovider \
      "${workers[@]}" tests/test_cuda.py tests/test_fused_cuda.py && [ -z "$dry" ] &&
      grep -qE '[0-9]+ skipped' "$out/tests.log"; then
    note tests-ran "failed: tests skipped on the GPU machine"
  fi
fi
if [ -n "${native_build:-}" ]; then
  wait "$native_build"
  read -r rc took < "$work/native-build.rc" || rc=1 took=0
  case $rc in
    0) note native-build ok "$took" ;;
    124|137) note native-build "timed out after 300 s" "$took" ;;
    *) note native-build "failed (exit $rc)" "$took" ;;
  esac
  [ "$rc" -ne 0 ] || run_step native-tests 90 130 "$out/native.log" \
    bash benchmarks/gpu_native.sh test "$native" $dry
fi

# 3. The benchmarks, and 4. the training comparison.
if [ $built -ne 0 ]; then
  wanted bench && note bench "skipped: no extension"
  wanted train && note train "skipped: no extension"
  wanted gpt2 && note gpt2 "skipped: no extension"
  finish
fi
wanted bench && run_step bench 180 190 "$out/bench.log" \
  "$PY" benchmarks/gpu_bench.py --table "$work/bench.md" $dry
wanted train && run_step train 150 110 "$out/train.log" \
  "$PY" benchmarks/gpu_train.py --work "$work" --table "$work/train.md" $dry
wanted gpt2 && run_step gpt2 110 0 "$out/gpt2.log" \
  "$PY" benchmarks/gpu_gpt2.py --table "$work/gpt2.md" $dry
finish
