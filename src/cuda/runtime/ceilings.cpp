// The CUDA backend's measurements for an account of a step (bench-step --account): points on
// the compute stream's timeline (timing events), and what the GPU's GEMM and memory reach.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"

namespace dpt::cuda_impl {
namespace {

// Timing events recorded on one stream, made as marks need them.
class EventMarks final : public TimeMarks {
 public:
  explicit EventMarks(cudaStream_t s) : s_(s) {}
  ~EventMarks() override {
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  }
  void mark() override {
    if (used_ == ev_.size()) {
      cudaEvent_t e = nullptr;
      DPT_CHECK_CUDA(cudaEventCreate(&e));
      ev_.push_back(e);
    }
    DPT_CHECK_CUDA(cudaEventRecord(ev_[used_++], s_));
  }
  std::vector<double> seconds() override {
    std::vector<double> s(used_, 0.0);
    if (!used_) return s;
    DPT_CHECK_CUDA(cudaEventSynchronize(ev_[used_ - 1]));
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0;
      DPT_CHECK_CUDA(cudaEventElapsedTime(&ms, ev_[0], ev_[i]));
      s[i] = double(ms) * 1e-3;
    }
    return s;
  }

 private:
  cudaStream_t s_;
  std::vector<cudaEvent_t> ev_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<TimeMarks> CudaBackendImpl::time_marks() { return std::make_unique<EventMarks>(stream_.get()); }

// An 8192³ GEMM in the precision's operand type (bf16 with bf16 output, or fp32 / TF32) through
// cublasGemmEx, and a device-to-device copy of 1 GiB: each the best of ten after one untimed.
Ceilings CudaBackendImpl::measure_ceilings() {
  synchronize();
  const int n = 8192;
  const size_t esz = bf16() ? 2 : 4, mat = size_t(n) * size_t(n) * esz;
  const cudaDataType_t type = bf16() ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Ceilings r;
  StreamTimer timer;
  cudaStream_t s = stream_.get();
  auto best_ms = [&](auto&& work) {  // the best of ten after one untimed
    work();
    float best = 1e30f;
    for (int i = 0; i < 10; ++i) best = std::min(best, timer.time(s, work));
    return double(best);
  };
  {
    DevPtr a = dev_alloc(mat), b = dev_alloc(mat), c = dev_alloc(mat);
    // 0x3c bytes: about 0.0115 as bf16 and as fp32; finite products, no denormals.
    DPT_CHECK_CUDA(cudaMemsetAsync(a.get(), 0x3c, mat, s));
    DPT_CHECK_CUDA(cudaMemsetAsync(b.get(), 0x3c, mat, s));
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&] {
      DPT_CHECK_CUBLAS(cublasGemmEx(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), type, n,
                                    b.get(), type, n, &beta, c.get(), type, n, compute, CUBLAS_GEMM_DEFAULT));
    };
    r.gemm_flops = 2.0 * double(n) * n * n / (best_ms(gemm) * 1e-3);
  }
  {
    const size_t bytes = size_t(1) << 30;
    DevPtr x = dev_alloc(bytes), y = dev_alloc(bytes);
    DPT_CHECK_CUDA(cudaMemsetAsync(x.get(), 0, bytes, s));
    auto copy = [&] { DPT_CHECK_CUDA(cudaMemcpyAsync(y.get(), x.get(), bytes, cudaMemcpyDeviceToDevice, s)); };
    r.mem_bytes = 2.0 * double(bytes) / (best_ms(copy) * 1e-3);
  }
  r.gemm_what = std::string("cublasGemmEx 8192x8192x8192, ") +
                (bf16() ? "bf16 in and out, fp32 accumulate" : precision_ == Precision::tf32 ? "TF32" : "fp32");
  r.mem_what = "cudaMemcpyAsync device to device, 1 GiB (bytes read + written)";
  return r;
}

}  // namespace dpt::cuda_impl
