#!/usr/bin/env bash
# A one-machine Slurm cluster (munged + slurmctld + slurmd, no systemd) for trying the job scripts
# and for the `slurm` CTest. Needs root (or passwordless sudo) and the Debian packages from
# jobscripts/install-deps.sh (slurmctld, slurmd, slurm-client, munge).
#   jobscripts/slurm-local-cluster.sh start    # writes /etc/slurm/slurm.conf, starts the daemons, waits for `idle`
#   jobscripts/slurm-local-cluster.sh start --nodes 2   # a multi-node cluster on this machine (below)
#   jobscripts/slurm-local-cluster.sh status [--nodes N]  # exit 0 when the daemons run and the nodes
#                                              # answer (and, with --nodes, the cluster has N nodes)
#   jobscripts/slurm-local-cluster.sh nodes    # prints the running local cluster's node count (0: none)
#   jobscripts/slurm-local-cluster.sh stop     # stops the daemons by the PIDs in their pid files
# Both start and stop are idempotent; `start --nodes N` over a cluster of another size stops it first.
# Exit code 3: this machine cannot host the --nodes cluster (namespaces, bridge or veth refused).
# Environment:
#   FAKE_CPUS    CPUs each node advertises (default: max(nproc, 8)) so that `sbatch --ntasks=4` runs
#                on a 2-core machine instead of pending forever (Reason=PartitionConfig)
#   SLURM_MPI_DEFAULT   MpiDefault of slurm.conf (default pmix: Debian's Open MPI 4.1 needs PMIx
#                under srun; pmi2 and none fail with "OMPI was not built with SLURM's PMI support")
#   START_TIMEOUT  seconds to wait for the nodes to become idle (default 30)
#   SLURM_LOCAL_SUBNET  the first three octets of the --nodes cluster's /24 (default 10.77.0)
# --nodes N (2 to 8): nodes node1..nodeN, each a slurmd in its own network namespace
# (partrain-nodeI, `ip netns`) and hostname (UTS) namespace, with a veth pair to the bridge
# partrain-br0 on the host: the host (slurmctld, munged, sbatch/squeue) is 10.77.0.1, nodeI is
# 10.77.0.(I+1)/24 (SLURM_LOCAL_SUBNET); each slurmd sees /etc/netns/partrain-nodeI/hosts, naming
# every node, as /etc/hosts, and a TmpFS of its own. munged's socket is a file, so the nodes share
# the host's munged. Jobs see real multi-node Slurm: srun across the slurmd, PMIx between the
# nodes, Open MPI over TCP on the veth addresses (ranks on one node use shared memory, as on a real
# cluster); files (/tmp, the repository) stay shared. stop removes the namespaces and the bridge.
# Logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log (slurmd-nodeI.log with --nodes).
# Accounting is off: use `squeue` and `scontrol show job ID` (kept for MinJobAge=300 s), not sacct.
set -euo pipefail

marker="# written by partrain jobscripts/slurm-local-cluster.sh"
conf=/etc/slurm/slurm.conf
run_dir=/run/slurm
munge_pid=/run/munge/munged.pid
ctld_pid=$run_dir/slurmctld.pid
slurmd_pid=$run_dir/slurmd.pid          # the one-node cluster's slurmd; nodeI's is slurmd-nodeI.pid
munge_socket=/run/munge/munge.socket.2
timeout=${START_TIMEOUT:-30}
# the multi-node cluster's network: a bridge on the host, a namespace and a veth pair per node
bridge=partrain-br0
subnet=${SLURM_LOCAL_SUBNET:-10.77.0}   # a /24 that no network of this machine uses
host_ip=$subnet.1
netns_prefix=partrain-node

say() { echo "slurm-local-cluster: $*"; }
die() { echo "slurm-local-cluster: error: $*" >&2; exit 1; }
# exit code 3: this machine cannot host the multi-node cluster (no namespaces, bridges or veths)
unsupported() { echo "slurm-local-cluster: error: $*" >&2; exit 3; }

if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "needs root (or sudo)"
  exec sudo -n --preserve-env=FAKE_CPUS,SLURM_MPI_DEFAULT,START_TIMEOUT,SLURM_LOCAL_SUBNET "$0" "$@"
fi

# PID from a pid file when that process is alive, else nothing.
alive_pid() {
  local file=$1 pid
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# The node count of the configuration written here (0: none or another one).
conf_nodes() {
  [ -f "$conf" ] && grep -qF "$marker" "$conf" || { echo 0; return; }
  local n
  n=$(sed -n 's/^# partrain-local-nodes: \([0-9]*\)$/\1/p' "$conf" | head -1)
  echo "${n:-1}"   # written before --nodes existed: one node
}

# slurmd pid files: the one-node cluster's and every nodeI's
slurmd_pid_files() {
  local file
  for file in "$slurmd_pid" "$run_dir"/slurmd-*.pid; do [ -e "$file" ] && echo "$file"; done
  return 0
}

# every node of the configuration answers (idle or busy)
nodes_up() {
  local want=$1 up
  up=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -cE ' (idle|mixed|allocated|completing)$')
  [ "${up:-0}" -ge "$want" ]
}

