#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (as root, or with sudo) and builds dptrain into
# build/ (CUDA backend included where nvcc and NCCL are found). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libboost-program-options-dev libopenblas-dev libgtest-dev zlib1g-dev nlohmann-json3-dev
          dataset-fashion-mnist python3-torch python3-h5py python3-numpy python3-matplotlib
          slurm-wlm slurm-wlm-basic-plugins munge clang libclang-rt-14-dev)
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

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${DPT_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
