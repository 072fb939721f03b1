#!/usr/bin/env bash
# The default job from nothing: install, build, import Fashion-MNIST, train on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f data/fashion-mnist-train.h5 ] || ./dpdata fashion-mnist --out-dir data
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 ./dptrain --config inputs/run.ini "$@"
