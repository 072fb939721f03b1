// Batch norm, residual blocks, padded and global pooling, and the label-smoothed loss on the CUDA
// backend: norm.cu's kernels on the compute stream. Every op is stream-ordered and can be
// captured into the step graph: no host synchronisation, and scratch (the reductions' per-block
// partials, the loss's per-row values) comes from Scratch buffers sized on the first, eager call.
#include <algorithm>

#include "backend_impl.hpp"
#include "dpt/check.hpp"
#include "norm_kernels.cuh"

namespace dpt::cuda_impl {

// Scratch for the per-block partial sums of a batch-norm reduction over (rows, c).
double* CudaBackendImpl::bn_partial(int64_t rows, int c) {
  const size_t n = std::max<size_t>(1, cuda::bn_partial_doubles(rows, c));
  return static_cast<double*>(bn_partial_.get(n * sizeof(double), stream_.get()));
}

void CudaBackendImpl::bn_sums(const float* x, int64_t rows, int c, double* sums) {
  double* partial = bn_partial(rows, c);
  note_write(sums, (2 * size_t(c) + 1) * sizeof(double));
  cuda::bn_sums(bn_in(x, size_t(rows) * size_t(c)), rows, c, sums, partial, stream_.get());
}

// Scratch for batch norm's per-channel coefficients (4c floats).
float* CudaBackendImpl::bn_coef(int c) {
  return static_cast<float*>(bn_coef_.get(std::max<size_t>(1, 4 * size_t(c)) * sizeof(float), stream_.get()));
}

// bf16: the twin an op writes y's values into. A ReLU's output is most often a convolution's
// input (ResNet's blocks): a fused ReLU writes its bf16 twin in the same pass, as act_forward
// does, so that convolution does not convert it and the ReLU's backward reads its mask from it.
// Where only bf16 readers take y (note_bf16_readers) the twin is written instead of y's floats
// (only). nullptr (floats only) otherwise. Then wrote_twin, once the op is enqueued (after y's
// note_write).
void* CudaBackendImpl::out_twin(const float* y, size_t n, bool relu, bool& only) {
  only = false;
  if (!bf16() || im2col_convs_) return nullptr;
  const bool hinted = bf16_readers_.count(y) > 0;
  if (!relu && !hinted) return nullptr;
  void* t = twin_slot(y, n);
  only = t && hinted;
  return t;
}

void CudaBackendImpl::wrote_twin(const float* y, size_t n, const void* y16, bool only) {
  if (only) made_only_twin(y, n);
  else if (y16) twins_[y].valid = n;
}

// A batch-norm operand (x, dy): its bf16 twin where that is its only copy (the floats never written).
cuda::BnIn CudaBackendImpl::bn_in(const float* x, size_t n) const {
  if (const void* t = only_copy(x, n)) return {t, true};
  return {x, false};
}

void CudaBackendImpl::bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums,
                                 const float* w, const float* b, float eps, float momentum,
                                 float* save_mean, float* save_invstd, float* running_mean,
                                 float* running_var, bool relu) {
  bn_forward_with(x, y, rows, c, save_mean, save_invstd, running_mean, running_var, relu,
                  [&](cuda::BnIn xin, float* yf, void* y16) {
                    cuda::bn_forward(xin, yf, y16, relu, rows, c, sums, w, b, eps, momentum, save_mean, save_invstd,
                                     running_mean, running_var, bn_coef(c), stream_.get());
                  });
}

void CudaBackendImpl::bn_train_forward(const float* x, float* y, int64_t rows, int c, double* sums, const float* w,
                                       const float* b, float eps, float momentum, float* save_mean,
                                       float* save_invstd, float* running_mean, float* running_var, bool relu) {
  double* partial = bn_partial(rows, c);
  note_write(sums, (2 * size_t(c) + 1) * sizeof(double));
  bn_forward_with(x, y, rows, c, save_mean, save_invstd, running_mean, running_var, relu,
                  [&](cuda::BnIn xin, float* yf, void* y16) {
                    cuda::bn_train(xin, yf, y16, relu, rows, c, sums, partial, w, b, eps, momentum, save_mean,
                                   save_invstd, running_mean, running_var, bn_coef(c), stream_.get());
                  });
}

