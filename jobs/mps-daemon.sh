#!/usr/bin/env bash
# One node's NVIDIA MPS control daemon, for jobs/mps.sbatch (run once per node by srun) and for
# trying MPS by hand on a GPU machine without Slurm:
#   mps-daemon.sh run     the daemon in the foreground (its step lives as long as it does)
#   mps-daemon.sh ready   waits (up to DPT_MPS_WAIT_S, default 30 s) for its control pipe
#   mps-daemon.sh stop    asks it to quit
# The pipe folder (node-local) comes from CUDA_MPS_PIPE_DIRECTORY, which the ranks must see too:
# a job's own daemon, apart from any system-wide one and other jobs'. Logs go to
# $CUDA_MPS_LOG_DIRECTORY/<host>/.
# DPT_MPS_CONTROL names the control program (default nvidia-cuda-mps-control; the tests point it
# at a stand-in).
set -uo pipefail
ctl=${DPT_MPS_CONTROL:-nvidia-cuda-mps-control}
: "${CUDA_MPS_PIPE_DIRECTORY:?set CUDA_MPS_PIPE_DIRECTORY}" "${CUDA_MPS_LOG_DIRECTORY:?set CUDA_MPS_LOG_DIRECTORY}"
host=$(hostname -s)

case "${1:-}" in
  run)
    # One log folder per node (the job's may be on a shared file system); the pipes stay local.
    export CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY/$host
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || exit 1
    command -v "$ctl" >/dev/null || { echo "$host: $ctl not found (CUDA driver utilities)" >&2; exit 1; }
    echo "$host: MPS control daemon starting (pipes $CUDA_MPS_PIPE_DIRECTORY, log $CUDA_MPS_LOG_DIRECTORY/control.log)"
    # -f: no fork, so that Slurm tracks the daemon in this step and kills it if the job dies. In
    # the foreground it logs to stderr, hence the redirection.
    exec "$ctl" -f >> "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>&1
    ;;
  ready)
    deadline=$((SECONDS + ${DPT_MPS_WAIT_S:-30}))
    until [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; do
      ((SECONDS < deadline)) || { echo "$host: no MPS control pipe in $CUDA_MPS_PIPE_DIRECTORY" >&2; exit 1; }
      sleep 0.2
    done
    ;;
  stop)
    [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || exit 0
    echo quit | timeout 30 "$ctl" || echo "$host: MPS quit failed" >&2
    echo "$host: MPS control daemon asked to quit"
    ;;
  *) echo "usage: mps-daemon.sh run|ready|stop" >&2; exit 2 ;;
esac
