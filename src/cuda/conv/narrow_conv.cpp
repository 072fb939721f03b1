// Narrow convolutions on the CUDA backend under bf16: a first layer's 1 to 3 input channels
// (resnet50's 7x7 stride-2 stem, the compute-bound CNN's 3x3, resnet18(stem=small)'s one
// channel), forward. cuDNN runs them at a fraction of the GPU's speed (on the H200, cuDNN 9.19:
// the compute-bound CNN's 3 -> 128 3x3 at batch 256 forward in 0.488 ms, at 15 TFLOP/s;
// resnet50's stem in 1.82 ms), as its kernels want 8 channels or more. Here they are im2col's
// columns in bf16, each row's c·k·k values padded with zeros to a multiple of 8 (27 -> 32,
// 147 -> 152), made DPT_NARROW_CHUNK_MB (default 32) at a time (one chunk's scratch, never the
// layer's), and a cuBLASLt GEMM per chunk: the output in bf16 where cuDNN's would have gone, or
// with a bias and a ReLU whose output only bf16 readers take, relu(conv + bias) in the GEMM's
// epilogue straight into that bf16 copy. The backward stays cuDNN's: the weight gradient over
// the same columns (a short, wide product: K the rows) took longer than cuDNN's in every form
// measured (2026-12-02, the H200: resnet50's stem 2.86-2.92 ms against 1.13, one GEMM per chunk
// or a strided-batched GEMM over 128 parts of each). DPT_NARROW_CONV=0: cuDNN forward too.
#include <algorithm>
#include <cstdint>

#include "backend_impl.hpp"
#include "conv_kernels.cuh"
#include "cudnn_kernels.cuh"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"

namespace dpt::cuda_impl {

bool CudaBackendImpl::narrow_conv(const ConvGeom& g) const {
  return narrow_convs_ && bf16() && g.c <= kNarrowMaxChannels && g.cols() <= kNarrowMaxCols && !pointwise_gemm(g);
}

namespace {
int padded_width(const ConvGeom& g) { return (g.cols() + 7) / 8 * 8; }
}  // namespace

// Output rows per chunk of columns: a multiple of 8 (each chunk's output starts 16-byte aligned).
int CudaBackendImpl::narrow_chunk_rows(const ConvGeom& g) const {
  const size_t per = size_t(padded_width(g)) * 2;
  const size_t rows = std::max<size_t>(8, narrow_chunk_bytes_ / per / 8 * 8);
  return int(std::min<size_t>(rows, size_t(g.rows())));
}

// One line per shape and form (with the epilogue or without: the start-up timing of im2col_wins
// runs the plain form first).
void CudaBackendImpl::say_narrow(ConvPlan& p, const ConvGeom& g, bool epilogue) {
  const int form = epilogue ? 2 : 1;
  if (p.narrow_said & form) return;
  p.narrow_said |= form;
  log::info("cuda: conv " + g.text() + ": forward as " + std::to_string(g.cols()) + " columns padded to " +
            std::to_string(padded_width(g)) + ", " + std::to_string(narrow_chunk_rows(g)) +
            " rows a chunk, cuBLASLt GEMMs in bf16" + (epilogue ? " with bias and ReLU in the epilogue" : "") +
            " (DPT_NARROW_CONV=0: cuDNN)");
}

// y (g.rows() × g.out, bf16, NHWC) = the columns of x · wᵀ, chunk by chunk; with relu_bias,
// relu(that + relu_bias) (cuBLASLt's RELU_BIAS epilogue, rounded to bf16 once; the bias taken in
// fp32 where cuBLASLt offers that, else its bf16 shadow, as PyTorch's autocast does). False, with
// nothing enqueued, where that epilogue has no plan (the caller then runs the plain product and
// its own epilogue pass).
bool CudaBackendImpl::narrow_forward(const float* x, const float* w, const ConvGeom& g, void* y,
                                     const float* relu_bias) {
  cudaStream_t s = stream_.get();
  const int width = padded_width(g), rows = g.rows(), step = narrow_chunk_rows(g);
  auto out = [&](int r0) { return static_cast<char*>(y) + size_t(r0) * size_t(g.out) * 2; };
  void* wp = pad_w_.get(size_t(g.out) * size_t(width) * 2, s);
  void* cols = narrow_cols_.get(size_t(step) * size_t(width) * 2, s);
  int bias_type = CUDA_R_32F;
  const void* bias = relu_bias;
  auto fused = [&](int r0, int n) {
    LtSpec sp = spec(true, false, g.out, n, width, wp, width, cols, width, out(r0), g.out, 0.f, CUDA_R_16BF);
    sp.epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    sp.bias_type = bias_type;
    return sp;
  };
  auto planned = [&] {
    if (reinterpret_cast<uintptr_t>(bias) % 16) return false;
    for (int r0 = 0; r0 < rows; r0 += step)
      if (!lt_plan(fused(r0, std::min(step, rows - r0)), bias).ok) return false;
    return true;
  };
  if (relu_bias) {
    if (!use_lt_) return false;
    if (!planned()) {
      bias_type = CUDA_R_16BF;
      bias = as_bf16(relu_bias, size_t(g.out), bf16_c_);
      if (!planned()) return false;
    }
  }
  const size_t nx = size_t(g.batch) * g.h * g.w * g.c;
  const void* x16 = valid_twin(x, nx);
  const void* w16 = as_bf16(w, size_t(g.out) * size_t(g.cols()), bf16_a_);
  cuda::pad_channels_bf16(w16, true, wp, size_t(g.out), g.cols(), width, s);
  for (int r0 = 0; r0 < rows; r0 += step) {
    const int n = std::min(step, rows - r0);
    cuda::narrow_cols(x16 ? x16 : x, x16 != nullptr, g, r0, n, width, cols, s);
    if (relu_bias) lt_matmul(fused(r0, n), wp, cols, out(r0), 0.f, bias);
    else gemm_bf16_out(true, false, g.out, n, width, wp, width, cols, width, out(r0), g.out);
  }
  return true;
}

// gemm's product with a bf16 D (bf16 operands): cuBLASLt's plan, else cublasGemmEx.
void CudaBackendImpl::gemm_bf16_out(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B,
                                    int ldb, void* D, int ldd) {
  if (use_lt_) {
    const LtSpec sp = spec(ta, tb, m, n, k, A, lda, B, ldb, D, ldd, 0.f, CUDA_R_16BF);
    if (lt_matmul(sp, A, B, D, 0.f, nullptr)) return;
  }
  const float one = 1.f, zero = 0.f;
  DPT_CHECK_CUBLAS(cublasGemmEx(blas_.get(), ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &zero, D, CUDA_R_16BF, ldd,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace dpt::cuda_impl
