#!/usr/bin/env bash
# One call on the GPU machine (device tool): GPU tests, the end-to-end Fashion-MNIST run, its
# start-up and shut-down phase by phase, and bench-step beside the PyTorch peer, logs under $OUT. Expects the executables built here in
# .gpu/bin, the OpenBLAS runtime in .gpu/gpulibs.tar.xz and Fashion-MNIST's .gz files in
# .gpu/fashion (see bench/README.md, "GPU").
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
B=.gpu/bin
# The machine has its own libopenblas.so.0; a copy travels in case it ever does not.
if ! ldconfig -p | grep -q libopenblas.so.0 && [ -f .gpu/gpulibs.tar.xz ]; then
  mkdir -p /tmp/gl && tar -xJf .gpu/gpulibs.tar.xz -C /tmp/gl && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl
fi
what=${1:-all}  # all, or a comma-separated list of the sections below
want() { [[ $what == all || ,$what, == *,$1,* ]]; }
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  nvidia-smi topo -m; command -v nsys ncu; ldd $B/dptrain | grep -E "not found|openblas|nccl|cublas" ; nproc
} > "$OUT/machine.txt" 2>&1
if want tests; then
  { mpirun -np 1 $B/test_gpu; echo "rc=$?"; mpirun -np 2 $B/test_gpu_nccl; echo "rc=$?";
    mpirun -np 1 $B/test_gpu_train; echo "rc=$?"; mpirun -np 2 $B/test_gpu_train; echo "rc=$?";
    mpirun -np 4 $B/test_gpu_train; echo "rc=$?";
    mpirun -np 1 $B/test_core; echo "rc=$?"; mpirun -np 4 --oversubscribe $B/test_parallel; echo "rc=$?"; } > "$OUT/tests.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED|rc=" "$OUT/tests.log"
fi
if want e2e; then
  mkdir -p data && $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  for np in 1; do
    /usr/bin/time -f "wall %e s" mpirun -np $np $B/dptrain --config inputs/run.ini --train.epochs 20 \
      --checkpoint.dir /tmp/ck$np --log.metrics $OUT/e2e-metrics-$np.jsonl > "$OUT/e2e-$np.log" 2>&1
    grep -E "wall|final|done|error" "$OUT/e2e-$np.log"
  done
  # The same run reading only this rank's rows per epoch (data.read = shard), and with the data
  # streamed through pinned buffers instead of resident (DPT_STREAM_DATA=1: no step graph).
  /usr/bin/time -f "wall %e s" mpirun -np 1 $B/dptrain --config inputs/run.ini --train.epochs 20 --data.read shard \
    --checkpoint.dir /tmp/ck-shard --log.metrics $OUT/e2e-metrics-shard.jsonl > "$OUT/e2e-shard.log" 2>&1
  grep -E "wall|final|done|error|data.read" "$OUT/e2e-shard.log"
  /usr/bin/time -f "wall %e s" mpirun -x DPT_STREAM_DATA=1 -np 1 $B/dptrain --config inputs/run.ini --train.epochs 20 \
    --checkpoint.dir /tmp/ck-stream --log.metrics $OUT/e2e-metrics-stream.jsonl > "$OUT/e2e-stream.log" 2>&1
  grep -E "wall|final|done|error|stream" "$OUT/e2e-stream.log"
  # Two ranks sharing the one GPU over the MPI transport (MPS-style layout), 2 epochs.
  mpirun -np 2 $B/dptrain --config inputs/run.ini --train.epochs 2 --checkpoint.dir "" --comm.backend mpi > "$OUT/e2e-shared.log" 2>&1
  grep -E "final|done|error|transport" "$OUT/e2e-shared.log"
fi
if want startup; then
  # Time to first result: the 20-epoch default run with log.timing, the start-up cuts on and off.
  B=$B OUT=$OUT bash bench/startup.sh "${STARTUP_REPS:-3}" > "$OUT/startup.txt" 2>&1
  cat "$OUT/startup.txt"
