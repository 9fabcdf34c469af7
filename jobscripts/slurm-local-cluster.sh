#!/usr/bin/env bash
# A one-machine Slurm cluster (munged + slurmctld + slurmd, no systemd) for trying the job scripts
# and for the `slurm` CTest. Needs root (or passwordless sudo) and the Debian packages from
# jobscripts/install-deps.sh (slurmctld, slurmd, slurm-client, munge).
#   jobscripts/slurm-local-cluster.sh start    # writes /etc/slurm/slurm.conf, starts the daemons, waits for `idle`
#   jobscripts/slurm-local-cluster.sh status   # exit 0 when all three daemons run and the node answers
#   jobscripts/slurm-local-cluster.sh stop     # stops the daemons by the PIDs in their pid files
# Both start and stop are idempotent. Environment:
#   FAKE_CPUS    CPUs the node advertises (default: max(nproc, 8)) so that `sbatch --ntasks=4` runs
#                on a 2-core machine instead of pending forever (Reason=PartitionConfig)
#   SLURM_MPI_DEFAULT   MpiDefault of slurm.conf (default pmix: Debian's Open MPI 4.1 needs PMIx
#                under srun; pmi2 and none fail with "OMPI was not built with SLURM's PMI support")
#   START_TIMEOUT  seconds to wait for the node to become idle (default 30)
# Logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log. Accounting is off: use
# `squeue` and `scontrol show job ID` (kept for MinJobAge=300 s), not sacct.
set -euo pipefail

marker="# written by partrain jobscripts/slurm-local-cluster.sh"
conf=/etc/slurm/slurm.conf
run_dir=/run/slurm
munge_pid=/run/munge/munged.pid
ctld_pid=$run_dir/slurmctld.pid
slurmd_pid=$run_dir/slurmd.pid
munge_socket=/run/munge/munge.socket.2
timeout=${START_TIMEOUT:-30}

say() { echo "slurm-local-cluster: $*"; }
die() { echo "slurm-local-cluster: error: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "needs root (or sudo)"
  exec sudo -n --preserve-env=FAKE_CPUS,SLURM_MPI_DEFAULT,START_TIMEOUT "$0" "$@"
fi

# PID from a pid file when that process is alive, else nothing.
alive_pid() {
  local file=$1 pid
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

node_idle() { sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'; }

status() {
  local ok=0 name file pid
  for name in munged:$munge_pid slurmctld:$ctld_pid slurmd:$slurmd_pid; do
    file=${name#*:}
    if pid=$(alive_pid "$file"); then say "${name%%:*} running (pid $pid)"
    else say "${name%%:*} not running"; ok=1; fi
  done
  if [ $ok -eq 0 ]; then
    node_idle || { say "node not up: $(sinfo -h -N -o '%N %T %E' 2>&1 | head -1)"; ok=1; }
  fi
  [ $ok -eq 0 ] && sinfo 2>/dev/null || true
  return $ok
}

write_conf() {
  local host ncpu fake mem node_hw extra
  host=$(hostname -s)
  ncpu=$(nproc)
  fake=${FAKE_CPUS:-$(( ncpu > 8 ? ncpu : 8 ))}
  mem=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) - 512 ))
  if [ "$fake" -gt "$ncpu" ]; then
    node_hw="CPUs=$fake Sockets=1 CoresPerSocket=$fake ThreadsPerCore=1"
    extra="SlurmdParameters=config_overrides"   # slurmd accepts the advertised CPUs over the real ones
  else
    node_hw=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=.*//')
    extra=""
  fi
  if [ -e "$conf" ] && ! grep -qF "$marker" "$conf"; then
    [ -e "$conf.partrain-saved" ] || cp -p "$conf" "$conf.partrain-saved"
    say "saved the existing $conf as $conf.partrain-saved"
  fi
  install -d -m 0755 /etc/slurm
  cat >"$conf.tmp" <<CONF
$marker
ClusterName=local
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=${SLURM_MPI_DEFAULT:-pmix}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
$extra
NodeName=${host} NodeAddr=127.0.0.1 ${node_hw} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  mv "$conf.tmp" "$conf"
}

start_munge() {
  alive_pid "$munge_pid" >/dev/null && [ -S "$munge_socket" ] && return 0
  # a munged started otherwise (systemd) that answers is fine too
  [ -S "$munge_socket" ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  [ -s /etc/munge/munge.key ] || /usr/sbin/mungekey --create --force
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  # --force: a socket left behind by a munged that died is not an error
  runuser -u munge -- /usr/sbin/munged --force
  local _
  for _ in $(seq 100); do [ -S "$munge_socket" ] && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
}

start() {
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
      die "$tool is missing: run jobscripts/install-deps.sh (Debian packages slurmctld slurmd slurm-client munge)"
  done
  if status >/dev/null 2>&1; then say "already running"; sinfo; return 0; fi
  start_munge
  install -d -m 0755 "$run_dir" /var/log/slurm /var/spool/slurmctld /var/spool/slurmd
  # Write the configuration only when no Slurm daemon runs (a running one keeps its own).
  if ! alive_pid "$ctld_pid" >/dev/null && ! alive_pid "$slurmd_pid" >/dev/null; then write_conf; fi
  alive_pid "$ctld_pid" >/dev/null || /usr/sbin/slurmctld -i   # -i: start from empty state; daemonizes
  alive_pid "$slurmd_pid" >/dev/null || /usr/sbin/slurmd -N "$(hostname -s)"
  local deadline=$(( SECONDS + timeout ))
  until node_idle; do
    if [ $SECONDS -ge $deadline ]; then
      sinfo -N -l 2>&1 || true
      tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log 2>/dev/null || true
      die "the node did not become idle within ${timeout} s"
    fi
    sleep 0.2
  done
  sinfo
  say "started: munged $(alive_pid $munge_pid), slurmctld $(alive_pid $ctld_pid), slurmd $(alive_pid $slurmd_pid)"
}

stop() {
  local file pid _
  for file in "$slurmd_pid" "$ctld_pid" "$munge_pid"; do
    pid=$(alive_pid "$file") || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "$(basename "$file" .pid) (pid $pid) ignored TERM for 10 s: KILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    say "stopped $(basename "$file" .pid) (pid $pid)"
  done
  say "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) stop; start ;;
  *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
