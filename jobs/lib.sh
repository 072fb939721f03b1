# Shared by the batch scripts in jobs/ (sourced, not run): the per-job folder, data staging, the
# launcher, signal forwarding and requeue. Everything a site may want to change is an environment
# variable with a default, listed here and at the top of each script:
#
#   DPT_HOME         repository root holding ./dptrain and jobs/ (default: the submit folder)
#   DPT_BIN          folder holding the executables (default: $DPT_HOME)
#   DPT_LAUNCHER     srun (default: `srun --mpi=pmix`) or mpirun (Open MPI inside the allocation)
#   DPT_SRUN_ARGS    extra srun arguments (default: --mpi=pmix)
#   DPT_MPIRUN_ARGS  extra mpirun arguments (default: --bind-to none)
#   DPT_RUN_DIR      per-job folder (default: $DPT_HOME/runs/<job name>-<job id>); it keeps the
#                    checkpoints, metrics and job.log across requeues
#   DPT_STAGE        1: copy data.train/data.test once per node to DPT_STAGE_DIR first
#   DPT_STAGE_DIR    node-local folder for staged data (default: ${TMPDIR:-/tmp}/dptrain-<job id>)
#   DPT_MAX_RESTARTS requeue at most this many times (default 50)
# shellcheck shell=bash

dpt_log() { echo "[$(date '+%F %T')] ${SLURM_JOB_ID:+job $SLURM_JOB_ID: }$*"; }

# Clean-up that must run however the job ends (failure included): dpt_at_exit CMD queues CMD;
# dpt_cleanup runs the queue once, newest first (also from the EXIT trap).
DPT_AT_EXIT=()
dpt_at_exit() {
  DPT_AT_EXIT=("$1" "${DPT_AT_EXIT[@]}")
  trap dpt_cleanup EXIT
}
dpt_cleanup() {
  local cmds=("${DPT_AT_EXIT[@]}") c
  DPT_AT_EXIT=()
  for c in "${cmds[@]}"; do eval "$c"; done
}

# One line per event in the per-job folder: what a person (or a test) reads to see what happened.
dpt_mark() { echo "$(date '+%F %T') restart=${SLURM_RESTART_COUNT:-0} $*" >> "$DPT_RUN_DIR/job.log"; }

