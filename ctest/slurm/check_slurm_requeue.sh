#!/usr/bin/env bash
# The `slurm` CTests of time limits and preemption (faults item 4):
#   check_slurm_requeue.sh SOURCE_DIR PARTRAIN_BINARY WORK_DIR [time-limit]
# Trains gpt-tiny on 4 ranks (a manual 2x2 plan, so every run trains bitwise the same numbers)
# once straight under mpiexec, then as a job of the real jobscripts/slurm-single-node.sbatch on the
# local Slurm (jobscripts/slurm-local-cluster.sh).
# - Default: once the job has logged a few steps, its batch shell gets SIGUSR1 the way
#   `--signal=B:USR1@<lead>` delivers it before a time limit (scancel --batch --signal=USR1).
# - `time-limit`: nothing is sent; the job runs with a real 1-minute limit (--time=1) and
#   --signal=B:USR1@LEAD_SECONDS (default 45), so slurmctld itself signals the batch shell when the
#   limit nears (its check runs every 30 s: 15 to 45 s into the run). The job trains more steps
#   than fit in a minute whatever the machine's speed: a 10-step calibration run measures the
#   seconds per step here and now, and the job gets enough steps for 100 s of training (STEPS
#   overrides), so the signal stops it; once requeued (pending), the test gives it 10 minutes, and
#   the second run completes. About 5 minutes (Slurm holds a requeued job back for 2).
# Checks: the script forwards the signal to the ranks, they checkpoint and exit 3, the script
# requeues the job, the requeued run resumes from that checkpoint (--resume auto), the job
# completes (Restarts=1, exit code 0), every step is logged once, and the losses are the straight
# run's exactly. Bounded waits; exit 77 (skip) without Slurm or root.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
binary=$2
work=$3
mode=${4:-signal}
job_timeout=${JOB_TIMEOUT:-300}
steps=${STEPS:-60}
lead=${LEAD_SECONDS:-45}
case "$mode" in
  signal) time_options=(--time=00:10:00) ;;
  time-limit) steps=${STEPS:-0} time_options=(--time=1 "--signal=B:USR1@$lead") ;;
  *) echo "check_slurm_requeue.sh: unknown mode $mode (signal or time-limit)" >&2; exit 2 ;;
esac
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

# 0. time-limit: as many steps as take 100 s at this machine's present speed (the median step of a
# 10-step calibration run), so the job cannot finish inside its 1-minute limit on a fast machine.
if [ "$steps" = 0 ]; then
  calibration=(--set train.steps=10 "${arguments[@]:2}")
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
    mpiexec -n $tasks --oversubscribe --allow-run-as-root "$binary" train configs/gpt-tiny.toml "${calibration[@]}" \
    --set log.dir="$work/calibration" > "$work/calibration.log" 2>&1 || { tail -20 "$work/calibration.log"; fail "the calibration run failed"; }
  steps=$("$python" - "$work/calibration/metrics.jsonl" <<'PY'
import json, math, statistics, sys
seconds = statistics.median(json.loads(line)["seconds"] for line in open(sys.argv[1]) if line.strip())
print(max(150, math.ceil(100 / seconds)))
PY
) || fail "cannot read the calibration run's step times"
  arguments[1]=train.steps=$steps
  echo "check_slurm_requeue: calibration: $steps steps take about 100 s here"
fi

# 1. The uninterrupted run.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout $(( 60 + 3 * steps )) \
  mpiexec -n $tasks --oversubscribe --allow-run-as-root "$binary" train configs/gpt-tiny.toml "${arguments[@]}" \
  --set log.dir="$work/straight" > "$work/straight.log" 2>&1 || { tail -20 "$work/straight.log"; fail "the straight run failed"; }

# 2. The same as a Slurm job, signalled as before a time limit.
start_local_cluster
run_dir=$work/run
job_id=$(sbatch --parsable --ntasks=$tasks --job-name=partrain-requeue "${time_options[@]}" --output="$work/slurm-%j.out" \
           jobscripts/slurm-single-node.sbatch configs/gpt-tiny.toml "${arguments[@]}" --set log.dir="$run_dir") ||
  fail "sbatch failed"
