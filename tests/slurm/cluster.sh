#!/usr/bin/env bash
# cluster.sh: a throw-away Slurm cluster on this one machine, for the kit's tests.
#
# Two emulated nodes (kitn1, kitn2), each declaring 4 GPUs that are character devices in a
# temporary folder, and more CPUs than the machine has. No GPU, no munge, no cgroups: the job
# scripts run for real (sbatch, srun, one process per task), and the trainers fall back to Gloo
# on the CPU. The daemons run as root and live entirely inside DIR.
#
# Usage:
#   cluster.sh setup       install Debian's slurmctld, slurmd and slurm-client when missing and
#                          name the nodes in /etc/hosts. Idempotent; needs root (apt-get).
#                          `cluster.sh install` is the same.
#   cluster.sh start DIR   write a configuration into DIR (a fresh or empty folder), start
#                          slurmctld and one slurmd per node, wait until both nodes are idle.
#   cluster.sh stop DIR    stop the daemons that `start DIR` started (also after a failed start).
#   cluster.sh conf DIR    print the SLURM_CONF path for clients (sbatch, squeue, scontrol).
#
# A test boots its own cluster (about a second) and stops it in an EXIT trap:
#     dir=$(mktemp -d); trap 'cluster.sh stop "$dir"' EXIT
#     cluster.sh start "$dir" && export SLURM_CONF=$(cluster.sh conf "$dir")
#
# Exit status: 0 on success, 1 on failure (one line on stderr), 2 for a usage error,
# 77 when this machine cannot run the cluster at all (not root) - CTest reports that as skipped.
set -u

prog=cluster.sh
NODES="kitn1 kitn2"
GPUS_PER_NODE=4
CPUS_PER_NODE=64     # declared, not real: SlurmdParameters=config_overrides lets slurmd accept it

die() { printf '%s: %s\n' "$prog" "$*" >&2; exit 1; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    printf '%s: the test cluster needs root (slurmd launches the job steps); skipping\n' "$prog" >&2
    exit 77
  fi
}

