// Backend::resized_crop on the GPU: one thread per output pixel (sample, row, column), all
// channels, with the antialiased bilinear weights of augment.cpp's resize_taps computed in
// place (the same float formula; no table), so any window size works without scratch memory.
#include <cuda_runtime.h>

#include <algorithm>

#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "transform.cuh"

namespace dpt::cuda {
namespace {

// One output coordinate's taps: [lo, lo + n) of the window's span, weight(j) / total.
struct Taps {
  int lo, n;
  float center, invscale, total;
  __device__ float weight(int j) const {
    return fmaxf(0.f, 1.f - fabsf(__fmul_rn(__fsub_rn(__fadd_rn(float(j + lo), -center), -0.5f), invscale)));
  }
};

__device__ Taps taps(int in, int out, int o) {
  Taps t;
  const float scale = __fdiv_rn(float(in), float(out));
  const float support = scale >= 1.f ? scale : 1.f;
  t.invscale = scale >= 1.f ? __fdiv_rn(1.f, scale) : 1.f;
  t.center = __fmul_rn(scale, __fadd_rn(float(o), 0.5f));
  t.lo = max(int(__fadd_rn(__fsub_rn(t.center, support), 0.5f)), 0);
  t.n = min(int(__fadd_rn(__fadd_rn(t.center, support), 0.5f)), in) - t.lo;
  t.total = 0.f;
  for (int j = 0; j < t.n; ++j) t.total = __fadd_rn(t.total, t.weight(j));
  return t;
}

__device__ float tap_weight(const Taps& t, int j) {
  const float w = t.weight(j);
  return t.total != 0.f ? __fdiv_rn(w, t.total) : w;
}

__global__ void resized_crop_kernel(const float* __restrict__ x, float* __restrict__ y, int c, int h, int w,
                                    Div oh_n, Div ow_n, const int64_t* __restrict__ draws, const StepCtl* ctl,
                                    int64_t offset, int64_t fixed, const float* __restrict__ norm, int total) {
  const int oh = oh_n.d, ow = ow_n.d;
  const int64_t first = (ctl ? ctl->cursor : 0) + offset;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int col, row;
    const int n = oh_n.divmod(ow_n.divmod(i, col), row);
    const int pix = row * ow + col;
    const int64_t d = draws ? draws[first + n] : fixed;
    // pack_window's fields (augment.hpp): top, left, height, width, flip.
    const int top = int(d & 0x7FFF), left = int((d >> 15) & 0x7FFF), wh = int((d >> 30) & 0x7FFF),
              ww = int((d >> 45) & 0x7FFF);
    const int ox = ((d >> 60) & 1) ? ow - 1 - col : col;
    const Taps ty = taps(wh, oh, row), tx = taps(ww, ow, ox);
    for (int ch = 0; ch < c; ++ch) {
      const float* plane = x + ((size_t(n) * c + ch) * h + top) * w + left;
      float v = 0.f;
      for (int a = 0; a < ty.n; ++a) {
        const float* r = plane + size_t(ty.lo + a) * w + tx.lo;
        float s = 0.f;
        for (int b = 0; b < tx.n; ++b) s = __fadd_rn(s, __fmul_rn(tap_weight(tx, b), r[b]));
        v = __fadd_rn(v, __fmul_rn(tap_weight(ty, a), s));
      }
      if (norm) v = __fdiv_rn(__fsub_rn(v, norm[ch]), norm[c + ch]);
      y[(size_t(n) * c + ch) * size_t(oh) * ow + pix] = v;
    }
  }
}

}  // namespace

void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow, const int64_t* draws,
                  const StepCtl* ctl, int64_t offset, int64_t fixed, const float* norm, cudaStream_t s) {
  const int total = batch * oh * ow;
  if (total <= 0) return;
  const unsigned blocks = unsigned(std::min<int>((total + 255) / 256, 132 * 32));
  resized_crop_kernel<<<blocks, 256, 0, s>>>(x, y, c, h, w, Div(oh), Div(ow), draws, ctl, offset, fixed, norm, total);
  DPT_CHECK_LAUNCH("resized_crop_kernel");
}

}  // namespace dpt::cuda
