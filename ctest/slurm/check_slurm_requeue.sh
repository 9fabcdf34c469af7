#!/usr/bin/env bash
# The `slurm` CTest of time limits and preemption (faults item 4):
#   check_slurm_requeue.sh SOURCE_DIR PARTRAIN_BINARY WORK_DIR
# Trains gpt-tiny on 4 ranks (a manual 2x2 plan, so every run trains bitwise the same numbers)
# once straight under mpiexec, then as a job of the real jobscripts/slurm-single-node.sbatch on the
# local Slurm (jobscripts/slurm-local-cluster.sh). Once the job has logged a few steps, its batch
# shell gets SIGUSR1 the way `--signal=B:USR1@<lead>` delivers it before a time limit (scancel
# --batch --signal=USR1). Checks: the script forwards it to the ranks, they checkpoint and exit 3,
# the script requeues the job, the requeued run resumes from that checkpoint (--resume auto), the
# job completes (Restarts=1, exit code 0), every step is logged once, and the losses are the
# straight run's exactly. Bounded waits; exit 77 (skip) without Slurm or root.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
binary=$2
work=$3
job_timeout=${JOB_TIMEOUT:-300}
steps=${STEPS:-60}
signal_after=3
tasks=4
python=/usr/bin/python3

test_name=check_slurm_requeue
# shellcheck source=slurm_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_test_common.sh"

rm -rf "$work"
mkdir -p "$work"
cd "$source_dir" || fail "cannot cd to $source_dir"
source jobscripts/mpi-env.sh
export PARTRAIN_BINARY=$binary OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
arguments=(--set train.steps=$steps --set train.global_batch=8 --set model.seq_len=32 --set checkpoint.every=0
           --set data.path=data/prepared/text.h5 --set parallel.planner=manual --set parallel.stages=2
           --set 'parallel.replicas=[2,2]' --set 'parallel.boundaries=["h.1"]' --set train.microbatches=2
           --set profile.cache_dir="$work/profile-cache")

# 1. The uninterrupted run.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 240 \
  mpiexec -n $tasks --oversubscribe --allow-run-as-root "$binary" train configs/gpt-tiny.toml "${arguments[@]}" \
  --set log.dir="$work/straight" > "$work/straight.log" 2>&1 || { tail -20 "$work/straight.log"; fail "the straight run failed"; }

# 2. The same as a Slurm job, signalled as before a time limit.
start_local_cluster
run_dir=$work/run
job_id=$(sbatch --parsable --ntasks=$tasks --job-name=partrain-requeue --time=00:10:00 --output="$work/slurm-%j.out" \
           jobscripts/slurm-single-node.sbatch configs/gpt-tiny.toml "${arguments[@]}" --set log.dir="$run_dir") ||
  fail "sbatch failed"
job_id=${job_id%%;*}
log=$work/slurm-$job_id.out
echo "check_slurm_requeue: submitted job $job_id (log $log)"
rows() { local n; n=$(grep -c '"step"' "$run_dir/metrics.jsonl" 2>/dev/null); echo "${n:-0}"; }
deadline=$(( SECONDS + job_timeout ))
until [ "$(rows)" -ge $signal_after ]; do
  squeue -h -j "$job_id" 2>/dev/null | grep -q . || { cat "$log"; fail "job $job_id ended before step $signal_after"; }
  [ $SECONDS -lt $deadline ] || { cat "$log"; fail "job $job_id logged no $signal_after steps in $job_timeout s"; }
  sleep 0.2
done
scancel --batch --signal=USR1 "$job_id" || fail "scancel --batch --signal=USR1 $job_id failed"
echo "check_slurm_requeue: sent SIGUSR1 to the batch shell of job $job_id after $(rows) steps"

# 3. Bounded wait: the job requeues, runs again and completes.
while squeue -h -j "$job_id" 2>/dev/null | grep -q .; do
  [ $SECONDS -lt $deadline ] || { scontrol show job "$job_id"; cat "$log"; fail "job $job_id still runs after $job_timeout s"; }
  sleep 1
done
job_info=$(scontrol show job "$job_id" 2>&1)
echo "----- $log"; cat "$log"; echo "-----"
grep -q 'JobState=COMPLETED' <<<"$job_info" || { echo "$job_info"; fail "job $job_id did not complete"; }
grep -q ' ExitCode=0:0' <<<"$job_info" || { echo "$job_info"; fail "job $job_id did not exit 0"; }
grep -q 'Restarts=1 ' <<<"$job_info" || { echo "$job_info"; fail "job $job_id was not requeued exactly once"; }
stopped=$(grep -oE "^stopped by SIGUSR1 after step [0-9]+ of $steps" "$log" | head -1)
[ -n "$stopped" ] || fail "no 'stopped by SIGUSR1 after step N' line in the log"
step=${stopped#stopped by SIGUSR1 after step }
step=${step%% *}
checkpoint=$run_dir/checkpoints/$(printf 'step_%06d.h5' "$step")
grep -q "^partrain: stopped after a checkpoint (exit code 3): requeueing job $job_id" "$log" || fail "the script did not requeue"
grep -q "^partrain: restart 1 of job $job_id: --resume auto" "$log" || fail "the requeued run was not given --resume auto"
grep -q "^resume: $checkpoint (step $step)" "$log" || fail "the requeued run did not resume from $checkpoint"

# 4. Every step once, the straight run's losses exactly.
"$python" - "$work/straight" "$run_dir" "$steps" <<'PY' || fail "the losses differ from the straight run's (above)"
import json, sys
straight, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(d): return [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
a, b = rows(straight), rows(run)
assert [r["step"] for r in b] == list(range(1, steps + 1)), f"steps logged: {[r['step'] for r in b]}"
assert [r["loss"] for r in a] == [r["loss"] for r in b], [(r["step"], r["loss"], s["loss"]) for r, s in zip(a, b) if r["loss"] != s["loss"]]
print(f"check_slurm_requeue: {steps} steps, losses identical to the straight run's")
PY
echo "check_slurm_requeue: OK (stopped after step $step, requeued, resumed, completed)"
