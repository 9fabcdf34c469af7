#!/usr/bin/env bash
# The `slurm` CTest of the multi-node job script: the real jobscripts/slurm-multi-node.sbatch on a
# two-node local Slurm (jobscripts/slurm-local-cluster.sh start --nodes 2: two slurmd, each in its
# own network and hostname namespace on this machine), 2 tasks per node.
#   check_slurm_multi_node.sh SOURCE_DIR PARTRAIN_BINARY WORK_DIR
# Trains bert-tiny for a few steps under a fixed 2-stage x 2-replica plan, once straight under
# mpiexec on this machine (the reference) and once through jobscripts/submit.sh, which submits the
# multi-node script for 4 ranks of 2 per node. Checks: the job ran on node1 and node2 and completed
# with exit code 0; partrain's ranks saw two hostnames (the communication profile has a measured
# across-nodes link, which partrain measures only between ranks whose hostnames differ); every
# step's loss equals the reference's (1e-5 relative); the checkpoint is readable. Bounded waits.
# A local cluster of another size that runs before is started again at exit (the one-node tests
# then find theirs); one this test started is stopped. Exit 77 (skip) without Slurm, root, or
# network/hostname namespaces.
set -uo pipefail
source_dir=$(cd "$1" && pwd)
binary=$2
work=$3
job_timeout=${JOB_TIMEOUT:-240}
steps=${STEPS:-4}
nodes=2
per_node=2
tasks=$(( nodes * per_node ))
python=/usr/bin/python3

test_name=check_slurm_multi_node
# shellcheck source=slurm_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_test_common.sh"
[ -x "$python" ] || fail "$python is missing (data/prepare.sh installs it)"

rm -rf "$work"
mkdir -p "$work"
cd "$source_dir" || fail "cannot cd to $source_dir"   # the job script runs in the submit directory (configs/, data/prepared/)
source jobscripts/mpi-env.sh
export PARTRAIN_BINARY=$binary OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# A manual plan with everything the planner could pick fixed, so the two runs train the same numbers.
arguments=(--set train.steps=$steps --set log.every=1 --set checkpoint.every=$steps --set parallel.world_size=$tasks
           --set parallel.devices_per_node=$per_node --set parallel.planner=manual --set parallel.stages=2
           --set 'parallel.replicas=[2,2]' --set 'parallel.boundaries=["encoder.layer.1"]'
           --set train.microbatches=2 --set parallel.recompute=none)

# 1. The two-node cluster (first: a machine without namespaces skips at once), and the reference:
# the same 4 ranks on this machine under mpiexec.
start_local_cluster $nodes
timeout 240 mpiexec -n $tasks --oversubscribe --allow-run-as-root "$binary" train configs/bert-tiny.toml "${arguments[@]}" \
  --set log.dir="$work/reference" --set profile.cache_dir="$work/reference-profile" > "$work/reference.log" 2>&1 ||
  { tail -20 "$work/reference.log"; fail "the reference run under mpiexec failed"; }

# 2. The job: submit.sh picks the multi-node script (world size 4 > 2 devices per node).
run_dir=$work/run
profile_dir=$work/profile-cache
job_id=$(jobscripts/submit.sh configs/bert-tiny.toml "${arguments[@]}" --set log.dir="$run_dir" \
           --set profile.cache_dir="$profile_dir" \
           -- --job-name=partrain-multi-node --time=00:10:00 --output="$work/slurm-%j.out" | tee "$work/submit.out" | tail -1) ||
  { cat "$work/submit.out"; fail "jobscripts/submit.sh failed"; }
job_id=${job_id%%;*}
grep -q "^submit: sbatch .*--nodes=$nodes --ntasks-per-node=$per_node .*slurm-multi-node.sbatch" "$work/submit.out" ||
  { cat "$work/submit.out"; fail "submit.sh did not choose the multi-node script with $nodes nodes of $per_node tasks"; }
log=$work/slurm-$job_id.out
echo "check_slurm_multi_node: submitted job $job_id (log $log)"