status() {
  local want=${1:-} ok=0 nodes name file pid
  nodes=$(conf_nodes)
  if [ -n "$want" ] && [ "$nodes" != "$want" ]; then
    say "the configuration in $conf is not a $want-node local cluster (local nodes: $nodes)"
    ok=1
  fi
  local daemons=("munged:$munge_pid" "slurmctld:$ctld_pid")
  if [ "$nodes" -gt 1 ]; then
    for i in $(seq "$nodes"); do daemons+=("slurmd node$i:$run_dir/slurmd-node$i.pid"); done
  else
    daemons+=("slurmd:$slurmd_pid")
  fi
  for name in "${daemons[@]}"; do
    file=${name#*:}
    if pid=$(alive_pid "$file"); then say "${name%%:*} running (pid $pid)"
    else say "${name%%:*} not running"; ok=1; fi
  done
  if [ $ok -eq 0 ]; then
    nodes_up "$nodes" || { say "nodes not up: $(sinfo -h -N -o '%N %T %E' 2>&1 | tr '\n' ';')"; ok=1; }
  fi
  [ $ok -eq 0 ] && sinfo 2>/dev/null || true
  return $ok
}

write_conf() {
  local nodes=$1 host ncpu fake mem node_hw extra ctld_addr node_lines partition_nodes pid_file log_file spool_dir
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
  if [ "$nodes" -gt 1 ]; then
    # slurmctld on the bridge address (the nodes' 127.0.0.1 is their own); per-node slurmd files
    ctld_addr=$host_ip
    node_lines=""
    for i in $(seq "$nodes"); do
      node_lines+="NodeName=node$i NodeHostname=node$i NodeAddr=$subnet.$(( i + 1 )) ${node_hw} RealMemory=$(( mem / nodes )) State=UNKNOWN"$'\n'
    done
    partition_nodes="node[1-$nodes]"
    pid_file=$run_dir/slurmd-%n.pid log_file=/var/log/slurm/slurmd-%n.log spool_dir=/var/spool/slurmd/%n
    # a per-node TmpFS: the PMIx plugin makes its client directories there, named by job and step
    # only, so in the shared /tmp the second node's slurmstepd fails with "File exists"
    extra+=$'\n'"TmpFS=/var/spool/slurmd/%n/tmp"
  else
    ctld_addr=127.0.0.1
    node_lines="NodeName=${host} NodeAddr=127.0.0.1 ${node_hw} RealMemory=${mem} State=UNKNOWN"
    partition_nodes=$host
    pid_file=$slurmd_pid log_file=/var/log/slurm/slurmd.log spool_dir=/var/spool/slurmd
  fi
  if [ -e "$conf" ] && ! grep -qF "$marker" "$conf"; then
    [ -e "$conf.partrain-saved" ] || cp -p "$conf" "$conf.partrain-saved"
    say "saved the existing $conf as $conf.partrain-saved"
  fi
  install -d -m 0755 /etc/slurm
  cat >"$conf.tmp" <<CONF
$marker
# partrain-local-nodes: $nodes
ClusterName=local
SlurmctldHost=${host}(${ctld_addr})
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
SlurmdPidFile=$pid_file
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=$log_file
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=$spool_dir
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
$extra
${node_lines%$'\n'}
PartitionName=debug Nodes=${partition_nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
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

# Whether this machine can host the multi-node cluster (exit 3 when not), before anything changes.
check_namespaces() {
  local tool
  for tool in ip nsenter unshare; do
    command -v "$tool" >/dev/null 2>&1 || unsupported "$tool is missing (Debian packages iproute2, util-linux)"
  done
  unshare --uts --mount true 2>/dev/null || unsupported "unshare --uts --mount is refused here (no hostname or mount namespaces)"
  if ! ip netns list 2>/dev/null | grep -q "^${netns_prefix}1\b"; then
    ip netns add "${netns_prefix}-probe" 2>/dev/null || unsupported "ip netns add is refused here (no network namespaces)"
    ip netns del "${netns_prefix}-probe" 2>/dev/null || true
  fi
}

# The bridge, and per node a network namespace with a veth pair into it and an /etc/hosts.
setup_network() {
  local nodes=$1 i ns hosts
  check_namespaces
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge || unsupported "cannot create the bridge $bridge (no CAP_NET_ADMIN or no bridge support?)"
  fi
  ip addr replace "$host_ip/24" dev "$bridge"
  ip link set "$bridge" up
  hosts="127.0.0.1 localhost"$'\n'"$host_ip $(hostname -s)"$'\n'
  for i in $(seq "$nodes"); do hosts+="$subnet.$(( i + 1 )) node$i"$'\n'; done
  for i in $(seq "$nodes"); do
    ns=$netns_prefix$i
    ip netns list | grep -qw "^$ns" || ip netns add "$ns" || unsupported "cannot create the network namespace $ns"
    if ! ip link show "pt-node$i" >/dev/null 2>&1; then
      ip link add "pt-node$i" type veth peer name eth0 netns "$ns" || unsupported "cannot create the veth pair of node$i"
    fi
    ip link set "pt-node$i" master "$bridge"
    ip link set "pt-node$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$subnet.$(( i + 1 ))/24" dev eth0
    ip -n "$ns" link set eth0 up
    install -d -m 0755 "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"   # bound over /etc/hosts for the node's slurmd
  done
}

teardown_network() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${netns_prefix}[0-9]*$"); do
    ip netns del "$ns" 2>/dev/null || true   # takes its end of the veth pair, and so the pair, along
    rm -rf "/etc/netns/$ns"
    say "removed the network namespace $ns"
  done
  rmdir /etc/netns 2>/dev/null || true   # when this script's were the only ones
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link del "$bridge" 2>/dev/null || true
    say "removed the bridge $bridge"
  fi
}

start() {
  local nodes=${1:-1} running i
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
      die "$tool is missing: run jobscripts/install-deps.sh (Debian packages slurmctld slurmd slurm-client munge)"
  done
  if status "$nodes" >/dev/null 2>&1; then say "already running"; sinfo; return 0; fi
  [ "$nodes" -gt 1 ] && check_namespaces
  running=$(conf_nodes)
  if [ "$running" != "$nodes" ] && { alive_pid "$ctld_pid" >/dev/null || [ -n "$(slurmd_pid_files)" ]; }; then
    say "a $running-node local cluster runs: stopping it for $nodes node(s)"
    stop
  fi
  start_munge
  install -d -m 0755 "$run_dir" /var/log/slurm /var/spool/slurmctld /var/spool/slurmd
  if [ "$nodes" -gt 1 ]; then
    for i in $(seq "$nodes"); do install -d -m 0755 "/var/spool/slurmd/node$i" && install -d -m 1777 "/var/spool/slurmd/node$i/tmp"; done
    setup_network "$nodes"
  fi
  # Write the configuration only when no Slurm daemon runs (a running one keeps its own).
  if ! alive_pid "$ctld_pid" >/dev/null && [ -z "$(for f in $(slurmd_pid_files); do alive_pid "$f"; done)" ]; then
    write_conf "$nodes"
  fi
  alive_pid "$ctld_pid" >/dev/null || /usr/sbin/slurmctld -i   # -i: start from empty state; daemonizes
  if [ "$nodes" -gt 1 ]; then
    for i in $(seq "$nodes"); do
      alive_pid "$run_dir/slurmd-node$i.pid" >/dev/null && continue
      # its own network (nsenter --net; not `ip netns exec`, whose fresh /sys lacks the cgroup
      # mounts slurmd needs), hostname (--uts) and /etc/hosts (--mount); slurmd daemonizes inside
      nsenter --net="/run/netns/$netns_prefix$i" unshare --uts --mount --propagation slave \
        sh -c "mount --bind /etc/netns/$netns_prefix$i/hosts /etc/hosts && hostname node$i && exec /usr/sbin/slurmd -N node$i" ||
        die "slurmd of node$i did not start (see /var/log/slurm/slurmd-node$i.log)"
    done
  else
    alive_pid "$slurmd_pid" >/dev/null || /usr/sbin/slurmd -N "$(hostname -s)"
  fi
  local deadline=$(( SECONDS + timeout ))
  until nodes_up "$nodes"; do
    if [ $SECONDS -ge $deadline ]; then
      sinfo -N -l 2>&1 || true
      tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd*.log 2>/dev/null || true
      die "the node(s) did not become idle within ${timeout} s"
    fi
    sleep 0.2
  done
  sinfo -N
  local pids=""
  for f in $(slurmd_pid_files); do pids+=" $(alive_pid "$f")"; done
  say "started: munged $(alive_pid $munge_pid), slurmctld $(alive_pid $ctld_pid), slurmd$pids"
}

stop() {
  local file pid _
  for file in $(slurmd_pid_files) "$ctld_pid" "$munge_pid"; do
    pid=$(alive_pid "$file") || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "$(basename "$file" .pid) (pid $pid) ignored TERM for 10 s: KILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    say "stopped $(basename "$file" .pid) (pid $pid)"
  done
  teardown_network
  say "stopped"
}

command=${1:-}
shift || true
nodes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    *) echo "usage: $0 start|stop|status|nodes|restart [--nodes N]" >&2; exit 2 ;;
  esac
done
if [ -n "$nodes" ]; then
  [[ $nodes =~ ^[1-8]$ ]] || die "--nodes $nodes: give 1 to 8"
fi
case "$command" in
  start) start "${nodes:-1}" ;;
  stop) stop ;;
  status) status "$nodes" ;;
  nodes) if status >/dev/null 2>&1; then conf_nodes; else echo 0; fi ;;
  restart) stop; start "${nodes:-1}" ;;
  *) echo "usage: $0 start|stop|status|nodes|restart [--nodes N]" >&2; exit 2 ;;
esac
