#!/usr/bin/env bash
# The sanitizer half of the test suite (scripts/test.sh --full and CI run it after the main ctest):
#  1. the fast unit tests (core, layers, data, data_order, ckpt, parallel) built with
#     AddressSanitizer and UndefinedBehaviorSanitizer (DPT_SANITIZE, CPU only) into build-asan/
#     and run by ctest;
#  2. the libFuzzer targets of fuzz/ built with clang into build-fuzz/ and run for
#     DPT_FUZZ_SECONDS (default 60) each. DPT_FUZZ_SECONDS=0 skips both.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${DPT_FUZZ_SECONDS:-60}
((secs > 0)) || { echo "fuzz/ci.sh: skipped (DPT_FUZZ_SECONDS=0)"; exit 0; }
jobs=$(nproc)
# libhdf5 is not instrumented; its own memcpy over-reads on damaged files are suppressed (see
# fuzz/asan.supp). Open MPI keeps its allocations to the end, so leak checking is off.
export ASAN_OPTIONS="suppressions=$PWD/fuzz/asan.supp:detect_leaks=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

t0=$SECONDS
cmake -S . -B build-asan -DDPT_SANITIZE=ON -DDPT_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build-asan -j"$jobs" --target test_core test_layers test_data test_data_order test_ckpt test_parallel test_resnet test_parallel_resnet
(cd build-asan && ctest --output-on-failure --timeout 900 -R '^test_(core|layers|data|data_order|ckpt|parallel|resnet|parallel_resnet)$')
echo "fuzz/ci.sh: sanitizer build and tests took $((SECONDS - t0)) s"

t0=$SECONDS
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang > /dev/null
cmake --build build-fuzz -j"$jobs"
bash fuzz/run.sh build-fuzz "$secs"
echo "fuzz/ci.sh: fuzz build and run took $((SECONDS - t0)) s"
