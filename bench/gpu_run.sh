#!/usr/bin/env bash
# One call on the GPU machine (device tool): GPU tests, the end-to-end Fashion-MNIST run, its
# start-up and shut-down phase by phase, bench-step beside the PyTorch peer, the batch-size / lr
# grid with time to target, logs under $OUT. Expects the executables built here in
# .gpu/bin, the Debian runtimes the GPU machine may lack (oneDNN's libdnnl.so.2 and its
# libOpenCL.so.1, OpenBLAS, libjpeg-turbo's libjpeg.so.62, libpng16) in .gpu/gpulibs.tar.xz and Fashion-MNIST's .gz files in
# .gpu/fashion (see docs/benchmarks.md, "GPU"). scale12 (2 GPUs) and one12 (1 GPU) are each one
# call of their own (run them alone: `bash bench/gpu_run.sh scale12`).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
B=.gpu/bin
# The machine has its own libopenblas.so.0, not (as far as seen) Debian's oneDNN: copies travel,
# used for whichever library the machine lacks (appended to the path: its own come first).
for lib in libopenblas.so.0 libdnnl.so.2 libOpenCL.so.1 libjpeg.so.62 libpng16.so.16; do
  if ! ldconfig -p | grep -q "$lib" && [ -f .gpu/gpulibs.tar.xz ]; then
    mkdir -p /tmp/gl && tar -xJf .gpu/gpulibs.tar.xz -C /tmp/gl && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl
    break
  fi