// The affine pass deferred into the block's sum (Backend::bn_train_deferred): the statistics and
// coef only, into y's own coefficient buffer (the sum comes after the other branch's batch norm,
// which takes the shared scratch). y's twins are dropped as for a write; its values then come
// from residual_sum, rounded as the pass would have written them (bf16 where a bf16 reader's
// hint made y bf16 only).
bool CudaBackendImpl::bn_train_deferred(const float* x, float* y, int64_t rows, int c, double* sums, const float* w,
                                        const float* b, float eps, float momentum, float* save_mean,
                                        float* save_invstd, float* running_mean, float* running_var) {
  if (!defer_bn_ || c <= 0 || rows <= 0) return false;
  const size_t n = size_t(rows) * size_t(c);
  // Rounded as a bf16 reader's output (out_twin's condition) in every step alike, eager or
  // captured (y's twin is never made).
  const bool round16 = bf16() && !im2col_convs_ && bf16_readers_.count(y) > 0;
  auto it = deferred_.find(y);
  if (it == deferred_.end() || it->second.c != c) {
    if (capturing()) return false;
    Deferred d;
    d.coef = dev_alloc(2 * size_t(c) * sizeof(float));
    d.c = c;
    it = deferred_.insert_or_assign(y, std::move(d)).first;
  }
  double* partial = bn_partial(rows, c);
  note_write(y, n * sizeof(float));
  note_write(sums, (2 * size_t(c) + 1) * sizeof(double));
  note_write(save_mean, size_t(c) * sizeof(float));
  note_write(save_invstd, size_t(c) * sizeof(float));
  note_write(running_mean, size_t(c) * sizeof(float));
  note_write(running_var, size_t(c) * sizeof(float));
  Deferred& d = it->second;
  d.x = bn_in(x, n);
  d.n = n;
  d.round16 = round16;
  cuda::bn_train(d.x, nullptr, nullptr, false, rows, c, sums, partial, w, b, eps, momentum, save_mean, save_invstd,
                 running_mean, running_var, static_cast<float*>(d.coef.get()), stream_.get());
  d.live = true;
  return true;
}

// The frame of both training forward calls: the writes noted, x's operand, y's bf16 twin
// (out_twin), then run(x's operand, y's floats or nullptr, the twin or nullptr).
template <class Run>
void CudaBackendImpl::bn_forward_with(const float* x, float* y, int64_t rows, int c, float* save_mean,
                                      float* save_invstd, float* running_mean, float* running_var, bool relu,
                                      Run&& run) {
  const size_t n = size_t(rows) * size_t(c);
  note_write(y, n * sizeof(float));
  note_write(save_mean, size_t(c) * sizeof(float));
  note_write(save_invstd, size_t(c) * sizeof(float));
  note_write(running_mean, size_t(c) * sizeof(float));
  note_write(running_var, size_t(c) * sizeof(float));
  const cuda::BnIn xin = bn_in(x, n);
  bool only = false;
  void* y16 = out_twin(y, n, relu, only);
  run(xin, only ? nullptr : y, y16);
  wrote_twin(y, n, y16, only);
}

void CudaBackendImpl::bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
                               const float* running_var, const float* w, const float* b, float eps, bool relu) {
  const cuda::BnIn xin = bn_in(x, size_t(rows) * size_t(c));
  note_write(y, size_t(rows) * size_t(c) * sizeof(float));
  cuda::bn_infer(xin, y, relu, rows, c, running_mean, running_var, w, b, eps, stream_.get());
}

void CudaBackendImpl::bn_backward_sums(const float* dy, const float* x, int64_t rows, int c,
                                       const float* mean, double* sums, const float* relu_out) {
  const size_t n = size_t(rows) * size_t(c);
  double* partial = bn_partial(rows, c);
  const void* mask16 = relu_out ? valid_twin(relu_out, n) : nullptr;
  const cuda::BnIn dyin = bn_in(dy, n), xin = bn_in(x, n);
  note_write(sums, (2 * size_t(c) + 1) * sizeof(double));
  cuda::bn_backward_sums(dyin, xin, rows, c, mean, mask16 ? mask16 : relu_out, mask16 != nullptr, sums, partial,
                         stream_.get());
}

void CudaBackendImpl::bn_param_grads(const double* sums, const float* invstd, int c, float* dw,
                                     float* db, bool accumulate) {
  note_write(dw, size_t(c) * sizeof(float));
  note_write(db, size_t(c) * sizeof(float));
  cuda::bn_param_grads(sums, invstd, c, dw, db, accumulate, stream_.get());
}

// bf16, dx read only by the convolution below (note_grad_use): dx written in bf16 only, into its
// twin, the operand that convolution's backward takes (its floats never written).
void CudaBackendImpl::bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c,
                                  const double* sums, const float* mean, const float* invstd,
                                  const float* w, const float* relu_out) {
  bn_backward_with(dy, x, dx, rows, c, relu_out, [&](cuda::BnIn dyin, cuda::BnIn xin, const void* mask, bool mask16,
                                                     cuda::BnOut out) {
    cuda::bn_backward(dyin, xin, mask, mask16, out, rows, c, sums, mean, invstd, w, bn_coef(c), stream_.get());
  });
}

