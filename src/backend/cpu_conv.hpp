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
void pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g, bool max);
void pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g, bool max);
void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw);
void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw);
void dropout(const float* x, float* y, int batch, const DropoutArgs& d, int64_t step);
void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, int64_t first);
// Backend::resized_crop: sample i's window is draws[first + i] (draws nullptr: fixed).
void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                  const int64_t* draws, int64_t first, int64_t fixed, const float* norm);


// Batch norm, residual sums, global average and padded pooling (cpu_bn.cpp; Backend gives the
// contracts).
void bn_sums(const float* x, int64_t rows, int c, double* sums);
void bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums, const float* w,
                const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, bool relu);
void bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
              const float* running_var, const float* w, const float* b, float eps, bool relu);
void bn_backward_sums(const float* dy, const float* x, int64_t rows, int c, const float* mean, double* sums,
                      const float* relu_out);
void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db, bool accumulate);
void bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, const double* sums,
                 const float* mean, const float* invstd, const float* w, const float* relu_out);
void add(const float* x, float* y, size_t n);
void residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu);
void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c);
void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c);

}  // namespace dpt::cpu
