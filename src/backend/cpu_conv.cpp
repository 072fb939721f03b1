// The CPU backend's convolution, pooling, layout, dropout and augmentation loops. Every loop
// runs the channel dimension innermost: it is contiguous in NHWC, so the compiler vectorises it.
#include "cpu_conv.hpp"

#include <cmath>
#include <cstring>

#include "dpt/augment.hpp"
#include "dpt/dropout.hpp"
#include "simd.hpp"

namespace dpt::cpu {

namespace {
// Short copies (a few floats per kernel row for small channel counts) inline, not memcpy calls.
inline void copy_run(float* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}
inline void zero_run(float* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = 0.f;
}
}  // namespace

// For one output pixel and kernel row kh the k·c values of the patch are contiguous in NHWC
// (k neighbouring pixels of one input row): one copy where the row lies inside the image,
// pixel by pixel with zeros where it crosses the padding.
DPT_SIMD void im2col(const float* x, const ConvGeom& g, float* cols) {
  const int OH = g.oh(), OW = g.ow(), C = g.c, K = g.k;
  const size_t run = size_t(K) * C;
  float* dst = cols;
  for (int n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const int iw0 = ow * g.stride - g.pad;
        for (int kh = 0; kh < K; ++kh, dst += run) {
          const int ih = oh * g.stride - g.pad + kh;
          if (ih < 0 || ih >= g.h) {
            zero_run(dst, run);
            continue;
          }
          const float* src = x + ((size_t(n) * g.h + ih) * g.w) * C;
          if (iw0 >= 0 && iw0 + K <= g.w) {
            copy_run(dst, src + size_t(iw0) * C, run);
            continue;
          }
          for (int kw = 0; kw < K; ++kw) {
            const int iw = iw0 + kw;
            if (iw >= 0 && iw < g.w) copy_run(dst + size_t(kw) * C, src + size_t(iw) * C, size_t(C));
            else zero_run(dst + size_t(kw) * C, size_t(C));
          }
        }
      }
}

// Scatter-add in im2col's order (rows, then kh, kw): deterministic.
DPT_SIMD void col2im(const float* dcols, const ConvGeom& g, float* dx) {
  const int OH = g.oh(), OW = g.ow(), C = g.c, K = g.k;
  std::memset(dx, 0, size_t(g.batch) * g.h * g.w * C * sizeof(float));
  const float* src = dcols;
  for (int n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow)
        for (int kh = 0; kh < K; ++kh) {
          const int ih = oh * g.stride - g.pad + kh;
          for (int kw = 0; kw < K; ++kw, src += C) {
            const int iw = ow * g.stride - g.pad + kw;
            if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
            float* __restrict d = dx + ((size_t(n) * g.h + ih) * g.w + iw) * C;
            const float* __restrict s = src;
            for (int c = 0; c < C; ++c) d[c] += s[c];
          }
        }
}

// Windows clipped to the input (padding, PyTorch's): max over the taps inside it, the first
// maximum in row-major order winning and a NaN replacing it (PyTorch's `val > maxval ||
// isnan(val)`), argmax = the tap's kh·k + kw; avg: the taps summed in row-major order, then
// divided by k² (the padding's zeros counted, count_include_pad; PyTorch's order).
DPT_SIMD void pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g, bool max) {
  const int OH = g.oh(), OW = g.ow(), C = g.c, K = g.k;
  const float area = float(K * K);
  for (int n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const size_t o = ((size_t(n) * OH + oh) * OW + ow) * C;
        float* __restrict yo = y + o;
        uint8_t* __restrict ao = max ? argmax + o : nullptr;
        bool first = true;
        for (int j = 0; j < K * K; ++j) {
          const int ih = oh * g.stride - g.pad + j / K, iw = ow * g.stride - g.pad + j % K;
          if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
          const float* __restrict xi = x + ((size_t(n) * g.h + ih) * g.w + iw) * C;
          if (first) {
            for (int c = 0; c < C; ++c) yo[c] = xi[c];
            if (max)
              for (int c = 0; c < C; ++c) ao[c] = uint8_t(j);
            first = false;
          } else if (max) {
            for (int c = 0; c < C; ++c) {
              const float v = xi[c];
              const bool take = v > yo[c] || v != v;  // v != v: NaN
              yo[c] = take ? v : yo[c];
              ao[c] = take ? uint8_t(j) : ao[c];
            }
          } else {
            for (int c = 0; c < C; ++c) yo[c] += xi[c];
          }
        }
        if (!max)
          for (int c = 0; c < C; ++c) yo[c] /= area;
      }
}

