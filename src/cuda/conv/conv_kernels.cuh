// Launchers for the CUDA backend's kernels of convolutional networks (defined in conv.cu):
// im2col / col2im, pooling, elementwise activations, the NHWC <-> NCHW transposes, dropout and
// augmentation. Layouts and semantics are Backend's (backend.hpp); each launcher takes the
// stream it enqueues on, returns at once and checks the launch; pointers are device memory.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dpt/backend.hpp"

namespace dpt::cuda {

// cols (g.rows(), g.cols()) from x (NHWC); in bf16 (round to nearest even) when bf16_out, so a
// bf16 GEMM reads it with no conversion pass.
void im2col(const float* x, const ConvGeom& g, void* cols, bool bf16_out, cudaStream_t s);
// Rows [row0, row0 + rows) of a narrow convolution's columns into cols (those rows alone,
// width_padded columns each: a multiple of 8, at least g.cols(); 16-byte aligned): x's values
// in the weight's (kh, kw, c) order, zeros after, in bf16. x is float, or bf16 where x_bf16.
void narrow_cols(const void* x, bool x_bf16, const ConvGeom& g, int row0, int rows, int width_padded, void* cols,
                 cudaStream_t s);
// dx (NHWC) = per input element the sum of its columns, gathered (no atomics) in the order of
// increasing output pixel, the CPU backend's scatter order: the same sums, bit for bit.
void col2im(const float* dcols, const ConvGeom& g, float* dx, cudaStream_t s);
// Pooling without padding. Each operand is float, or bf16 where its flag says so (read widened,
// written rounded).
void pool_forward(const void* x, bool x_bf16, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g, bool max,
                  cudaStream_t s);
// Max pooling of a convolution's ReLU output from its bf16 output z16 before bias and ReLU
// (note_relu_pool): the values pooled are bf16(relu(z16 + bias)) (bias may be nullptr), those the
// convolution's epilogue would have stored.
void pool_forward_relu(const void* z16, const float* bias, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g,
                       cudaStream_t s);
// Gathered per input element over the windows holding it, in increasing output order (the CPU's).
void pool_backward(const void* dy, bool dy_bf16, const uint8_t* argmax, void* dx, bool dx_bf16, const PoolGeom& g,
                   bool max, cudaStream_t s);
// Max pooling's backward, then the convolution's ReLU backward (pool_forward_relu's): dx16 (bf16)
// = the gathered gradient rounded to bf16, times 0 where bf16(relu(z16 + bias)) is not > 0.
void pool_backward_relu(const void* dy, bool dy_bf16, const uint8_t* argmax, const void* z16, const float* bias,
                        void* dx16, const PoolGeom& g, cudaStream_t s);
void act_forward(const float* z, float* a, size_t n, Act act, cudaStream_t s);
void act_backward(float* da, const float* z, const float* a, size_t n, Act act, cudaStream_t s);
// Per sample, dst (c, hw) = src (hw, c)ᵀ (to_nchw) or dst (hw, c) = src (c, hw)ᵀ.
void batched_transpose(const float* src, float* dst, int batch, int rows, int cols, cudaStream_t s);
// The same on bf16 values (as 16-bit words).
void batched_transpose_bf16(const void* src, void* dst, int batch, int rows, int cols, cudaStream_t s);
// batched_transpose of floats into bf16 (to_bf16's rounding).
void batched_transpose_to_bf16(const float* src, void* dst, int batch, int rows, int cols, cudaStream_t s);
// Backend::dropout with the step read from ctl on the device (ctl nullptr: step 0).
void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl, cudaStream_t s);
// Backend::augment: sample i's draw is draws[(ctl ? ctl->cursor : 0) + offset + i].
void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, const StepCtl* ctl, int64_t offset, cudaStream_t s);

}  // namespace dpt::cuda