cmd_setup() {
  need_root
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
     ! command -v sbatch >/dev/null; then
    command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get to install it"
    echo "$prog: installing slurmctld slurmd slurm-client (Debian packages)"
    # No daemon may start at install time: the tests start their own, with their own configuration.
    local policy=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client >/dev/null ||
      { DEBIAN_FRONTEND=noninteractive apt-get update >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
          slurmctld slurmd slurm-client >/dev/null; }
    local rc=$?
    [ "$created" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install slurmctld slurmd slurm-client failed"
  fi
  # The job scripts find rank 0 by the first host name of the job's node list.
  local node
  for node in $NODES; do
    if ! getent hosts "$node" >/dev/null; then
      printf '127.0.0.1 %s\n' "$node" >>/etc/hosts || die "cannot add $node to /etc/hosts"
    fi
  done
  echo "$prog: Slurm $(dpkg-query -W -f '${Version}' slurmd 2>/dev/null) is ready"
}

# free_ports N: N TCP ports that nobody listens on right now.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

cmd_start() {
  need_root
  local dir=$1
  command -v slurmctld >/dev/null || die "Slurm is not installed: run '$0 setup' first"
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  mkdir -p "$dir/state" "$dir/dev" "$dir/log" || die "cannot populate $dir"
  local i node ports ctld_port n=0
  for node in $NODES; do
    getent hosts "$node" >/dev/null || die "$node is not in /etc/hosts: run '$0 setup' first"
  done
  # The fake GPUs: /dev/null's major and minor numbers under other names. Slurm only needs files.
  for ((i = 0; i < GPUS_PER_NODE; i++)); do
    [ -e "$dir/dev/nvidia$i" ] || mknod "$dir/dev/nvidia$i" c 1 3 || die "mknod $dir/dev/nvidia$i failed"
  done
  # slurmd and each job step listen on Unix sockets in the spool folder, named
  # <spool>/<node>_<job>.<step>, and a socket path has at most 108 bytes: a spool folder deep in
  # a build tree (a CI clone, a long test name) makes every job fail at launch, after which Slurm
  # holds it for ever ("launch failed requeued held"). So the spool folders live in a short
  # folder of their own under /tmp, linked from DIR/spool and removed by `stop`.
  local spool
  spool=$(mktemp -d /tmp/kit-spool.XXXXXX) || die "cannot create a spool folder in /tmp"
  # Open to everyone, as a real slurmd's spool is: a job of an unprivileged user (the handout's
  # test) runs its batch script from there as that user.
  chmod 755 "$spool" || die "cannot open $spool to the jobs' users"
  ln -sfn "$spool" "$dir/spool" || die "cannot link $dir/spool"
  read -r ctld_port ports <<<"$(free_ports 3)"
  [ -n "$ports" ] || die "cannot find free TCP ports"
  # Job ids decide the trainers' rendezvous port (20000 + id % 10000): start at a random id, so
  # that two clusters on this machine (parallel test runs) do not hand out the same ports.
  local first_id=$(( (RANDOM % 900 + 100) * 10 ))

  {
    echo "# Written by tests/slurm/cluster.sh: a throw-away test cluster."
    echo "ClusterName=kittest"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=$ctld_port"
    echo "AuthType=auth/none"
    echo "CredType=cred/none"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    # pgid waits for the end of every step with sleep(1), doubling: 3 s more for each batch job
    # (a job of `srun true`: 4 s; 1 s with proctrack/linuxproc). linuxproc was tried and
    # dropped: a job that requeued itself (slurm.requeue) then sometimes ended FAILED instead of
    # running again. ./kit test runs the Slurm tests beside the others, which hides the wait.
    echo "ProctrackType=proctrack/pgid"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "LaunchParameters=use_interactive_step"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "GresTypes=gpu"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "FirstJobId=$first_id"
    # Finished jobs leave the controller quickly, and a submitted job starts at once.
    echo "MinJobAge=2"
    echo "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0"
    echo "SchedulerTimeSlice=5"
    echo "KillWait=2"
    echo "InactiveLimit=0"
    echo "MessageTimeout=20"
    for node in $NODES; do
      echo "NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node Port=${ports%% *}" \
           "CPUs=$CPUS_PER_NODE Sockets=1 CoresPerSocket=$CPUS_PER_NODE ThreadsPerCore=1" \
           "RealMemory=4000 Gres=gpu:$GPUS_PER_NODE State=UNKNOWN"
      ports=${ports#* }
    done
    echo "PartitionName=gpus Nodes=${NODES// /,} Default=YES MaxTime=INFINITE State=UP"
  } >"$dir/slurm.conf"
  {
    for node in $NODES; do
      echo "NodeName=$node Name=gpu File=$dir/dev/nvidia[0-$((GPUS_PER_NODE - 1))]"
    done
  } >"$dir/gres.conf"
  echo 'ConstrainDevices=no' >"$dir/cgroup.conf"

  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" >>"$dir/log/slurmctld.out" 2>&1 ||
    die "slurmctld did not start (see $dir/log/slurmctld.log)"
  for node in $NODES; do
    slurmd -f "$SLURM_CONF" -N "$node" >>"$dir/log/slurmd-$node.out" 2>&1 ||
      die "slurmd -N $node did not start (see $dir/log/slurmd-$node.log)"
  done
  # Both nodes idle: the cluster takes jobs.
  for ((n = 0; n < 300; n++)); do
    [ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" -eq 2 ] && return 0
    sleep 0.1
  done
  die "the nodes did not become idle within 30 s: $(sinfo -h -N -o '%N %T' 2>&1 | tr '\n' ' ')(logs in $dir/log)"
}

cmd_stop() {
  local dir=$1 pidfile pid n proc
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  # Jobs first: their steps (slurmstepd and the trainers) are not children of the daemons.
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
    SLURM_CONF=$dir/slurm.conf scancel --quiet --user=root 2>/dev/null
    for ((n = 0; n < 50; n++)); do
      [ -z "$(SLURM_CONF=$dir/slurm.conf squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
  done
  # Wait for them (a slurmd still running would hold its port and its steps).
  for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null)
    [ -n "$pid" ] || continue
    for ((n = 0; n < 50; n++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
  done
  # What is left of this cluster's jobs: processes of a job (SLURM_JOB_ID) whose environment
  # names this cluster's configuration, and the job step daemons.
  local env
  for proc in /proc/[0-9]*; do
    env=$(tr '\0' '\n' 2>/dev/null <"$proc/environ") || continue
    case $env in *"SLURM_CONF=$dir/slurm.conf"*) ;; *) continue ;; esac
    case $env in
      *SLURM_JOB_ID=*) kill -9 "${proc#/proc/}" 2>/dev/null ;;
      *) [ "$(cat "$proc/comm" 2>/dev/null)" = slurmstepd ] && kill -9 "${proc#/proc/}" 2>/dev/null ;;
    esac
  done
  # The short spool folder of `start` (see there).
  if [ -L "$dir/spool" ]; then
    local spool
    spool=$(readlink "$dir/spool")
    case $spool in /tmp/kit-spool.*) rm -rf "$spool" ;; esac
    rm -f "$dir/spool"
  fi
  return 0
}

case ${1:-} in
  setup | install) [ $# -eq 1 ] || { echo "usage: $prog setup" >&2; exit 2; }; cmd_setup ;;
  start) [ $# -eq 2 ] || { echo "usage: $prog start DIR" >&2; exit 2; }; cmd_start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $prog stop DIR" >&2; exit 2; }; cmd_stop "$2" ;;
  conf) [ $# -eq 2 ] || { echo "usage: $prog conf DIR" >&2; exit 2; }; echo "$(cd "$2" && pwd)/slurm.conf" ;;
  -h | --help) sed -n '2,/^set -u$/{/^#/s/^# \{0,1\}//p;}' "$0" ;;
  *) echo "usage: $prog setup | start DIR | stop DIR | conf DIR (see --help)" >&2; exit 2 ;;
esac
