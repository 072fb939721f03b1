// Linear layers one at a time on the CUDA backend (forward with the bias in the GEMM's epilogue,
// backward with dz, bf16(dz) and the bias gradient in one pass, the weight gradient in row
// pieces, TF32's K-major copies) and the softmax cross-entropy loss.
#include <algorithm>

#include "backend_impl.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {

// ---- the MLP ----
// Row-major (r, c) is column-major (c, r) to cuBLAS, so every product is written transposed:
//   z (batch,out)  : Zᶜ (out×batch)  = Wᶜᵀ·Xᶜ  with Wᶜ = w as (in×out), Xᶜ = x as (in×batch)
//   dw (out,in)    : dWᶜ (in×out)    = Xᶜ·dZᶜᵀ  with dZᶜ = dz as (out×batch)
//   dx (batch,in)  : dXᶜ (in×batch)  = Wᶜ·dZᶜ
void CudaBackendImpl::linear_forward(const float* x, const float* w, const float* b, float* z, float* a,
                                     int batch, int in, int out, Act act) {
  linear_fwd(x, w, b, z, a, batch, in, out, act, true);
}

// a16_twin: bf16 also writes bf16(a) for the next GEMMs (a conv's output goes to pooling or
// im2col instead, which read fp32).
void CudaBackendImpl::linear_fwd(const float* x, const float* w, const float* b, float* z, float* a, int batch,
                                 int in, int out, Act act, bool a16_twin) {
  cudaStream_t s = stream_.get();
  const size_t n = size_t(batch) * size_t(out);
  // With cuBLASLt the GEMM's epilogue adds the bias (z = x·Wᵀ + b written once), and the
  // kernel below only reads z; otherwise the kernel adds b to z in place.
  bool biased = false;
  if (bf16()) {
    const void* w16 = as_bf16(w, size_t(out) * size_t(in), bf16_a_);
    const void* x16 = as_bf16(x, size_t(batch) * size_t(in), bf16_b_);
    biased = gemm(true, false, out, batch, in, w16, in, x16, in, z, out, 0.f, b);
  } else {
    biased = gemm(true, false, out, batch, in, w, in, x, in, z, out, 0.f, b);
  }
  note_write(z, n * sizeof(float));
  note_write(a, n * sizeof(float));
  // bf16: the epilogue also writes bf16(a), the operand of the next layer's forward GEMM and of
  // that layer's weight-gradient GEMM.
  void* a16 = bf16() && a16_twin ? twin_slot(a, n) : nullptr;
  cuda::bias_act_forward(z, a, biased ? nullptr : b, batch, out, act, s, a16);
  if (a16) twins_[a].valid = n;
}

// One pass computes dz (over da), bf16(dz) for both GEMMs (bf16) and the bias gradient.
void CudaBackendImpl::linear_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                                      int batch, int in, int out, Act act, float* dw, float* db, float* dx,
                                      bool accumulate) {
  cudaStream_t s = stream_.get();
  const size_t n = size_t(batch) * size_t(out);
  const float beta = accumulate ? 1.f : 0.f;
  // The operands' bf16 copies are looked up before the outputs' notes drop any copy they hit.
  const void* x16 = bf16() ? as_bf16(x, size_t(batch) * size_t(in), bf16_b_) : nullptr;
  const void* w16 = bf16() && dx ? as_bf16(w, size_t(out) * size_t(in), bf16_a_) : nullptr;
  note_write(da, n * sizeof(float));
  note_write(dw, size_t(out) * size_t(in) * sizeof(float));
  note_write(db, size_t(out) * sizeof(float));
  if (dx) note_write(dx, size_t(batch) * size_t(in) * sizeof(float));
  float* partial = bgrad_partial(batch, out);
  void* dz16 = bf16() ? bf16_dz_.get(std::max<size_t>(1, n) * 2, s) : nullptr;
  cuda::act_backward_bgrad(da, z, a, batch, out, act, db, accumulate, partial, dz16, s);
  weight_grad(x, x16, da, dz16, batch, in, out, dw, beta);
  if (dx) gemm(false, false, in, batch, out, bf16() ? w16 : static_cast<const void*>(w), in,
               bf16() ? dz16 : static_cast<const void*>(da), out, dx, in, 0.f);
}

