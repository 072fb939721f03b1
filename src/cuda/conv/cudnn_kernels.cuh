// Launchers of the element-wise passes around cuDNN's convolutions (cudnn_kernels.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "dpt/backend.hpp"

namespace dpt::cuda {

// dst (n, fp32) = (accumulate ? dst : 0) + src (n, bf16).
void widen_bf16(const void* src, float* dst, size_t n, bool accumulate, cudaStream_t s);
// A bf16 convolution's epilogue over (rows, c) NHWC: z = float(y16) + b (b nullptr: none),
// a = act(z), a16 = bf16(a), each written unless nullptr.
void conv_epilogue_bf16(const void* y16, const float* b, float* z, float* a, void* a16, size_t rows, int c,
                        Act act, cudaStream_t s);
// a = act(z) and a16 = bf16(a) (round to nearest even) in one pass: the next convolution's input.
void act_forward_twin(const float* z, float* a, void* a16, size_t n, Act act, cudaStream_t s);

// dst (rows, cp) bf16 = src (rows, c) (bf16, or fp32 rounded to nearest even) in its first c
// columns, zeros after: a convolution's input or weight with its channels padded (cp > c).
void pad_channels_bf16(const void* src, bool src_bf16, void* dst, size_t rows, int c, int cp, cudaStream_t s);
// dst (rows, c) fp32 = (accumulate ? dst : 0) + the first c columns of src (rows, cp) bf16.
void unpad_widen_bf16(const void* src, float* dst, size_t rows, int c, int cp, bool accumulate, cudaStream_t s);

}  // namespace dpt::cuda