started=$SECONDS
wait_for_job "$job_id" "$log" "$job_timeout"
elapsed=$(( SECONDS - started ))
job_info=$(scontrol show job "$job_id" 2>&1)
state=$(grep -oE 'JobState=[A-Z_]+' <<<"$job_info" | head -1)
exit_code=$(grep -oE ' ExitCode=[0-9]+:[0-9]+' <<<"$job_info" | head -1 | tr -d ' ')
node_list=$(grep -oE ' NodeList=[^ ]+' <<<"$job_info" | head -1 | tr -d ' ')
echo "check_slurm_multi_node: job $job_id ended after about $elapsed s: $state $exit_code $node_list"
echo "----- $log"
cat "$log" 2>/dev/null
echo "-----"
[ "$state" = JobState=COMPLETED ] || { echo "$job_info"; tail -n 20 /var/log/slurm/slurmd-node*.log; fail "job $job_id did not complete: $state"; }
[ "$exit_code" = ExitCode=0:0 ] || fail "job $job_id exit code: $exit_code"
[ "$node_list" = "NodeList=node[1-2]" ] || fail "job $job_id ran on $node_list, not on node[1-2]"

# 3. The log: the script's job line, one loss line per step, the plan for 4 devices.
[ -f "$log" ] || fail "no job log $log"
grep -q "^partrain: job $job_id on node\[1-2\]: $tasks tasks, $per_node per node, config configs/bert-tiny.toml" "$log" ||
  fail "the log does not start with the multi-node job line"
for step in $(seq 1 $steps); do
  grep -qE "^step $step/$steps \| loss [0-9]+\.[0-9]+ \| lr " "$log" || fail "no 'step $step/$steps | loss X' line in the log"
done
grep -qE "^plan: manual, 2 stages .* on $tasks devices" "$log" || fail "the plan was not the manual one for $tasks devices"

# 4. Two hostnames, and the reference's losses.
"$python" - "$work/reference" "$run_dir" "$steps" "$profile_dir" <<'PY' || fail "the job's numbers or hosts are wrong (above)"
import glob, json, sys
reference, run, steps, profile_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def rows(d): return [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
a, b = rows(reference), rows(run)
assert [r["step"] for r in b] == list(range(1, steps + 1)), f"steps logged by the job: {[r['step'] for r in b]}"
assert [r["step"] for r in a] == list(range(1, steps + 1)), f"steps logged by the reference: {[r['step'] for r in a]}"
worst = max(abs(r["loss"] - s["loss"]) / abs(s["loss"]) for r, s in zip(b, a))
for r, s in zip(b, a):
    print(f"step {r['step']}: job loss {r['loss']:.6f}, reference {s['loss']:.6f}")
assert worst <= 1e-5, f"the losses differ from the reference's by {worst:.2e} (relative) > 1e-5"
files = glob.glob(f"{profile_dir}/profile-*.json")
assert files, f"no communication profile in {profile_dir}"
communication = json.load(open(files[0]))["communication"]
across = communication.get("across_nodes") or {}
assert across.get("bytes_per_second", 0) > 0, (
    f"partrain measured no link across nodes: its ranks saw a single hostname ({communication})")
print(f"check_slurm_multi_node: {steps} steps, losses within {worst:.1e} of the one-machine run's; "
      f"ranks on two hostnames (across-nodes link {across['bytes_per_second'] / 1e9:.2f} GB/s)")
PY

# 5. The checkpoint the job wrote after its last step.
checkpoint=$run_dir/checkpoints/$(printf 'step_%06d.h5' "$steps")
[ -f "$checkpoint" ] || fail "the job wrote no checkpoint $checkpoint"
"$binary" inspect "$checkpoint" > "$work/inspect.txt" 2>&1 || fail "partrain inspect $checkpoint failed: $(cat "$work/inspect.txt")"
grep -q "^step: $steps\$" "$work/inspect.txt" || fail "partrain inspect $checkpoint does not report step $steps"
echo "check_slurm_multi_node: checkpoint $checkpoint (step $steps): OK"
echo "check_slurm_multi_node: OK (job $job_id on node1 and node2, 2 tasks each)"
