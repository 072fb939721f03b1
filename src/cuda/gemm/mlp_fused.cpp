// The whole MLP on the CUDA backend (mlp_forward / mlp_backward): in bf16, hidden ReLU layers
// take cuBLASLt's RELU_BIAS epilogue and keep their activations in bf16 only; the decision per
// model and batch size, and the fused GEMMs' plans.
#include <algorithm>
#include <string>

#include "backend_impl.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {

// ---- the whole MLP: bf16 hidden ReLU activations that never exist in fp32 ----
// With precision bf16, a hidden ReLU layer i is "fused" (when cuBLASLt plans both GEMMs below):
//   forward   the GEMM's RELU_BIAS epilogue writes a = bf16(relu(x·Wᵀ + b)) straight into the
//             twin of a; neither z nor the fp32 a is written (the twin is the activation's only
//             copy: the next layer's forward GEMM and this layer's weight gradient read it).
//   backward  layer i+1's input-gradient GEMM writes bf16(da) (bf16 output, not fp32), and one
//             kernel pass turns it into bf16(dz) = bf16(da)·[a > 0] in place and sums the bias
//             gradient (relu_backward_bgrad_bf16).
// Numbers: a and dz are the bits of the per-layer path (bf16 of the same fp32 values; a > 0
// exactly where z > 0), except that cuBLASLt takes the bias in bf16 when its output is bf16
// (no fp32 bias is offered with a bf16 D: the bias enters rounded like the weights, as under
// torch.autocast) and the bias gradient is summed over bf16(dz) instead of the fp32 dz.
// Per fused 4096-wide layer at batch 4096 this drops 22 of the 32 bytes per activation element
// that the per-layer path moves outside the GEMMs (fp32 z written and read, fp32 a written,
// fp32 da written and read, dz rewritten) and the GEMMs write half the bytes.
// Not used, measured (bench-lt-epilogues, H200, cuBLAS 13.1, 4096³): RELU_AUX_BIAS (+5% on the
// forward GEMM) with DRELU_BGRAD on the input gradient, which would also drop the kernel pass:
// DRELU(_BGRAD) GEMMs run at 0.28 ms against 0.17 ms plain, more than the pass they save, and
// DRELU_BGRAD's bias gradient with a bf16 output is bf16-summed (2.3% off the fp32 sum). In
// TF32 every epilogue but BIAS costs more than it saves (RELU_BIAS 0.37 ms against 0.33 ms), so
// fp32 and tf32 keep the per-layer path. DPT_LT_FUSE=0 turns the bf16 path off.
void CudaBackendImpl::mlp_forward(const float* x, int batch, const std::vector<LinearArgs>& L) {
  Fusion& f = fusion_for(x, batch, L);
  last_fused_ = 0;
  const float* in = x;
  for (size_t i = 0; i < L.size(); ++i) {
    const LinearArgs& l = L[i];
    if (!f.d->on[i]) {
      linear_forward(in, l.w, l.b, l.z, l.a, batch, l.in, l.out, l.act);
      in = l.a;
      continue;
    }
    const void* B = as_bf16(in, size_t(batch) * size_t(l.in), bf16_b_);
    const FusedGemm g = fused_forward_gemm(L, i, B, batch, f.d->bias16[i] != 0);
    if (!g.D || !lt_matmul(g.sp, g.A, g.B, g.D, 0.f, g.bias))
      throw Error("cuBLASLt refused a GEMM it had planned (fused forward, layer " + std::to_string(i) + ")");
    twins_[l.a].valid = size_t(batch) * size_t(l.out);
    ++last_fused_;
    in = l.a;
  }
  f.fwd_batch = batch;
}