job_id=${job_id%%;*}
log=$work/slurm-$job_id.out
echo "check_slurm_requeue: submitted job $job_id (log $log)"
rows() { local n; n=$(grep -c '"step"' "$run_dir/metrics.jsonl" 2>/dev/null); echo "${n:-0}"; }
deadline=$(( SECONDS + job_timeout ))
if [ "$mode" = signal ]; then
  until [ "$(rows)" -ge $signal_after ]; do
    squeue -h -j "$job_id" 2>/dev/null | grep -q . || { cat "$log"; fail "job $job_id ended before step $signal_after"; }
    [ $SECONDS -lt $deadline ] || { cat "$log"; fail "job $job_id logged no $signal_after steps in $job_timeout s"; }
    sleep 0.2
  done
  scancel --batch --signal=USR1 "$job_id" || fail "scancel --batch --signal=USR1 $job_id failed"
  echo "check_slurm_requeue: sent SIGUSR1 to the batch shell of job $job_id after $(rows) steps"
else
  echo "check_slurm_requeue: job $job_id has a 1-minute time limit and --signal=B:USR1@$lead: waiting for Slurm to signal it"
fi

# 3. Bounded wait: the job requeues, runs again and completes. With a real time limit, the
# requeued job (pending: Slurm delays a requeued job's start by about 2 minutes) gets a 10-minute
# limit, so that its second run finishes instead of being stopped again every minute.
extended=0
while squeue -h -j "$job_id" 2>/dev/null | grep -q .; do
  [ $SECONDS -lt $deadline ] || { scontrol show job "$job_id"; cat "$log"; fail "job $job_id still runs after $job_timeout s"; }
  if [ "$mode" = time-limit ] && [ $extended -eq 0 ] &&
     scontrol show job "$job_id" 2>/dev/null | grep -q 'JobState=PENDING .*' &&
     scontrol show job "$job_id" 2>/dev/null | grep -qE 'Restarts=[1-9]'; then
    scontrol update JobId="$job_id" TimeLimit=10 || fail "scontrol update JobId=$job_id TimeLimit=10 failed"
    extended=1
    echo "check_slurm_requeue: job $job_id was stopped by its time limit's signal and requeued: its next run gets 10 minutes"
  fi
  sleep 1
done
job_info=$(scontrol show job "$job_id" 2>&1)
echo "----- $log"; cat "$log"; echo "-----"
grep -q 'JobState=COMPLETED' <<<"$job_info" || { echo "$job_info"; fail "job $job_id did not complete"; }
grep -q ' ExitCode=0:0' <<<"$job_info" || { echo "$job_info"; fail "job $job_id did not exit 0"; }
restarts=$(grep -oE 'Restarts=[0-9]+' <<<"$job_info" | head -1)
restarts=${restarts#Restarts=}
if [ "$mode" = signal ]; then
  [ "$restarts" = 1 ] || { echo "$job_info"; fail "job $job_id was not requeued exactly once (Restarts=$restarts)"; }
else
  [ "${restarts:-0}" = 1 ] || { echo "$job_info"; fail "job $job_id was requeued ${restarts:-0} times, not once (0: the training ended before the time limit's signal: raise STEPS)"; }
  [ $extended -eq 1 ] || fail "job $job_id was never seen pending after its requeue"
fi
# One stop per requeue, each followed by the requeue and a resume from its checkpoint.
mapfile -t stops < <(grep -oE "^stopped by SIGUSR1 after step [0-9]+ of $steps" "$log" | sed -E 's/.* after step ([0-9]+) of .*/\1/')
[ ${#stops[@]} -gt 0 ] || fail "no 'stopped by SIGUSR1 after step N' line in the log"
[ ${#stops[@]} -eq "$restarts" ] || fail "${#stops[@]} stops logged (steps ${stops[*]}) but Restarts=$restarts"
[ "$(grep -c '^partrain: SIGUSR1: asking the ranks to checkpoint and stop' "$log")" -eq "$restarts" ] ||
  fail "the batch script did not forward SIGUSR1 once per run that was stopped"
[ "$(grep -c "^partrain: stopped after a checkpoint (exit code 3): requeueing job $job_id" "$log")" -eq "$restarts" ] ||
  fail "the script did not requeue after every stop"
for restart in $(seq "$restarts"); do
  step=${stops[$(( restart - 1 ))]}
  checkpoint=$run_dir/checkpoints/$(printf 'step_%06d.h5' "$step")
  grep -q "^partrain: restart $restart of job $job_id: --resume auto" "$log" || fail "restart $restart was not given --resume auto"
  grep -q "^resume: $checkpoint (step $step)" "$log" || fail "no run resumed from $checkpoint"
done
step=${stops[-1]}

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
echo "check_slurm_requeue: OK ($mode: stopped after step(s) ${stops[*]}, requeued $restarts time(s), resumed, completed)"
