#!/usr/bin/env bash
# The GPU device command (issue 23 item 3): validates the CUDA backend, NCCL and GPU training on the
# lent GPU machine, then benchmarks against PyTorch on the same GPU. Prepared here by
# jobscripts/device-pack.sh; run there as one device `run` with carry [".devdeps", ".devdata"]:
#   bash jobscripts/device-checks.sh
# Correctness first, the benchmark last. Each result is written as soon as it exists, so a timeout
# keeps what ran. Under $OUT (or runs/device-checks without it), at most 8 files since that is what a
# device run brings back: device-checks.log (everything printed), device-checks.json (pass/fail, seconds
# and detail per check; versions), logs.tar.gz (every check's own log), benchmark.md.
# A skipped test counts as a failure here: on the GPU machine nothing may skip.
#
# Steps (CHECKS selects, default all): versions ops nccl training resume pipeline profile benchmark
# Environment: CHECKS, ORDERINGS ("overlap plain": PARTRAIN_CUDA_ORDERING for the training checks),
#   BENCHMARK_CASES (gpt1024 bert128 bert512 resnet50), BENCHMARK_STEPS (10), BENCHMARK_MODES (eager),
#   STEP_TIMEOUT (seconds of the op checks, 240), TRAIN_TIMEOUT (one training run, 120), NCCL_TIMEOUT
#   (one NCCL test run, 120), PROFILE_TIMEOUT (180), BENCHMARK_TIMEOUT (300), PARTRAIN_NCCL_TIMEOUT_SECONDS (60),
#   DEADLINE (seconds for the whole command, 450: a device run may take 480): no program runs past it,
#   and one that would start with under 10 s left is recorded "not run: out of time".
# Economies: the plain ordering trains only a case that failed under overlap (to tell an ordering
# fault from a kernel fault); the fp32 overlap runs write the step-10 checkpoint the resume checks
# read, and are the one-rank references of the pipeline checks.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2
out=${OUT:-$root/runs/device-checks}
mkdir -p "$out"
work=${TMPDIR:-/tmp}/partrain-device-checks
rm -rf "$work" && mkdir -p "$work/logs"
exec > >(tee -a "$out/device-checks.log") 2>&1
tee_pid=$!
started=$SECONDS
deadline=$((started + ${DEADLINE:-450}))
echo "device-checks: $(date -u +%FT%TZ) on $(hostname); output $out"

CHECKS=${CHECKS:-"versions ops nccl training resume pipeline profile benchmark"}
ORDERINGS=${ORDERINGS:-"overlap plain"}
STEP_TIMEOUT=${STEP_TIMEOUT:-240} TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-120} NCCL_TIMEOUT=${NCCL_TIMEOUT:-120}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-180}
export PARTRAIN_NCCL_TIMEOUT_SECONDS=${PARTRAIN_NCCL_TIMEOUT_SECONDS:-60}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} CUDNN_LOGERR_DBG=${CUDNN_LOGERR_DBG:-1} CUDNN_LOGDEST_DBG=${CUDNN_LOGDEST_DBG:-stderr}
export CUBLASLT_LOG_LEVEL=${CUBLASLT_LOG_LEVEL:-1}   # cuBLASLt: errors only
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} OPENBLAS_NUM_THREADS=1 GTEST_COLOR=no
# Open MPI's shared-memory transport without CMA/XPMEM single copies (not every sandbox allows them).
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
data=$root/.devdata/data
reference=$root/.devdata/reference

if [ -f .devdeps/env.sh ]; then
  # shellcheck disable=SC1091
  source .devdeps/env.sh || echo "device-checks: sourcing .devdeps/env.sh failed"
else
  echo "device-checks: no .devdeps/ (run jobscripts/device-pack.sh here and carry .devdeps)"
fi
partrain=$(command -v partrain || echo "$root/build/cuda/bin/partrain")
test_cuda=$(command -v test_cuda || echo "$root/build/cuda/bin/test_cuda")
test_communicators=$(command -v test_gpu_communicators || echo "$root/build/cuda/bin/test_gpu_communicators")
# Python and torch must not see the carried MPI/HDF5 libraries that env.sh puts first.
python_ld=${DEVDEPS_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
python=python3
for candidate in /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none)