// Layer by layer from the last: the bias gradient with dz (one pass), the weight gradient (in
// row pieces when asked, each reported final as soon as it is enqueued, so its reduction
// starts while the next piece is computed), then the input gradient, after which the layer's
// parameters are reported released. Fused layers (bf16 ReLU) keep dz in bf16 only.
void CudaBackendImpl::mlp_backward(const float* x, int batch, const std::vector<LinearArgs>& L, float* d0, float* d1,
                                   bool accumulate, const PassHooks& hooks, float* dx0) {
  Fusion& f = fusion_for(x, batch, L);
  const std::vector<char>& on = f.d->on;
  if (std::find(on.begin(), on.end(), 1) != on.end() && f.fwd_batch != batch)
    throw Error("mlp_backward: the last mlp_forward of these layers ran another batch size");
  // d0 holds dLoss/dlogits; each layer's bf16 dz (bf16 precision) is in dz16[cur].
  cudaStream_t s = stream_.get();
  const float beta = accumulate ? 1.f : 0.f;
  float* d[2] = {d0, d1};
  int cur = 0;
  const size_t dzb = std::max<size_t>(1, size_t(batch) * f.widest) * 2;
  for (int i = int(L.size()) - 1; i >= 0; --i) {
    const LinearArgs& l = L[size_t(i)];
    const size_t n = size_t(batch) * size_t(l.out), nw = size_t(l.out) * size_t(l.in);
    const float* xin = i == 0 ? x : L[size_t(i) - 1].a;
    const void* x16 = bf16() ? as_bf16(xin, size_t(batch) * size_t(l.in), bf16_b_) : nullptr;
    const bool want_dx = i > 0 || dx0;
    const void* w16 = bf16() && want_dx ? as_bf16(l.w, nw, bf16_a_) : nullptr;
    void* dz16 = bf16() ? f.dz16[cur].get(dzb, s) : nullptr;
    note_write(l.dw, nw * sizeof(float));
    note_write(l.db, size_t(l.out) * sizeof(float));
    float* partial = bgrad_partial(batch, l.out);
    if (!on[size_t(i)]) {
      // d[cur] holds dLoss/da in fp32 (the logits' gradient, or the input gradient of the
      // layer above when that one is not fused): dz (over it), bf16 dz and db in one pass.
      note_write(d[cur], n * sizeof(float));
      cuda::act_backward_bgrad(d[cur], l.z, l.a, batch, l.out, l.act, l.db, accumulate, partial, dz16, s);
    } else {
      // dz16 holds bf16(da) from the layer above's input-gradient GEMM.
      cuda::relu_backward_bgrad_bf16(dz16, twin_of(l.a), batch, l.out, l.db, accumulate, partial, s);
    }
    if (hooks.grads_final) hooks.grads_final(l.b_at, l.b_at + size_t(l.out));
    const Wgrad wg = wgrad_ops(xin, x16, d[cur], dz16, batch, l.in, l.out);
    const int rows = l.piece_rows > 0 ? l.piece_rows : l.out;
    for (int r0 = 0; r0 < l.out; r0 += rows) {
      const int r1 = std::min(l.out, r0 + rows);
      wgrad_rows(wg, batch, l.in, r0, r1, l.dw, beta);
      if (hooks.grads_final) hooks.grads_final(l.w_at + size_t(r0) * size_t(l.in), l.w_at + size_t(r1) * size_t(l.in));
    }
    if (want_dx) {
      if (i > 0 && on[size_t(i) - 1]) {
        const FusedGemm g = fused_backward_gemm(L, size_t(i), w16, dz16, f.dz16[1 - cur].get(dzb, s), batch);
        if (!lt_matmul(g.sp, g.A, g.B, g.D, 0.f, nullptr))
          throw Error("cuBLASLt refused a GEMM it had planned (bf16 input gradient, layer " + std::to_string(i) + ")");
      } else {
        float* dx = i > 0 ? d[1 - cur] : dx0;  // dx0: the input gradient of a run inside a model
        note_write(dx, size_t(batch) * size_t(l.in) * sizeof(float));
        gemm(false, false, l.in, batch, l.out, bf16() ? w16 : static_cast<const void*>(l.w), l.in,
             bf16() ? dz16 : static_cast<const void*>(d[cur]), l.out, dx, l.in, 0.f);
      }
    }
    if (hooks.params_released) {
      hooks.params_released(l.w_at, l.w_at + nw);
      hooks.params_released(l.b_at, l.b_at + size_t(l.out));
    }
    cur = 1 - cur;
  }
}

// Layer i's forward GEMM with RELU_BIAS into the twin of a, input operand B (bf16).
CudaBackendImpl::FusedGemm CudaBackendImpl::fused_forward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* B, int batch,
                                                               bool bias16) {
  const LinearArgs& l = L[i];
  FusedGemm g;
  g.A = as_bf16(l.w, size_t(l.out) * size_t(l.in), bf16_a_);
  g.B = B;
  g.D = twin_slot(l.a, size_t(batch) * size_t(l.out));
  g.bias = bias16 ? as_bf16(l.b, size_t(l.out), bf16_c_) : static_cast<const void*>(l.b);
  g.sp = spec(true, false, l.out, batch, l.in, g.A, l.in, g.B, l.in, g.D, l.out, 0.f, CUDA_R_16BF);
  g.sp.epi = CUBLASLT_EPILOGUE_RELU_BIAS;
  g.sp.bias_type = bias16 ? CUDA_R_16BF : CUDA_R_32F;
  return g;
}

