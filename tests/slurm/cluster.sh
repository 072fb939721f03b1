#!/usr/bin/env bash
# A throw-away single-node Slurm for the tests (Debian's slurmctld, slurmd and munge): its own
# munged (own key and socket), slurmctld and slurmd on free loopback ports, every file under one
# folder.
#   cluster.sh up DIR [PID]  starts it; prints `export SLURM_CONF=DIR/slurm.conf` when it is ready.
#                            With PID, a watcher tears it down and removes DIR once PID is gone,
#                            so a test killed by its timeout leaves no daemons behind.
#   cluster.sh down DIR      stops every daemon it started (by the pids in DIR); safe to repeat
# Exit codes of `up`: 0 ready; 77 cannot run here (not root, Slurm or munge missing); 1 failed.
set -uo pipefail

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: SKIP: $*" >&2; exit 77; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for SECONDS COMMAND...: polls every 0.2 s
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

no_live_jobs() {
  local live
  live=$(timeout 5 squeue -h -t pending,running,completing,suspended -o %i) || return 0  # no controller
  [ -z "$live" ]
}

stop_pidfile() {  # TERM, then KILL after 5 s, the process named in a pid file
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 25); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
}

up() {
  local d=$1
  [ "$(id -u)" -eq 0 ] || skip "needs root (slurmd runs jobs as their users)"
  for b in munged slurmctld slurmd sbatch scontrol squeue python3; do
    command -v "$b" >/dev/null || skip "$b not installed (apt-get install slurm-wlm munge)"
  done
  id munge >/dev/null 2>&1 || skip "no munge user (apt-get install munge)"
  mkdir -p "$d"/{munge,state,spool,log} || die "cannot create $d"
  d=$(cd "$d" && pwd)

  # munged insists on a private folder owned by its user and a key readable only by it.
  chown munge: "$d/munge" && chmod 711 "$d/munge"  # clients need to reach the socket
  head -c 1024 /dev/urandom > "$d/munge/munge.key"
  chown munge: "$d/munge/munge.key" && chmod 400 "$d/munge/munge.key"
  local sock=$d/munge/munge.socket
  runuser -u munge -- munged --socket="$sock" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" \
    --seed-file="$d/munge/munged.seed" || die "munged did not start: $(tail -3 "$d/munge/munged.log" 2>/dev/null)"
  cp "$d/munge/munged.pid" "$d/munged.pid"
  wait_for 10 bash -c "munge -S '$sock' -n | unmunge -S '$sock'" || die "munge does not answer"

  local host cpus
  host=$(hostname -s)
  cpus=$(nproc); ((cpus >= 2)) || cpus=2  # the jobs ask for 2 tasks
  cat > "$d/slurm.conf" <<CONF
ClusterName=dpttest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=10
MinJobAge=600
SchedulerParameters=sched_interval=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -i -f "$SLURM_CONF" || die "slurmctld did not start: $(tail -5 "$d/log/slurmctld.log")"
  wait_for 20 scontrol ping || die "slurmctld does not answer: $(tail -5 "$d/log/slurmctld.log")"
  slurmd -f "$SLURM_CONF" || die "slurmd did not start: $(tail -5 "$d/log/slurmd.log")"
  wait_for 30 bash -c "sinfo -h -o %t | grep -qx idle" ||
    die "node not idle: $(sinfo 2>&1; tail -5 "$d/log/slurmd.log")"
  if [ -n "${2:-}" ]; then
    # shellcheck disable=SC2016  # expanded by the watcher's own shell
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" down "$3"; rm -rf "$3"' \
      watcher "$2" "$(readlink -f "$0")" "$d" </dev/null >/dev/null 2>&1 &
    echo $! > "$d/watcher.pid"
  fi
  echo "export SLURM_CONF=$SLURM_CONF"
}

down() {
  local d=$1
  [ -d "$d" ] || return 0
  export SLURM_CONF=$d/slurm.conf
  # Jobs first, so that no step outlives its slurmd.
  if [ -s "$d/slurmctld.pid" ] && kill -0 "$(cat "$d/slurmctld.pid")" 2>/dev/null; then
    timeout 10 scancel --full --signal=KILL -u root >/dev/null 2>&1
    wait_for 15 no_live_jobs
  fi
  stop_pidfile "$d/slurmd.pid"
  stop_pidfile "$d/slurmctld.pid"
  stop_pidfile "$d/munged.pid"
  # A step daemon whose slurmd is gone waits for it for minutes: ours hold files under $d open.
  local pid fd
  for pid in $(pgrep -x slurmstepd); do
    for fd in /proc/"$pid"/fd/*; do
      [[ $(readlink "$fd") == "$d"/* ]] && { kill -KILL "$pid" 2>/dev/null; break; }
    done
  done
  # The watcher, unless it is the one tearing down (it is then our parent).
  [ -s "$d/watcher.pid" ] && [ "$(cat "$d/watcher.pid")" != "$PPID" ] && kill "$(cat "$d/watcher.pid")" 2>/dev/null
  rm -f "$d/watcher.pid"
  return 0
}

case "${1:-}" in
  up) [ $# -ge 2 ] || die "usage: cluster.sh up DIR [PID]"; up "$2" "${3:-}" ;;
  down) [ $# -eq 2 ] || die "usage: cluster.sh down DIR"; down "$2" ;;
  *) die "usage: cluster.sh up|down DIR" ;;
esac
