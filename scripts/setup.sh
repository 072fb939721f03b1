#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (as root, or with sudo) and builds into build/
# (CUDA backend included where nvcc and NCCL are found; DPT_CMAKE_ARGS=-DDPT_WITH_CUDA=OFF leaves it
# out, read when build/ is first configured). Safe to run again.
#   bash scripts/setup.sh           the main job: the packages that build and run dptrain and
#                                   dpdata, and those two built (scripts/run-default.sh)
#   bash scripts/setup.sh --tests   also the test packages; everything built: tests, bench-scaling,
#                                   the GPU micro-benchmarks (scripts/test.sh)
# Prints the seconds of each phase: "setup: apt 21.3 s", "setup: build 40.2 s".
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
case ${1:-} in
  --tests) tests=1 ;;
  "") ;;
  *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
esac

# The main job: compiler, CMake, Open MPI, HDF5, Boost.Program_options, OpenBLAS, oneDNN (the CPU's
# convolutions), zlib, nlohmann-json (a .safetensors file's header), libjpeg and libpng (`dpdata
# images`), and the Fashion-MNIST files that `dpdata fashion-mnist` imports.
packages=(g++ make cmake libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev
          libopenblas-dev libdnnl-dev zlib1g-dev nlohmann-json3-dev libjpeg62-turbo-dev libpng-dev
          dataset-fashion-mnist)
# The tests: GoogleTest; h5dump; PyTorch, torchvision, h5py, NumPy and PIL for the cross-checks; Slurm and munge
# for the batch-script tests; clang and its sanitizer runtime for the fuzzers; matplotlib for
# bench-scaling's plots.
((tests)) && packages+=(build-essential pkg-config libgtest-dev hdf5-tools python3-torch python3-torchvision python3-h5py
                        python3-numpy python3-pil slurm-wlm slurm-wlm-basic-plugins munge clang libclang-rt-14-dev
                        python3-matplotlib)

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t=$(now)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "setup: apt $(took "$t") s (${#missing[@]} of ${#packages[@]} packages were missing)"

t=$(now)
# The main job's first configuration leaves the tests out (GoogleTest need not be installed);
# --tests turns them on, and a later main-job run leaves that as it is.
if ((tests)); then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON ${DPT_CMAKE_ARGS:-}
  cmake --build build -j"$(nproc)"
else
  [ -f build/CMakeCache.txt ] ||
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF ${DPT_CMAKE_ARGS:-}
  cmake --build build -j"$(nproc)" --target main-job  # dptrain and dpdata
fi
echo "setup: build $(took "$t") s"
