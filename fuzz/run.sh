#!/usr/bin/env bash
# Bounded fuzz run of every target: bash fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET
# Seeds are generated into BUILD_DIR/seeds; the corpus grows in BUILD_DIR/corpus (kept between
# runs); a crash leaves its input in BUILD_DIR/crashes and fails the run, except a crash whose
# innermost frame is inside libhdf5 itself (an HDF5 1.10 bug on a damaged file, not ours): that
# one is kept as crashes/hdf5-*, counted, reported, and fuzzing goes on for the time left.
set -uo pipefail
build=${1:-build-fuzz}
secs=${2:-60}
here="$(cd "$(dirname "$0")" && pwd)"
# No single allocation may exceed 1 GiB on inputs of at most 64 KiB: libhdf5's malloc then gets
# NULL and fails cleanly (glibc would hand it untouched virtual memory, but ASan's shadow of a
# 17 GB block alone is 2 GB of RSS); our own code allocates with new, which throws bad_alloc, and
# that escaping the reader is reported as a crash: the "no large allocation" contract, tested.
export ASAN_OPTIONS="suppressions=$here/asan.supp:detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=1024:quarantine_size_mb=64"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
"$build/fuzz_seeds" "$build/seeds" || exit 1
mkdir -p "$build/crashes"
status=0
for t in dataset ckpt config; do
  mkdir -p "$build/corpus/$t"
  end=$(( $(date +%s) + secs ))
  runs=0 hdf5=0 i=0
  while left=$(( end - $(date +%s) )); (( left > 2 )); do
    i=$((i + 1))
    log="$build/fuzz_$t.$i.log"
    # -rss_limit_mb: a hostile header must not make the reader allocate its way past 2 GiB.
    "$build/fuzz_$t" -max_total_time="$left" -timeout=5 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
      "$build/corpus/$t" "$build/seeds/$t" > "$log" 2>&1
    rc=$?
    n=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    runs=$((runs + ${n:-0}))
    (( rc == 0 )) && break
    # The innermost frame that is neither the sanitizer's nor libc's (its string routines may be
    # named by their source, sysdeps/...: a timeout inside ASan's memset of a block libhdf5 asked
    # for, on a damaged file, named __memset_avx512_unaligned_erms at memset-vec-unaligned-erms.S).
    top=$(grep -E '^ +#[0-9]+ ' "$log" |
          grep -vE '__interceptor_|__asan|__sanitizer|fuzzer::|memmove-vec|sysdeps/|libc\.so| in (malloc|calloc|realloc|free) ' | head -1)
    artifact=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | cut -d' ' -f5)
    if [[ "$top" == *libhdf5* ]] && grep -qE 'AddressSanitizer|libFuzzer: (timeout|out-of-memory|deadly signal)' "$log"; then
      hdf5=$((hdf5 + 1))
      [ -n "$artifact" ] && mv "$artifact" "$build/crashes/hdf5-$(basename "$artifact")"
      echo "fuzz_$t: HDF5 library crash/hang on a damaged file (kept as crashes/hdf5-*): $(echo "$top" | sed 's/^ *//' | cut -c1-120)"
      continue
    fi
    echo "fuzz_$t: FAILED (log: $log)"; grep -A30 -E 'ERROR|runtime error|timeout|out-of-memory' "$log" | head -45
    status=1
    break
  done
  cov=$(grep -ho 'cov: [0-9]*' "$build"/fuzz_"$t".*.log 2>/dev/null | tail -1)
  echo "fuzz_$t: $runs inputs in ${secs} s, $cov, HDF5-internal crashes: $hdf5"
done
exit $status