// Layer i's input-gradient GEMM with a bf16 output D = bf16(dz_i·W_i), the da of layer i−1.
CudaBackendImpl::FusedGemm CudaBackendImpl::fused_backward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* w16,
                                                                const void* dz16, void* D, int batch) {
  const LinearArgs& l = L[i];
  FusedGemm g;
  g.A = w16;
  g.B = dz16;
  g.D = D;
  g.sp = spec(false, false, l.in, batch, l.out, w16, l.in, dz16, l.out, D, l.in, 0.f, CUDA_R_16BF);
  return g;
}

// The bf16 copy of a fused layer's activation (its twin), which the forward pass wrote.
const void* CudaBackendImpl::twin_of(const float* a) const {
  const void* t = valid_twin(a, 1);
  if (!t) throw Error("fused bf16 layer: its activation's bf16 copy is missing");
  return t;
}

// The model's fusion state with this batch's decision, taken on first use: which hidden ReLU
// layers cuBLASLt plans both GEMMs for (bf16 only; an fp32 bias preferred where offered).
CudaBackendImpl::Fusion& CudaBackendImpl::fusion_for(const float* x, int batch, const std::vector<LinearArgs>& L) {
  Fusion& f = fusions_[L.back().z];
  auto same = [](const LinearArgs& a, const LinearArgs& b) {
    return a.w == b.w && a.b == b.b && a.dw == b.dw && a.db == b.db && a.z == b.z && a.a == b.a &&
           a.in == b.in && a.out == b.out && a.act == b.act;
  };
  if (!std::equal(L.begin(), L.end(), f.layers.begin(), f.layers.end(), same)) {
    f = Fusion{};
    f.layers = L;
    for (const LinearArgs& l : L) f.widest = std::max({f.widest, size_t(l.in), size_t(l.out)});
  }
  auto it = f.by_batch.find(batch);
  if (it == f.by_batch.end()) {
    Decision d;
    d.on.assign(L.size(), 0);
    d.bias16.assign(L.size(), 0);
    const bool eligible = bf16() && fuse_ && use_lt_ && batch > 0 && L.back().act == Act::none;
    const size_t dzb = std::max<size_t>(1, size_t(batch) * f.widest) * 2;
    for (size_t i = 0; eligible && i + 1 < L.size(); ++i) {
      const LinearArgs& l = L[i];
      if (l.act != Act::relu) continue;
      const void* B = i == 0 ? as_bf16(x, size_t(batch) * size_t(l.in), bf16_b_)
                             : twin_slot(L[i - 1].a, size_t(batch) * size_t(l.in));
      if (!B) continue;
      bool fwd_ok = false;
      for (int b16 = 0; b16 < 2 && !fwd_ok; ++b16) {
        const FusedGemm g = fused_forward_gemm(L, i, B, batch, b16 != 0);
        if (g.D && lt_plan(g.sp, g.bias).ok) {
          fwd_ok = true;
          d.bias16[i] = char(b16);
        }
      }
      const LinearArgs& up = L[i + 1];
      const void* w = as_bf16(up.w, size_t(up.out) * size_t(up.in), bf16_a_);
      const FusedGemm g = fused_backward_gemm(L, i + 1, w, f.dz16[0].get(dzb, stream_.get()),
                                              f.dz16[1].get(dzb, stream_.get()), batch);
      d.on[i] = fwd_ok && lt_plan(g.sp, nullptr).ok;
    }
    if (!fusion_said_ && eligible) {  // said once per backend (a benchmark makes many models)
      int on = 0, b16 = 0, relu = 0;
      for (size_t i = 0; i + 1 < L.size(); ++i) {
        relu += L[i].act == Act::relu;
        on += d.on[i];
        b16 += d.on[i] && d.bias16[i];
      }
      fusion_said_ = relu > 0;
      if (relu)
        log::info("cuda: " + std::to_string(on) + " of " + std::to_string(relu) +
                  " hidden ReLU layers keep bf16 activations only (ReLU in the GEMM's epilogue, bias " +
                  (b16 ? "bf16" : "fp32") + ") at batch " + std::to_string(batch));
    }
    it = f.by_batch.emplace(batch, std::move(d)).first;
  }
  f.d = &it->second;
  return f;
}

}  // namespace dpt::cuda_impl
