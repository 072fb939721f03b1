// Programmatic dependent launch (Hopper): a kernel of ours launched with launch_early() may be
// scheduled while the kernel before it on the stream finishes, instead of after it; it waits in
// wait_for_prior_kernel(), its first statement, until that kernel has finished and its writes
// are visible. In the step's CUDA graph the stream capture keeps this as a programmatic edge.
//
// Why: batch norm's kernels at resnet18(stem=small)'s sizes take a few microseconds each, and a
// plain kernel boundary (the previous grid drained, the next one launched) costs about as much
// again. A kernel that calls allow_next_kernel() lets the next one be launched as soon as all of
// its own blocks have started; the next one's blocks then wait on the GPU, not on the launch.
//
// Safety: a kernel launched this way does nothing before wait_for_prior_kernel() (no read, no
// write), so it observes exactly what a plain launch would. A kernel launched plainly passes
// wait_for_prior_kernel() at once. DPT_PDL=0 launches every kernel plainly (for measurements).
// Include from .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "dpt/check.hpp"

namespace dpt::cuda {
namespace {

__device__ __forceinline__ void wait_for_prior_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream (if launched with launch_early) be scheduled once every
// block of this one has called it or exited. Call after wait_for_prior_kernel().
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

inline bool early_launch_on() {
  static const bool on = [] {
    const char* v = std::getenv("DPT_PDL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

template <class... P, class... A>
void launch_early(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = early_launch_on() ? 1 : 0;
  const cudaError_t rc = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw_call_error("CUDA", (std::string("launch of ") + name).c_str(), cudaGetErrorString(rc), __FILE__, __LINE__);
  }
}

}  // namespace
}  // namespace dpt::cuda