fi
if want mps; then
  # jobs/mps-daemon.sh without Slurm: a real MPS control daemon, two ranks on the GPU through it.
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/dpt-mps/pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log
  bash jobs/mps-daemon.sh run > "$OUT/mps-daemon.log" 2>&1 &
  daemon=$!
  if bash jobs/mps-daemon.sh ready; then
    echo "mps: control pipe up"
    timeout 180 mpirun -x CUDA_MPS_PIPE_DIRECTORY -np 2 $B/dptrain --config inputs/run.ini --train.epochs 2 \
      --checkpoint.dir "" --comm.backend mpi > "$OUT/mps-train.log" 2>&1 &
    train=$!
    sleep 4; nvidia-smi > "$OUT/mps-nvidia-smi.txt" 2>&1
    wait $train; echo "mps: dptrain rc=$?"
    grep -E "final|done|error" "$OUT/mps-train.log"
  fi
  bash jobs/mps-daemon.sh stop
  timeout 30 tail --pid=$daemon -f /dev/null; kill $daemon 2>/dev/null
  grep -c -i "new client\|client" "$OUT"/mps-log/*/control.log 2>/dev/null | sed 's/^/mps: control.log client lines /'
  grep -i "M+C\|MPS" "$OUT/mps-nvidia-smi.txt" | head -5
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if want layouts; then
  python3 bench/gemm_layouts.py --batch 4096 --width 4096 --precision tf32,bf16 > "$OUT/gemm-layouts.jsonl" 2>&1
  cat "$OUT/gemm-layouts.jsonl"
fi
if want bench; then
  [[ ${SKIP_TORCH:-0} == 1 ]] || python3 bench/torch_step.py --gemm --layers 784,1024,1024,10 --batch 256 --precision tf32 --modes eager,graph > "$OUT/torch-small.jsonl" 2>&1
  mpirun -np 1 $B/bench-step --layers 784,1024,1024,10 --batch 256 --precision tf32 > "$OUT/ours-small.log" 2>&1
  mpirun -np 1 $B/bench-step --layers 784,1024,1024,10 --batch 256 --precision fp32 >> "$OUT/ours-small.log" 2>&1
  mpirun -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 --warmup 20 --steps 200 > "$OUT/ours-wide.log" 2>&1
  mpirun -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision tf32 --warmup 20 --steps 200 >> "$OUT/ours-wide.log" 2>&1
  # TF32 with the weight gradient's operands as they are (0) and both transposed (2); 1 is the default.
  for t in 0 2; do
    DPT_TF32_TRANSPOSE=$t mpirun -x DPT_TF32_TRANSPOSE -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision tf32 --warmup 20 --steps 200 > "$OUT/ours-wide-tf32-t$t.log" 2>&1
  done
  # The step's memory-bound passes alone against a device copy of the same bytes.
  for p in bf16 tf32; do $B/bench-kernels --precision $p --reps 50 > "$OUT/ours-kernels-$p.log" 2>&1; done
  # The per-layer path (ReLU not fused into cuBLASLt's epilogues), as before the fusion.
  for p in bf16 tf32; do
    DPT_LT_FUSE=0 mpirun -x DPT_LT_FUSE -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision $p --warmup 20 --steps 200 > "$OUT/ours-wide-nofuse-$p.log" 2>&1
  done
  # The same bf16 step with the GEMMs on cublasGemmEx instead of cuBLASLt (bias in a kernel).
  DPT_CUBLASLT=0 mpirun -x DPT_CUBLASLT -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 --warmup 20 --steps 200 > "$OUT/ours-wide-gemmex.log" 2>&1
  if [[ ${SKIP_TORCH:-0} != 1 ]]; then
    python3 bench/torch_step.py --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 --modes eager,compile --steps 100 > "$OUT/torch-wide.jsonl" 2>&1
    python3 bench/torch_step.py --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision tf32 --modes eager --steps 100 >> "$OUT/torch-wide.jsonl" 2>&1
  fi
  grep -h "^{" "$OUT"/ours-*.log "$OUT"/torch-*.jsonl
fi
if want epilogues; then
  # cuBLASLt's epilogues per GEMM of a 4096-wide layer at batch 4096, every heuristic candidate
  # timed, and DRELU_BGRAD checked against the host; k=10: the output layer's input gradient.
  for p in bf16 tf32; do
    $B/bench-lt-epilogues --precision $p --m 4096 --n 4096 --k 4096 > "$OUT/lt-epilogues-$p.jsonl" 2>&1
  done
  $B/bench-lt-epilogues --precision bf16 --m 4096 --n 4096 --k 10 > "$OUT/lt-epilogues-bf16-k10.jsonl" 2>&1
  $B/bench-lt-epilogues --precision bf16 --m 4096 --n 4096 --k 784 > "$OUT/lt-epilogues-bf16-k784.jsonl" 2>&1
  mpirun -np 1 $B/test_gpu --gtest_filter='*Fused*' > "$OUT/fused-test.log" 2>&1; echo "fused test rc=$?"
  grep "fused  " "$OUT/fused-test.log"
  grep -h check "$OUT"/lt-epilogues-*.jsonl
fi
if want profile; then
  # Where the wide bf16 / tf32 step's time goes, kernel by kernel (Nsight Systems, where installed).
  if command -v nsys > /dev/null; then
    for p in bf16 tf32; do
      nsys profile -o "$OUT/wide-$p" --force-overwrite true -t cuda mpirun -np 1 $B/bench-step --layers 784,4096,4096,4096,4096,10 \
        --batch 4096 --precision $p --warmup 10 --steps 50 --repeat 1 > "$OUT/profile-$p.log" 2>&1
      nsys stats -r cuda_gpu_kern_sum -f csv -o "$OUT/wide-$p" "$OUT/wide-$p.nsys-rep" > /dev/null 2>&1
      head -25 "$OUT"/wide-$p*kern_sum*.csv | cut -c1-220
      rm -f "$OUT/wide-$p.nsys-rep" "$OUT/wide-$p.sqlite"
    done
  else
    echo "profile: nsys not installed here"
  fi
fi
if want scaling; then
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  timeout ${SCALING_TIMEOUT:-240} mpirun -np 1 $B/bench-scaling --config bench/scaling.ini --out "$OUT/scaling" > "$OUT/scaling-stdout.log" 2>&1
  echo "bench-scaling rc=$?"; grep -A12 -i "findings" "$OUT/scaling-stdout.log" | head -20
fi
if want multi; then
  # Issue 7's list in one call, for a host with G GPUs (nvidia-h200-x2/x4/x8): NCCL across real
  # GPUs against MPI, NVIDIA's all_reduce_perf beside dptrain's allreduce sweep, bench-scaling for
  # the default MLP (with the batch/LR grid) and for the wide MLP in bf16 at batch 4096 per GPU,
  # and the default run on G GPUs against 1 GPU at the same global batch (64).
  # all_reduce_perf: nccl-tests built here from source (not committed) into .gpu/bin. QUICK=1
  # shortens every sweep (a dry run of this section on one GPU).
  G=$(nvidia-smi -L | wc -l)
  q=${QUICK:-0}
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  { mpirun -np $G $B/test_gpu_nccl; echo "rc=$?"; mpirun -np $G $B/test_gpu_train; echo "rc=$?"; } > "$OUT/multi-tests.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED|rc=" "$OUT/multi-tests.log"
  if [ -x $B/all_reduce_perf ]; then
    e=4G; ((q)) && e=64M
    mpirun -np $G -x NCCL_NVLS_ENABLE $B/all_reduce_perf -b 8 -e $e -f 2 -g 1 > "$OUT/nccl-all_reduce_perf.log" 2>&1
    echo "all_reduce_perf rc=$?"; grep -E "^ +(268435456|1073741824|4294967296|67108864) |Avg bus" "$OUT/nccl-all_reduce_perf.log"
  fi
  quick=(); ((q)) && quick=(--scaling.timed_steps 20 --scaling.repeats 1 --allreduce.max_bytes 67108864 --allreduce.repeats 1 --buckets.sizes_mb 4,64 --grid.enabled false)
  timeout 900 mpirun -np $G $B/bench-scaling --config bench/scaling.ini --allreduce.max_bytes 1073741824 "${quick[@]}" \
    --out "$OUT/scaling-default" > "$OUT/scaling-default.log" 2>&1; echo "bench-scaling default rc=$?"
  timeout 900 mpirun -np $G $B/bench-scaling --config bench/scaling.ini --scaling.models wide:784,4096,4096,4096,4096,10 \
    --train.precision bf16 --scaling.weak_batch_per_rank 4096 --scaling.strong_global_batch $((4096 * G)) \
    --grid.enabled false "${quick[@]}" --out "$OUT/scaling-wide" > "$OUT/scaling-wide.log" 2>&1; echo "bench-scaling wide rc=$?"
  grep -h -A12 -i "findings" "$OUT"/scaling-*.log | head -40
  ep=10; ((q)) && ep=1
  mpirun -np 1 $B/dptrain --config inputs/run.ini --train.epochs $ep --train.batch_per_rank 64 --checkpoint.dir "" \
    --log.metrics "$OUT/acc-1gpu.jsonl" > "$OUT/acc-1gpu.log" 2>&1
  mpirun -np $G $B/dptrain --config inputs/run.ini --train.epochs $ep --train.batch_per_rank $((64 / G)) --checkpoint.dir "" \
    --log.metrics "$OUT/acc-${G}gpu.jsonl" > "$OUT/acc-${G}gpu.log" 2>&1
  grep -H "final test accuracy" "$OUT"/acc-*.log
fi
# The device tool brings back few files: pack everything into one archive.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