// Scratch for the per-chunk column sums of a backward pass over (batch, out).
float* CudaBackendImpl::bgrad_partial(int batch, int out) {
  const size_t n = std::max<size_t>(1, cuda::act_bgrad_partial_floats(batch, out));
  return static_cast<float*>(partial_.get(n * sizeof(float), stream_.get()));
}

// bf16 from x16 and dz16, else from x and dz.
CudaBackendImpl::Wgrad CudaBackendImpl::wgrad_ops(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                                                  int in, int out) {
  cudaStream_t s = stream_.get();
  Wgrad w;
  if (bf16()) {
    w.A = x16; w.lda = in; w.B = dz16; w.ldb = out; w.esz = 2;
  } else if (precision_ == Precision::tf32 && tf32_transpose_ > 0 && batch <= kMaxTransposeRows) {
    // The weight gradient's operands x and dz both run along the batch, its K, so neither is
    // K-major, and Hopper's tensor cores read TF32 operands K-major only: cuBLAS's product
    // runs at 245 TFLOP/s for 4096³ as stored, 350 with one operand transposed first, 373 with
    // both (bench/gemm_layouts.py on the H200). DPT_TF32_TRANSPOSE = 1 (default) transposes the
    // smaller of x and dz, 2 both, 0 neither; the wide MLP's step: 4.53 ms, 4.70, 4.94.
    const bool tx = tf32_transpose_ == 2 || in <= out, td = tf32_transpose_ == 2 || !tx;
    float* xt = tx ? static_cast<float*>(tposed_x_.get(size_t(batch) * size_t(in) * sizeof(float), s)) : nullptr;
    float* dt = td ? static_cast<float*>(tposed_dz_.get(size_t(batch) * size_t(out) * sizeof(float), s)) : nullptr;
    if (tx) cuda::transpose(x, batch, in, xt, s);
    if (td) cuda::transpose(dz, batch, out, dt, s);
    w.ta = tx; w.tb = !td;
    w.A = tx ? static_cast<const void*>(xt) : x; w.lda = tx ? batch : in;
    w.B = td ? static_cast<const void*>(dt) : dz; w.ldb = td ? batch : out;
  } else {
    w.A = x; w.lda = in; w.B = dz; w.ldb = out;
  }
  return w;
}

// Rows [r0, r1) of dw (+ dw there when beta == 1).
void CudaBackendImpl::wgrad_rows(const Wgrad& w, int batch, int in, int r0, int r1, float* dw, float beta) {
  const size_t boff = (w.tb ? size_t(r0) : size_t(r0) * size_t(w.ldb)) * w.esz;
  gemm(w.ta, w.tb, in, r1 - r0, batch, w.A, w.lda, static_cast<const char*>(w.B) + boff, w.ldb,
       dw + size_t(r0) * size_t(in), in, beta);
}

void CudaBackendImpl::weight_grad(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                                  int in, int out, float* dw, float beta) {
  wgrad_rows(wgrad_ops(x, x16, dz, dz16, batch, in, out), batch, in, 0, out, dw, beta);
}

void CudaBackendImpl::softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                                   float grad_scale, float* dlogits, float* stats) {
  cudaStream_t s = stream_.get();
  auto* row_loss = static_cast<float*>(row_loss_.get(size_t(batch) * sizeof(float), s));
  auto* row_ok = static_cast<int*>(row_ok_.get(size_t(batch) * sizeof(int), s));
  if (dlogits) note_write(dlogits, size_t(batch) * size_t(classes) * sizeof(float));
  if (stats) note_write(stats, 2 * sizeof(float));
  cuda::softmax_xent(logits, labels, batch, classes, grad_scale, dlogits, row_loss, row_ok,
                     stats, s);
}

}  // namespace dpt::cuda_impl
