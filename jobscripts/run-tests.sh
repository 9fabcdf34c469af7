#!/usr/bin/env bash
# Builds partrain and runs its CTest suite: install-deps -> configure -> build -> ctest.
# Usage: jobscripts/run-tests.sh [LABEL_REGEX]   e.g. "unit", "unit|mpi"; default: every test not labelled slow,
# plus the CUDA build (where nvcc exists), the sanitizer run (debug preset) and the fuzzers (where clang exists).
# Environment: PRESET (default cpu), JOBS (default: number of cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
preset=${PRESET:-cpu}
jobs=${JOBS:-$(nproc)}

"$root/jobscripts/install-deps.sh"
source "$root/jobscripts/mpi-env.sh"

# One compiler cache for the run: the cuda preset compiles partrain_lib with exactly the cpu preset's
# commands, so with ccache its ~210 library files are cache hits rather than a second full compile.
# A launcher or cache the caller set is kept; PARTRAIN_CCACHE=off leaves it out. It only initialises
# a build directory's first configure.
if [ "${PARTRAIN_CCACHE:-auto}" != off ] && command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR=${CCACHE_DIR:-$root/build/.ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  for language in C CXX CUDA; do
    launcher=CMAKE_${language}_COMPILER_LAUNCHER
    export "$launcher=${!launcher:-ccache}"
  done
fi

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

# Sanitizers: the debug preset (ASan + UBSan, stopping at the first UBSan report) runs the unit
# tests and the MPI tests that are not end-to-end validations (those run the release build below;
# under ASan they take too long for CI). PARTRAIN_SANITIZE=off leaves this out.
if [ "$preset" = cpu ] && [ "${PARTRAIN_SANITIZE:-auto}" != off ] &&
   { [ -z "$label" ] || [[ "sanitize" =~ ^($label)$ ]]; }; then
  # Planning Megatron-sized models (thousands of devices, Table 1 layouts) is arithmetic the small
  # planner tests already cover line by line; at -O0 under ASan these few took 6 of the run's 15 minutes.
  planning_at_scale='AtScale$|^MegatronLayouts\.|^StageDp\.TheObjectiveReadingsAgainstTheSimulatedStepTime$|^plan_bert-large_infeasible$'
  cmake --preset debug
  cmake --build --preset debug -j "$jobs" --target sanitizer_tests  # not the validation programs
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/debug --output-on-failure -j "$jobs" -L "unit|mpi" -LE "validation|slow|slurm|cuda" \
      -E "$planning_at_scale"
fi

# Fuzzing: libFuzzer targets built with clang (the fuzz preset), each replaying its corpus and
# fuzzing a seeded, bounded number of runs (label fuzz). PARTRAIN_FUZZ=off leaves this out.
if [ "$preset" = cpu ] && [ "${PARTRAIN_FUZZ:-auto}" != off ] && command -v clang++ >/dev/null 2>&1 &&
   { [ -z "$label" ] || [[ "fuzz" =~ ^($label)$ ]]; }; then
  cmake --preset fuzz
  cmake --build --preset fuzz -j "$jobs"
  ctest --test-dir build/fuzz --output-on-failure -j "$jobs" -L fuzz
fi

# The main suite runs last so that its summary is the one a reader (and CI) sees at the end.
build_dir="build/$preset"
if [ -n "$label" ]; then
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -L "$label"
else
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -LE slow
fi
