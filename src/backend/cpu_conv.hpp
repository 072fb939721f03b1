// The CPU backend's loops for convolutional networks (NHWC, see ConvGeom in backend.hpp), as
// free functions that CpuBackend forwards to. Single-threaded: a rank's other cores are the
// GEMMs' (OpenBLAS threads) or other ranks'.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dpt/backend.hpp"

namespace dpt::cpu {

void im2col(const float* x, const ConvGeom& g, float* cols);
void col2im(const float* dcols, const ConvGeom& g, float* dx);
void pool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g, bool max);
void pool_backward(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g, bool max);
void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw);
void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw);
void dropout(const float* x, float* y, int batch, const DropoutArgs& d, int64_t step);
void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, int64_t first);

}  // namespace dpt::cpu
