// Launchers for the CUDA backend's own kernels (defined in kernels.cu). Every launcher takes
// the stream it enqueues on, returns at once and checks the launch; pointers are device memory.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dpt/backend.hpp"

namespace dpt::cuda {

void fill(float* p, size_t n, float v, cudaStream_t s);
void scale(float* p, size_t n, float a, cudaStream_t s);

// z (batch,out) += b (out) broadcast over rows (b may be nullptr); a = act(z) (a may equal z);
// a16 (batch,out, bf16), when set, = bf16(a) rounded to nearest even (the next GEMMs' operand).
void bias_act_forward(float* z, float* a, const float* b, int batch, int out, Act act,
                      cudaStream_t s, void* a16 = nullptr);
// One pass over (batch,out): da becomes dz = da·act'(z) (the derivative from z and/or a = act(z)),
// dz16 (bf16), when set, = bf16(dz), and db (out) = (accumulate ? db : 0) + Σ_rows dz, summed
// through `partial` (act_bgrad_partial_floats(batch, out) floats of scratch) in a fixed order.
// write_dz false, with dz16 set: da is left as it is (only bf16(dz) is read afterwards).
void act_backward_bgrad(float* da, const float* z, const float* a, int batch, int out, Act act,
                        float* db, bool accumulate, float* partial, void* dz16, cudaStream_t s,
                        bool write_dz = true);
size_t act_bgrad_partial_floats(int batch, int out);
// The bf16 path's ReLU backward: d16 (batch,out, bf16) holds bf16(da) and becomes bf16(dz),
// dz = da·[a16 > 0] (a16 the layer's bf16 activation); db = (accumulate ? db : 0) + Σ_rows dz
// through `partial` (act_bgrad_partial_floats(batch, out) floats), fixed order as above. a16
// nullptr: d16 holds dz already (the mask applied by pool_backward_relu): db alone, d16 unwritten.
void relu_backward_bgrad_bf16(void* d16, const void* a16, int batch, int out, float* db,
                              bool accumulate, float* partial, cudaStream_t s);
// dst (n, bf16, round to nearest even) = src (n, fp32).
void to_bf16(const float* src, void* dst, size_t n, cudaStream_t s);
// dst (n, fp32) = src (n, bf16) exactly; *flag = 1 when flag and any value is NaN/Inf.
void from_bf16(const void* src, float* dst, size_t n, int* flag, cudaStream_t s);
// dst (cols, rows) = src (rows, cols)ᵀ, both row-major fp32: a copy, no arithmetic.
void transpose(const float* src, int rows, int cols, float* dst, cudaStream_t s);

// Per row b: row_loss[b] = −log softmax(logits[b])[label], row_ok[b] = argmax == label,
// dlogits = (softmax − onehot)·grad_scale unless nullptr. Then stats[0] += Σ row_loss,
// stats[1] += Σ row_ok, summed by one block in a fixed order (deterministic).
void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                  float grad_scale, float* dlogits, float* row_loss, int* row_ok, float* stats,
                  cudaStream_t s);

// One fused elementwise optimizer update over n parameters (torch.optim formulas). With ctl,
// lr = lr_table[ctl->step], t = ctl->updates + 1, read on the device, and no update when ctl->bad.
// p16 (n, bf16), when set, receives bf16(p) of the updated parameters in the same pass.
// flag, when set: the non-finite check folded in (*flag = 1 when any g read is NaN/Inf; the
// update goes ahead).
void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n, const OptimStep& h,
                    cudaStream_t s, const float* lr_table = nullptr, const StepCtl* ctl = nullptr,
                    void* p16 = nullptr, int* flag = nullptr);

// *flag = 1 if any of p[0..n) is NaN or ±Inf; the caller zeroes flag first.
void flag_nonfinite(const float* p, size_t n, int* flag, cudaStream_t s);

// x[i] = feat[rows[i]] · scale + offset (dim values per row), y[i] = labels[rows[i]].
// feat is uint8 when is_u8, else float32.
// With ctl, the rows are rows[ctl->cursor + first + i] (read on the device); else rows[first + i].
void gather_rows(const void* feat, bool is_u8, const int32_t* labels, const int64_t* rows,
                 int count, int64_t dim, float scale, float offset, float* x, int32_t* y,
                 cudaStream_t s, const StepCtl* ctl = nullptr, int64_t first = 0);

// The end of a step on the device (see Backend::end_step).
void end_step(StepCtl* ctl, int64_t global_batch, bool sticky, cudaStream_t s);

}  // namespace dpt::cuda
