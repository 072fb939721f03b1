// Launchers for the CUDA backend's kernels of residual networks: batch norm's reductions and
// elementwise passes (bn.cu), the residual sum, global and padded pooling, and the
// label-smoothed softmax cross-entropy (norm.cu). Layouts and semantics are Backend's (backend.hpp);
// each launcher takes the stream it enqueues on, returns at once and checks the launch; pointers
// are device memory, sums included. Every reduction runs in a fixed order (no atomics): the same
// inputs give the same bits on every run.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dpt/backend.hpp"

namespace dpt::cuda {

// An operand read (batch norm's x and dy, a residual sum's terms): float, or (bf16) the bf16
// tensor that stands for it.
struct Operand {
  const void* p;
  bool bf16;
};
using BnIn = Operand;
// Batch norm's input gradient written: float, or bf16.
struct BnOut {
  void* p;
  bool bf16;
};

// Doubles of scratch that bn_sums / bn_backward_sums need for (rows, c): per-block partial sums,
// (chunks, 2c), chunks a function of rows and c only.
size_t bn_partial_doubles(int64_t rows, int c);
// sums (2c + 1) = [Σx (c), Σx² (c), rows], in double: per-block partials into `partial`
// (bn_partial_doubles(rows, c)), then summed over the blocks in block order.
void bn_sums(BnIn x, int64_t rows, int c, double* sums, double* partial, cudaStream_t s);
// sums (2c + 1) = [Σdy (c), Σdy·(x − mean) (c), rows], the same way; dy counted only where
// relu_out > 0 unless relu_out is nullptr (relu_out: float, or bf16 with relu_out_bf16).
void bn_backward_sums(BnIn dy, BnIn x, int64_t rows, int c, const float* mean,
                      const void* relu_out, bool relu_out_bf16, double* sums, double* partial, cudaStream_t s);
// Backend::bn_forward: mean, var, invstd from the sums in double; the running stats (when not
// nullptr) moved once per channel; y = max(y, 0) with relu; y unless nullptr, and its bf16 copy
// into y16 unless nullptr.
// coef: scratch of 2c floats (bn_backward: 4c), the per-channel coefficients of the vector pass.
void bn_forward(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, const double* sums,
                const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, float* coef, cudaStream_t s);
// bn_sums then bn_forward where nothing comes between them (Backend::bn_train_forward): the
// statistics and coefficients come from the kernel that totals the sums, one launch fewer. With
// neither y nor y16 the affine pass is left out: coef (2c, [scale, shift]) is what it would
// apply (Backend::bn_train_deferred; residual_sum_bn applies it).
void bn_train(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, double* sums, double* partial,
              const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
              float* running_mean, float* running_var, float* coef, cudaStream_t s);
void bn_infer(BnIn x, float* y, bool relu, int64_t rows, int c, const float* running_mean,
              const float* running_var, const float* w, const float* b, float eps, cudaStream_t s);
void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db,
                    bool accumulate, cudaStream_t s);
// dx may be dy (the same memory and type); relu_out as bn_backward_sums'.
void bn_backward(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                 const double* sums, const float* mean, const float* invstd, const float* w, float* coef,
                 cudaStream_t s);
// bn_backward_sums, bn_param_grads and (dx.p not nullptr) bn_backward where nothing comes between
// them (Backend::bn_train_backward): the parameter gradients and the input gradient's
// coefficients come from the kernel that totals the sums, two launches fewer.
void bn_train_backward(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                       double* sums, double* partial, const float* mean, const float* invstd, const float* w,
                       float* dw, float* db, bool accumulate, float* coef, cudaStream_t s);
// y (n) += x (n).
void add(const float* x, float* y, size_t n, cudaStream_t s);
// y (n) = body + shortcut (each float, or bf16 with .bf16), max(y, 0) with relu; y unless
// nullptr, and its bf16 copy into y16 unless nullptr.
void residual_sum(Operand body, Operand shortcut, float* y, void* y16, size_t n, bool relu, cudaStream_t s);
// A residual sum's term: its values (coef nullptr), or a batch norm's output deferred into the
// sum (bn_train's coef of c channels: x·scale + shift of channel i mod c, rounded to bf16 with
// round16, the bits the affine pass would have written to its bf16-only output).
struct BnTerm {
  const float* coef = nullptr;
  bool round16 = false;
};
// residual_sum with either term a deferred batch norm's (c: the channels, innermost).
void residual_sum_bn(Operand body, BnTerm tb, Operand shortcut, BnTerm ts, float* y, void* y16, size_t n, int c,
                     bool relu, cudaStream_t s);
// d (n) = d where mask > 0, else 0 (mask: float, or bf16 with mask_bf16), and keep = d; keep may be
// the mask. With d16, the masked d goes there in bf16 and d's floats are left as they are.
void residual_backward(float* d, const void* mask, bool mask_bf16, float* keep, void* d16, size_t n, cudaStream_t s);
// The residual gradient stream with bf16 operands: out (n, bf16 or float) = a + b; and
// v = mask > 0 ? d : 0 written to out (unless nullptr) and keep (each bf16 or float). out may
// alias an operand of its type (in place), keep the mask.
void sum_io(Operand a, Operand b, void* out, bool out_bf16, size_t n, cudaStream_t s);
void residual_backward_io(Operand d, Operand mask, void* out, bool out_bf16, void* keep, bool keep_bf16, size_t n,
                          cudaStream_t s);
void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c, cudaStream_t s);
void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c, cudaStream_t s);
// Pooling with g.pad >= 0: windows clipped to the input (the CPU backend's padded_pool_*). The
// backward pass is a gather per input element over the windows holding it, in increasing output
// order (the CPU's scatter order). Each operand float or bf16 (x, dy: .bf16; y, dx: out_bf16):
// bf16 values are widened as they are read, and an output rounded to bf16 as it is written (max
// pooling then selects among the bf16 values, the first of equal ones winning).
void padded_pool_forward(Operand x, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g, bool max,
                         cudaStream_t s);
void padded_pool_backward(Operand dy, const uint8_t* argmax, void* dx, bool dx_bf16, const PoolGeom& g,
                          bool max, cudaStream_t s);
// Per row b: row_loss[b] (double) = the smoothed loss, row_ok[b] = argmax == label, dlogits as
// Backend::softmax_xent_smoothed unless nullptr. Then, when stats is set, stats[0] += float(Σ
// row_loss) summed in double, stats[1] += Σ row_ok, by one block in a fixed order.
void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                           float grad_scale, float eps, float* dlogits, double* row_loss,
                           int* row_ok, float* stats, cudaStream_t s);

}  // namespace dpt::cuda