// Every window adds to each of its elements inside the input (zero where it is not the
// window's argmax), in increasing output order: the sums of the CUDA backend's gathers, which
// skip the zeros.
DPT_SIMD void pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g, bool max) {
  const int OH = g.oh(), OW = g.ow(), C = g.c, K = g.k;
  const float area = float(K * K);
  std::memset(dx, 0, size_t(g.batch) * g.h * g.w * C * sizeof(float));
  for (int n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const size_t o = ((size_t(n) * OH + oh) * OW + ow) * C;
        const float* __restrict dyo = dy + o;
        const uint8_t* __restrict ao = max ? argmax + o : nullptr;
        for (int j = 0; j < K * K; ++j) {
          const int ih = oh * g.stride - g.pad + j / K, iw = ow * g.stride - g.pad + j % K;
          if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
          float* __restrict d = dx + ((size_t(n) * g.h + ih) * g.w + iw) * C;
          if (max)
            for (int c = 0; c < C; ++c) d[c] += ao[c] == j ? dyo[c] : 0.f;
          else
            for (int c = 0; c < C; ++c) d[c] += dyo[c] / area;
        }
      }
}

DPT_SIMD void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) {
  const size_t per = size_t(c) * hw;
  for (int n = 0; n < batch; ++n)
    for (int p = 0; p < hw; ++p)
      for (int ch = 0; ch < c; ++ch) dst[n * per + size_t(ch) * hw + p] = src[n * per + size_t(p) * c + ch];
}

DPT_SIMD void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) {
  const size_t per = size_t(c) * hw;
  for (int n = 0; n < batch; ++n)
    for (int p = 0; p < hw; ++p)
      for (int ch = 0; ch < c; ++ch) dst[n * per + size_t(p) * c + ch] = src[n * per + size_t(ch) * hw + p];
}

// x·0 for a dropped element (±0, NaN for ±Inf), x·scale for a kept one: PyTorch's x·mask·scale.
DPT_SIMD void dropout(const float* x, float* y, int batch, const DropoutArgs& d, int64_t step) {
  const uint32_t thr = dropout_threshold(d.p);
  const float scale = float(1.0 / (1.0 - d.p));
  const int hw = d.h * d.w;
  const size_t per = size_t(d.c) * hw;
  for (int i = 0; i < batch; ++i) {
    const uint64_t key = dropout_key(d.seed, d.layer, step, d.first + i);
    const float* xi = x + size_t(i) * per;
    float* yi = y + size_t(i) * per;
    for (int p = 0; p < hw; ++p)
      for (int ch = 0; ch < d.c; ++ch) {
        const size_t m = size_t(p) * d.c + ch;  // memory (NHWC) index
        const int64_t e = int64_t(ch) * hw + p;  // NCHW index: the mask's element
        yi[m] = xi[m] * (dropout_keep(key, e, thr) ? scale : 0.f);
      }
  }
}

void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, int64_t first) {
  const size_t per = size_t(c) * h * w;
  for (int i = 0; i < batch; ++i)
    augment_image(x + i * per, y + i * per, c, h, w, pad, draws[first + i]);
}

void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                  const int64_t* draws, int64_t first, int64_t fixed, const float* norm) {
  const size_t in = size_t(c) * h * w, out = size_t(c) * oh * ow;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < batch; ++i)
    resized_crop_image(x + i * in, y + i * out, c, h, w, oh, ow, draws ? draws[first + i] : fixed,
                       norm, norm ? norm + c : nullptr);
}

}  // namespace dpt::cpu
