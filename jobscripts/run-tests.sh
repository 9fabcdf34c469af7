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

build_dir="build/$preset"
if [ $# -ge 1 ] && [ -n "$1" ]; then
  ctest --test-dir "$build_dir" --output-on-failure -L "$1"
else
  ctest --test-dir "$build_dir" --output-on-failure -LE slow
fi
