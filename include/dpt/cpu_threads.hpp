// How many BLAS threads a CPU rank starts: what its allocation gives it, in the order an HPC
// user expects (device.threads, the CPU affinity mask, SLURM_CPUS_PER_TASK, OMP_NUM_THREADS /
// OPENBLAS_NUM_THREADS, else the node's cores over its ranks), with the source named.
#pragma once
#include <string>
#include <vector>

namespace dpt {

struct ThreadSources {
  int configured = 0;    // device.threads (0 = decide)
  int mask_cpus = 0;     // CPUs in this process's affinity mask (0 = unknown)
  int online_cpus = 1;   // CPUs of the machine
  int sharing_mask = 1;  // ranks on the node (this one included) with the same mask
  std::string slurm_cpus_per_task, omp_num_threads, openblas_num_threads;  // "" = unset
};

struct ThreadChoice {
  int threads = 1;
  std::string source;  // e.g. "CPU affinity mask: 1 CPU"
};

// Pure: the decision from its inputs.
ThreadChoice choose_cpu_threads(const ThreadSources& s);

// This process's affinity mask and environment; sharing_mask is left for the caller (it needs
// the other ranks' masks).
ThreadSources read_thread_sources(int configured);

// This process's affinity mask as bytes, to compare with other ranks' ({} where unknown).
std::vector<unsigned char> affinity_mask_bytes();

}  // namespace dpt
