// BLAS threads per CPU rank from the allocation (see cpu_threads.hpp).
#include "dpt/cpu_threads.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dpt {
namespace {

// A positive count ("4", or OMP_NUM_THREADS's nested form "4,2": its first level); 0 otherwise.
int positive(const std::string& v) {
  if (v.empty()) return 0;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || (*end != '\0' && *end != ',') || n < 1 || n > 4096) return 0;
  return int(n);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string cpus(int n) { return std::to_string(n) + (n == 1 ? " CPU" : " CPUs"); }

}  // namespace

ThreadChoice choose_cpu_threads(const ThreadSources& s) {
  const int sharing = std::max(1, s.sharing_mask);
  const std::string shared = sharing > 1 ? " shared by " + std::to_string(sharing) + " ranks" : "";
  if (s.configured > 0) return {s.configured, "device.threads"};
  // A mask narrower than the machine is what the launcher or Slurm gave this rank (taskset,
  // --bind-to core, --cpus-per-task with task affinity, a cgroup cpuset).
  if (s.mask_cpus > 0 && s.mask_cpus < s.online_cpus)
    return {std::max(1, s.mask_cpus / sharing), "CPU affinity mask: " + cpus(s.mask_cpus) + shared};
  if (int n = positive(s.slurm_cpus_per_task)) return {n, "SLURM_CPUS_PER_TASK=" + s.slurm_cpus_per_task};
  if (int n = positive(s.omp_num_threads)) return {n, "OMP_NUM_THREADS=" + s.omp_num_threads};
  if (int n = positive(s.openblas_num_threads)) return {n, "OPENBLAS_NUM_THREADS=" + s.openblas_num_threads};
  const int all = s.mask_cpus > 0 ? s.mask_cpus : std::max(1, s.online_cpus);
  return {std::max(1, all / sharing), cpus(all) + shared};
}

std::vector<unsigned char> affinity_mask_bytes() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<unsigned char> out(sizeof set);
  std::memcpy(out.data(), &set, sizeof set);
  return out;
}

ThreadSources read_thread_sources(int configured) {
  ThreadSources s;
  s.configured = configured;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) s.mask_cpus = CPU_COUNT(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  s.online_cpus = online > 0 ? int(online) : std::max(1, s.mask_cpus);
  s.slurm_cpus_per_task = env("SLURM_CPUS_PER_TASK");
  s.omp_num_threads = env("OMP_NUM_THREADS");
  s.openblas_num_threads = env("OPENBLAS_NUM_THREADS");
  return s;
}

}  // namespace dpt
