#!/usr/bin/env bash
# Builds partrain and runs its CTest suite: install-deps -> configure -> build -> ctest.
# Usage: jobscripts/run-tests.sh [LABEL_REGEX]   e.g. "unit", "unit|mpi"; default: every test not labelled slow.
# Environment: PRESET (default cpu), JOBS (default: number of cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
preset=${PRESET:-cpu}
jobs=${JOBS:-$(nproc)}

"$root/jobscripts/install-deps.sh"
source "$root/jobscripts/mpi-env.sh"

cmake --preset "$preset"
cmake --build --preset "$preset" -j "$jobs"

label=${1:-}

# The CUDA backend must compile wherever nvcc exists (CI has nvcc but no GPU); its tests (label
# "cuda") run on a GPU and skip with a message elsewhere. PARTRAIN_CUDA=off leaves this out.
if [ "$preset" = cpu ] && [ "${PARTRAIN_CUDA:-auto}" != off ] && command -v nvcc >/dev/null 2>&1 &&
   { [ -z "$label" ] || [[ "cuda" =~ ^($label)$ ]]; }; then
  cmake --preset cuda
  cmake --build --preset cuda -j "$jobs" --target partrain partrain_cuda_tests
  ctest --test-dir build/cuda --output-on-failure -L cuda
fi

# The main suite runs last so that its summary is the one a reader (and CI) sees at the end.
build_dir="build/$preset"
if [ -n "$label" ]; then
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -L "$label"
else
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -LE slow
fi
