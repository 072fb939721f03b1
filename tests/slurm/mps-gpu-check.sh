#!/usr/bin/env bash
# The MPS part of jobs/mps.sbatch on a real GPU, without Slurm: jobs/mps-daemon.sh starts a private
# nvidia-cuda-mps-control, 4 dptrain ranks share the GPU(s) over the MPI transport, then the daemon
# is asked to quit and must be gone. Exit 77 where MPS is not available.
#   bash tests/slurm/mps-gpu-check.sh BUILD_DIR     (a CUDA build of dptrain and dpdata)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
bin=${1:?usage: mps-gpu-check.sh BUILD_DIR}
command -v nvidia-cuda-mps-control >/dev/null || { echo "SKIP: nvidia-cuda-mps-control not installed"; exit 77; }
nvidia-smi -L || { echo "SKIP: no GPU visible"; exit 77; }
work=$(mktemp -d /tmp/dpt-mps-XXXX)
export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs/mps-daemon.sh run & daemon=$!
stop() { jobs/mps-daemon.sh stop; for _ in $(seq 100); do kill -0 $daemon 2>/dev/null || return 0; sleep 0.2; done; echo "daemon did not quit"; kill $daemon; return 1; }
jobs/mps-daemon.sh ready || { echo "SKIP: daemon did not come up"; cat "$work"/log/* 2>/dev/null; kill $daemon; exit 77; }
"$bin/dpdata" synth blobs --n 8000 --dim 32 --classes 4 --spread 0.5 --seed 3 --out "$work/train.h5" >/dev/null
"$bin/dpdata" synth blobs --n 1000 --dim 32 --classes 4 --spread 0.5 --seed 3 --out "$work/test.h5" >/dev/null
mpirun -np 4 --oversubscribe --bind-to none "$bin/dptrain" --model.layers 32,64,4 --data.train "$work/train.h5" \
  --data.test "$work/test.h5" --train.epochs 2 --train.batch_per_rank 25 --train.optimizer adam --train.lr 0.002 \
  --comm.backend mpi --device.type cuda --log.every_steps 40 2>&1 | grep -E "rank|backend|accuracy|done|error|Error"
rc=${PIPESTATUS[0]}
echo "dptrain exit code $rc"
echo "--- MPS processes while the daemon runs:"; pgrep -a nvidia-cuda-mps || true
stop; src=$?
log=$work/log/$(hostname -s)
echo "--- control log:"; grep -c "NEW CLIENT" "$log/control.log"; tail -8 "$log/control.log"
echo "--- server log:"; tail -3 "$log/server.log" 2>/dev/null
left=$(pgrep -a nvidia-cuda-mps || true)
echo "--- MPS processes after quit: ${left:-none}"
rm -rf "$work"
[ "$rc" -eq 0 ] && [ "$src" -eq 0 ] && [ -z "$left" ]
