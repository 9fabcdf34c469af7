# Sourced by the `slurm` CTest scripts (check_slurm_job.sh, check_slurm_requeue.sh,
# check_slurm_multi_node.sh) after they set `source_dir`, `binary` and `test_name`: skip/fail helpers, the checks that Slurm and root are
# there (exit 77, CTest's SKIP_RETURN_CODE, otherwise), one Slurm test at a time on this machine,
# and a cleanup trap that cancels the test's job (`job_id`), stops a cluster the test started
# (`started_cluster`; start it with start_local_cluster [NODES]) and starts again a cluster of
# another size that it replaced (`restore_nodes`).
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

# wait_for_job JOB_ID LOG TIMEOUT: a bounded wait while squeue lists the job (until it ends); a job
# that can never run, or one still listed after TIMEOUT seconds, fails the test (its log's tail shown).
wait_for_job() {
  local job_id=$1 log=$2 timeout=$3 reason deadline=$(( SECONDS + $3 ))
  while squeue -h -j "$job_id" 2>/dev/null | grep -q .; do
    reason=$(squeue -h -j "$job_id" -o '%T %r' 2>/dev/null)
    case "$reason" in
      PENDING*PartitionConfig*|PENDING*ReqNodeNotAvail*|PENDING*PartitionNodeLimit*)
        scontrol show job "$job_id"; fail "job $job_id can never run: $reason" ;;
    esac
    if [ $SECONDS -ge $deadline ]; then
      scontrol show job "$job_id"
      [ -f "$log" ] && tail -n 30 "$log"
      fail "job $job_id still '$reason' after $timeout s: cancelled"
    fi
    sleep 1
  done
}

for tool in sbatch squeue scontrol scancel sinfo slurmctld slurmd munged; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
    skip "$tool is not installed (jobscripts/install-deps.sh installs slurmctld slurmd slurm-client munge)"
done
if [ "$(id -u)" -ne 0 ] && ! sudo -n true 2>/dev/null; then
  skip "starting munged/slurmctld/slurmd needs root or passwordless sudo"
fi
[ -x "$binary" ] || fail "$binary is not an executable"

# One Slurm test at a time on this machine (several build trees may run CTest side by side).
exec 9>"${TMPDIR:-/tmp}/partrain-slurm-ctest.lock"
flock -w 90 9 || fail "another slurm test held the lock for 90 s"

cluster=$source_dir/jobscripts/slurm-local-cluster.sh
job_id=""
started_cluster=0
restore_nodes=0   # the size of a local cluster that ran before this test and is started again after it
cleanup() {
  local rc=$?
  if [ -n "$job_id" ] && squeue -h -j "$job_id" 2>/dev/null | grep -q .; then
    echo "$test_name: cancelling job $job_id"
    scancel "$job_id" 2>/dev/null || true
    local _   # let slurmd kill the job's tasks before the cluster goes down (KillWait=5)
    for _ in $(seq 30); do squeue -h -j "$job_id" 2>/dev/null | grep -q . || break; sleep 0.5; done
  fi
  if [ $started_cluster -eq 1 ]; then "$cluster" stop || true; fi
  if [ "$restore_nodes" -gt 0 ]; then
    echo "$test_name: starting the $restore_nodes-node local cluster that ran before again"
    "$cluster" start --nodes "$restore_nodes" >/dev/null 9>&- || echo "$test_name: the $restore_nodes-node cluster did not start again" >&2
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# start_local_cluster [NODES]: uses the local cluster of NODES nodes (default 1) that already runs
# (left running afterwards), else starts one (stopped at exit); a local cluster of another size is
# stopped for the test and started again at exit. With 2+ nodes (network namespaces), a machine
# that cannot host them (the cluster script's exit code 3) skips the test.
start_local_cluster() {
  local nodes=${1:-1} running rc=0
  if "$cluster" status --nodes "$nodes" >/dev/null 2>&1; then
    echo "$test_name: using the $nodes-node Slurm cluster that already runs (left running afterwards)"
    return 0
  fi
  running=$("$cluster" nodes 2>/dev/null || echo 0)
  if [ "${running:-0}" -gt 0 ] && [ "$running" != "$nodes" ]; then
    echo "$test_name: a $running-node local cluster runs: replaced by a $nodes-node one for this test, started again at exit"
    restore_nodes=$running
  fi
  started_cluster=1
  "$cluster" start --nodes "$nodes" 9>&- || rc=$?   # 9>&-: the daemons must not hold the test lock
  if [ $rc -eq 3 ]; then
    # refused; usually before anything changed: then the cluster that ran before runs on, untouched
    if [ "$restore_nodes" -gt 0 ] && "$cluster" status --nodes "$restore_nodes" >/dev/null 2>&1; then
      started_cluster=0 restore_nodes=0
    fi
    skip "this machine cannot host a $nodes-node local Slurm cluster (network/hostname namespaces refused: above)"
  fi
  [ $rc -eq 0 ] || fail "the local Slurm cluster did not start (see /var/log/slurm/*.log)"
}
