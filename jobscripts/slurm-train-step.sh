# Sourced by the slurm-*.sbatch scripts: runs the training step so that a time limit or a
# preemption costs at most the current step.
#   partrain_train_step srun [srun options] BINARY train CONFIG [options]
# - The scripts request `--signal=B:USR1@<lead>`: Slurm signals this batch shell <lead> seconds
#   before the time limit. The trap forwards SIGUSR1 (and a SIGTERM from scancel or preemption) to
#   srun, which passes it to every rank; partrain finishes its step, the ranks agree, write a
#   checkpoint and exit with code 3 ("stopped by signal after a checkpoint").
# - Exit code 3: `scontrol requeue` (the scripts request --requeue). A requeued run (a restart count
#   above 0) gets `--resume auto`: the newest valid checkpoint when there is one, else a fresh start;
#   a different task count re-plans for the new world size.
# Returns the step's exit code (0 once requeued).
partrain_train_step() {
  local command=("$@") argument has_resume=0
  for argument in "${command[@]}"; do [ "$argument" = --resume ] && has_resume=1; done
  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ $has_resume -eq 0 ]; then
    echo "partrain: restart ${SLURM_RESTART_COUNT} of job ${SLURM_JOB_ID:-?}: --resume auto"
    command+=(--resume auto)
  fi
  "${command[@]}" &
  local step_pid=$! status=0
  # shellcheck disable=SC2064
  trap "echo 'partrain: SIGUSR1: asking the ranks to checkpoint and stop'; kill -USR1 $step_pid 2>/dev/null || true" USR1
  # shellcheck disable=SC2064
  trap "echo 'partrain: SIGTERM: asking the ranks to checkpoint and stop'; kill -TERM $step_pid 2>/dev/null || true" TERM
  while true; do
    status=0
    wait "$step_pid" || status=$?
    # a trapped signal interrupts wait (status > 128) while srun still runs: wait again
    kill -0 "$step_pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  if [ "$status" -eq 3 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "partrain: stopped after a checkpoint (exit code 3): requeueing job $SLURM_JOB_ID; it resumes from the newest checkpoint"
    if scontrol requeue "$SLURM_JOB_ID"; then
      return 0
    fi
    echo "partrain: scontrol requeue $SLURM_JOB_ID failed: resubmit with --resume latest" >&2
  fi
  return "$status"
}
