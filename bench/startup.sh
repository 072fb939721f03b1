#!/usr/bin/env bash
# Time to first result on a GPU: the default Fashion-MNIST job for 20 epochs on one GPU
# (`mpirun -np 1 dptrain --config inputs/run.ini --train.epochs 20`, as gpu_run.sh's e2e), wall
# time from launch to exit beside dptrain's own per-phase report (log.timing = true), with the
# start-up cuts on (the default) and off — all together (the old path) and each alone — every
# variant REPS times, interleaved, so that a change of the machine's state hits them alike.
# Also `mpirun -np 1 /bin/true`: the launcher's own share. Run from the repository root on the
# GPU machine (gpu_run.sh's `startup` section calls it); logs under $OUT/startup/.
#   bash bench/startup.sh [REPS]     (default 3)
# STARTUP_ARGS adds dptrain arguments (a dry run on a CPU: STARTUP_ARGS="--train.steps 50").
set -uo pipefail
OUT=${OUT:-/tmp/out}
B=${B:-.gpu/bin}
reps=${1:-3}
dir=$OUT/startup
mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null

# name=the switches set to 0 (see include/dpt/app.hpp); "new" sets none.
variants=(
  "new="
  "old=DPT_EARLY_CUDA DPT_LOAD_THREAD DPT_ONE_RANK_COMM DPT_FAST_EXIT"
  "nccl-one-rank=DPT_ONE_RANK_COMM"
  "no-load-thread=DPT_LOAD_THREAD"
  "no-early-cuda=DPT_EARLY_CUDA"
  "no-fast-exit=DPT_FAST_EXIT"
)
now() { date +%s.%N; }
{
  date -u
  nvidia-smi --query-gpu=name,persistence_mode,clocks.sm --format=csv 2> /dev/null
  uptime
} > "$dir/machine.txt"
for ((r = 1; r <= reps; ++r)); do
  s=$(now); mpirun -np 1 /bin/true; e=$(now)
  echo "launcher rep=$r wall=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }')" >> "$dir/walls.txt"
  for v in "${variants[@]}"; do
    name=${v%%=*}
    off=(${v#*=})
    xs=()
    for x in "${off[@]}"; do export "$x=0"; xs+=(-x "$x"); done
    rm -rf /tmp/dpt-startup-ck
    log=$dir/$name-$r.log
    s=$(now)
    mpirun "${xs[@]}" -np 1 $B/dptrain --config inputs/run.ini --train.epochs 20 --log.timing true \
      --checkpoint.dir /tmp/dpt-startup-ck --log.metrics "$dir/$name-$r.jsonl" ${STARTUP_ARGS:-} > "$log" 2>&1
    rc=$?
    e=$(now)
    for x in "${off[@]}"; do unset "$x"; done
    own=$(sed -nE 's/.*process start to the end of main ([0-9.]+) s.*/\1/p' "$log")
    loop=$(sed -nE 's/^done: .* in ([0-9.]+) s,.*/\1/p' "$log")
    acc=$(sed -nE 's/^final test accuracy ([0-9.]+).*/\1/p' "$log")
    echo "$name rep=$r rc=$rc wall=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", b - a }') own=${own:-?} loop=${loop:-?} acc=${acc:-?}" >> "$dir/walls.txt"
  done
done
uptime >> "$dir/machine.txt"
# Median (min–max) of each variant; then the phase tables of the first repetition of new and old.
python3 - "$dir/walls.txt" << 'EOF'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:])
    rows.setdefault(f[0], []).append(kv)
print(f"{'variant':<16} {'n':>2} {'wall s median (min-max)':>26} {'dptrain own s':>14} {'loop s':>7} {'rc':>4} {'accuracy':>9}")
for name, rs in rows.items():
    def med(key):
        v = [float(r[key]) for r in rs if r.get(key, "?") not in ("?", "")]
        return (statistics.median(v), min(v), max(v)) if v else None
    w, o, l = med("wall"), med("own"), med("loop")
    rcs = ",".join(sorted({r.get("rc", "0") for r in rs}))
    accs = ",".join(sorted({r.get("acc", "-") for r in rs}))
    ws = f"{w[0]:.3f} ({w[1]:.3f}-{w[2]:.3f})" if w else "-"
    print(f"{name:<16} {len(rs):>2} {ws:>26} {o[0] if o else '-':>14} {l[0] if l else '-':>7} {rcs:>4} {accs:>9}")
EOF
for name in new old; do
  echo "--- $name, repetition 1"
  grep -A11 "^timing (log.timing)" "$dir/$name-1.log"
  grep "^timing: shut-down" "$dir/$name-1.log"
done
