#!/usr/bin/env bash
# The default job from nothing: install what it needs, build dptrain and dpdata, import
# Fashion-MNIST, train on 2 ranks. Prints the seconds of each phase (apt, build, import, train).
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t0=$(now)
bash scripts/setup.sh
t=$(now)
[ -f data/fashion-mnist-train.h5 ] || ./dpdata fashion-mnist --out-dir data
echo "run-default: import $(took "$t") s"
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$(now)
mpirun -np 2 ./dptrain --config inputs/run.ini "$@"
echo "run-default: train $(took "$t") s; total $(took "$t0") s"
