#!/usr/bin/env bash
# The `slurm` CTest: the real jobscripts/slurm-single-node.sbatch under a real (one-machine) Slurm.
#   check_slurm_job.sh SOURCE_DIR PARTRAIN_BINARY WORK_DIR
# Starts jobscripts/slurm-local-cluster.sh (unless a cluster already runs: then it is left running),
# submits bert-tiny for 4 steps on 4 tasks, polls squeue (bounded: JOB_TIMEOUT seconds, then scancel
# and fail), and checks the job state and exit code, the log's loss lines and the outputs
# (plan.json, metrics.jsonl, trace.json). Stops the cluster it started, also on failure.
# Exit 77 (CTest SKIP_RETURN_CODE) when Slurm is not installed or root is not available.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
binary=$2
work=$3
job_timeout=${JOB_TIMEOUT:-240}
steps=4
tasks=4
python=/usr/bin/python3

test_name=check_slurm_job
# shellcheck source=slurm_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_test_common.sh"
[ -x "$python" ] || fail "$python is missing (data/prepare.sh installs it)"

start_local_cluster

rm -rf "$work"
mkdir -p "$work"
run_dir=$work/run
cd "$source_dir" || fail "cannot cd to $source_dir"   # the job script runs in the submit directory (configs/, data/prepared/)
export PARTRAIN_BINARY=$binary OMP_NUM_THREADS=1
# Through jobscripts/submit.sh, which requests the plan's world size ($tasks ranks: one node) and
# submits the real jobscripts/slurm-single-node.sbatch.
job_id=$(jobscripts/submit.sh configs/bert-tiny.toml --set parallel.world_size=$tasks \
           --set train.steps=$steps --set log.every=1 --set log.dir="$run_dir" \
           --set profile.cache_dir="$work/profile-cache" --set checkpoint.every=$steps \
           -- --job-name=partrain-ctest --time=00:10:00 --output="$work/slurm-%j.out" | tail -1) ||
  fail "jobscripts/submit.sh failed"
job_id=${job_id%%;*}
log=$work/slurm-$job_id.out
echo "check_slurm_job: submitted job $job_id (log $log)"

started=$SECONDS
wait_for_job "$job_id" "$log" "$job_timeout"
elapsed=$(( SECONDS - started ))

# accounting is off in the local cluster (no sacct): scontrol keeps finished jobs for MinJobAge
job_info=$(scontrol show job "$job_id" 2>&1)
state=$(grep -oE 'JobState=[A-Z_]+' <<<"$job_info" | head -1)
exit_code=$(grep -oE ' ExitCode=[0-9]+:[0-9]+' <<<"$job_info" | head -1 | tr -d ' ')
echo "check_slurm_job: job $job_id ended after about $elapsed s: $state $exit_code"
echo "----- $log"
cat "$log" 2>/dev/null
echo "-----"
[ "$state" = JobState=COMPLETED ] || { echo "$job_info"; fail "job $job_id did not complete: $state"; }
[ "$exit_code" = ExitCode=0:0 ] || fail "job $job_id exit code: $exit_code"

# The log: one line per step, then the first/last loss summary.
[ -f "$log" ] || fail "no job log $log"
grep -q "^partrain: job $job_id on .*, $tasks tasks, config configs/bert-tiny.toml" "$log" ||
  fail "the log does not start with the job line"
for step in $(seq 1 $steps); do
  grep -qE "^step $step/$steps \| loss [0-9]+\.[0-9]+ \| lr " "$log" || fail "no 'step $step/$steps | loss X' line in the log"
done
grep -qE "^first loss [0-9]+\.[0-9]+, last loss [0-9]+\.[0-9]+ after $steps steps$" "$log" ||
  fail "no 'first loss X, last loss Y after $steps steps' line in the log"
grep -qE "^plan: .* on $tasks devices" "$log" || fail "the plan was not made for $tasks devices"

# The outputs: plan.json and trace.json parse, metrics.jsonl has one object per step.
"$python" - "$run_dir" "$steps" "$tasks" <<'PY' || fail "the job's outputs are wrong (above)"
import json, math, sys
run_dir, steps, tasks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
plan = json.load(open(f"{run_dir}/plan.json"))
assert isinstance(plan, dict) and plan, "plan.json is not a JSON object"
lines = [line for line in open(f"{run_dir}/metrics.jsonl") if line.strip()]
assert len(lines) == steps, f"metrics.jsonl has {len(lines)} lines, expected {steps}"
for number, line in enumerate(lines, 1):
    record = json.loads(line)
    assert isinstance(record, dict), f"metrics.jsonl line {number} is not an object"
    for key in ("step", "loss", "lr"):
        assert key in record, f"metrics.jsonl line {number} lacks {key}"
    assert record["step"] == number, f"metrics.jsonl line {number} has step {record['step']}"
    assert math.isfinite(record["loss"]) and record["loss"] > 0, f"bad loss on line {number}"
trace = json.load(open(f"{run_dir}/trace.json"))
events = trace["traceEvents"]
ranks = {event["pid"] for event in events if event.get("ph") == "X"}
assert ranks == set(range(tasks)), f"trace.json has complete events of ranks {sorted(ranks)}"
print(f"check_slurm_job: plan.json, {len(lines)} metrics lines, trace.json with {len(events)} events of {len(ranks)} ranks: OK")
PY

# The checkpoint the job wrote after its last step: a readable partrain checkpoint of that step.
checkpoint=$run_dir/checkpoints/$(printf 'step_%06d.h5' "$steps")
[ -f "$checkpoint" ] || fail "the job wrote no checkpoint $checkpoint"
grep -q "^checkpoint: $checkpoint" "$log" || fail "the job log does not announce $checkpoint"
"$binary" inspect "$checkpoint" > "$work/inspect.txt" 2>&1 || fail "partrain inspect $checkpoint failed: $(cat "$work/inspect.txt")"
grep -q "^step: $steps\$" "$work/inspect.txt" || fail "partrain inspect $checkpoint does not report step $steps"
grep -q "^model/bert.embeddings.word_embeddings.weight " "$work/inspect.txt" || fail "the checkpoint lacks the word embeddings"
echo "check_slurm_job: checkpoint $checkpoint (step $steps): OK"

# The plots from the job's outputs (plot_run.py exits 0 with a message without matplotlib).
"$source_dir/validation/plot_run.py" "$run_dir" --out "$work/plots" || fail "validation/plot_run.py failed"
echo "check_slurm_job: OK"
