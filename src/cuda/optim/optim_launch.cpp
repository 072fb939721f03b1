// The optimizers' launches on the CUDA backend: the fused update over the flat arena (writing
// the bf16 weight shadow in the same pass), LARS/LAMB's two passes, the non-finite checks and
// the end of a device-controlled step.
#include <cuda_runtime.h>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "kernels.cuh"
#include "layerwise.cuh"

namespace dpt::cuda_impl {

// ---- the optimizer ----
void CudaBackendImpl::optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                                     const OptimStep& h) {
  void* p16 = note_update(p, s1, s2, n);
  cuda::optimizer_step(p, g, s1, s2, n, h, stream_.get(), nullptr, nullptr, p16);
}

// LARS and LAMB: the two passes of layerwise.cu; LAMB's sums pass writes the moments.
void CudaBackendImpl::layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                                 const std::vector<TensorSeg>& segs, const OptimStep& h, const float* lr_table,
                                 const StepCtl* ctl, float* sums) {
  cudaStream_t s = stream_.get();
  if (h.kind == OptKind::lamb) {
    note_write(s1, n * sizeof(float));
    note_write(s2, n * sizeof(float));
  }
  note_write(sums, 2 * segs.size() * sizeof(float));
  auto* partial = static_cast<float*>(layer_partial_.get(cuda::layer_partial_floats(segs, lo, n) * sizeof(float), s));
  cuda::layer_sums(p, g, s1, s2, lo, n, segs, h, lr_table, ctl, sums, partial, s);
}

void CudaBackendImpl::layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                                  const std::vector<TensorSeg>& segs, const float* sums, const OptimStep& h,
                                  const float* lr_table, const StepCtl* ctl) {
  void* p16 = note_update(p, s1, nullptr, n);
  cuda::layer_apply(p, g, s1, s2, lo, n, segs, sums, h, lr_table, ctl, p16, stream_.get());
}

bool CudaBackendImpl::all_finite(const float* p, size_t n) {
  cudaStream_t s = stream_.get();
  int* flag = static_cast<int*>(flag_.get(sizeof(int), s));
  DPT_CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), s));
  cuda::flag_nonfinite(p, n, flag, s);
  int bad = 0;
  download(&bad, flag, sizeof bad);
  return bad == 0;
}

void CudaBackendImpl::check_finite(const float* g, size_t n, StepCtl* ctl) {
  cuda::flag_nonfinite(g, n, &ctl->bad, lane());
}

void CudaBackendImpl::optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                                        const OptimStep& h, const float* lr_table, StepCtl* ctl, bool flag) {
  void* p16 = note_update(p, s1, s2, n);
  cuda::optimizer_step(p, g, s1, s2, n, h, lane(), lr_table, ctl, p16, flag ? &ctl->bad : nullptr);
}

void CudaBackendImpl::end_step(StepCtl* ctl, int64_t global_batch, bool sticky) {
  cuda::end_step(ctl, global_batch, sticky, stream_.get());
}

}  // namespace dpt::cuda_impl