void CudaBackendImpl::bn_train_backward(const float* dy, const float* x, float* dx, int64_t rows, int c,
                                        double* sums, const float* mean, const float* invstd, const float* w,
                                        const float* relu_out, float* dw, float* db, bool accumulate) {
  double* partial = bn_partial(rows, c);
  note_write(sums, (2 * size_t(c) + 1) * sizeof(double));
  note_write(dw, size_t(c) * sizeof(float));
  note_write(db, size_t(c) * sizeof(float));
  bn_backward_with(dy, x, dx, rows, c, relu_out, [&](cuda::BnIn dyin, cuda::BnIn xin, const void* mask, bool mask16,
                                                     cuda::BnOut out) {
    cuda::bn_train_backward(dyin, xin, mask, mask16, out, rows, c, sums, partial, mean, invstd, w, dw, db, accumulate,
                            bn_coef(c), stream_.get());
  });
}

// The frame of both backward calls: dy's and x's operands, the ReLU's mask (its bf16 copy where
// valid), dx's output (its twin in bf16 only where only the convolution below reads it; nullptr
// dx: none), then run(dy, x, mask, mask is bf16, dx).
template <class Run>
void CudaBackendImpl::bn_backward_with(const float* dy, const float* x, float* dx, int64_t rows, int c,
                                       const float* relu_out, Run&& run) {
  const size_t n = size_t(rows) * size_t(c);
  const bool to_conv = dx && take_grad_use(dx, {GradUse::conv}) && bf16();
  const void* mask16 = relu_out ? valid_twin(relu_out, n) : nullptr;
  const cuda::BnIn xin = bn_in(x, n), dyin = bn_in(dy, n);
  if (dx) note_write(dx, n * sizeof(float));
  void* dx16 = to_conv ? twin_slot(dx, n) : nullptr;
  const cuda::BnOut out = dx16 ? cuda::BnOut{dx16, true} : cuda::BnOut{dx, false};
  run(dyin, xin, mask16 ? mask16 : relu_out, mask16 != nullptr, out);
  if (dx16) made_only_twin(dx, n);
}

// A residual block's input gradient: y, the body's (a convolution's input gradient kept in bf16
// only: note_grad_use's GradUse::sum), plus x, the shortcut's (the block's kept output gradient,
// bf16 only since residual_backward keeps it so, or a projection's input gradient), in one pass.
// Where the op below is the previous block's add (GradUse::res) or a pooling (GradUse::pool: the
// stem's), the sum is written in bf16 only: the residual gradient stream stays bf16 between
// blocks, as under PyTorch's autocast.
void CudaBackendImpl::add(const float* x, float* y, size_t n) {
  const bool to_res = take_grad_use(y, {GradUse::res, GradUse::pool}) && bf16();
  const cuda::Operand xin = bn_in(x, n), yin = bn_in(y, n);
  note_write(y, n * sizeof(float));
  void* y16 = to_res ? twin_slot(y, n) : nullptr;
  if (!xin.bf16 && !yin.bf16 && !y16) cuda::add(x, y, n, stream_.get());
  else cuda::sum_io(xin, yin, y16 ? y16 : static_cast<void*>(y), y16 != nullptr, n, stream_.get());
  if (y16) made_only_twin(y, n);
}

// Terms kept in bf16 only (note_bf16_readers: a batch norm's output) are read as they are; y is
// written in bf16 only where only bf16 readers take it.
// A term bn_train_deferred left unwritten is made from its batch norm's input as it is read.
void CudaBackendImpl::residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu) {
  auto deferred = [&](const float* p) -> const Deferred* {
    auto it = deferred_.find(p);
    if (it == deferred_.end() || !it->second.live) return nullptr;
    if (it->second.n != n) throw Error("residual_sum: a deferred batch norm's output of another size");
    return &it->second;
  };
  const Deferred* db = deferred(body);
  const Deferred* ds = deferred(shortcut);
  const cuda::Operand b = db ? db->x : bn_in(body, n), sc = ds ? ds->x : bn_in(shortcut, n);
  bool only = false;
  void* y16 = out_twin(y, n, relu, only);
  note_write(y, n * sizeof(float));
  if (db || ds) {
    auto term = [](const Deferred* d) {
      return d ? cuda::BnTerm{static_cast<const float*>(d->coef.get()), d->round16} : cuda::BnTerm{};
    };
    cuda::residual_sum_bn(b, term(db), sc, term(ds), only ? nullptr : y, y16, n, db ? db->c : ds->c, relu,
                          stream_.get());
  } else {
    cuda::residual_sum(b, sc, only ? nullptr : y, y16, n, relu, stream_.get());
  }
  wrote_twin(y, n, y16, only);
}

