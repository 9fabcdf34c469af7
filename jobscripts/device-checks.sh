#!/usr/bin/env bash
# The CUDA checks of issue 7 on the GPU machine, which has no CMake/CTest: runs every cuda-labelled
# test binary directly (ops CUDA vs CPU, backend services, 10-step training GPU vs CPU), then the NCCL
# communicator test under mpirun with 1 rank and, with 2+ GPUs, 2 ranks, and the shared-GPU
# (host-staged) communicator test with 2 ranks. Prints a summary line per
# binary and exits non-zero if any failed.
#
# Here (build machine): cmake --preset cuda && cmake --build --preset cuda --target partrain partrain_cuda_tests
#   bash ../shared/device/pack.sh build/cuda/bin/partrain build/cuda/bin/test_cuda_* build/cuda/bin/test_nccl_communicator \
#     build/cuda/bin/test_shared_gpu_communicator
# There (device `run`, carry [".devdeps", "data/prepared"]): jobscripts/device-checks.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ -f .devdeps/env.sh ]; then source .devdeps/env.sh; fi
bin_dir=${BUILD_DIR:-$root/build/cuda}/bin
[ -d "$bin_dir" ] || bin_dir=$root/.devdeps/app   # pack.sh puts the binaries there (and on PATH)
export PARTRAIN_BINARY=${PARTRAIN_BINARY:-$(command -v partrain || echo "$bin_dir/partrain")}
export PARTRAIN_SOURCE_DIR=$root PARTRAIN_DATA_DIR=${PARTRAIN_DATA_DIR:-$root/data/prepared}
export PARTRAIN_RUN_DIR=${PARTRAIN_RUN_DIR:-${TMPDIR:-/tmp}/partrain-device-checks}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} OPENBLAS_NUM_THREADS=1
# A hung NCCL operation ends its rank after a minute, not after 10 of the window (docs/gpus.md).
export PARTRAIN_NCCL_TIMEOUT_SECONDS=${PARTRAIN_NCCL_TIMEOUT_SECONDS:-60}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"

failed=0
run() {  # run NAME COMMAND...
  local name=$1; shift
  local log="$PARTRAIN_RUN_DIR/$name.log"
  mkdir -p "$PARTRAIN_RUN_DIR"
  if "$@" >"$log" 2>&1; then status=ok; else status=FAILED; failed=1; fi
  printf '%-28s %-7s %s\n' "$name" "$status" "$(grep -oE '\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$log" | tr -d '[]' | tr -s ' ' | tr '\n' ' ')"
  [ "$status" = ok ] || grep -E "Failure|error|Expected|Which is|actual" "$log" | head -20
}

for test in "$bin_dir"/test_cuda_*; do
  run "$(basename "$test")" "$test"
done
nccl=$(command -v test_nccl_communicator || echo "$bin_dir/test_nccl_communicator")
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
run nccl_np1 mpirun --allow-run-as-root --oversubscribe -np 1 "$nccl"
if [ "${gpus:-0}" -ge 2 ]; then run nccl_np2 mpirun --allow-run-as-root --oversubscribe -np 2 "$nccl"; fi
# 2 ranks on one GPU (or forced host staging on 2 GPUs): the host-staged device world.
shared=$(command -v test_shared_gpu_communicator || echo "$bin_dir/test_shared_gpu_communicator")
run shared_gpu_np2 mpirun --allow-run-as-root --oversubscribe -np 2 "$shared"
echo "logs: $PARTRAIN_RUN_DIR"
exit $failed