# ---- results: checks.jsonl (one line per check), device-checks.json rebuilt after each ----
failures=0
json_escape() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/ }; s=${s//$'\r'/}; printf '%s' "${s//$'\n'/\\n}"; }
record() {  # record NAME STATUS SECONDS DETAIL
  local name=$1 status=$2 seconds=$3 detail=$4
  [ "$status" = pass ] || failures=$((failures + 1))
  printf '{"check": "%s", "status": "%s", "seconds": %s, "detail": "%s"}\n' "$name" "$status" "$seconds" \
    "$(json_escape "$detail")" >> "$work/checks.jsonl"
  printf '%-40s %-5s %6ss  %s\n' "$name" "$status" "$seconds" "$(printf '%s' "$detail" | head -c 300 | tr '\n' ' ')"
  save
}
save() {  # device-checks.json and logs.tar.gz as they stand now
  {
    printf '{"date": "%s", "gpu": "%s", "gpus": %s, "versions": "%s", "failures": %s, "elapsed_seconds": %s,\n "checks": [\n' \
      "$(date -u +%FT%TZ)" "$(json_escape "${gpu_name:-none}")" "${gpus:-0}" "$(json_escape "${versions:-}")" \
      "$failures" "$((SECONDS - started))"
    paste -sd, "$work/checks.jsonl" 2>/dev/null | sed 's/},{/},\n{/g'
    printf ']}\n'
  } > "$out/device-checks.json"
  tar -czf "$out/logs.tar.gz" -C "$work" logs 2>/dev/null || true
}
: > "$work/checks.jsonl"
# seconds_left OWN: OWN, or what is left before the deadline (less 15 s for the last save) if less.
seconds_left() { local left=$((deadline - SECONDS - 15)); echo $(( $1 < left ? $1 : left )); }
# run_logged NAME TIMEOUT COMMAND...: runs with its own timeout (cut to the deadline) and log;
# returns its exit code (124: timed out, or not started for want of time).
run_logged() {
  local name=$1 limit
  limit=$(seconds_left "$2")
  shift 2
  if [ "$limit" -lt 10 ]; then
    echo "not run: out of time (DEADLINE ${DEADLINE:-450} s)" > "$work/logs/$name.log"
    return 124
  fi
  timeout --kill-after=5 "$limit" "$@" > "$work/logs/$name.log" 2>&1
}
last_lines() { grep -vE '^\s*$' "$work/logs/$1.log" 2>/dev/null | grep -iE "${2:-error|fail|abort|what\(\)|exception|out of time}" | head -${3:-6}; }
# compare LOG_ARGS...: compare_losses.py with Python's own library path (not the carried MPI/HDF5 one).
compare() { LD_LIBRARY_PATH=$python_ld "$python" jobscripts/device/compare_losses.py "$@" 2>&1; }
wants() { [[ " $CHECKS " == *" $1 "* ]]; }

# ---- a. versions ----
gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
if wants versions; then
  t0=$SECONDS
  nvidia-smi > "$work/logs/nvidia-smi.log" 2>&1 || true
  run_logged versions 60 "$test_cuda" --gtest_filter='CudaDevice.*'
  rc=$?
  versions=$(grep -oE 'driver [0-9].*' "$work/logs/versions.log" | head -1)
  if [ $rc = 0 ] && ! grep -q SKIPPED "$work/logs/versions.log" && [ -n "$versions" ]; then
    record versions pass $((SECONDS - t0)) "${gpu_name}; $versions"
  else
    record versions fail $((SECONDS - t0)) "rc $rc; ${gpu_name:-no nvidia-smi}; $(tail -3 "$work/logs/versions.log")"
  fi
fi

# ---- b. every op's CUDA forward/backward against the CPU kernel; optimizer and tensor-parallel kernels ----
gtest_passed() {  # gtest_passed RC COUNTS: true when the binary succeeded, ran tests and none failed or skipped
  [ "$1" = 0 ] && [[ $2 != "0 passed"* ]] && [[ $2 == *" 0 failed, 0 skipped" ]]
}
gtest_counts() {  # gtest_counts LOG: "N passed, N failed, N skipped" from GoogleTest's summary lines
  local log=$work/logs/$1.log
  summary() { grep -oE "^\[  $1 *\] [0-9]+ tests?" "$log" | head -1 | grep -oE '[0-9]+' || echo 0; }
  printf '%s passed, %s failed, %s skipped' "$(summary PASSED)" "$(summary FAILED)" "$(summary SKIPPED)"
}
if wants ops; then
  # With CUDA_LAUNCH_BLOCKING=1: a kernel fault is reported at the op that caused it.
  t0=$SECONDS
  CUDA_LAUNCH_BLOCKING=1 run_logged ops "$STEP_TIMEOUT" "$test_cuda" --gtest_filter='-CudaTraining*:CudaDevice.*' \
    --gtest_output="json:$work/logs/ops.json"
  rc=$?
  counts=$(gtest_counts ops)
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$work/logs/ops.log" | sort -u | head -40 | sed 's/^\[  FAILED  \] //' | tr '\n' ' ')
  if gtest_passed $rc "$counts"; then
    record ops pass $((SECONDS - t0)) "$counts"
  else
    record ops fail $((SECONDS - t0)) "rc $rc; $counts; failed: $failed $(last_lines ops 'Expected|error|skipped' 10)"
  fi
fi

# ---- c. the NCCL communicator: one rank, and 2 ranks (on one GPU only NCCL's refusal of a shared
# GPU: the communicator tests need a GPU per rank and skip); the host-staged communicator of ranks
# sharing a GPU on 2 ranks. Tests that need more ranks or GPUs than there are are left out, since a
# skip counts as a failure here. ----
if wants nccl; then
  nccl_np1='Nccl*:-NcclCommunicatorTest.PairedSendAndReceiveInMatchingOrder'  # needs 2 ranks
  nccl_np2='Nccl*'
  [ "${gpus:-0}" -ge 2 ] || nccl_np2='NcclSetup.*'
  for test in "nccl-np1 1 $nccl_np1" "nccl-np2 2 $nccl_np2" "shared-gpu-np2 2 SharedGpu*"; do
    read -r name ranks filter <<<"$test"
    t0=$SECONDS
    run_logged "$name" "$NCCL_TIMEOUT" mpirun "${mpirun_flags[@]}" -np "$ranks" "$test_communicators" \
      --gtest_filter="$filter"
    rc=$?
    counts=$(gtest_counts "$name")
    if gtest_passed $rc "$counts"; then
      record "$name ($gpus GPU)" pass $((SECONDS - t0)) "$counts"
    else
      record "$name ($gpus GPU)" fail $((SECONDS - t0)) "rc $rc; $counts; $(last_lines "$name" 'Failure|Expected|error|Which' 8)"
    fi
  done
fi

# ---- d. training: 20 steps on the GPU against the CPU reference computed on the build machine ----
# fp32: 1e-4 relative per step (cuBLAS/cuDNN sum in other orders than OpenBLAS; no TF32). bf16: the
# CPU emulates bf16 storage with fp32 arithmetic as the GPU kernels do, but each of the many bf16
# roundings may fall the other way when the fp32 sums differ in their last bits, and 20 optimizer
# steps carry such differences forward; 1e-2 relative (a few bf16 ulps of the loss, 2^-8 each).
source jobscripts/device/training_cases.sh
tolerance_of() { [ "$1" = fp32 ] && echo 1e-4 || echo 1e-2; }
train_gpu() {  # train_gpu NAME MODEL PRECISION ORDERING [extra --set]: trains on the GPU; returns rc
  local name=$1 model=$2 precision=$3 ordering=$4
  shift 4
  mapfile -t arguments < <(training_arguments "$model" "$precision" cuda "$work/runs/$name" "$data" "$@")
  PARTRAIN_CUDA_ORDERING=$ordering run_logged "$name" "$TRAIN_TIMEOUT" "$partrain" "${arguments[@]}"
}
first_ordering=${ORDERINGS%% *}
if wants training; then
  for model in $TRAINING_MODELS; do
    for precision in $TRAINING_PRECISIONS; do
      for ordering in $ORDERINGS; do
        name=train-$model-$precision-$ordering
        extra=()
        # The resume checks start from this run's step-10 checkpoint.
        [ "$precision" = fp32 ] && [ "$ordering" = "$first_ordering" ] && extra=(--set checkpoint.every=10)
        t0=$SECONDS
        train_gpu "$name" "$model" "$precision" "$ordering" "${extra[@]+"${extra[@]}"}"
        rc=$?
        if [ $rc != 0 ]; then
          record "$name" fail $((SECONDS - t0)) "rc $rc: $(last_lines "$name")"
          continue
        fi
        verdict=$(compare "$work/runs/$name/metrics.jsonl" "$reference/$model-$precision/metrics.jsonl" \
          --tolerance "$(tolerance_of "$precision")" --steps "$TRAINING_STEPS")
        cp "$work/runs/$name/metrics.jsonl" "$work/logs/$name.metrics.jsonl" 2>/dev/null
        [[ $verdict == ok* ]] && status=pass || status=fail
        record "$name" $status $((SECONDS - t0)) "$verdict"
        [ $status = pass ] && break  # the other orderings only diagnose a failure
      done
    done
  done
  # The trace holds each action's device time (CUDA events), what re-planning on a GPU reads.
  t0=$SECONDS
  PARTRAIN_BINARY=$partrain PARTRAIN_SOURCE_DIR=$root PARTRAIN_DATA_DIR=$data PARTRAIN_RUN_DIR=$work/runs \
    run_logged trace-device-times "$TRAIN_TIMEOUT" "$test_cuda" --gtest_filter='CudaTrainingTrace.*'
  rc=$?
  counts=$(gtest_counts trace-device-times)
  if gtest_passed $rc "$counts"; then
    record "trace of device times" pass $((SECONDS - t0)) "$counts"
  else
    record "trace of device times" fail $((SECONDS - t0)) "rc $rc; $counts; $(last_lines trace-device-times 'Failure|Expected|error|skipped' 8)"
  fi
fi

# ---- d. a checkpoint written on the GPU resumes on the CPU with the same next loss ----
if wants resume; then
  for model in $TRAINING_MODELS; do
    name=resume-$model
    t0=$SECONDS
    gpu_run=$work/runs/train-$model-fp32-$first_ordering  # written by the training checks
    rc=0
    if [ ! -f "$gpu_run/checkpoints/step_000010.h5" ]; then
      train_gpu "$name-gpu" "$model" fp32 "$first_ordering" --set checkpoint.every=10
      rc=$?
      gpu_run=$work/runs/$name-gpu
    fi
    checkpoint=$gpu_run/checkpoints/step_000010.h5
    if [ $rc != 0 ] || [ ! -f "$checkpoint" ]; then
      record "$name" fail $((SECONDS - t0)) "GPU run rc $rc, checkpoint $checkpoint: $(last_lines "$name-gpu")"
      continue
    fi
    mapfile -t arguments < <(training_arguments "$model" fp32 cpu "$work/runs/$name-cpu" "$data" --set train.steps=11)
    run_logged "$name-cpu" "$TRAIN_TIMEOUT" "$partrain" "${arguments[@]}" --resume "$checkpoint"
    rc=$?
    if [ $rc != 0 ]; then
      record "$name" fail $((SECONDS - t0)) "CPU resume rc $rc: $(last_lines "$name-cpu")"
      continue
    fi
    # The GPU run's own step 11 against the CPU's first step after resuming (its only one).
    verdict=$(compare "$gpu_run/metrics.jsonl" "$work/runs/$name-cpu/metrics.jsonl" --tolerance 1e-4 --from-step 11 --steps 1)
    [[ $verdict == ok* ]] && status=pass || status=fail
    record "$name (GPU step 10 -> CPU step 11)" $status $((SECONDS - t0)) "$verdict"
  done
fi

# ---- d. a pipeline of 2 stages on 2 ranks sharing the GPU against 1 rank ----
if wants pipeline; then
  for model in gpt bert; do
    name=pipeline-$model
    t0=$SECONDS
    one_rank=$work/runs/train-$model-fp32-$first_ordering  # the training checks' run, when it was made
    if [ ! -f "$one_rank/metrics.jsonl" ]; then
      train_gpu "$name-1rank" "$model" fp32 "$first_ordering"
      one_rank=$work/runs/$name-1rank
    fi
    mapfile -t arguments < <(training_arguments "$model" fp32 cuda "$work/runs/$name-2ranks" "$data" --set parallel.stages=2)
    PARTRAIN_CUDA_ORDERING=$first_ordering run_logged "$name-2ranks" "$TRAIN_TIMEOUT" mpirun "${mpirun_flags[@]}" -np 2 "$partrain" "${arguments[@]}"
    rc=$?
    if [ $rc != 0 ]; then
      record "$name (2 stages, 2 ranks, 1 GPU)" fail $((SECONDS - t0)) "rc $rc: $(last_lines "$name-2ranks")"
      continue
    fi
    verdict=$(compare "$work/runs/$name-2ranks/metrics.jsonl" "$one_rank/metrics.jsonl" --tolerance 1e-5 \
      --steps "$TRAINING_STEPS")
    [[ $verdict == ok* ]] && status=pass || status=fail
    record "$name (2 stages, 2 ranks, 1 GPU)" $status $((SECONDS - t0)) "$verdict"
  done
fi

# ---- e. profiling on the GPU, then `partrain plan` for GPT-2 on 8 such GPUs from that ProfileDB ----
if wants profile; then
  t0=$SECONDS
  cache=$work/runs/profile-gpt2/cache
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
  # The GPU's own memory (the default plans for 16 GiB) and its bf16 peak (989 TFLOP/s on H100 and
  # H200 SXM: the plan's MFU is against device_flops).
  gpu_sets=(--set parallel.device_memory="${gpu_mib:-81920}MiB" --set parallel.device_flops=989e12)
  run_logged profile-gpt2 "$PROFILE_TIMEOUT" "$partrain" train configs/gpt2.toml "${gpu_sets[@]}" --set train.device=cuda --set train.precision=bf16 \
    --set train.steps=2 --set train.global_batch=8 --set train.microbatches=1 --set data.path="$data/text.h5" \
    --set profile.enabled=true --set profile.cache_dir="$cache" --set parallel.planner=rannc \
    --set log.dir="$work/runs/profile-gpt2" --set checkpoint.every=0 --set train.eval_every=0 --set log.trace=
  rc=$?
  profile_db=$(ls -t "$cache"/* 2>/dev/null | head -1)
  if [ $rc != 0 ] || [ -z "$profile_db" ]; then
    record "profile gpt2 on the GPU" fail $((SECONDS - t0)) "rc $rc: $(last_lines profile-gpt2)"
  else
    record "profile gpt2 on the GPU" pass $((SECONDS - t0)) "$(grep -iE 'prediction|profil' "$work/logs/profile-gpt2.log" | tail -3)"
    t0=$SECONDS
    run_logged plan-gpt2-8gpus 120 "$partrain" plan configs/gpt2.toml --world-size 8 --device-memory "${gpu_mib:-81920}MiB" \
      --set parallel.device_flops=989e12 \
      --profile-db "$profile_db" --set train.precision=bf16 --set train.global_batch=512 \
      --save "$work/logs/plan-gpt2-8gpus.json"
    rc=$?
    [ $rc = 0 ] && status=pass || status=fail
    record "plan gpt2 on 8 GPUs from the GPU ProfileDB" $status $((SECONDS - t0)) "$(tail -4 "$work/logs/plan-gpt2-8gpus.log")"
  fi
fi

# ---- f. the benchmark against PyTorch on the same GPU (last: it may run out of time) ----
if wants benchmark; then
  t0=$SECONDS
  CASES=${BENCHMARK_CASES:-"gpt1024 bert128 bert512 resnet50"} PRECISIONS=${BENCHMARK_PRECISIONS:-bf16} \
    MODES=${BENCHMARK_MODES:-eager} STEPS=${BENCHMARK_STEPS:-10} WARMUP=${BENCHMARK_WARMUP:-3} \
    RUN_TIMEOUT=${BENCHMARK_RUN_TIMEOUT:-120} PARTRAIN=$partrain PYTHON=$python COPY_TO= OUT= \
    RESULTS_DIR="$work/logs/benchmark" TEXT_DATA="$data/text.h5" \
    timeout --kill-after=5 "$(seconds_left "${BENCHMARK_TIMEOUT:-300}")" bash validation/perf/gpu_training_benchmark.sh
  rc=$?
  cp "$work/logs/benchmark/results.md" "$out/benchmark.md" 2>/dev/null
  [ $rc = 0 ] && status=pass || status=fail
  record benchmark $status $((SECONDS - t0)) "rc $rc; see benchmark.md"
fi

echo "device-checks: $failures failed check(s) in $((SECONDS - started)) s; $out/device-checks.json"
save
exec >&- 2>&-  # let tee write the last lines before the command ends
wait "$tee_pid" 2>/dev/null
exit $((failures > 0))