done
what=${1:-all}  # all (not scale12, one12), or a comma-separated list of the sections below (tests, e2e, mps,
# layouts, bench, epilogues, profile, scaling, multi, cnn, resnet, grid, startup, finetune, scale12, one12,
# samebits, images, images_acc, streambits; the last six not in all)
# cuDNN: the version built against (9.19) is PyTorch's copy there; the machine's default is older.
CUDNN_LIB=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib
[ -d $CUDNN_LIB ] && export LD_LIBRARY_PATH=$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
want() { [[ ($what == all && $1 != scale12 && $1 != one12 && $1 != samebits && $1 != images && $1 != images_acc && $1 != streambits && $1 != streamrate) || ,$what, == *,$1,* ]]; }
# EXTRA_ENV="NAME=VALUE ...": variables for dptrain's runs in scale12 (all of them) and one12
# (bench-step a second time with them, A/B in one call); forwarded to every rank with mpirun -x.
xenv=()
for kv in ${EXTRA_ENV:-}; do xenv+=(-x "${kv%%=*}"); done
# Seconds left before the section's deadline (set by the section), and a time limit of at most
# $1 seconds that leaves $2 seconds for what follows.
left() { echo $(( deadline - SECONDS )); }
cap() { local l=$(( deadline - SECONDS - ${2:-0} )); (( l < $1 )) && echo $(( l > 5 ? l : 5 )) || echo "$1"; }
# nccl-tests' binary for a collective: .gpu/bin, else a build tree carried in .gpu/nccl-tests.
nccl_perf() { for f in $B/$1_perf .gpu/nccl-tests/build/$1_perf; do [ -x "$f" ] && { echo "$f"; return; }; done; }
{
  date -u; lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core)"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  nvidia-smi topo -m; command -v nsys ncu; ldd $B/dptrain | grep -E "not found|openblas|dnnl|OpenCL|nccl|cublas" ; nproc
} > "$OUT/machine.txt" 2>&1
if want tests; then
  # Each test at most TEST_LIMIT seconds (default 240): a hang costs one test, not the call.
  # A test binary not carried in $B (the CPU ones pass in ctest on the CPU machine) is named and skipped.
  t() {
    local a; for a in "$@"; do [[ $a == $B/* && ! -x $a ]] && { echo "$a: not carried, skipped"; return 0; }; done
    timeout "${TEST_LIMIT:-240}" "$@"
  }
  { t mpirun -np 1 $B/test_gpu; echo "rc=$?"; t mpirun -np 1 $B/test_gpu_bf16; echo "rc=$?";
    t mpirun -np 2 $B/test_gpu_nccl; echo "rc=$?";
    t mpirun -np 1 $B/test_gpu_train; echo "rc=$?"; t mpirun -np 2 $B/test_gpu_train; echo "rc=$?";
    t mpirun -np 4 $B/test_gpu_train; echo "rc=$?";
    t mpirun -np 1 $B/test_core; echo "rc=$?"; t mpirun -np 4 --oversubscribe $B/test_parallel; echo "rc=$?";
    t mpirun -np 1 $B/test_gpu_conv; echo "rc=$?"; t mpirun -np 1 $B/test_gpu_train_cnn; echo "rc=$?";
    t mpirun -np 2 $B/test_gpu_train_cnn; echo "rc=$?"; t mpirun -np 1 $B/test_layers; echo "rc=$?";
    t mpirun -np 4 --oversubscribe $B/test_parallel_cnn; echo "rc=$?";
    t mpirun -np 1 $B/test_gpu_resnet; echo "rc=$?"; t mpirun -np 1 $B/test_gpu_residual; echo "rc=$?";
    # Weights in and out against torchvision on the GPU (fp32, 1 and 2 ranks; ctest's torch_finetune).
    t python3 tests/torch_finetune_check.py --build $B --root . --device cuda; echo "rc=$?"; } \
    > "$OUT/tests.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED|rc=|torch_finetune_check|not carried" "$OUT/tests.log"
fi
if want e2e; then
  # Fresh checkpoint folders: the shipped configs resume (a second call on a warm machine would
  # otherwise find the first one's run complete).
  rm -rf /tmp/ck1 /tmp/ck-shard /tmp/ck-stream
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
if want resnet; then
  # Residual networks and convolutions on cuDNN, bf16, data resident: bench-step beside the
  # PyTorch peer (bench/torch_cnn.py: torchvision's models for the presets, channels_last, cuDNN
  # autotuned; eager and the whole step in a CUDA graph, PyTorch's best modes for these networks
  # on 2026-12-01, and torch.compile of the whole step for the compute-bound CNN, its best there)
  # in the same call: resnet50 3x224x224 b256, resnet18(stem=small) 1x28x28 b512, the compute-bound
  # CNN of section cnn and inputs/cnn.ini's, those two also with DPT_CONV=im2col (the GEMM path).
  # Then inputs/resnet.ini on Fashion-MNIST on the GPU (1 rank, batch 256, bf16).
  BIG="conv(128,3,pad=1) relu conv(128,3,pad=1) relu maxpool(2) conv(256,3,pad=1) relu conv(256,3,pad=1) relu maxpool(2) flatten linear(10)"
  CNN="conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(256) relu dropout(0.25) linear(10)"
  mp=(mpirun -np 1 -x LD_LIBRARY_PATH)
  "${mp[@]}" $B/bench-step --layers "resnet50(classes=10)" --input 3,224,224 --batch 256 --precision bf16 --warmup 5 --steps 20 > "$OUT/rn50-ours.log" 2>&1
  "${mp[@]}" $B/bench-step --layers "resnet18(stem=small,classes=10)" --input 1,28,28 --batch 512 --precision bf16 --warmup 10 --steps 50 > "$OUT/rn18-ours.log" 2>&1
  # ResNet-50's 1x1 convolutions on cuDNN instead of cuBLASLt's GEMMs, to compare (RN50_1X1=1).
  [[ ${RN50_1X1:-0} == 1 ]] && "${mp[@]}" -x DPT_CONV1X1=cudnn $B/bench-step --layers "resnet50(classes=10)" --input 3,224,224 --batch 256 --precision bf16 --warmup 5 --steps 20 > "$OUT/rn50-ours-1x1cudnn.log" 2>&1
  "${mp[@]}" $B/bench-step --layers "$BIG" --input 3,64,64 --batch 256 --precision bf16 --warmup 10 --steps 50 > "$OUT/big-ours.log" 2>&1
  "${mp[@]}" -x DPT_CONV=im2col $B/bench-step --layers "$BIG" --input 3,64,64 --batch 256 --precision bf16 --warmup 10 --steps 50 > "$OUT/big-ours-im2col.log" 2>&1
  "${mp[@]}" $B/bench-step --layers "$CNN" --input 1,28,28 --batch 256 --precision bf16 > "$OUT/small-ours.log" 2>&1
  "${mp[@]}" -x DPT_CONV=im2col $B/bench-step --layers "$CNN" --input 1,28,28 --batch 256 --precision bf16 > "$OUT/small-ours-im2col.log" 2>&1
  grep -hE "bench-step|rror" "$OUT"/rn50-ours*.log "$OUT"/rn18-ours.log "$OUT"/big-ours*.log "$OUT"/small-ours*.log | cut -c1-400
  if [[ ${SKIP_TORCH:-0} != 1 ]]; then
    tp() { timeout "${CNN_PEER_S:-150}" python3 bench/torch_cnn.py --precision bf16 --formats nhwc "$@"; }
    # The modes to run: PyTorch's best for each network on 2026-12-01 always among the defaults.
    tp --layers "resnet50(classes=10)" --input 3,224,224 --batch 256 --modes ${RN50_MODES:-eager,graph} --steps 20 --repeat 2 > "$OUT/rn50-torch.jsonl" 2>&1
    tp --layers "resnet18(stem=small,classes=10)" --input 1,28,28 --batch 512 --modes ${RN18_MODES:-eager,graph} --steps 50 > "$OUT/rn18-torch.jsonl" 2>&1
    tp --layers "$BIG" --input 3,64,64 --batch 256 --modes ${BIG_MODES:-graph,compile-step} --steps 30 > "$OUT/big-torch.jsonl" 2>&1
    tp --layers "$CNN" --input 1,28,28 --batch 256 --modes ${SMALL_MODES:-graph,compile-step} > "$OUT/small-torch.jsonl" 2>&1
    grep -h samples_per_s "$OUT"/*-torch.jsonl | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l); print(d['layers'][:40], d['mode'], d['samples_per_s'], d['ms_per_step'])"
  fi
  if [[ ${RESNET_E2E:-1} == 1 ]]; then
    mkdir -p data && [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
    rm -rf /tmp/ck-rn
    /usr/bin/time -f "wall %e s" "${mp[@]}" $B/dptrain --config inputs/resnet.ini --device.type cuda --train.precision bf16 \
      --train.batch_per_rank 256 --checkpoint.dir /tmp/ck-rn --log.metrics $OUT/resnet-e2e-metrics.jsonl \
      --log.every_steps 50 > "$OUT/resnet-e2e.log" 2>&1
    grep -E "wall|final|done|rror|eval" "$OUT/resnet-e2e.log" | tail -14
    # The same with label smoothing 0.1 and 16 epochs.
    rm -rf /tmp/ck-rn
    /usr/bin/time -f "wall %e s" "${mp[@]}" $B/dptrain --config inputs/resnet.ini --device.type cuda --train.precision bf16 \
      --train.batch_per_rank 256 --train.epochs 16 --train.label_smoothing 0.1 --checkpoint.dir /tmp/ck-rn \
      --log.metrics $OUT/resnet-e2e16-metrics.jsonl --log.every_steps 50 > "$OUT/resnet-e2e16.log" 2>&1
    grep -E "wall|final|done|rror|eval" "$OUT/resnet-e2e16.log" | tail -18
  fi
  # inputs/cnn.ini and the default MLP job (inputs/run.ini, 20 epochs) end to end with this build
  # and with the one before it (.gpu/before/dptrain, im2col convolutions), alternating, twice.
  if [ -x .gpu/before/dptrain ]; then
    for r in $(seq "${CMP_REPS:-2}"); do
      for v in before after; do
        exe=$B/dptrain; [ $v = before ] && exe=.gpu/before/dptrain
        for cfg in cnn run; do
          rm -rf /tmp/ck-cmp
          /usr/bin/time -f "wall %e s" "${mp[@]}" $exe --config inputs/$cfg.ini --checkpoint.dir /tmp/ck-cmp \
            --log.metrics "" > "$OUT/cmp-$cfg-$v-$r.log" 2>&1
          echo "$cfg $v $r: $(grep -hE 'wall|final' "$OUT/cmp-$cfg-$v-$r.log" | tr '\n' ' ' | cut -c1-300)"
        done
      done
    done
  fi
fi
if want samebits; then
  # A refactor's check: the same runs with the executable built before it (.gpu/before/dptrain)
  # and after it ($B/dptrain) must end in bitwise-equal parameters (fp32, TF32, bf16; MLP, CNN).
  mkdir -p data && [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  for case in "mlp-fp32:inputs/run.ini:fp32" "mlp-tf32:inputs/run.ini:tf32" "mlp-bf16:inputs/run.ini:bf16" \
              "cnn-bf16:inputs/cnn.ini:bf16" "cnn-tf32:inputs/cnn.ini:tf32"; do
    IFS=: read -r name cfg prec <<< "$case"
    for who in before after; do
      exe=$B/dptrain; [ $who = before ] && exe=.gpu/before/dptrain
      rm -rf /tmp/sb-$name-$who
      mpirun -np 1 $exe --config $cfg --train.precision $prec --train.steps 300 --checkpoint.dir /tmp/sb-$name-$who \
        --checkpoint.resume none --log.metrics "" > "$OUT/samebits-$name-$who.log" 2>&1 || echo "$name $who: rc=$?"
    done
    python3 - /tmp/sb-$name-before/ckpt-000000300.h5 /tmp/sb-$name-after/ckpt-000000300.h5 "$name" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a["model"].visit(lambda n: names.append(n) if isinstance(a["model"][n], h5py.Dataset) else None)
same = all(np.array_equal(a["model"][n][()], b["model"][n][()]) for n in names)
print(f"samebits {sys.argv[3]}: {len(names)} tensors, {'bitwise equal' if same else 'DIFFERENT'}")
PY
  done 2>&1 | tee "$OUT/samebits.txt"
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
    python3 bench/torch_step.py --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 --modes eager,compile-model,compile-step --steps 100 > "$OUT/torch-wide.jsonl" 2>&1
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
  mpirun -np 1 $B/test_gpu_bf16 --gtest_filter='*Fused*' > "$OUT/fused-test.log" 2>&1; echo "fused test rc=$?"
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
  # Without nsys: resnet50's step kernel by kernel under Nsight Compute (its duration metric only;
  # cuDNN's heuristic algorithms, so no timed search among the kernels), summed per kernel name.
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if ! command -v nsys > /dev/null && [ -x "$NCU" ]; then
    timeout "${PROFILE_S:-300}" mpirun -np 1 -x LD_LIBRARY_PATH "$NCU" --metrics gpu__time_duration.sum --csv --page raw \
      --log-file "$OUT/rn50-ncu.csv" $B/bench-step --layers "resnet50(classes=10)" --input 3,224,224 --batch 256 \
      --precision bf16 --conv-tuning heuristic --warmup 1 --steps 1 --repeat 1 > "$OUT/rn50-ncu.log" 2>&1
    echo "profile: ncu rc=$?"
    python3 bench/ncu_summary.py "$OUT/rn50-ncu.csv" --top 40 | tee "$OUT/rn50-ncu-summary.txt"
    xz -9 "$OUT/rn50-ncu.csv"
  fi
fi
if want scaling; then
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  # The batch-size / lr grid has a section of its own (grid): it would not fit this one's time.
  # The default sweep's rn50 rows add an estimated 4-6 min (more with the PyTorch peer): 600 s.
  timeout ${SCALING_TIMEOUT:-600} mpirun -np 1 $B/bench-scaling --config bench/scaling.ini --grid.enabled false \
    --out "$OUT/scaling" > "$OUT/scaling-stdout.log" 2>&1
  echo "bench-scaling rc=$?"; grep -A12 -i "findings" "$OUT/scaling-stdout.log" | head -20
fi
if want grid; then
  # The batch-size / learning-rate grid and time to target (bench/scaling.ini [grid]: nesterov, LARS
  # and LAMB x none/linear/sqrt x warm-up, global batch 64-32768 on one GPU; estimated 1.5-2 min on one
  # H200), then, where inputs/cnn.ini exists, the same for the CNN (a smaller grid: CNN_GRID_ARGS).
  # On G GPUs the grid still trains on one; the step times, the check run (the setting predicted
  # fastest on G GPUs, trained on 1 and on G: measured against predicted time to target) and the
  # allreduce fit use them all. GRID_ARGS adds overrides (a subset: --grid.global_batches 64,4096).
  G=$(nvidia-smi -L | wc -l)
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  sections=grid; ((G > 1)) && sections=grid,allreduce
  timeout ${GRID_TIMEOUT:-420} mpirun -np $G $B/bench-scaling --config bench/scaling.ini --report.sections $sections \
    ${GRID_ARGS:-} --out "$OUT/grid-mlp" > "$OUT/grid-mlp.log" 2>&1
  echo "grid mlp rc=$?"; sed -n '/^# Findings/,$p' "$OUT/grid-mlp.log" | head -40
  if [ -f inputs/cnn.ini ]; then
    timeout ${GRID_TIMEOUT:-420} mpirun -np $G $B/bench-scaling --config bench/scaling.ini --grid.config inputs/cnn.ini \
      --report.sections $sections ${CNN_GRID_ARGS:---grid.global_batches 64,256,1024,4096,16384,32768 --grid.lr_rules linear,sqrt --grid.warmup on --grid.epochs 5} \
      --out "$OUT/grid-cnn" > "$OUT/grid-cnn.log" 2>&1
    echo "grid cnn rc=$?"; sed -n '/^# Findings/,$p' "$OUT/grid-cnn.log" | head -40
  fi
fi
if want multi; then
  # Issue 7's list in one call, for a host with G GPUs (nvidia-h200-x2/x4/x8): NCCL across real
  # GPUs against MPI, NVIDIA's all_reduce_perf beside dptrain's allreduce sweep, bench-scaling for
  # the default MLP (its batch/LR grid is section grid's) and for the wide MLP in bf16 at batch 4096 per GPU,
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
  # (the grid and its time to target on G GPUs: section grid)
  timeout 900 mpirun -np $G $B/bench-scaling --config bench/scaling.ini --allreduce.max_bytes 1073741824 --grid.enabled false "${quick[@]}" \
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
if want cnn; then
  # Convolutional networks: bench-step (the product's loop, data resident) beside the PyTorch
  # peer (bench/torch_cnn.py: eager with cuDNN, the whole step in a CUDA graph, torch.compile;
  # NCHW and channels_last) in the same call, bf16 and TF32, at batch 256: inputs/cnn.ini's
  # network on 1x28x28, and a compute-bound network on 3x64x64. The GEMM ceiling (8192^3, as
  # torch.matmul reaches it) for the fraction of it the large network's model TFLOP/s is. Then
  # inputs/cnn.ini end to end on Fashion-MNIST (1 GPU).
  CNN="conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(256) relu dropout(0.25) linear(10)"
  BIG="conv(128,3,pad=1) relu conv(128,3,pad=1) relu maxpool(2) conv(256,3,pad=1) relu conv(256,3,pad=1) relu maxpool(2) flatten linear(10)"
  [[ ${SKIP_TORCH:-0} == 1 ]] || python3 bench/torch_step.py --gemm --layers 784,10 --batch 256 --precision bf16 --modes eager --steps 10 > "$OUT/cnn-gemm.jsonl" 2>&1
  for p in bf16 tf32; do
    mpirun -np 1 $B/bench-step --layers "$CNN" --input 1,28,28 --batch 256 --precision $p > "$OUT/cnn-small-ours-$p.log" 2>&1
    mpirun -np 1 $B/bench-step --layers "$BIG" --input 3,64,64 --batch 256 --precision $p --warmup 10 --steps 50 > "$OUT/cnn-big-ours-$p.log" 2>&1
    if [[ ${SKIP_TORCH:-0} != 1 ]]; then
      # Each peer run at most CNN_PEER_S seconds (default 150; its rows print as they finish).
      timeout "${CNN_PEER_S:-150}" python3 bench/torch_cnn.py --layers "$CNN" --input 1,28,28 --batch 256 --precision $p > "$OUT/cnn-small-torch-$p.jsonl" 2>&1
      timeout "${CNN_PEER_S:-150}" python3 bench/torch_cnn.py --layers "$BIG" --input 3,64,64 --batch 256 --precision $p --steps 30 > "$OUT/cnn-big-torch-$p.jsonl" 2>&1
    fi
  done
  python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
def rows(pattern):
    r = []
    for f in sorted(glob.glob(f"{out}/{pattern}")):
        for line in open(f):
            line = line[line.find("{"):] if "{" in line else ""
            try:
                r.append(json.loads(line))
            except ValueError:
                pass
    return r
gemm = {k: v for d in rows("cnn-gemm.jsonl") if d.get("bench") == "gemm" for k, v in d.items()}
print(f"{'net':<6}{'prec':<6}{'ours sps':>11}{'TFLOP/s':>9}{'eager':>11}{'graph':>11}{'cmp-step':>11}"
      f"{'x eager':>9}{'x best':>8}{'% ceiling':>10}")
for net in ("small", "big"):
    for p in ("bf16", "tf32"):
        ours = [d for d in rows(f"cnn-{net}-ours-{p}.log") if d.get("bench") == "step"]
        peer = [d for d in rows(f"cnn-{net}-torch-{p}.jsonl") if "samples_per_s" in d]
        if not ours:
            print(f"{net:<6}{p:<6} bench-step gave no result"); continue
        o = ours[0]
        best = {m: max([d["samples_per_s"] for d in peer if d["mode"] == m] or [0]) for m in ("eager", "graph", "compile-step")}
        top = max(best.values()) or float("nan")
        ceil = gemm.get(f"{p}_tflops")
        frac = f"{100 * o['model_tflops'] / ceil:.0f}%" if ceil else "-"
        print(f"{net:<6}{p:<6}{o['samples_per_s']:>11.0f}{o['model_tflops']:>9.1f}{best['eager']:>11.0f}"
              f"{best['graph']:>11.0f}{best['compile-step']:>11.0f}{o['samples_per_s'] / (best['eager'] or float('nan')):>9.2f}"
              f"{o['samples_per_s'] / top:>8.2f}{frac:>10}")
print("GEMM ceiling (8192^3):", gemm or "not measured")
PY
  [ -f data/fashion-mnist-train.h5 ] || $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  rm -rf /tmp/ck-cnn
  /usr/bin/time -f "wall %e s" mpirun -np 1 $B/dptrain --config inputs/cnn.ini --checkpoint.dir /tmp/ck-cnn \
    --log.metrics $OUT/cnn-e2e-metrics.jsonl > "$OUT/cnn-e2e.log" 2>&1
  grep -E "wall|final|done|error" "$OUT/cnn-e2e.log"
fi
if want scale12; then
  # The scaling issue's measurements on nvidia-h200-x2 in one call (~8 minutes, inside BUDGET
  # seconds, default 500; QUICK=1 shortens every part): the GPU tests across the GPUs; nccl-tests'
  # all_reduce_perf, reduce_scatter_perf and all_gather_perf from 1 MB to 1 GB; bench-scaling for
  # the wide MLP in bf16 at 4096 per GPU (weak) and 4096 x G in all (strong) with the four
  # variants (train.shard_optimizer false/true x comm.grad_dtype fp32/bf16), the allreduce,
  # reduce-scatter and all-gather sweeps to 1 GB and the PyTorch DDP peer (torchrun, bucket sweep
  # and the compiled step); then a comm.nccl_max_ctas sweep (CTAS) of the fastest variant with
  # bench-step on G GPUs; a summary at the end. Other knobs: GPUS (default nvidia-smi's count),
  # MODEL, PREC, WEAK_B, DDP_COMPILE (none|model|step|both), SCALING_EXTRA (more bench-scaling
  # arguments, shell-quoted), EXTRA_ENV (above). nccl-tests: see docs/benchmarks.md, "GPU".
  deadline=$((SECONDS + ${BUDGET:-500}))
  G=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  W=${MODEL:-784,4096,4096,4096,4096,10}; PREC=${PREC:-bf16}; WB=${WEAK_B:-4096}; q=${QUICK:-0}
  ((G >= 2)) || echo "scale12: $G GPU(s) visible; the section is meant for 2 or more"
  mpi=(mpirun -np "$G" --bind-to none -x NCCL_NVLS_ENABLE "${xenv[@]}")
  { timeout "$(cap 150 360)" env ${EXTRA_ENV:-} "${mpi[@]}" $B/test_gpu_nccl; echo "test_gpu_nccl np=$G rc=$?"
    timeout "$(cap 200 330)" env ${EXTRA_ENV:-} "${mpi[@]}" $B/test_gpu_train; echo "test_gpu_train np=$G rc=$?"; } > "$OUT/s12-tests.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED|rc=" "$OUT/s12-tests.log"
  e=1G; ((q)) && e=64M
  for c in all_reduce reduce_scatter all_gather; do
    exe=$(nccl_perf $c)
    if [ -z "$exe" ]; then echo "scale12: ${c}_perf not in $B or .gpu/nccl-tests/build: skipped"; continue; fi
    timeout "$(cap 60 300)" mpirun -np "$G" -x NCCL_NVLS_ENABLE "$exe" -b 1M -e $e -f 2 -g 1 > "$OUT/s12-nccl-${c}_perf.log" 2>&1
    echo "${c}_perf rc=$?"; grep -E "^ +(268435456|1073741824|67108864) " "$OUT/s12-nccl-${c}_perf.log"
  done
  quick=(); ((q)) && quick=(--scaling.timed_steps 20 --scaling.repeats 1 --allreduce.max_bytes 67108864
    --allreduce.repeats 1 --ddp.steps 10 --ddp.repeats 2 --ddp.buckets_mb 25,100)
  eval "extra=(${SCALING_EXTRA:-})"
  timeout "$(cap 420 40)" env ${EXTRA_ENV:-} "${mpi[@]}" $B/bench-scaling --config bench/scaling.ini \
    --scaling.models "wide:$W" --train.precision "$PREC" --scaling.weak_batch_per_rank "$WB" \
    --scaling.strong_global_batch $((WB * G)) --scaling.variants "unsharded-fp32 sharded-fp32 unsharded-bf16 sharded-bf16" \
    --scaling.warmup_steps 30 --scaling.timed_steps 100 --scaling.repeats 3 --allreduce.min_bytes 1048576 \
    --allreduce.max_bytes 1073741824 --allreduce.repeats 3 --buckets.sizes_mb 25 --grid.enabled false \
    --ddp.compile "${DDP_COMPILE:-step}" --ddp.timeout_s "$(cap 110 60)" --ddp.steps 50 --ddp.repeats 3 \
    "${quick[@]}" "${extra[@]}" --out "$OUT/s12-scaling" > "$OUT/s12-scaling.log" 2>&1
  echo "bench-scaling rc=$? ($((SECONDS)) s into the call)"
  best=$(python3 bench/gpu_summary.py best-variant "$OUT/s12-scaling" "$G" 2>/dev/null)
  best=${best:-sharded-bf16}
  shard=false; [[ $best == sharded-* ]] && shard=true
  st=200; ((q)) && st=20
  for c in ${CTAS:-0 4 8 16 32}; do
    if (( $(left) < 25 )); then echo "scale12: nccl_max_ctas $c skipped (deadline)"; continue; fi
    timeout "$(cap 60)" env ${EXTRA_ENV:-} mpirun -np "$G" -x NCCL_NVLS_ENABLE "${xenv[@]}" $B/bench-step --layers "$W" \
      --batch "$WB" --precision "$PREC" --warmup 20 --steps $st --repeat 3 --shard-optimizer $shard \
      --grad-dtype "${best##*-}" --nccl-max-ctas "$c" >> "$OUT/s12-ctas.log" 2>&1
  done
  python3 bench/gpu_summary.py scale12 "$OUT" | tee /tmp/dpt-summary-scale12.txt
fi
if want one12; then
  # One H200 (~6 minutes, inside BUDGET seconds, default 500): bench-step for the wide MLP in
  # bf16 and TF32 (model TFLOP/s; the scaling issue's targets: 620 and 330) beside
  # bench/torch_step.py in every mode (eager, CUDA graph, torch.compile of the model, of the whole
  # step) in the same call, with the ratio to PyTorch's strongest row. With EXTRA_ENV set,
  # bench-step runs again with those variables (A/B in one call). dptrain's switches:
  #   DPT_CUBLASLT=0            GEMMs on cublasGemmEx, the bias in a kernel
  #   DPT_LT_FUSE=0             the per-layer path (no ReLU in cuBLASLt's epilogue; bf16)
  #   DPT_TF32_TRANSPOSE=0|1|2  which of the TF32 weight gradient's operands are transposed first
  #   DPT_STREAM_DATA=1         batches streamed from the host (the step not captured)
  #   (the overlap switches of the scaling work, the optimizer and the check behind the backward
  #   pass, go here by name when they land)
  # Dry-run knobs: PRECS (default "bf16 tf32"), TORCH_DEVICE (cpu runs torch_step.py's logic).
  deadline=$((SECONDS + ${BUDGET:-500}))
  W=${MODEL:-784,4096,4096,4096,4096,10}; q=${QUICK:-0}
  st=200; ((q)) && st=20
  for p in ${PRECS:-bf16 tf32}; do
    timeout "$(cap 90 300)" mpirun -np 1 $B/bench-step --layers "$W" --batch 4096 --precision $p --warmup 20 \
      --steps $st >> "$OUT/o12-step.log" 2>&1; echo "bench-step $p rc=$?"
    if [ -n "${EXTRA_ENV:-}" ]; then
      timeout "$(cap 90 300)" env $EXTRA_ENV mpirun -np 1 "${xenv[@]}" $B/bench-step --layers "$W" --batch 4096 \
        --precision $p --warmup 20 --steps $st >> "$OUT/o12-step-extra.log" 2>&1; echo "bench-step $p with $EXTRA_ENV rc=$?"
    fi
  done
  if python3 -c "import torch" 2>/dev/null; then
    for p in ${PRECS:-bf16 tf32}; do
      gemm=(); [ $p = bf16 ] && gemm=(--gemm)
      # Rows print as each mode finishes: a mode cut off by the limit leaves the others.
      timeout "$(cap 200 $([ $p = bf16 ] && echo 150 || echo 5))" python3 bench/torch_step.py "${gemm[@]}" --layers "$W" \
        --batch 4096 --precision $p --modes all --steps $((st / 2)) --repeat 3 --device "${TORCH_DEVICE:-cuda}" \
        > "$OUT/o12-torch-$p.jsonl" 2> "$OUT/o12-torch-$p.err"
      echo "torch_step $p rc=$?"
    done
  else
    echo "one12: python3 cannot import torch: the PyTorch rows are skipped"
  fi
  python3 bench/gpu_summary.py one12 "$OUT" | tee /tmp/dpt-summary-one12.txt
fi
if want finetune; then
  # Fine-tuning on Fashion-MNIST beside PyTorch's same recipes (bench/finetune_fmnist.py).
  mkdir -p data && $B/dpdata fashion-mnist --dir .gpu/fashion --out-dir data > /dev/null
  # Its datasets and checkpoints stay behind; the logs, metrics and finetune.json come back.
  rm -rf /tmp/ft && timeout 400 python3 bench/finetune_fmnist.py --build $B --data data --out /tmp/ft --device cuda \
    --labelled 100,250,1000 --seeds 3 \
    > "$OUT/finetune.log" 2>&1
  echo "finetune_fmnist rc=$?"; grep -E "^pretrain|^summary" "$OUT/finetune.log"; tail -n 3 "$OUT/finetune.log"
  mkdir -p "$OUT/finetune" && cp /tmp/ft/*.log /tmp/ft/*.jsonl /tmp/ft/finetune.json "$OUT/finetune/" 2>/dev/null
  cp /tmp/ft/finetune.json /tmp/dpt-summary-finetune.txt 2>/dev/null
fi
if want images; then
  # Images from files (a call of its own: ~6 minutes on one H200, inside BUDGET seconds, default
  # 560). IMAGES_N JPEG files (default 50,000; 500x375, ~110 KB, 100 classes) written by
  # bench/make_image_set.py into /tmp (kept across calls on a warm machine); their import to
  # 256x256 by `dpdata images --threads $W` (scaled and full JPEG decodes) timed against
  # torchvision's loader doing the same work (bench/import_rate.py, page cache warm); ResNet-50 at 224 in bf16, batch 256, trained by
  # dptrain on the imported file with random_resized_crop,flip and ImageNet's mean and std
  # (bench/images_r50.ini, 300 steps, samples/s from its metrics), beside bench-step's rate for
  # the same model on resident data and bench/torch_imagefolder.py (PyTorch's ImageFolder
  # pipeline alone, feeding the CUDA-graph step, and the step on resident data). W: IMAGES_WORKERS
  # (default: one per core).
  deadline=$((SECONDS + ${BUDGET:-560}))
  IO=$OUT/images; mkdir -p "$IO"
  N=${IMAGES_N:-50000}; W=${IMAGES_WORKERS:-$(nproc)}; IMG=/tmp/images-$N; H5=/tmp/images-$N-256.h5
  mp=(mpirun -np 1 -x LD_LIBRARY_PATH)
  if [ ! -f "$IMG.done" ]; then
    rm -rf "$IMG"
    timeout "$(cap 240 300)" python3 bench/make_image_set.py "$IMG" --count "$N" --classes 100 --workers "$W" --seed 1 \
      > "$IO/make.log" 2>&1; rc=$?
    echo "make_image_set rc=$rc"; ((rc == 0)) && touch "$IMG.done"
  fi
  [ -f "$IO/make.log" ] && tail -n 2 "$IO/make.log" | head -n 1
  rm -f "$H5"
  timeout "$(cap 200 200)" python3 bench/import_rate.py --build $B --images "$IMG" --size 256 --workers "$W" --out "$H5" --keep \
    > "$IO/import-rate.jsonl" 2>&1
  echo "import_rate rc=$?"; grep -hE '"side": "(dpdata|torchvision|ratio)"' "$IO/import-rate.jsonl" | cut -c1-300
  # The same import written to /dev/shm (memory: no disk behind the final fsync), to tell the
  # decoding's rate from the disk's.
  if [ -d /dev/shm ]; then
    t0=$SECONDS; timeout "$(cap 60 150)" $B/dpdata images --folder "$IMG" --out /dev/shm/images-shm.h5 --size 256 \
      --threads "$W" > "$IO/import-shm.log" 2>&1; echo "dpdata to /dev/shm rc=$? in $((SECONDS - t0)) s"
    grep -E "^images:|writing thread" "$IO/import-shm.log" | tail -n 2; rm -f /dev/shm/images-shm.h5
  fi
  # One decoding thread fewer than cores (the writing thread has a core of its own), and the
  # disk's write rates: through the page cache with no fsync, with fsync, and O_DIRECT.
  t0=$SECONDS; timeout "$(cap 60 150)" $B/dpdata images --folder "$IMG" --out /tmp/images-w1.h5 --size 256 \
    --threads "$((W - 1))" > "$IO/import-threads-less1.log" 2>&1; echo "dpdata --threads $((W - 1)) rc=$? in $((SECONDS - t0)) s"
  grep -E "^images:|writing thread" "$IO/import-threads-less1.log" | tail -n 2; rm -f /tmp/images-w1.h5
  for how in "" "conv=fsync" "oflag=direct"; do
    echo "dd 4 GiB of zeros to /tmp ${how:-(page cache, no fsync)}: $(dd if=/dev/zero of=/tmp/dd-probe bs=8M count=512 $how 2>&1 | tail -n 1)"
    rm -f /tmp/dd-probe
  done | tee "$IO/disk-write-dd.log"
  if [ -f "$H5" ]; then
    # Resident (data.read = all: the file in host memory, uint8 on the GPU) and streamed from the
    # file (data.read = stream: each micro-batch's rows read a few batches ahead).
    timeout "$(cap 100 150)" "${mp[@]}" $B/dptrain --config bench/images_r50.ini --data.train "$H5" --data.read all \
      --log.metrics "$IO/dptrain-metrics.jsonl" > "$IO/dptrain.log" 2>&1
    echo "dptrain rc=$?"; grep -E "done|rror|augment|memory" "$IO/dptrain.log" | tail -n 4
    # The page cache dropped first where the machine lets us, so the streamed rows come from the disk.
    sync; if echo 1 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "page cache dropped"; else echo "page cache not dropped (not permitted)"; fi
    # The first epoch only (190 of its 195 steps): every row from the disk, none from the cache.
    timeout "$(cap 100 150)" "${mp[@]}" $B/dptrain --config bench/images_r50.ini --data.train "$H5" --data.read stream \
      --train.steps 190 --log.metrics "$IO/dptrain-stream-metrics.jsonl" > "$IO/dptrain-stream.log" 2>&1
    echo "dptrain stream rc=$?"; grep -E "done|rror|stream|memory" "$IO/dptrain-stream.log" | tail -n 4
    # IMAGES_LEAN=1: the raw import's rows alone (resident and streamed from the disk); no warm
    # stream, no JPEG storage.
    if [ "${IMAGES_LEAN:-0}" != 1 ]; then
    # Again with the file in the page cache (a set that fits in memory, from its second epoch on).
    timeout "$(cap 100 150)" "${mp[@]}" $B/dptrain --config bench/images_r50.ini --data.train "$H5" --data.read stream \
      --log.metrics "$IO/dptrain-stream-warm-metrics.jsonl" > "$IO/dptrain-stream-warm.log" 2>&1
    echo "dptrain stream, page cache warm rc=$?"; grep -E "done|rror|stream|memory" "$IO/dptrain-stream-warm.log" | tail -n 4
    # The same set stored as JPEG (dpdata images --store jpeg, quality 90: each 256x256 row
    # re-encoded, decoded by the stream's reader threads), streamed from the disk and then warm;
    # --bind-to none, as mpirun -np 1 binds the rank (and its decoding threads) to one core.
    H5J=/tmp/images-$N-256-jpeg.h5; rm -f "$H5J"
    t0=$SECONDS; timeout "$(cap 90 150)" $B/dpdata images --folder "$IMG" --out "$H5J" --size 256 --store jpeg \
      --threads "$W" > "$IO/import-jpeg.log" 2>&1; echo "dpdata --store jpeg rc=$? in $((SECONDS - t0)) s"
    grep -E "^images:|JPEG" "$IO/import-jpeg.log" | tail -n 2; ls -l "$H5J" "$H5" 2>&1 | tee -a "$IO/import-jpeg.log"
    if [ -f "$H5J" ]; then
      sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null
      timeout "$(cap 100 120)" "${mp[@]}" --bind-to none $B/dptrain --config bench/images_r50.ini --data.train "$H5J" --data.read stream \
        --train.steps 190 --log.metrics "$IO/dptrain-jpeg-stream-metrics.jsonl" > "$IO/dptrain-jpeg-stream.log" 2>&1
      echo "dptrain jpeg stream rc=$?"; grep -E "done|rror|stream|memory" "$IO/dptrain-jpeg-stream.log" | tail -n 4
      timeout "$(cap 100 110)" "${mp[@]}" --bind-to none $B/dptrain --config bench/images_r50.ini --data.train "$H5J" --data.read stream \
        --log.metrics "$IO/dptrain-jpeg-stream-warm-metrics.jsonl" > "$IO/dptrain-jpeg-stream-warm.log" 2>&1
      echo "dptrain jpeg stream, page cache warm rc=$?"; grep -E "done|rror|stream" "$IO/dptrain-jpeg-stream-warm.log" | tail -n 3
    fi
    fi
    # The disk's own rate: 4 GiB of the file read in order with the page cache dropped.
    sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null
    dd if="$H5" of=/dev/null bs=8M count=512 2>&1 | tail -n 1 | tee "$IO/disk-dd.log"
    df -h /tmp >> "$IO/disk-dd.log" 2>&1; lsblk -o NAME,SIZE,ROTA,MODEL >> "$IO/disk-dd.log" 2>&1
  else
    echo "images: $H5 not written (dpdata images failed or missing): dptrain's run skipped"
  fi
  timeout "$(cap 100 130)" "${mp[@]}" $B/bench-step --layers "resnet50(classes=100)" --input 3,224,224 --batch 256 \
    --precision bf16 --warmup 5 --steps 20 > "$IO/bench-step.log" 2>&1
  echo "bench-step rc=$?"
  # The peer twice: its JPEG files read from the disk (page cache dropped just before), then from
  # the page cache (every file read once first, as many readers as cores: the peer's strongest
  # setup, for a set that fits in memory); the ratios take the faster of the two.
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo "page cache dropped before PyTorch's first run"
  timeout "$(cap 200 60)" python3 bench/torch_imagefolder.py --images "$IMG" --workers "$W" --batch 256 \
    --steps ${TORCH_STEPS:-100} --arch resnet50 > "$IO/torch.jsonl" 2>&1
  echo "torch_imagefolder rc=$?"
  t0=$SECONDS; find "$IMG" -type f -print0 | xargs -0 -P "$W" -n 1000 cat > /dev/null
  echo "JPEG files read into the page cache in $((SECONDS - t0)) s"
  timeout "$(cap 150 5)" python3 bench/torch_imagefolder.py --images "$IMG" --workers "$W" --batch 256 \
    --steps ${TORCH_STEPS:-100} --arch resnet50 --parts loader,train > "$IO/torch-warm.jsonl" 2>&1
  echo "torch_imagefolder, files in the page cache rc=$?"
  python3 bench/images_summary.py "$IO" | tee /tmp/dpt-summary-images.txt
fi
if want streamrate; then
  # The streamed rate beside the synthetic one, in one run (a call of its own, ~5 minutes):
  # bench/make_image_set.py's set imported raw, ResNet-50 resident, then streamed with the page
  # cache dropped (the first epoch: every row from the disk), then bench-step on synthetic
  # resident data; the same set imported with --store jpeg, its whole decode timed by
  # `dpdata validate` (every row decoded on up to 16 threads), and streamed from the disk with
  # --bind-to none (mpirun -np 1 binds the rank, and its decoding threads, to one core).
  IO=$OUT/streamrate; mkdir -p "$IO"
  N=${IMAGES_N:-50000}; W=$(nproc); IMG=/tmp/images-$N; H5=/tmp/images-$N-256.h5; H5J=/tmp/images-$N-256-jpeg.h5
  mp=(mpirun -np 1 -x LD_LIBRARY_PATH)
  if [ ! -f "$IMG.done" ]; then
    rm -rf "$IMG"; python3 bench/make_image_set.py "$IMG" --count "$N" --classes 100 --workers "$W" --seed 1 \
      > "$IO/make.log" 2>&1 && touch "$IMG.done"
  fi
  [ -f "$H5" ] || $B/dpdata images --folder "$IMG" --out "$H5" --size 256 --threads "$W" > "$IO/import.log" 2>&1
  timeout 100 "${mp[@]}" $B/dptrain --config bench/images_r50.ini --data.train "$H5" --data.read all --train.steps 190 \
    --log.metrics "$IO/resident-metrics.jsonl" > "$IO/resident.log" 2>&1; echo "resident rc=$?"
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo "page cache dropped"
  timeout 100 "${mp[@]}" $B/dptrain --config bench/images_r50.ini --data.train "$H5" --data.read stream --train.steps 190 \
    --log.metrics "$IO/stream-metrics.jsonl" > "$IO/stream.log" 2>&1; echo "stream rc=$?"; grep -E "waited|done" "$IO/stream.log"
  timeout 120 "${mp[@]}" $B/bench-step --layers "resnet50(classes=100)" --input 3,224,224 --batch 256 \
    --precision bf16 --warmup 5 --steps 20 > "$IO/bench-step.log" 2>&1; echo "bench-step rc=$?"; grep -E "img/s|samples" "$IO/bench-step.log" | tail -n 2
  ldd $B/dpdata | grep -E "jpeg|png" | tee "$IO/ldd.txt"
  [ -f "$H5J" ] || $B/dpdata images --folder "$IMG" --out "$H5J" --size 256 --store jpeg --threads "$W" > "$IO/import-jpeg.log" 2>&1
  t0=$(date +%s.%N); $B/dpdata validate "$H5J" > "$IO/validate-jpeg.log" 2>&1; echo "validate rc=$?"
  python3 -c "import sys,time; print(f'dpdata validate (decodes all $N rows): {time.time()-$t0:.2f} s')" | tee -a "$IO/validate-jpeg.log"
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null
  timeout 100 "${mp[@]}" --bind-to none $B/dptrain --config bench/images_r50.ini --data.train "$H5J" --data.read stream --train.steps 100 \
    --log.metrics "$IO/jpeg-stream-metrics.jsonl" > "$IO/jpeg-stream.log" 2>&1; echo "jpeg stream rc=$?"; grep -E "waited|done" "$IO/jpeg-stream.log"
  for f in resident stream jpeg-stream; do
    python3 - "$IO/$f-metrics.jsonl" "$f" <<'PY'
import json, sys
rec = [json.loads(l[l.find("{"):]) for l in open(sys.argv[1]) if "{" in l]
head = next((r for r in rec if "global_batch" in r), {})
st = [r for r in rec if "samples_per_s" in r and r.get("step", 0) >= 50]
if len(st) >= 2 and head:
    print(f"{sys.argv[2]}: {(st[-1]['step'] - st[0]['step']) * head['global_batch'] / (st[-1]['time_s'] - st[0]['time_s']):.0f} img/s (steps {st[0]['step']}-{st[-1]['step']})")
PY
  done | tee "$IO/summary.txt"
fi
if want streambits; then
  # data.read = stream trains bit for bit as data.read = all on the GPU: inputs/cnn.ini on
  # Fashion-MNIST for 300 steps with random_resized_crop, flip and normalisation, each way; the
  # losses logged every 50 steps and the final test figures must be equal (the resident run's
  # step is a CUDA graph, the streamed one's is not).
  mkdir -p "$OUT/streambits" /tmp/sb
  $B/dpdata import-idx --images .gpu/fashion/train-images-idx3-ubyte.gz --labels .gpu/fashion/train-labels-idx1-ubyte.gz \
    --out /tmp/sb/train.h5 > /dev/null && \
  $B/dpdata import-idx --images .gpu/fashion/t10k-images-idx3-ubyte.gz --labels .gpu/fashion/t10k-labels-idx1-ubyte.gz \
    --out /tmp/sb/test.h5 > /dev/null
  for r in all stream; do
    timeout 120 mpirun -np 1 $B/dptrain --config inputs/cnn.ini --data.train /tmp/sb/train.h5 --data.test /tmp/sb/test.h5 \
      --train.steps 300 --data.read $r --data.augment random_resized_crop,flip --data.crop_size 24 \
      --data.mean 0.286 --data.std 0.353 --checkpoint.dir /tmp/sb/ck-$r --checkpoint.resume none \
      --log.metrics "$OUT/streambits/$r.jsonl" > "$OUT/streambits/$r.log" 2>&1
    echo "streambits $r rc=$?"; grep -E "final|stream|graph" "$OUT/streambits/$r.log" | tail -n 3
    # The final model evaluated with 8 significant digits of the loss.
    timeout 60 mpirun -np 1 $B/dptrain --eval --checkpoint /tmp/sb/ck-$r/ckpt-000000300.h5 --data.test /tmp/sb/test.h5 \
      2>&1 | grep "^eval" | sed 's/^eval [^:]*: //' > "$OUT/streambits/$r.eval"
    cat "$OUT/streambits/$r.eval"
  done
  if cmp -s <(grep -oE '"(loss|accuracy)": *[^,}]*' "$OUT/streambits/all.jsonl") \
            <(grep -oE '"(loss|accuracy)": *[^,}]*' "$OUT/streambits/stream.jsonl") &&
     [ -s "$OUT/streambits/all.eval" ] && cmp -s "$OUT/streambits/all.eval" "$OUT/streambits/stream.eval"; then
    echo "streambits: all and stream logged the same losses and test figures and evaluate alike"
  else
    echo "streambits: DIFFER"; diff <(grep -oE '"loss": *[^,}]*' "$OUT/streambits/all.jsonl") \
      <(grep -oE '"loss": *[^,}]*' "$OUT/streambits/stream.jsonl") | head -n 6
  fi
fi
if want images_acc; then
  # Fashion-MNIST as PNG files (bench/fmnist_png.py) imported by `dpdata images --size 28
  # --channels 1` and trained by inputs/resnet.ini, beside the same run on the idx import: both
  # final test accuracies and whether the PNG import's reaches 0.945 (bench/images_fmnist.py).
  mkdir -p "$OUT/images/fmnist"
  rm -rf /tmp/images-fmnist && timeout 540 python3 bench/images_fmnist.py --build $B --data .gpu/fashion \
    --work /tmp/images-fmnist --device cuda --threads "$(nproc)" > "$OUT/images/fmnist.jsonl" 2>&1
  echo "images_fmnist rc=$?"; cut -c1-300 "$OUT/images/fmnist.jsonl"
  cp /tmp/images-fmnist/*.log /tmp/images-fmnist/*.jsonl "$OUT/images/fmnist/" 2>/dev/null
  python3 bench/images_summary.py "$OUT/images" | grep -E "Fashion-MNIST" >> /tmp/dpt-summary-images.txt
fi
# The device tool brings back few files: pack everything into one archive, the summaries beside it.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
for f in /tmp/dpt-summary-*.txt; do if [ -f "$f" ]; then mv "$f" "$OUT/"; fi; done