dpt_setup() {
  DPT_HOME=${DPT_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  DPT_BIN=${DPT_BIN:-$DPT_HOME}
  DPT_LAUNCHER=${DPT_LAUNCHER:-srun}
  DPT_SRUN_ARGS=${DPT_SRUN_ARGS:---mpi=pmix}
  DPT_MPIRUN_ARGS=${DPT_MPIRUN_ARGS:---bind-to none}
  DPT_RUN_DIR=${DPT_RUN_DIR:-$DPT_HOME/runs/${SLURM_JOB_NAME:-dptrain}-${SLURM_JOB_ID:-$$}}
  DPT_MAX_RESTARTS=${DPT_MAX_RESTARTS:-50}
  cd "$DPT_HOME" || { echo "DPT_HOME=$DPT_HOME: no such folder" >&2; exit 2; }
  mkdir -p "$DPT_RUN_DIR" || exit 2
  [ -x "$DPT_BIN/dptrain" ] || { echo "$DPT_BIN/dptrain not found: build it, or set DPT_BIN" >&2; exit 2; }
  # From here on a signal is noted (and passed on once something runs), never fatal to this shell.
  DPT_GOT_SIGNAL=${DPT_GOT_SIGNAL:-}
  trap 'dpt_on_signal USR1' USR1
  trap 'dpt_on_signal TERM' TERM
}

# dpt_has_key KEY ARGS...: is --KEY among the command-line overrides?
dpt_has_key() {
  local k=$1; shift
  local a
  for a in "$@"; do [ "$a" = "--$k" ] && return 0; done
  return 1
}

# dpt_key SECTION KEY CONFIG ARGS...: the value the run will use (command line, else INI file).
dpt_key() {
  local sec=$1 key=$2 cfg=$3; shift 3
  while (($#)); do
    if [ "$1" = "--$sec.$key" ] && (($# > 1)); then echo "$2"; return; fi
    shift
  done
  [ -f "$cfg" ] || return 0
  awk -v sec="[$sec]" -v key="$key" '
    { sub(/[#;].*/, ""); gsub(/^[ \t]+|[ \t]+$/, "") }
    /^\[/ { in_sec = ($0 == sec); next }
    in_sec && index($0, "=") { k = $0; sub(/[ \t]*=.*/, "", k); if (k == key) { v = $0; sub(/^[^=]*=[ \t]*/, "", v); print v; exit } }
  ' "$cfg"
}

# dpt_srun_per_node CMD...: one task on every node of the allocation, beside any running step.
dpt_srun_per_node() {
  srun --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 --ntasks="${SLURM_JOB_NUM_NODES:-1}" "$@"
}

# Copies the datasets once per node (sbcast: one read of the shared file system, a tree broadcast
# to the nodes) and appends --data.train/--data.test overrides pointing at the copies to
# DPT_EXTRA, with --data.read shard (unless the config or command line sets data.read): each
# rank then reads only its own rows of the copies, epoch by epoch.
dpt_stage_data() {
  local cfg=$1; shift
  local dir=${DPT_STAGE_DIR:-${TMPDIR:-/tmp}/dptrain-$SLURM_JOB_ID} which src dst
  dpt_srun_per_node mkdir -p "$dir" || { dpt_log "staging: cannot create $dir on every node"; return 1; }
  DPT_STAGED_DIR=$dir
  for which in train test; do
    src=$(dpt_key data "$which" "$cfg" "$@")
    [ -n "$src" ] || continue
    [ -f "$src" ] || { dpt_log "staging: data.$which = $src: no such file"; return 1; }
    dst=$dir/$which-$(basename "$src")
    if command -v sbcast >/dev/null; then
      sbcast --force --preserve "$src" "$dst" || return 1
    else
      dpt_srun_per_node cp "$src" "$dst" || return 1
    fi
    dpt_log "staged data.$which $src -> $dst on ${SLURM_JOB_NUM_NODES:-1} node(s)"
    dpt_mark "staged data.$which $dst"
    # The staged copy replaces any --data.<which> given on the command line.
    DPT_EXTRA+=(--data."$which" "$dst")
  done
  if [ -z "$(dpt_key data read "$cfg" "$@")" ]; then
    DPT_EXTRA+=(--data.read shard)
    dpt_mark "data.read shard"
  fi
}

dpt_unstage_data() {
  [ -n "${DPT_STAGED_DIR:-}" ] || return 0
  dpt_srun_per_node rm -rf "$DPT_STAGED_DIR" >/dev/null 2>&1 || true
}

# One MPS control daemon per node, in a step of its own that lasts as long as the daemon; the
# ranks find it through CUDA_MPS_PIPE_DIRECTORY (node-local, exported, so srun and mpirun pass it
# on). Its logs stay in the per-job folder, mps-log/<host>/.
dpt_mps_start() {
  local base=${DPT_MPS_DIR:-${TMPDIR:-/tmp}/dptrain-mps-$SLURM_JOB_ID}
  export CUDA_MPS_PIPE_DIRECTORY=$base/pipe CUDA_MPS_LOG_DIRECTORY=$DPT_RUN_DIR/mps-log
  dpt_at_exit dpt_mps_stop
  dpt_srun_per_node "$DPT_HOME/jobs/mps-daemon.sh" run &
  DPT_MPS_STEP_PID=$!
  if ! dpt_srun_per_node "$DPT_HOME/jobs/mps-daemon.sh" ready; then
    dpt_log "MPS control daemon did not start on every node"
    return 1
  fi
  dpt_log "MPS control daemon running on every node (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)"
}

# Asks every node's daemon to quit, waits for its step (30 s), then ends the step by force.
dpt_mps_stop() {
  [ -n "${DPT_MPS_STEP_PID:-}" ] || return 0
  dpt_srun_per_node "$DPT_HOME/jobs/mps-daemon.sh" stop
  local _
  for _ in $(seq 150); do
    kill -0 "$DPT_MPS_STEP_PID" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$DPT_MPS_STEP_PID" 2>/dev/null; then
    dpt_log "MPS daemon step still running after quit: ending it"
    kill -TERM "$DPT_MPS_STEP_PID" 2>/dev/null
    kill -TERM "$DPT_MPS_STEP_PID" 2>/dev/null  # a second signal within 1 s makes srun end the step at once
  fi
  wait "$DPT_MPS_STEP_PID" 2>/dev/null
  dpt_srun_per_node rm -rf "$(dirname "$CUDA_MPS_PIPE_DIRECTORY")" >/dev/null 2>&1
  DPT_MPS_STEP_PID=
  dpt_log "MPS control daemon stopped"
}

# dpt_launch PROGRAM ARGS...: PROGRAM (dptrain, bench-scaling) on every task of the allocation, in
# the background (pid in DPT_LAUNCHER_PID), so that this shell stays free to catch signals.
dpt_launch() {
  local prog=$DPT_BIN/$1; shift
  case "$DPT_LAUNCHER" in
    srun)
      # shellcheck disable=SC2086  # word splitting of the argument string is intended
      srun $DPT_SRUN_ARGS "$prog" "$@" &
      ;;
    mpirun)
      # shellcheck disable=SC2086
      mpirun -np "${SLURM_NTASKS:?not inside a Slurm allocation}" $DPT_MPIRUN_ARGS "$prog" "$@" &
      ;;
    *) echo "DPT_LAUNCHER=$DPT_LAUNCHER: expected srun or mpirun" >&2; return 2 ;;
  esac
  DPT_LAUNCHER_PID=$!
}

# Slurm's warning signal (--signal=B:USR1@<s>, or a site's preemption notice) reaches this shell
# only. Both srun and Open MPI's mpirun pass SIGUSR1 on to every rank; dptrain then finishes the
# step all ranks agree on, writes a checkpoint and exits 6.
dpt_on_signal() {
  DPT_GOT_SIGNAL=$1
  dpt_log "got SIG$1: asking dptrain to checkpoint and stop"
  dpt_mark "signal $1"
  [ -n "${DPT_LAUNCHER_PID:-}" ] && kill -USR1 "$DPT_LAUNCHER_PID" 2>/dev/null
}

# Waits for the launcher through any number of trapped signals; returns its exit code.
dpt_wait_launcher() {
  local rc
  while :; do
    wait "$DPT_LAUNCHER_PID"
    rc=$?
    # Above 128 with the launcher still alive: a trap interrupted the wait, not its end.
    if ((rc > 128)) && kill -0 "$DPT_LAUNCHER_PID" 2>/dev/null; then continue; fi
    return "$rc"
  done
}

# After dptrain stopped on SIGUSR1 with a checkpoint (exit 6): put the job back in the queue; it
# keeps its id, so DPT_RUN_DIR is the same and `checkpoint.resume = auto` continues from there.
dpt_requeue() {
  local restarts=${SLURM_RESTART_COUNT:-0}
  trap - USR1 TERM
  if ((restarts >= DPT_MAX_RESTARTS)); then
    dpt_log "not requeueing: $restarts restarts already (DPT_MAX_RESTARTS)"
    dpt_mark "end rc=6 action=none (restart limit)"
    return 6
  fi
  dpt_mark "end rc=6 action=requeue"
  dpt_log "checkpoint written; requeueing (restart $((restarts + 1)))"
  scontrol requeue "$SLURM_JOB_ID" && return 0
  dpt_log "scontrol requeue failed (submitted without --requeue, or JobRequeue=0?): resubmit to resume"
  return 6
}

# dpt_train [CONFIG] [--section.key value ...]: the whole job. Extra overrides for every run can be
# put in the array DPT_EXTRA before calling (mps.sbatch adds --comm.backend mpi).
dpt_train() {
  local cfg=inputs/run.ini
  if (($#)) && [[ $1 != --* ]]; then cfg=$1; shift; fi
  dpt_setup
  [ -f "$cfg" ] || { dpt_log "config $cfg not found (relative to $DPT_HOME)"; exit 2; }
  DPT_EXTRA=("${DPT_EXTRA[@]}")
  dpt_has_key checkpoint.dir "$@" || DPT_EXTRA+=(--checkpoint.dir "$DPT_RUN_DIR/checkpoints")
  dpt_has_key checkpoint.resume "$@" || DPT_EXTRA+=(--checkpoint.resume auto)
  dpt_has_key log.metrics "$@" || DPT_EXTRA+=(--log.metrics "$DPT_RUN_DIR/metrics.jsonl")
  [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || cp "$cfg" "$DPT_RUN_DIR/config.ini"
  dpt_log "dptrain on ${SLURM_NTASKS:-?} task(s), ${SLURM_JOB_NUM_NODES:-?} node(s) ($SLURM_JOB_NODELIST), launcher $DPT_LAUNCHER, run folder $DPT_RUN_DIR"
  dpt_mark "start nodes=${SLURM_JOB_NODELIST:-?} tasks=${SLURM_NTASKS:-?} launcher=$DPT_LAUNCHER"

  if [ "${DPT_STAGE:-0}" = 1 ]; then
    dpt_at_exit dpt_unstage_data
    dpt_stage_data "$cfg" "$@" || { dpt_mark "end rc=2 action=none (staging failed)"; exit 2; }
  fi
  # dptrain rejects a key given twice: drop user overrides that staging replaces.
  local args=() a skip=0
  for a in "$@"; do
    if ((skip)); then skip=0; continue; fi
    if [ -n "${DPT_STAGED_DIR:-}" ] && [[ $a == --data.train || $a == --data.test ]]; then skip=1; continue; fi
    args+=("$a")
  done

  # A signal before the launch (while staging or starting MPS): nothing to save, so stop here.
  if [ -n "$DPT_GOT_SIGNAL" ]; then
    dpt_cleanup
    if [ "$DPT_GOT_SIGNAL" = USR1 ]; then dpt_requeue; return $?; fi
    dpt_mark "end rc=143 action=none (SIGTERM before launch)"
    return 143
  fi
  dpt_launch dptrain --config "$cfg" "${args[@]}" "${DPT_EXTRA[@]}" || exit $?
  local rc=0
  dpt_wait_launcher || rc=$?
  dpt_log "dptrain exited with code $rc"
  # Clean up before a requeue: `scontrol requeue` ends this shell.
  dpt_cleanup
  if ((rc == 6)) && [ "$DPT_GOT_SIGNAL" = USR1 ]; then
    dpt_requeue
    return $?
  fi
  dpt_mark "end rc=$rc action=none"
  return "$rc"
}