// The ReLU's mask from the output's bf16 twin where residual_sum wrote one (2 bytes instead of 4),
// looked up before keep's note drops it (keep may be y). d, the block's output gradient, is
// read as it is (bf16 only where the block above's add wrote it so: GradUse::res). Where only
// the batch norm below reads d (note_grad_use: GradUse::bn), the masked d is written in bf16
// only, the operand it takes. Under bf16 keep is written in bf16 only: its readers (the block's
// add, or the projection shortcut's copy) take that.
void CudaBackendImpl::residual_backward(float* d, const float* y, float* keep, size_t n, bool relu) {
  const bool to_bn = take_grad_use(d, {GradUse::bn}) && bf16();
  if (!relu) copy(keep, d, n * sizeof(float));  // a bf16-only d stays bf16 (copy)
  else residual_mask(d, bn_in(d, n), y, keep, n, true, to_bn);
}

// Only keep written: both branches' first readers take it (Model's dy_from_), so d's pass out
// is saved (a quarter of the add's backward traffic in bf16). Under bf16 keep is bf16 only, so
// a d of other values (the last block's, from the average pooling's float gradient) is declined:
// its batch norm then reads those floats, as before.
bool CudaBackendImpl::residual_backward_keep(float* d, const float* y, float* keep, size_t n, bool relu) {
  const cuda::Operand din = bn_in(d, n);
  if (bf16() && !din.bf16) return false;
  if (!relu) copy(keep, d, n * sizeof(float));  // a bf16-only d stays bf16 (copy)
  else residual_mask(d, din, y, keep, n, false, false);
  return true;
}

// Both backward calls' pass with a ReLU: v = d (read as din) where y > 0, into keep and, with
// write_d, into d (in bf16 only with d16_only).
void CudaBackendImpl::residual_mask(float* d, cuda::Operand din, const float* y, float* keep, size_t n, bool write_d,
                                    bool d16_only) {
  const void* mask16 = valid_twin(y, n);
  if (!mask16) floats_of(y, n);
  if (write_d) note_write(d, n * sizeof(float));
  note_write(keep, n * sizeof(float));
  void* d16 = write_d && d16_only ? twin_slot(d, n) : nullptr;
  void* k16 = bf16() ? twin_slot(keep, n) : nullptr;
  if (write_d && !din.bf16 && !k16) {
    cuda::residual_backward(d, mask16 ? mask16 : y, mask16 != nullptr, keep, d16, n, stream_.get());
  } else {
    void* out = write_d ? (d16 ? d16 : static_cast<void*>(d)) : nullptr;
    cuda::residual_backward_io(din, {mask16 ? mask16 : y, mask16 != nullptr}, out, d16 != nullptr,
                               k16 ? k16 : static_cast<void*>(keep), k16 != nullptr, n, stream_.get());
  }
  if (d16) made_only_twin(d, n);
  if (k16) made_only_twin(keep, n);
}

void CudaBackendImpl::global_avgpool_forward(const float* x, float* y, int batch, int hw, int c) {
  note_write(y, size_t(batch) * size_t(c) * sizeof(float));
  cuda::global_avgpool_forward(x, y, batch, hw, c, stream_.get());
}

void CudaBackendImpl::global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c) {
  note_write(dx, size_t(batch) * size_t(hw) * size_t(c) * sizeof(float));
  cuda::global_avgpool_backward(dy, dx, batch, hw, c, stream_.get());
}

void CudaBackendImpl::softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch,
                                            int classes, float grad_scale, float* dlogits,
                                            float* stats, float eps) {
  cudaStream_t s = stream_.get();
  const size_t rows = std::max<size_t>(1, size_t(std::max(batch, 0)));
  auto* row_loss = static_cast<double*>(xent_loss_.get(rows * sizeof(double), s));
  auto* row_ok = static_cast<int*>(xent_ok_.get(rows * sizeof(int), s));
  if (dlogits) note_write(dlogits, size_t(batch) * size_t(classes) * sizeof(float));
  if (stats) note_write(stats, 2 * sizeof(float));
  cuda::softmax_xent_smoothed(logits, labels, batch, classes, grad_scale, eps, dlogits, row_loss,
                              row_ok, stats, s);
}

}  // namespace dpt::cuda_impl
