// Narrow convolutions on the CUDA backend under bf16: a first layer's 1 or 3 input channels
// (resnet50's 7x7 stride-2 stem, the compute-bound CNN's 3x3, resnet18(stem=small)'s one
// channel). cuDNN runs them at a fraction of the GPU's speed (on the H200, cuDNN 9.19: the
// compute-bound CNN's 3 -> 128 3x3 at batch 256 forward at 15 TFLOP/s, 7.3x its floor;
// resnet50's stem 12.8x), as its kernels want 8 channels or more. Here they are im2col's
// columns in bf16, each row's c·k·k values padded with zeros to a multiple of 8 (27 -> 32,
// 147 -> 152), and cuBLASLt GEMMs over them: the output in bf16 (where cuDNN's would have gone,
// so the epilogues after it are unchanged) and the weight gradient in fp32. The columns are
// made DPT_NARROW_CHUNK_MB (default 32) at a time, again for the weight gradient: one chunk's
// scratch, never the layer's. The input gradient (a first layer has none) stays cuDNN's. DPT_NARROW_CONV=0:
// cuDNN for them too, to measure.
#include <algorithm>

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

void CudaBackendImpl::say_narrow(ConvPlan& p, const ConvGeom& g) {
  if (p.said) return;
  p.said = true;
  log::info("cuda: conv " + g.text() + ": " + std::to_string(g.cols()) + " columns padded to " +
            std::to_string(padded_width(g)) + ", " + std::to_string(narrow_chunk_rows(g)) +
            " rows a chunk, cuBLASLt GEMMs in bf16 (DPT_NARROW_CONV=0: cuDNN)");
}

// y (g.rows() × g.out, bf16, NHWC) = the columns of x · wᵀ, chunk by chunk.
void CudaBackendImpl::narrow_forward(const float* x, const float* w, const ConvGeom& g, void* y) {
  cudaStream_t s = stream_.get();
  const int width = padded_width(g), rows = g.rows(), step = narrow_chunk_rows(g);
  const size_t nx = size_t(g.batch) * g.h * g.w * g.c;
  const void* x16 = valid_twin(x, nx);
  const void* w16 = as_bf16(w, size_t(g.out) * size_t(g.cols()), bf16_a_);
  void* wp = pad_w_.get(size_t(g.out) * size_t(width) * 2, s);
  cuda::pad_channels_bf16(w16, true, wp, size_t(g.out), g.cols(), width, s);
  void* cols = narrow_cols_.get(size_t(step) * size_t(width) * 2, s);
  for (int r0 = 0; r0 < rows; r0 += step) {
    const int n = std::min(step, rows - r0);
    cuda::narrow_cols(x16 ? x16 : x, x16 != nullptr, g, r0, n, width, cols, s);
    gemm_bf16_out(true, false, g.out, n, width, wp, width, cols, width,
                  static_cast<char*>(y) + size_t(r0) * size_t(g.out) * 2, g.out);
  }
}

// dw (g.out × g.cols(), fp32) = (accumulate ? dw : 0) + dyᵀ · the columns of x (dy: g.rows() ×
// g.out, bf16). Column-major to cuBLAS: dWᶜ (cols × out) = Colsᶜ · dYᶜᵀ, the columns' padding
// never read (m = g.cols() rows of each padded column). The product is short and wide (its K
// the rows, 10^5 to 10^6) and one GEMM of it runs on a few blocks of the GPU (resnet50's stem:
// 2.86 ms against cuDNN's 1.13, the H200, 2026-12-02): each chunk's rows are split into up to
// kNarrowParts equal parts, one strided-batched GEMM computes every part's product (the
// remainder of rows one more), and sum_parts adds them onto dw in a fixed order.
void CudaBackendImpl::narrow_filter(const float* x, const void* x16, const void* dy, const ConvGeom& g, float* dw,
                                    bool accumulate) {
  cudaStream_t s = stream_.get();
  const int width = padded_width(g), rows = g.rows(), step = narrow_chunk_rows(g), k = g.cols();
  const size_t per_part = size_t(k) * size_t(g.out);
  void* cols = narrow_cols_.get(size_t(step) * size_t(width) * 2, s);
  auto* parts = static_cast<float*>(narrow_parts_.get((kNarrowParts + 1) * per_part * sizeof(float), s));
  const float one = 1.f, zero = 0.f;
  for (int r0 = 0; r0 < rows; r0 += step) {
    const int n = std::min(step, rows - r0);
    cuda::narrow_cols(x16 ? x16 : x, x16 != nullptr, g, r0, n, width, cols, s);
    const int count = std::max(1, std::min(kNarrowParts, n / kNarrowPartRows));
    const int len = n / count, rest = n - count * len;
    const auto* d = static_cast<const char*>(dy) + size_t(r0) * size_t(g.out) * 2;
    DPT_CHECK_CUBLAS(cublasGemmStridedBatchedEx(
        blas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, k, g.out, len, &one, cols, CUDA_R_16BF, width,
        (long long)len * width, d, CUDA_R_16BF, g.out, (long long)len * g.out, &zero, parts, CUDA_R_32F, k,
        (long long)per_part, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (rest)
      gemm(false, true, k, g.out, rest, static_cast<const char*>(cols) + size_t(count) * len * width * 2, width,
           d + size_t(count) * len * g.out * 2, g.out, parts + size_t(count) * per_part, k, 0.f);
    cuda::sum_parts(parts, count + (rest ? 1 : 0), int(per_part), dw, accumulate || r0 > 0, s);
  }
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
