#!/usr/bin/env bash
# Install (the main job's packages and the tests'), build everything, and run the whole test
# suite (GPU tests skip where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
# One test at a time: the multi-rank tests oversubscribe the cores on their own.
ctest --output-on-failure --timeout 600
# Then the sanitizers: fast tests under ASan+UBSan, and a bounded fuzz run of the three readers.
cd .. && bash fuzz/ci.sh
