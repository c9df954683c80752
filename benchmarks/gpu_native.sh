#!/usr/bin/env bash
# The native CUDA kernel tests (tests/native/cuda/test_*.cu, CMakeLists.txt) for
# benchmarks/gpu_check.sh, in two phases so that the build can overlap other work:
#   gpu_native.sh build BUILD_DIR [--dry-run]   configure and build the tests
#   gpu_native.sh test  BUILD_DIR [--dry-run]   run them under ctest
# On a GPU machine they are compiled by nvcc (NVCC, default `nvcc`) for the GPU's architecture
# (CUDA_ARCH, e.g. 90) and run on the GPU: a test that skips (no GPU seen) counts as a failure.
# --dry-run builds and runs one of them on the host CUDA emulator instead, on any CPU, to prove
# this script's logic where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

phase=${1:?usage: gpu_native.sh build|test BUILD_DIR [--dry-run]}
dir=${2:?usage: gpu_native.sh build|test BUILD_DIR [--dry-run]}
dry=${3:-}
jobs=$(nproc)

if [ "$dry" = --dry-run ]; then
  options=(-DPYGPT_CUDA=OFF -DPYGPT_CUDA_EMULATOR=ON)
  targets=(test_bias_gelu_cuda_emulated)
  selection='^test_bias_gelu_cuda_emulated$'
else
  nvcc=$(command -v "${NVCC:-nvcc}") || { echo "nvcc not found" >&2; exit 1; }
  options=(-DPYGPT_CUDA=ON -DPYGPT_CUDA_EMULATOR=OFF -DCMAKE_CUDA_COMPILER="$nvcc"
           -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:?CUDA_ARCH, e.g. 90}")
  targets=()
  for source in tests/native/cuda/test_*.cu; do
    targets+=("$(basename "$source" .cu)")
  done
  selection='_cuda$'
fi

case $phase in
  build)
    cmake -S . -B "$dir" "${options[@]}"
    cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
    ;;
  test)
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    ctest --test-dir "$dir" -R "$selection" --no-tests=error --output-on-failure 2>&1 | tee "$log"
    if [ "$dry" != --dry-run ] && grep -qE "Skipped|Not Run" "$log"; then
      echo "a native CUDA test did not run on this GPU machine (skipped: no GPU seen?)" >&2
      exit 1
    fi
    ;;
  *)
    echo "unknown phase $phase: build or test" >&2
    exit 2
    ;;
esac
