#!/usr/bin/env bash
# The everyday test command: install what the tests need (the main job's packages and the
# tests'), build everything and run ctest (GPU tests skip where no GPU is visible).
#   bash scripts/test.sh          install, build, ctest; prints how to run the rest
#   bash scripts/test.sh --full   then the sanitizer and fuzz runs too (fuzz/ci.sh): what CI runs
# Exits non-zero when anything fails; with --full the sanitizer and fuzz runs go ahead after a
# failing ctest, so one run reports both.
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
case ${1:-} in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: $0 [--full]" >&2; exit 2 ;;
esac
bash scripts/setup.sh --tests
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One test at a time: the multi-rank tests oversubscribe the cores on their own.
status=0
(cd build && ctest --output-on-failure --timeout 600) || status=$?
if ((full)); then
  # The sanitizers: fast tests under ASan+UBSan, and a bounded fuzz run of the three readers.
  bash fuzz/ci.sh || { rc=$?; ((status)) || status=$rc; }
  if ((status == 0)); then echo "scripts/test.sh --full: ctest and fuzz/ci.sh passed"; fi
else
  echo "scripts/test.sh: ctest done. Not run here: the sanitizer build and its tests, and the"
  echo "  fuzzers (what CI adds): bash fuzz/ci.sh, or bash scripts/test.sh --full for all of it"
fi
exit "$status"
